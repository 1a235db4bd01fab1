"""What the bench scripts share: their training commands run a few at a time, each as its own process."""

from __future__ import annotations

import subprocess
import time


def run_jobs(jobs: list[list[str]], parallel: int, shown_from: int = 2) -> None:
    """Run each command, at most `parallel` at once, printing each start and end (the command from its
    `shown_from`-th word: past the interpreter's `-m reflectrl`)."""
    jobs = list(jobs)
    running: list[tuple[subprocess.Popen, list[str], float]] = []
    while jobs or running:
        while jobs and len(running) < parallel:
            cmd = jobs.pop(0)
            print("start:", " ".join(cmd[shown_from:]), flush=True)
            running.append((subprocess.Popen(cmd), cmd, time.time()))
        for item in list(running):
            proc, cmd, start = item
            if proc.poll() is not None:
                running.remove(item)
                print(f"done ({proc.returncode}) in {time.time() - start:.0f}s:", " ".join(cmd[shown_from:]),
                      flush=True)
        time.sleep(2)
