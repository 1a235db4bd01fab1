"""The local backend: up to `workers` `reflectrl train` subprocesses at once, each writing
its output to the run's log (the seeds of an entry whose trainer trains them as one program,
backend=jax's: one `reflectrl train-group` process, vectorised over them). Ctrl-C or SIGTERM
on the driver stops them all (they resume from their last checkpoints): no orphaned runs left
writing into a directory the user may be about to delete."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from reflectrl.experiments.progress import Progress
from reflectrl.experiments.spec import RunSpec
from reflectrl.experiments.state import ExperimentResult, log_path, train_argv
from reflectrl.runs.files import last_logged_step, run_status


def _raise_interrupt(signum, frame):
    from reflectrl.runs.session import Terminated

    raise Terminated  # a KeyboardInterrupt: the same clean-up; the CLI exits 143, as train does


def groups_seeds(run: RunSpec) -> bool:
    """Whether the run's trainer, on its backend, trains an entry's seeds as one program (its TrainerSpec's
    groups_seeds: the JAX PPO's)."""
    from reflectrl.training import trainer_form

    return trainer_form(run.given_config()).groups_seeds


def seed_groups(todo: list[tuple[RunSpec, str]]) -> list[list[tuple[RunSpec, str]]]:
    """`todo` as jobs: a run whose trainer groups seeds (groups_seeds) joins the other seeds of its entry
    (same env, entry and state) in one job, trained as one program (`reflectrl train-group`, which
    resumes runs checkpointed at different iterations as groups of their own: trainers/ppo_jax/trainer.py
    train_group; the steps their metrics reached may differ where a kill cut the logging short); every
    other run is a job of its own."""
    jobs: list[list[tuple[RunSpec, str]]] = []
    groups: dict[tuple, list] = {}
    for run, state in todo:
        if not groups_seeds(run):
            jobs.append([(run, state)])
            continue
        key = (run.env_id, run.entry.label, state)
        if key not in groups:
            groups[key] = []
            jobs.append(groups[key])
        groups[key].append((run, state))
    return jobs


def _group_command(job: list[tuple[RunSpec, str]]) -> list[str]:
    """The command of a job: `reflectrl train` for one run, `reflectrl train-group` for a group of seeds
    (its runs listed in a JSON file beside the first run's directory)."""
    run, state = job[0]
    if len(job) == 1 and not groups_seeds(run):
        return [sys.executable, "-m", "reflectrl", *train_argv(run, state)]
    items = [{"path": str(r.path), "argv": train_argv(r, st)[1:-1]} for r, st in job]
    spec = run.path.parent / f".group-{run.path.name}.json"
    spec.write_text(json.dumps(items, indent=1))
    return [sys.executable, "-m", "reflectrl", "train-group", str(spec), "--no-progress"]


def run_local(todo: list[tuple[RunSpec, str]], workers: int, result: ExperimentResult, bar: Progress) -> None:
    pending = seed_groups(todo)
    running: dict[subprocess.Popen, tuple[list, object]] = {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # `kill` (or a cluster scheduler's SIGTERM) stops the workers too, as Ctrl-C does.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main else None
    try:
        while pending or running:
            while pending and len(running) < workers:
                job = pending.pop(0)
                run = job[0][0]
                run.path.parent.mkdir(parents=True, exist_ok=True)
                log = open(log_path(run), "a")
                cmd = _group_command(job)
                log.write("$ reflectrl " + " ".join(cmd[3:]) + "\n")
                log.flush()
                for other, _ in job[1:]:  # a group writes one log: the first run's
                    with open(log_path(other), "a") as note:
                        note.write(f"$ (trained with the other seeds of its entry; output in {log_path(run)})\n")
                running[subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)] = (job, log)
            time.sleep(0.5)
            for proc, (job, log) in list(running.items()):
                for run, _ in job:
                    bar.set_step(run.path, last_logged_step(run.path))
                if proc.poll() is None:
                    continue
                log.close()
                del running[proc]
                for run, _ in job:
                    status = run_status(run.path) or {}
                    if proc.returncode == 0 or (len(job) > 1 and status.get("status") == "finished"):
                        result.finished.append(run)
                    else:
                        result.failed.append((run, status.get("reason") or _tail(log_path(job[0][0]))))
            bar.set_running(sum(len(job) for job, _ in running.values()))
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
