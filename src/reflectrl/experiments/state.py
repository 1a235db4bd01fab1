"""What an experiment's runs have done so far, and who may run them.

* `run_state`: finished | resume | fresh, read from the run directory (runs/files.py), so
  that running `compare` again skips finished runs and resumes interrupted ones.
* `train_argv`: the `reflectrl train` command that continues a run from its state.
* `ExperimentResult`: what one `compare` call did.
* `exclusive`: the experiment lock, one `compare` per experiment directory at a time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from reflectrl.errors import UserError
from reflectrl.experiments.spec import RunSpec
from reflectrl.runs.files import has_checkpoint, has_config, has_staged_checkpoint, run_status
from reflectrl.runs.rundir import make_dir


@dataclass
class ExperimentResult:
    finished: list[RunSpec] = field(default_factory=list)  # trained to their end by this call
    skipped: list[RunSpec] = field(default_factory=list)   # finished before it
    failed: list[tuple[RunSpec, str]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)  # what this call added to an existing experiment
    resumed: list[RunSpec] = field(default_factory=list)  # the runs this call continued from a checkpoint

    def summary(self) -> str:
        """The line a `compare` ends with: how many runs it trained (from the start or on from an interrupted
        run's checkpoint), how many had finished before, how many failed; then, when any were, how many of
        the trained were resumed. The first part keeps its old form, which users' scripts read."""
        resumed = sum(1 for run in self.finished if run in self.resumed)
        line = (f"runs: {len(self.finished)} trained, {len(self.skipped)} already finished, "
                f"{len(self.failed)} failed")
        return line + (f" ({resumed} of the trained resumed from a checkpoint)" if resumed else "")


def run_state(run: RunSpec) -> str:
    """finished | resume | fresh (fresh also when a run died before its first checkpoint)."""
    status = run_status(run.path)
    if status is not None and status.get("status") == "finished":
        return "finished"
    if (has_checkpoint(run.path) or has_staged_checkpoint(run.path)) and has_config(run.path):
        return "resume"  # a staged checkpoint only: a JAX group killed while putting its first in place
    return "fresh"


def runs_to_train(runs: list[RunSpec], result: ExperimentResult) -> list[tuple[RunSpec, str]]:
    """(run, state) of the runs still to train; finished ones go to result.skipped, and a run that died
    before its first checkpoint is cleared (nothing to keep) to start afresh."""
    todo = []
    for run in runs:
        state = run_state(run)
        if state == "finished":
            result.skipped.append(run)
            continue
        if state == "fresh" and run.path.exists():
            shutil.rmtree(run.path)
        if state == "resume":
            result.resumed.append(run)
        todo.append((run, state))
    return todo


def train_argv(run: RunSpec, state: str, path: Path | None = None) -> list[str]:
    where = str(path or run.path)
    if state == "resume":
        return ["train", "--resume", where, "--no-progress"]
    argv = list(run.argv)
    argv[argv.index("--out") + 1] = where
    return ["train", *argv, "--no-progress"]


def log_path(run: RunSpec) -> Path:
    """The run's training output, next to its run directory (DIR/runs/<env>/<entry>/seed<N>.log)."""
    return run.path.with_suffix(".log")


@contextlib.contextmanager
def exclusive(root: Path):
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


_exclusive = exclusive
