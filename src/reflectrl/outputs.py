"""Every output path a command writes (a report, a plot, a video, a model): checked before the
work that fills it, and a write that still fails (a full disk) said in one line.

`check_writable(path, flag)` runs before the long part of a command: the folder the output goes
in must exist (or be creatable) and be writable, so that an hour of evaluation is not lost to a
typo. `write_error(err)` is the one line the CLI prints for an `OSError` that escapes anyway
(the disk filled during the write); writers use `runs.rundir.atomic_write_bytes`/`atomic_dir`,
which leave no partial file behind.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from reflectrl.errors import UserError

HINTS = {
    errno.EROFS: "the location is read-only; choose a writable one",
    errno.ENOSPC: "the disk is full; free space or choose another location",
    errno.EDQUOT: "the disk quota is used up; free space or choose another location",
    errno.EACCES: "permission denied; choose a location you can write",
    errno.EPERM: "permission denied; choose a location you can write",
    errno.ENOENT: "no such folder; create it first or choose another path",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    errno.EISDIR: "it is a folder; give a file name",
}


def write_error(err: OSError, flag: str | None = None) -> str:
    """One line for an OSError raised while writing an output."""
    where = f"{flag} {err.filename}" if flag and err.filename else (err.filename or "an output file")
    hint = HINTS.get(err.errno, "choose another location")
    return f"cannot write {where}: {err.strerror or type(err).__name__} ({hint})"


def check_writable(path: str | os.PathLike, flag: str, *, directory: bool = False) -> Path:
    """Refuse, in one line, an output path that cannot be written: its folder (for `directory`,
    the path itself) must be a writable directory or creatable under one."""
    path = Path(path)
    if directory and path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path}: it is a file, not a folder; choose a folder")
    if not directory and path.is_dir():
        raise UserError(f"{flag} {path}: it is a folder; give a file name")
    target = path if directory else path.parent
    existing = target
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path}: {existing} is a file, not a folder; choose another path")
    if not directory and existing != target:
        raise UserError(f"{flag} {path}: the folder {target} does not exist; create it first or choose another path")
    if not os.access(existing, os.W_OK | os.X_OK) or not _can_create_in(existing):
        why = "is read-only" if _read_only(existing) else "is not writable"
        raise UserError(f"{flag} {path}: {existing} {why}; choose a writable location")
    return path


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder`, tried: root passes os.access everywhere, even in /proc
    or /sys, where the write then fails after the work."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".reflectrl-probe-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def write_files(out: Path, files: dict[str, bytes], flag: str = "--out") -> Path:
    """Write a folder's files (a plot's PNGs and GIF) all or none: each atomically, and on a
    failure the ones this call wrote are removed (and the folder, if this call made it)."""
    from reflectrl.runs.rundir import atomic_write_bytes, make_dir

    out = Path(out)
    created = not out.exists()
    make_dir(out, flag)
    written: list[Path] = []
    try:
        for name, data in files.items():
            atomic_write_bytes(out / name, data)
            written.append(out / name)
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        if created:
            try:
                out.rmdir()
            except OSError:
                pass
        raise
    return out


# A figure that would have more pixels than this at its dpi (a diagnostics grid of many panels,
# a state map of many snapshots) is saved at a lower dpi, down to MIN_DPI (9-point text stays
# about 7.5 px high): the dozens-of-panels grids were 1260x5840 px, over 1 MB each.
MAX_PIXELS = 2_500_000
MIN_DPI = 60
PALETTE_COLORS = 256  # a plot's colours fit a palette; a paletted PNG is about a third of the RGBA one


def png_bytes(fig, dpi: float = 100) -> bytes:
    """A matplotlib figure's PNG bytes, kept small (every picture a command writes: the report's, the
    calibration signal's): at most MAX_PIXELS (the dpi lowered, not below MIN_DPI) and quantised to a
    PALETTE_COLORS palette (no dithering: flat colours stay flat). Closes the figure."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    width, height = fig.get_size_inches()
    dpi = max(MIN_DPI, min(dpi, (MAX_PIXELS / (width * height)) ** 0.5))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    image = Image.open(buf).convert("RGB").quantize(PALETTE_COLORS, method=Image.Quantize.MAXCOVERAGE,
                                                    dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()
