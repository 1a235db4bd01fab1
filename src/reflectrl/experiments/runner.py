"""Run an experiment's runs, locally in parallel processes or as Ray tasks, resumably.

Each run is an ordinary `reflectrl train` (a fresh run, or `--resume` of an interrupted
one), so a run directory made by `compare` is the same as one made by hand and every
guarantee of a run (atomic checkpoints, bit-identical resume) carries over. Running
`compare` again skips finished runs, resumes interrupted ones from their checkpoints and
restarts only runs killed before their first checkpoint.

Backends:
* `local`: up to `workers` subprocesses at once (default: the machine's cores).
* `ray`: one Ray task per run on a Ray cluster (`ray_address`, or a local instance).
  Workers need reflectrl installed but no shared filesystem: a task receives the partial
  run directory (when resuming) as an archive, trains in a private directory, reports its
  progress to a small actor, and returns the finished run directory as an archive that
  the driver unpacks under DIR. A task whose worker dies is retried by Ray.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from reflectrl.errors import UserError
from reflectrl.experiments.spec import ExperimentSpec, RunSpec, load_or_create
from reflectrl.runs.rundir import make_dir


@dataclass
class ExperimentResult:
    finished: list[RunSpec] = field(default_factory=list)
    skipped: list[RunSpec] = field(default_factory=list)
    failed: list[tuple[RunSpec, str]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # what this call added to an existing experiment


def run_state(run: RunSpec) -> str:
    """finished | resume | fresh (fresh also when a run died before its first checkpoint)."""
    status_file = run.path / "run.json"
    if status_file.is_file():
        try:
            if json.loads(status_file.read_text()).get("status") == "finished":
                return "finished"
        except json.JSONDecodeError:
            pass
    if (run.path / "checkpoint.pt").is_file() and (run.path / "config.json").is_file():
        return "resume"
    return "fresh"


def train_argv(run: RunSpec, state: str, path: Path | None = None) -> list[str]:
    where = str(path or run.path)
    if state == "resume":
        return ["train", "--resume", where, "--no-progress"]
    argv = list(run.argv)
    argv[argv.index("--out") + 1] = where
    return ["train", *argv, "--no-progress"]


def _last_step(path: Path) -> int:
    """global_step of the last complete line of a run's metrics.jsonl (0 if none)."""
    try:
        with open(path / "metrics.jsonl", "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["global_step"])
        except (ValueError, KeyError):
            continue
    return 0


def validate_runs(spec: ExperimentSpec, root: Path) -> list[RunSpec]:
    """Check every distinct run configuration before anything starts."""
    runs = spec.runs(root)
    seen = set()
    for run in runs:
        key = (run.env_id, run.entry.label)
        if key not in seen:
            seen.add(key)
            run.config()
    return runs


def run_experiment(root: Path, spec: ExperimentSpec, backend: str = "local", workers: int | None = None,
                   ray_address: str | None = None, progress: bool = True) -> ExperimentResult:
    spec.validate()
    if backend not in ("local", "ray"):
        raise UserError(f"unknown --backend '{backend}'; use local or ray")
    if workers is not None and workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1")
    runs = validate_runs(spec, root)
    if backend == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError("--backend ray needs Ray: pip install 'reflectrl[ray]'") from None
    with _exclusive(root):
        result = ExperimentResult(added=load_or_create(root, spec))
        if result.added:
            print(f"reflectrl: extending {root} with {', '.join(result.added)}", file=sys.stderr)
        todo = []
        for run in runs:
            state = run_state(run)
            if state == "finished":
                result.skipped.append(run)
            else:
                if state == "fresh" and run.path.exists():
                    shutil.rmtree(run.path)  # died before its first checkpoint: nothing to keep
                todo.append((run, state))
        bar = _Progress(spec, runs, result, progress)
        try:
            if backend == "local":
                _run_local(todo, workers or os.cpu_count() or 1, result, bar)
            else:
                _run_ray(todo, workers, ray_address, result, bar)
        finally:
            bar.close()
    return result


@contextlib.contextmanager
def _exclusive(root: Path):
    """Hold an advisory lock on the experiment directory while its runs train, so that a
    second `compare` on the same --out stops at once instead of training the same runs."""
    make_dir(root)
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    fd = os.open(root, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UserError(f"another 'reflectrl compare' is running on {root}; wait for it to finish "
                            "(or stop it) before resuming or extending this experiment") from None
        yield
    finally:
        os.close(fd)


class _Progress:
    def __init__(self, spec: ExperimentSpec, runs: list[RunSpec], result: ExperimentResult, enabled: bool):
        from tqdm import tqdm

        self.total_runs = len(runs)
        self.cap = spec.total_steps  # runs end on a whole batch, a little past it
        self.result = result
        self.steps: dict[Path, int] = {r.path: (spec.total_steps if r in result.skipped else 0) for r in runs}
        self.bar = tqdm(total=spec.total_steps * len(runs), initial=sum(self.steps.values()), unit="step",
                        unit_scale=True, disable=not enabled, dynamic_ncols=True, smoothing=0.05, mininterval=1.0)
        self.set_running(0)

    def set_step(self, path: Path, step: int) -> None:
        step = max(min(step, self.cap), self.steps.get(path, 0))
        delta = step - self.steps.get(path, 0)
        self.steps[path] = step
        if delta:
            self.bar.update(delta)

    def set_running(self, running: int) -> None:
        done = len(self.result.finished) + len(self.result.skipped)
        failed = f", {len(self.result.failed)} failed" if self.result.failed else ""
        self.bar.set_postfix_str(f"runs {done}/{self.total_runs} done, {running} running{failed}", refresh=False)

    def close(self) -> None:
        self.bar.close()


def _log_path(run: RunSpec) -> Path:
    return run.path.with_suffix(".log")


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _run_local(todo, workers: int, result: ExperimentResult, bar: _Progress) -> None:
    pending = list(todo)
    running: dict[subprocess.Popen, tuple[RunSpec, object]] = {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # `kill` (or a cluster scheduler's SIGTERM) stops the workers too, as Ctrl-C does: no
    # orphaned runs left writing into a directory the user may be about to delete.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main else None
    try:
        while pending or running:
            while pending and len(running) < workers:
                run, state = pending.pop(0)
                run.path.parent.mkdir(parents=True, exist_ok=True)
                log = open(_log_path(run), "a")
                cmd = [sys.executable, "-m", "reflectrl", *train_argv(run, state)]
                log.write("$ reflectrl " + " ".join(cmd[3:]) + "\n")
                log.flush()
                running[subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)] = (run, log)
            time.sleep(0.5)
            for proc, (run, log) in list(running.items()):
                bar.set_step(run.path, _last_step(run.path))
                if proc.poll() is None:
                    continue
                log.close()
                del running[proc]
                if proc.returncode == 0:
                    result.finished.append(run)
                else:
                    result.failed.append((run, _tail(_log_path(run))))
            bar.set_running(len(running))
    except KeyboardInterrupt:
        for proc in running:
            proc.terminate()
        for proc in running:
            proc.wait()
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text().strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


# ---------------------------------------------------------------------------------- Ray

def _pack(path: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(path, arcname="run")
    return buf.getvalue()


def _unpack(data: bytes, dest: Path) -> None:
    """Unpack an archived run directory to `dest`, replacing it atomically."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest.parent))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp / "run", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _ray_task(argv_fresh: list[str], state: str, archive: bytes | None, key: str, reporter):
    """Runs on a Ray worker: train in a private directory, return the run as an archive."""
    work = Path(tempfile.mkdtemp(prefix="reflectrl-ray-"))
    path = work / "run"
    try:
        if archive is not None:
            _unpack(archive, path)
        if state == "resume":
            argv = ["train", "--resume", str(path), "--no-progress"]
        else:
            at = argv_fresh.index("--out") + 1
            argv = ["train", *argv_fresh[:at], str(path), *argv_fresh[at + 1:], "--no-progress"]
        stop = threading.Event()

        def report():
            while not stop.wait(1.0):
                reporter.report.remote(key, _last_step(path))

        thread = threading.Thread(target=report, daemon=True)
        thread.start()
        proc = subprocess.run([sys.executable, "-m", "reflectrl", *argv], capture_output=True, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        stop.set()
        thread.join()
        log = "$ reflectrl " + " ".join(argv) + "\n" + proc.stdout + proc.stderr
        return proc.returncode, log, (_pack(path) if path.exists() else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_ray(todo, workers: int | None, address: str | None, result: ExperimentResult, bar: _Progress) -> None:
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, num_cpus=workers if address is None else None,
                 include_dashboard=False, log_to_driver=False, logging_level="ERROR")

    @ray.remote
    class Reporter:
        def __init__(self):
            self.steps = {}

        def report(self, key, step):
            self.steps[key] = step

        def snapshot(self):
            return dict(self.steps)

    reporter = Reporter.remote()
    task = ray.remote(num_cpus=1, max_retries=2)(_ray_task)
    refs = {}
    for run, state in todo:
        archive = _pack(run.path) if state == "resume" else None
        argv = train_argv(run, "fresh")[1:-1]  # the train arguments, without the leading 'train' and --no-progress
        refs[task.remote(argv, state, archive, str(run.path), reporter)] = run
    try:
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=1.0)
            for ref in ready:
                run = refs.pop(ref)
                try:
                    code, log, archive = ray.get(ref)
                except Exception as err:  # the task itself failed after its retries
                    result.failed.append((run, f"Ray task failed: {type(err).__name__}: {str(err).splitlines()[0]}"))
                    continue
                if archive is not None:
                    _unpack(archive, run.path)
                run.path.parent.mkdir(parents=True, exist_ok=True)
                with open(_log_path(run), "a") as f:
                    f.write(log)
                if code == 0:
                    result.finished.append(run)
                else:
                    result.failed.append((run, " | ".join(log.strip().splitlines()[-3:])))
                bar.set_step(run.path, _last_step(run.path))
            for key, step in ray.get(reporter.snapshot.remote()).items():
                bar.set_step(Path(key), step)
            bar.set_running(len(refs))
    finally:
        if started_here:
            ray.shutdown()
