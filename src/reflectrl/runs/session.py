"""What every `train` command does around its trainer: reopen a run to resume it, and run
the trainer so that a blow-up, Ctrl-C, SIGTERM or a full disk leaves the run directory in a
state that says so.

SIGTERM (`kill`, a scheduler, `compare` stopping its runs) asks the trainer to stop at the
end of its current iteration, where its state is whole: it writes a checkpoint there (cheap
next to an iteration) and the run is marked `interrupted`. A second SIGTERM, or Ctrl-C,
stops at once; the run then resumes from its last cadence checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable

from reflectrl.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, NonFiniteError, UserError
from reflectrl.runs.files import has_checkpoint
from reflectrl.runs.rundir import RunDir

_stop = threading.Event()


class Terminated(KeyboardInterrupt):
    """Raised by a trainer at an iteration boundary after SIGTERM, once its checkpoint is written."""


def stop_requested() -> bool:
    """True once SIGTERM has asked the running trainer to stop; trainers check it between
    iterations, write a checkpoint and raise `Terminated`."""
    return _stop.is_set()


def _on_sigterm(signum, frame):
    if _stop.is_set():  # asked twice: stop now
        raise Terminated
    _stop.set()


@contextlib.contextmanager
def sigterm_stops_training():
    """Within the block, SIGTERM sets the stop flag instead of killing the process."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    _stop.clear()
    try:
        yield
    finally:
        _stop.clear()
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def open_to_resume(path: str, given: list[tuple[str, object]], kind: str = "control") -> RunDir | None:
    """The run at `path`, locked and ready to continue; None (after saying so) if it already
    finished. `given` are (flag, value) pairs of the command line: --resume takes none of them.
    `kind` is the kind of run the calling command trains ('control' or 'llm')."""
    extra = [flag for flag, value in given if value is not None]
    if extra:
        raise UserError(f"--resume continues a run with its saved config; drop {', '.join(extra)}")
    run = RunDir.open(path, kind=kind)
    run.lock()
    if run.status().get("status") == "finished":
        run.unlock()
        print(f"run {run.path} already finished; nothing to do", file=sys.stderr)
        return None
    return run


def _disk_error(err: OSError) -> bool:
    return err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM)


def train_guarded(trainer, run: RunDir, progress: bool, resume_command: str) -> int | None:
    """Run `trainer.train`; on a non-finite quantity, Ctrl-C, SIGTERM or a write that fails
    (a full disk) record why in run.json and return the exit code; None when training completed."""
    resume = f"{resume_command} --resume {run.path}"
    try:
        with sigterm_stops_training():
            trainer.train(progress=progress)
    except NonFiniteError as err:
        run.set_status("failed", reason=str(err))
        print(f"reflectrl: error: {err}", file=sys.stderr)
        return EXIT_FAILED
    except Terminated:
        run.set_status("interrupted", global_step=_progress_of(trainer), reason="SIGTERM")
        print(f"reflectrl: terminated; continue with: {resume}", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        run.set_status("interrupted", global_step=_progress_of(trainer))
        print(f"\nreflectrl: interrupted; continue with: {resume}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as err:
        if not _disk_error(err):
            raise
        cause = err.strerror or type(err).__name__
        with contextlib.suppress(OSError):  # on a full disk this may fail too; the message still goes out
            run.set_status("failed", reason=f"write failed: {cause}")
        if has_checkpoint(run.path):
            print(f"reflectrl: error: cannot write to {run.path}: {cause}; the last good checkpoint is kept "
                  f"(free space, then continue with: {resume})", file=sys.stderr)
        else:
            print(f"reflectrl: error: cannot write to {run.path}: {cause}; no checkpoint was written yet "
                  "(free space, then start the run again)", file=sys.stderr)
        return EXIT_FAILED
    return None


def _progress_of(trainer) -> int:
    return int(getattr(trainer, "global_step", getattr(trainer, "step", 0)))


# ---------------------------------------------------------------------------- the flows of `train` and `llm train`

def train_new_run(out: str, config: dict, build: Callable, finish: Callable, *, progress: bool,
                  resume_command: str) -> int:
    """Create the run directory `out` (locked), build the trainer with `build(run)`, train, and
    `finish(trainer, run)`. If the trainer cannot be built, no run directory is left behind."""
    created = not os.path.exists(out)
    run = RunDir.create(out, config, command=["reflectrl", *sys.argv[1:]])
    try:
        try:
            trainer = _prepared(build(run))
        except BaseException:
            if created:
                shutil.rmtree(run.path, ignore_errors=True)
            else:  # the directory was empty before: leave it so
                for child in run.path.iterdir():
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            raise
        return _train_and_finish(trainer, run, finish, progress, resume_command)
    finally:
        run.unlock()


def resume_run(path: str, given: list[tuple[str, object]], kind: str, build: Callable, finish: Callable, *,
               progress: bool, resume_command: str) -> int:
    """Reopen the run at `path` (locked), rebuild its trainer with `build(run)` from the saved
    config, load the checkpoint, train to the end and `finish(trainer, run)`."""
    run = open_to_resume(path, given, kind)
    if run is None:
        return 0
    try:
        state = run.load_checkpoint()
        trainer = build(run)
        trainer.load_state_dict(state)
        _prepared(trainer)  # refused before the run is marked running again
        run.set_status("running")
        return _train_and_finish(trainer, run, finish, progress, resume_command)
    finally:
        run.unlock()


def _prepared(trainer):
    """The trainer after its `prepare()`, where what can still be refused is (IMPALA's Ray
    cluster); closed again if that fails."""
    if hasattr(trainer, "prepare"):
        try:
            trainer.prepare()
        except BaseException:
            if hasattr(trainer, "close"):
                trainer.close()
            raise
    return trainer


def _train_and_finish(trainer, run: RunDir, finish: Callable, progress: bool, resume_command: str) -> int:
    try:
        code = train_guarded(trainer, run, progress, resume_command)
    finally:
        if hasattr(trainer, "close"):
            trainer.close()
    if code is not None:
        return code
    finish(trainer, run)
    return 0
