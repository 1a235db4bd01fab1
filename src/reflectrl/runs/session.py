"""What every `train` command does around its trainer: reopen a run to resume it, and run
the trainer so that a blow-up, Ctrl-C, SIGTERM or a full disk leaves the run directory in a
state that says so.

Ctrl-C (SIGINT) and SIGTERM (`kill`, a scheduler, `compare` stopping its runs) ask the trainer
to stop at the end of its current iteration, where its state is whole: it writes a checkpoint
there (cheap next to an iteration) and the run is marked `interrupted` at that step, so that
run.json, the checkpoint and `eval` agree and nothing is trained twice. The same signal a
second time stops at once; the run then resumes from its last checkpoint, and run.json and the
closing line say which step that is and how many steps are trained again. (A Ctrl-C at a
terminal reaches `compare`'s runs too, and `compare` then sends them SIGTERM: a different
signal, so they still stop at their iteration's end.)
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
_asked_by: list[int] = []  # the signals that asked to stop, in order


class Terminated(KeyboardInterrupt):
    """Raised by a trainer at an iteration boundary after SIGTERM, once its checkpoint is written."""


def stop_requested() -> bool:
    """True once SIGTERM or Ctrl-C has asked the running trainer to stop; trainers check it between
    iterations, write a checkpoint and raise `stopped()`."""
    return _stop.is_set()


def stopped() -> KeyboardInterrupt:
    """What a trainer raises where it stopped as asked, its checkpoint written: KeyboardInterrupt after
    Ctrl-C (exit 130), `Terminated` after SIGTERM or any other request to stop (exit 143)."""
    return KeyboardInterrupt() if _asked_by[:1] == [signal.SIGINT] else Terminated()


def _ask_to_stop(signum: int) -> None:
    if signum in _asked_by:  # asked twice: stop now
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    if signum == signal.SIGINT and not _asked_by:
        print("\nreflectrl: stopping at the end of this iteration, with a checkpoint there (Ctrl-C again to stop "
              "at once, from the last checkpoint)", file=sys.stderr)
    _asked_by.append(signum)
    _stop.set()


def _on_sigterm(signum, frame):
    _ask_to_stop(signal.SIGTERM)


def _on_sigint(signum, frame):
    _ask_to_stop(signal.SIGINT)


@contextlib.contextmanager
def sigterm_stops_training():
    """Within the block, SIGTERM and Ctrl-C set the stop flag instead of stopping the process at once
    (Ctrl-C only where it would raise KeyboardInterrupt: not where the shell made it ignored)."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if in_main else None
    previous_int = signal.getsignal(signal.SIGINT) if in_main else None
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
    _stop.clear()
    _asked_by.clear()
    try:
        yield
    finally:
        _stop.clear()
        _asked_by.clear()
        if in_main:
            signal.signal(signal.SIGTERM, previous)
            if previous_int is signal.default_int_handler:
                signal.signal(signal.SIGINT, previous_int)


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
    except KeyboardInterrupt as stop:  # Terminated too
        return _interrupted(trainer, run, resume, terminated=isinstance(stop, Terminated))
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


def _interrupted(trainer, run: RunDir, resume: str, terminated: bool) -> int:
    """Mark the run interrupted at the step it resumes from (its checkpoint's, which `eval` reads too),
    and say so: where it stopped, and, when it stopped between checkpoints, how much is trained again."""
    reached = _progress_of(trainer)
    resumes = run.checkpoint_step if run.checkpoint_step is not None else reached
    run.set_status("interrupted", global_step=resumes, **({"reason": "SIGTERM"} if terminated else {}))
    word = "reflectrl: terminated" if terminated else "\nreflectrl: interrupted"
    if reached <= resumes:
        where = f"at step {resumes:,}, checkpointed there"
    else:
        unit = getattr(trainer, "unit", "steps")
        where = (f"at step {reached:,}; it resumes from its last checkpoint, step {resumes:,} "
                 f"(the {reached - resumes:,} {unit} after it are trained again)")
    print(f"{word} {where}; continue with: {resume}", file=sys.stderr)
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED


# ---------------------------------------------------------------------------- the flows of `train` and `llm train`

def train_new_run(out: str, config: dict, build: Callable, finish: Callable, *, progress: bool,
                  resume_command: str, command: list[str] | None = None) -> int:
    """Create the run directory `out` (locked), build the trainer with `build(run)`, train, and
    `finish(trainer, run)`. If the trainer cannot be built, no run directory is left behind. `command`:
    what run.json records as the command (default: this process's command line)."""
    created = not os.path.exists(out)
    run = RunDir.create(out, config, command=command or ["reflectrl", *sys.argv[1:]])
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
        run.set_status("running")  # records this resume's session (commit, tree state, versions) in run.json
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
