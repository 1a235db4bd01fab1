"""Where a run's numbers came from (issue 59): the git commit of the reflectrl source, whether that
tree had uncommitted changes, and the installed versions of the packages that change a run's numbers.

Every run records them in run.json's `sessions`, one entry each time it starts or resumes:

    {"started": "2026-12-07T04:03:22+0000", "from_step": 0,
     "git": {"commit": "93e5eb1...", "uncommitted_changes": false, "source": ".../src/reflectrl"},
     "versions": {"reflectrl": "0.1.0", "python": "CPython 3.11.9", "torch": "2.5.1", ...}}

A report (report/provenance.py) writes the same git state and versions for itself, and counts which
runs came from which commit. Cheap and local: versions from the installed metadata (nothing is
imported), git through three short subprocesses with a timeout, once per process, no network.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from reflectrl._version import __version__

SESSIONS = "sessions"  # run.json's list of the run's starts and resumes
SOURCE_DIR = Path(__file__).resolve().parents[1]  # the reflectrl package that is running (runs/..)
GIT_TIMEOUT_S = 5.0
UNKNOWN = "unknown"
PACKAGES = ("torch", "gymnasium", "numpy")  # always listed (None where not installed)
# listed where installed: the JAX backend's (their versions change its programs' float rounding and speed), the
# envs' and the language-model trainers'
OPTIONAL_PACKAGES = ("ale-py", "minigrid", "envpool",
                     "jax", "jaxlib", "flax", "optax", "navix", "gymnax", "xminigrid", "craftax",
                     "transformers", "trl")
MAX_CHANGED_FILES = 20  # uncommitted paths listed by name; the rest are counted


def _git(source: Path, *args: str) -> str | None:
    """`git -C source ARGS` stdout, or None (no git, not a checkout, an error, too slow)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # status takes no index lock
    try:
        done = subprocess.run(["git", "-C", str(source), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_state(source: Path | None = None) -> dict:
    """The commit of the git checkout holding `source` (the reflectrl package) and whether its
    files there differ from that commit; commit "unknown" (and uncommitted_changes None) when
    `source` is in no checkout, is not tracked by the one around it (an installed copy inside
    an ignored virtualenv), or git is missing. `source` defaults to SOURCE_DIR."""
    source = SOURCE_DIR if source is None else Path(source)
    unknown = {"commit": UNKNOWN, "uncommitted_changes": None, "source": str(source)}
    head = _git(source, "rev-parse", "HEAD")
    tracked = _git(source, "ls-files", "--", ".") if head else None
    if not head or not tracked or not tracked.strip():
        return unknown
    status = _git(source, "status", "--porcelain", "--", ".")
    if status is None:
        return {**unknown, "commit": head.strip()}
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    out = {"commit": head.strip(), "uncommitted_changes": bool(changed), "source": str(source)}
    if changed:
        out["changed_files"] = changed[:MAX_CHANGED_FILES]
        if len(changed) > MAX_CHANGED_FILES:
            out["changed_files_not_listed"] = len(changed) - MAX_CHANGED_FILES
    return out


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """reflectrl, Python and the libraries' installed versions (none of them imported)."""
    out = {"reflectrl": __version__,
           "python": f"{platform.python_implementation()} {platform.python_version()}"}
    out.update({name: _version(name) for name in PACKAGES})
    out.update({name: v for name in OPTIONAL_PACKAGES if (v := _version(name)) is not None})
    return out


@functools.cache
def _this_process() -> tuple[dict, dict]:
    """(git state, versions) of the running reflectrl: looked up once per process (the code that runs was
    imported when it started; a JAX group starts all its runs at once)."""
    return git_state(), versions()


def session(from_step: int | None) -> dict:
    """One entry of run.json's `sessions`: a run started (from_step 0) or resumed (from its checkpoint's step)
    now, by this process."""
    git, found = _this_process()
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "from_step": from_step, "git": dict(git),
            "versions": dict(found)}
