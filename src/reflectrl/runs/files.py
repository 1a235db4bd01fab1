"""Reading run directories from outside the process that trains them.

The experiment runner and the report look at many runs, some half-written, some killed in
the middle of a write: these readers never raise on a missing or damaged file, they say
"nothing there" (None, 0, False, the rows before the damage). The run directory's file names are
spelled here (runs/rundir.py writes them); nothing outside runs/ spells them. Imports no torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from reflectrl.runs.jsonfile import loads

# a run directory's files (runs/rundir.py writes them)
CONFIG = "config.json"
STATUS = "run.json"
METRICS = "metrics.jsonl"
TENSORBOARD = "tb"
CHECKPOINT = "checkpoint.pt"
STAGED_CHECKPOINT = "checkpoint.pt.staged"  # a JAX group's two-phase checkpoint (trainers/ppo_jax/trainer.py)
STATE_SAMPLES = "state_samples.npz"  # runs/state_samples.py: what `plot state-map` draws


def _read_json(path: Path) -> dict | None:
    try:
        data = loads(path.read_text())
    except (OSError, ValueError):  # missing, unreadable, not UTF-8 or not JSON
        return None
    return data if isinstance(data, dict) else None


def run_status(path: str | os.PathLike) -> dict | None:
    """The run's status file (status, command, versions), or None when missing or corrupt."""
    return _read_json(Path(path) / STATUS)


def live_status(path: str | os.PathLike, status: dict | None = None) -> str:
    """The run's status as a reader should show it: the status file's word, except that a run
    whose file says "running" while no process holds its directory's lock (the trainer locks it
    for its life; the kernel drops the lock however the process dies) is "stopped": killed, or its
    machine gone, without a chance to say so. It resumes from its last checkpoint like an
    interrupted one. "not started" without a status file. `status`: the file's contents where the
    caller has read them already."""
    status = status if status is not None else run_status(path)
    if status is None:
        return "not started"
    word = str(status.get("status", "unknown"))
    if word == "running":
        try:
            held = dir_is_locked(path)
        except OSError:  # the directory went away under us
            return word
        if not held:
            return "stopped"
    return word


def dir_is_locked(path: str | os.PathLike) -> bool:
    """Whether a live process holds the run directory's lock (RunDir.lock; a quick probe, released at once)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def run_config(path: str | os.PathLike) -> dict | None:
    """The run's resolved config, or None when missing or corrupt."""
    return _read_json(Path(path) / CONFIG)


def has_config(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG).is_file()


def has_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / CHECKPOINT).is_file()


def has_staged_checkpoint(path: str | os.PathLike) -> bool:
    """A JAX group's next checkpoint, written whole and not yet put in place (runs/rundir.py)."""
    return (Path(path) / STAGED_CHECKPOINT).is_file()


def has_metrics(path: str | os.PathLike) -> bool:
    return (Path(path) / METRICS).is_file()


def last_logged_step(path: str | os.PathLike) -> int:
    """global_step of the last complete line of the run's metrics (0 if none); reads only the
    file's tail, so it is cheap to call every second on a run being trained."""
    try:
        with open(Path(path) / METRICS, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 4096))
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["global_step"])
        except (ValueError, KeyError, TypeError):  # a line cut by a kill, or not a row
            continue
    return 0


def read_logged_rows(path: str | os.PathLike) -> list[dict]:
    """The run's metric rows up to the first damaged line (a line cut by a kill ends the
    log); [] when there are none. `rundir.read_metrics` is the strict reader."""
    try:
        text = (Path(path) / METRICS).read_text()
    except (OSError, ValueError):
        return []
    rows = []
    for line in text.splitlines():
        try:
            row = loads(line)
        except json.JSONDecodeError:
            break
        if not isinstance(row, dict):
            break
        rows.append(row)
    return rows
