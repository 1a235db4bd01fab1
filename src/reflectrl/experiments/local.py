"""The local backend: up to `workers` `reflectrl train` subprocesses at once, each writing
its output to the run's log. Ctrl-C or SIGTERM on the driver stops them all (they resume
from their last checkpoints): no orphaned runs left writing into a directory the user may
be about to delete."""

from __future__ import annotations

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
from reflectrl.runs.files import last_logged_step


def _raise_interrupt(signum, frame):
    from reflectrl.runs.session import Terminated

    raise Terminated  # a KeyboardInterrupt: the same clean-up; the CLI exits 143, as train does


def run_local(todo: list[tuple[RunSpec, str]], workers: int, result: ExperimentResult, bar: Progress) -> None:
    pending = list(todo)
    running: dict[subprocess.Popen, tuple[RunSpec, object]] = {}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # `kill` (or a cluster scheduler's SIGTERM) stops the workers too, as Ctrl-C does.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if in_main else None
    try:
        while pending or running:
            while pending and len(running) < workers:
                run, state = pending.pop(0)
                run.path.parent.mkdir(parents=True, exist_ok=True)
                log = open(log_path(run), "a")
                cmd = [sys.executable, "-m", "reflectrl", *train_argv(run, state)]
                log.write("$ reflectrl " + " ".join(cmd[3:]) + "\n")
                log.flush()
                running[subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)] = (run, log)
            time.sleep(0.5)
            for proc, (run, log) in list(running.items()):
                bar.set_step(run.path, last_logged_step(run.path))
                if proc.poll() is None:
                    continue
                log.close()
                del running[proc]
                if proc.returncode == 0:
                    result.finished.append(run)
                else:
                    result.failed.append((run, _tail(log_path(run))))
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
