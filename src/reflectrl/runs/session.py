"""What every `train` command does around its trainer: reopen a run to resume it, and run
the trainer so that a blow-up or Ctrl-C leaves the run directory in a state that says so."""

from __future__ import annotations

import sys

from reflectrl.errors import EXIT_FAILED, EXIT_INTERRUPTED, NonFiniteError, UserError
from reflectrl.runs.rundir import RunDir


def open_to_resume(path: str, given: list[tuple[str, object]]) -> RunDir | None:
    """The run at `path`, ready to continue; None (after saying so) if it already finished.
    `given` are (flag, value) pairs of the command line: --resume takes none of them."""
    extra = [flag for flag, value in given if value is not None]
    if extra:
        raise UserError(f"--resume continues a run with its saved config; drop {', '.join(extra)}")
    run = RunDir.open(path)
    if run.status().get("status") == "finished":
        print(f"run {run.path} already finished; nothing to do", file=sys.stderr)
        return None
    return run


def train_guarded(trainer, run: RunDir, progress: bool, resume_command: str) -> int | None:
    """Run `trainer.train`; on a non-finite quantity or Ctrl-C record why in run.json and
    return the exit code; None when training completed."""
    try:
        trainer.train(progress=progress)
    except NonFiniteError as err:
        run.set_status("failed", reason=str(err))
        print(f"reflectrl: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        run.set_status("interrupted", global_step=trainer.global_step)
        print(f"\nreflectrl: interrupted; continue with: {resume_command} --resume {run.path}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return None
