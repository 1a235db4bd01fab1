"""The Ray backend: one Ray task per run, on a Ray cluster (`ray_address`) or a local instance.

Workers need reflectrl installed but no shared filesystem: a task receives the partial run
directory (when resuming) as an archive, trains in a private directory, reports its progress
to a small actor, and returns the finished run directory as an archive that the driver
unpacks under DIR. A task whose worker dies is retried by Ray.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from reflectrl.experiments.progress import Progress
from reflectrl.experiments.spec import RunSpec
from reflectrl.experiments.state import ExperimentResult, log_path, train_argv
from reflectrl.runs.files import last_logged_step


def pack(path: Path) -> bytes:
    """A run directory as a gzipped tar archive (its top entry named `run`)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(path, arcname="run")
    return buf.getvalue()


def unpack(data: bytes, dest: Path) -> None:
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


def ray_task(argv_fresh: list[str], state: str, archive: bytes | None, key: str, reporter):
    """Runs on a Ray worker: train in a private directory, return the run as an archive."""
    work = Path(tempfile.mkdtemp(prefix="reflectrl-ray-"))
    path = work / "run"
    try:
        if archive is not None:
            unpack(archive, path)
        if state == "resume":
            argv = ["train", "--resume", str(path), "--no-progress"]
        else:
            at = argv_fresh.index("--out") + 1
            argv = ["train", *argv_fresh[:at], str(path), *argv_fresh[at + 1:], "--no-progress"]
        stop = threading.Event()

        def report():
            while not stop.wait(1.0):
                reporter.report.remote(key, last_logged_step(path))

        thread = threading.Thread(target=report, daemon=True)
        thread.start()
        proc = subprocess.run([sys.executable, "-m", "reflectrl", *argv], capture_output=True, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        stop.set()
        thread.join()
        log = "$ reflectrl " + " ".join(argv) + "\n" + proc.stdout + proc.stderr
        return proc.returncode, log, (pack(path) if path.exists() else None)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_ray(todo: list[tuple[RunSpec, str]], workers: int | None, address: str | None, result: ExperimentResult,
            bar: Progress) -> None:
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
    task = ray.remote(num_cpus=1, max_retries=2)(ray_task)
    refs = {}
    for run, state in todo:
        archive = pack(run.path) if state == "resume" else None
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
                    unpack(archive, run.path)
                run.path.parent.mkdir(parents=True, exist_ok=True)
                with open(log_path(run), "a") as f:
                    f.write(log)
                if code == 0:
                    result.finished.append(run)
                else:
                    result.failed.append((run, " | ".join(log.strip().splitlines()[-3:])))
                bar.set_step(run.path, last_logged_step(run.path))
            for key, step in ray.get(reporter.snapshot.remote()).items():
                bar.set_step(Path(key), step)
            bar.set_running(len(refs))
    finally:
        if started_here:
            ray.shutdown()
