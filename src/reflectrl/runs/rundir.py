"""The run directory, the unit every command reads and writes.

    DIR/config.json      the resolved RunConfig (every default filled in)
    DIR/run.json         status (running | finished | failed | interrupted), command, versions, and
                         `sessions`: the commit, tree state and package versions of each start and
                         resume (runs/provenance.py)
    DIR/metrics.jsonl    one JSON object per iteration
    DIR/tb/              TensorBoard event files
    DIR/checkpoint.pt    the latest checkpoint, replaced atomically: torch.save's file where it holds torch
                         tensors (the torch trainers'), else (a JAX run's numpy leaves) a pickle behind a
                         one-line header, written and read with no torch imported
    DIR/checkpoint.pt.staged  a JAX group's next checkpoint, written whole before any seed's is put in place

Checkpoints are written to a temporary file, flushed to disk and renamed over the old one,
so a kill at any instant leaves either the old checkpoint or the new one. On resume the
metrics written after the checkpoint are cut away (they will be produced again, identically)
and TensorBoard purges its events past the checkpoint's step.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from reflectrl.errors import UserError
from reflectrl.runs import jsonfile, provenance
from reflectrl.runs.files import (  # noqa: F401 (the file names: files.py spells them; importers find them here too)
    CHECKPOINT,
    CONFIG,
    METRICS,
    STAGED_CHECKPOINT,
    STATE_SAMPLES,
    STATUS,
    TENSORBOARD,
    dir_is_locked,
    run_config,
    run_status,
)
from reflectrl.runs.jsonfile import read_json_object


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a kill or a full disk at any instant leaves either the
    old file or the new one, and no temporary file behind when the write fails."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):  # where the write failed, so may this (a read-only disk)
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError) and (err.filename is None or str(err.filename) == str(tmp)):
            err.filename = str(path)  # the one-line error names the file the user asked for, not our temporary
        raise


@contextlib.contextmanager
def atomic_dir(path: Path):
    """Write a directory whole or not at all: yields a sibling temporary path to fill; on
    success it replaces `path`, on failure it is removed and `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
        old = path.with_name(path.name + ".old")
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_dir(path: Path, flag: str = "--out") -> None:
    """mkdir -p, with one line saying why when the directory cannot be created."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{flag} {path}: cannot create the directory ({err.strerror or type(err).__name__}); "
                        "choose a writable location") from None


def run_kind(config: dict) -> str:
    """'llm' for a language-model run (`reflectrl llm train`), 'control' for a `reflectrl train` run."""
    return "llm" if "task" in config and "model" in config and "env_id" not in config else "control"


EVAL_COMMANDS = {"control": "reflectrl eval {}", "llm": "reflectrl llm eval --model {} --task TASK"}
RESUME_COMMANDS = {"control": "reflectrl train", "llm": "reflectrl llm train"}
KIND_COMMANDS = {"control": "reflectrl train --resume / reflectrl eval",
                 "llm": "reflectrl llm train --resume / reflectrl llm eval --model DIR"}


def _json_default(value: Any):
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot serialise {type(value).__name__}")


PICKLE_HEADER = b"reflectrl checkpoint: pickle\n"  # what a checkpoint written without torch starts with


def _holds_torch(value) -> bool:
    """Whether a checkpoint's state holds a torch object (a tensor, a module's state) anywhere."""
    if isinstance(value, dict):
        return any(_holds_torch(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_torch(v) for v in value)
    return type(value).__module__.split(".", 1)[0] == "torch"


def _write_checkpoint(path: Path, state: dict) -> None:
    """torch.save where the state holds torch objects (the torch trainers'); else, with no torch imported (a
    JAX run's numpy leaves and Python values), PICKLE_HEADER and a pickle. Read back by _read_checkpoint."""
    if _holds_torch(state):
        import torch

        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
    else:
        data = PICKLE_HEADER + pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    atomic_write_bytes(path, data)


def _read_checkpoint(path: Path):
    """A checkpoint's state, whichever way _write_checkpoint wrote it (told apart by the file's first bytes:
    a JAX run's checkpoint from before PICKLE_HEADER is torch.save's file, and loads with torch)."""
    with open(path, "rb") as f:
        data = f.read()
    if data.startswith(PICKLE_HEADER):
        return pickle.loads(data[len(PICKLE_HEADER):])
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _torch_version() -> str | None:
    """The installed torch's version, read without importing torch (None where none is installed)."""
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


class RunDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        # the global_step of the checkpoint this process last wrote or loaded (None: neither yet): where an
        # interrupted run resumes from, what run.json then records (runs/session.py)
        self.checkpoint_step: int | None = None
        self._staged_step: int | None = None

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT

    # -- creation and opening

    @classmethod
    def create(cls, path: str | os.PathLike, config: dict, command: list[str] | None = None) -> RunDir:
        run = cls(path)
        if run.path.exists() and (not run.path.is_dir() or any(run.path.iterdir())):
            if (run.path / CONFIG).exists():
                if run.is_locked():
                    raise UserError(f"--out {run.path} holds a run that another process is training; "
                                    "choose another --out")
                held, status = run_config(run.path), run_status(run.path) or {}
                kind = run_kind(held) if held is not None else "control"
                if status.get("status") == "finished":
                    raise UserError(f"--out {run.path} already holds a finished run (read it with "
                                    f"'{EVAL_COMMANDS[kind].format(run.path)}'); choose another --out")
                raise UserError(f"--out {run.path} already holds a run; continue it with "
                                f"'{RESUME_COMMANDS[kind]} --resume {run.path}' or choose another --out")
            raise UserError(f"--out {run.path} exists and is not an empty directory; choose another --out")
        make_dir(run.path)
        run.lock()
        run.write_json(CONFIG, config)
        from reflectrl._version import __version__

        status = {
            "status": "running",
            "command": command if command is not None else sys.argv,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "reflectrl_version": __version__,
            "torch_version": _torch_version(),
            "python": platform.python_version(),
            provenance.SESSIONS: [provenance.session(from_step=0)],
        }
        run.write_json(STATUS, status)
        return run

    @classmethod
    def open(cls, path: str | os.PathLike, kind: str | None = None) -> RunDir:
        """An existing run directory; with `kind` ('control' or 'llm'), refuse a run of the
        other kind with a line naming the commands that take it."""
        run = cls(path)
        if not run.path.is_dir():
            raise UserError(f"no run directory at {run.path}; pass the --out of a 'reflectrl train' run")
        if not (run.path / CONFIG).is_file():
            raise UserError(f"{run.path} is not a run directory (no {CONFIG}); "
                            "pass the --out of a 'reflectrl train' run")
        if kind is not None:
            found = run.kind()
            if found != kind:
                what = "a language-model run" if found == "llm" else "an env (reflectrl train) run"
                raise UserError(f"{run.path} is {what}: use {KIND_COMMANDS[found]}")
        return run

    def kind(self) -> str:
        return run_kind(self.config())

    # -- one process at a time

    def lock(self) -> None:
        """Hold an advisory lock on the directory for the rest of this process's life, so that
        a second `train` or `train --resume` on a run being trained stops at once. The kernel
        drops the lock when the process dies, however it dies: a stale lock never blocks."""
        try:
            import fcntl
        except ImportError:  # not POSIX: no lock
            return
        if getattr(self, "_lock_fd", None) is not None:
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UserError(f"{self.path} is being trained by another process (a 'reflectrl train' or a "
                            "'reflectrl compare' run); wait for it to finish or stop it first") from None
        self._lock_fd = fd

    def is_locked(self) -> bool:
        """Whether another live process holds this directory's lock (a quick probe, released at once)."""
        return dir_is_locked(self.path)

    def unlock(self) -> None:
        fd = getattr(self, "_lock_fd", None)
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the flock
            self._lock_fd = None

    def read_json(self, name: str) -> dict:
        return read_json_object(self.path / name, "the run directory cannot be used (train it again)")

    def write_json(self, name: str, data: dict) -> None:
        text = jsonfile.dumps(data, indent=2, default=_json_default) + "\n"  # strict: inf as "Infinity"
        atomic_write_bytes(self.path / name, text.encode())

    def config(self) -> dict:
        return self.read_json(CONFIG)

    def status(self) -> dict:
        return self.read_json(STATUS) if (self.path / STATUS).exists() else {}

    def record(self, **fields: Any) -> None:
        """Add fields to run.json, its status unchanged (e.g. the version of what a trainer computes with:
        a JAX run's jax_version)."""
        data = self.status()
        data.update(fields)
        self.write_json(STATUS, data)

    def set_status(self, status: str, **extra: Any) -> None:
        """Set run.json's status. A run set `running` again is resumed (`train --resume`, a JAX group's
        resume): that records a new session, from the step of the checkpoint it loaded."""
        data = self.status()
        if status == "running":
            step = self.checkpoint_step if self.checkpoint_step is not None else data.get("global_step")
            data[provenance.SESSIONS] = [*data.get(provenance.SESSIONS, []), provenance.session(from_step=step)]
        data.update(status=status, updated=time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra)
        self.write_json(STATUS, data)

    def add_warning(self, text: str) -> None:
        """Keep a warning the run gave in run.json's `warnings` (once), for whoever reads the run later."""
        data = self.status()
        if text not in data.setdefault("warnings", []):
            data["warnings"].append(text)
            self.write_json(STATUS, data)

    # -- checkpoints

    def save_checkpoint(self, state: dict) -> None:
        _write_checkpoint(self.checkpoint_path, state)
        self.checkpoint_step = state.get("global_step")

    def has_checkpoint(self) -> bool:
        return self.checkpoint_path.is_file()

    # A group of runs trained as one program (the JAX backend's seeds) must resume from one iteration:
    # it writes every run's next checkpoint beside the current one (stage), and only then puts each in
    # place (commit). A kill while staging leaves every run at the old iteration; a kill while committing
    # leaves staged checkpoints that complete the set (trainers/ppo_jax/trainer.py settle_checkpoints).

    def stage_checkpoint(self, state: dict) -> None:
        _write_checkpoint(self.path / STAGED_CHECKPOINT, state)
        self._staged_step = state.get("global_step")

    def commit_checkpoint(self, step: int | None = None) -> None:
        """Put the staged checkpoint in place; `step`: its global_step, where another process staged it."""
        os.replace(self.path / STAGED_CHECKPOINT, self.checkpoint_path)
        self.checkpoint_step = step if step is not None else self._staged_step

    def staged_checkpoint(self) -> dict | None:
        """The staged checkpoint, None where there is none or it cannot be read."""
        path = self.path / STAGED_CHECKPOINT
        if not path.is_file():
            return None
        try:
            state = _read_checkpoint(path)
        except Exception:  # a damaged staged checkpoint is as good as none: the committed one stands
            return None
        return state if isinstance(state, dict) and "global_step" in state else None

    def discard_staged_checkpoint(self) -> None:
        (self.path / STAGED_CHECKPOINT).unlink(missing_ok=True)

    def load_checkpoint(self) -> dict:
        if not self.has_checkpoint():
            raise UserError(f"no checkpoint in {self.path} ({CHECKPOINT} missing); "
                            "the run cannot be resumed or evaluated")
        try:
            state = _read_checkpoint(self.checkpoint_path)
        except Exception as err:  # torch and pickle raise many types for a damaged file
            raise UserError(f"checkpoint {self.checkpoint_path} is corrupt ({type(err).__name__}); "
                            "delete the run directory and train again") from None
        if not isinstance(state, dict) or "global_step" not in state:
            raise UserError(f"checkpoint {self.checkpoint_path} is not a reflectrl checkpoint")
        self.checkpoint_step = state["global_step"]
        return state


class ScalarEvents:
    """TensorBoard's event file of a run's scalars, written by the tensorboard package's own writer (what
    torch.utils.tensorboard.SummaryWriter wraps; no torch imported), the same events SummaryWriter.add_scalar
    writes. `purge_step`: a resumed run's first step again; TensorBoard hides the events logged at or after it
    by the killed process (SummaryWriter's purge_step)."""

    def __init__(self, folder: Path, purge_step: int | None = None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self.writer = EventFileWriter(str(folder), max_queue_size=10, flush_secs=120)
        if purge_step is not None:
            self._add(Event(step=purge_step, file_version="brain.Event:2"))
            self._add(Event(step=purge_step, session_log=SessionLog(status=SessionLog.START)))

    def _add(self, event) -> None:
        event.wall_time = time.time()
        self.writer.add_event(event)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        self._add(self._event(summary=summary, step=int(step)))

    def close(self) -> None:
        self.writer.close()  # flushes


class MetricsLogger:
    """Writes each iteration's metrics to metrics.jsonl and TensorBoard."""

    def __init__(self, run: RunDir, resume_step: int | None = None):
        self.path = run.path / METRICS
        purge = None
        if resume_step is not None:
            # from step 0 (the checkpoint written before anything ran) nothing logged is kept: what the
            # killed process logged at step 0 (an evaluation of the untrained policy) comes again
            last_kept = resume_step if resume_step > 0 else -1
            self._truncate_after(last_kept)
            purge = last_kept + 1
        self.writer = ScalarEvents(run.path / TENSORBOARD, purge_step=purge)
        self.file = open(self.path, "a")

    def _truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        kept = []
        with open(self.path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line cut by the kill: everything after it is gone too
                if row.get("global_step", 0) > step:
                    break
                kept.append(line)
        atomic_write_bytes(self.path, "".join(kept).encode())

    def log(self, row: dict) -> None:
        self.file.write(jsonfile.dumps(row, default=_json_default) + "\n")
        self.file.flush()
        step = row["global_step"]
        for key, value in row.items():
            if key != "global_step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.file.close()
        self.writer.close()


def read_metrics(path: str | os.PathLike) -> list[dict]:
    rows = []
    with open(Path(path) / METRICS) as f:
        for line in f:
            rows.append(jsonfile.loads(line))
    return rows
