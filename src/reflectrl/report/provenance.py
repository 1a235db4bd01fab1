"""Where a report's numbers came from: DIR/report/provenance.json, written beside runs.csv and
stats.json by `reflectrl compare` and `reflectrl report`.

It records the git commit of the reflectrl source tree that wrote the report (and whether that
tree had uncommitted changes; "unknown" outside a git checkout or without git), the command that
makes the experiment's runs (rebuilt from DIR/experiment.json) and the command that wrote the
report, the versions of reflectrl, Python and the libraries the numbers depend on, the machine,
the date (UTC), the statistics settings (read from the report code's own constants), and what the
runs themselves recorded when they started (their reflectrl / torch / Python versions).

Everything is cheap and local: package versions from the installed metadata (nothing is
imported), git through two short subprocesses with a timeout, no network.
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from collections import Counter
from importlib import metadata
from pathlib import Path

from reflectrl._version import __version__
from reflectrl.experiments.spec import SPEC_FILE, ExperimentSpec
from reflectrl.report import BOOTSTRAP_REPS, stats
from reflectrl.report.analysis import ALPHA, MARGIN_SHARE, MIN_SEEDS_FOR_CI
from reflectrl.runs.files import run_status

FILE = "provenance.json"
SOURCE_DIR = Path(__file__).resolve().parents[1]  # the reflectrl package that is running (report/..)
GIT_TIMEOUT_S = 5.0
UNKNOWN = "unknown"
PACKAGES = ("torch", "gymnasium", "numpy")  # always listed (None where not installed)
# listed where installed; the JAX backend's too, whose versions change its programs' float rounding and speed
OPTIONAL_PACKAGES = ("ale-py", "minigrid", "envpool",
                     "jax", "jaxlib", "flax", "optax", "navix", "gymnax", "xminigrid", "craftax")
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


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def machine() -> dict:
    """The machine that wrote the report (compare trains and reports in one process)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {"platform": platform.platform(), "arch": platform.machine(), "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(), "usable_cpus": usable, "hostname": socket.gethostname()}


def statistics(reps: int) -> dict:
    """The settings every number of the report was computed with, from the report code's constants."""
    interval = inspect.signature(stats.interval).parameters
    return {
        "bootstrap_resamples": reps,
        "default_bootstrap_resamples": BOOTSTRAP_REPS,
        "interval_bootstrap_seed": interval["seed"].default,  # the tables' CIs and P(improve)
        "verdict_bootstrap_seeds": list(stats.VERDICT_SEEDS),  # each verdict must agree under every one
        "ci_level": interval["size"].default,
        "alpha": ALPHA,
        "holm_correction": True,  # every family of verdicts (claims; the vs-baseline column) is Holm-corrected
        "equivalence_margin_share": MARGIN_SHARE,  # of each env's observed return range
        "min_seeds_for_ci": MIN_SEEDS_FOR_CI,
    }


def compare_command(spec: ExperimentSpec, root: Path) -> str:
    """The `reflectrl compare` command line that makes this experiment's runs (with --preset,
    the settings it expands to)."""
    argv = ["reflectrl", "compare", "--env", ",".join(spec.envs), "--algos", ",".join(spec.algos),
            "--seeds", str(spec.seeds), "--total-steps", str(spec.total_steps)]
    if spec.first_seed != 1:
        argv += ["--first-seed", str(spec.first_seed)]
    if spec.wrapper:
        argv += ["--wrapper", spec.wrapper]
    if spec.sets:
        argv += ["--set", *spec.sets]
    return shlex.join(argv + ["--out", str(root)])


def process_command() -> str:
    """This process's command line, the program named by its file name."""
    argv = list(sys.argv) or [""]
    return shlex.join([Path(argv[0]).name or sys.executable, *argv[1:]])


def _runs_recorded(spec: ExperimentSpec, root: Path) -> dict:
    """What the runs' status files say about the software they started with."""
    found = [s for run in spec.runs(root) if (s := run_status(run.path))]
    out: dict = {"runs": len(found)}
    for key in ("reflectrl_version", "torch_version", "jax_version", "python"):
        counts = Counter(str(s[key]) for s in found if s.get(key) is not None)
        if counts or key != "jax_version":  # jax_version: JAX runs only
            out[key] = dict(sorted(counts.items()))
    created = sorted(str(s["created"]) for s in found if s.get("created"))
    out["created"] = [created[0], created[-1]] if created else []
    return out


def collect(root: Path, spec: ExperimentSpec, reps: int, source: Path | None = None) -> dict:
    """The provenance of the report of the experiment in `root`."""
    root = Path(root)
    return {
        "recorded": True,
        "experiment": root.name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": git_state(source),
        "command": compare_command(spec, root),
        "command_note": (f"rebuilt from {root / SPEC_FILE}; --workers, --backend and --no-progress do not enter "
                         "the runs and are not recorded; each run's own 'reflectrl train' command is in "
                         "report.md (Runs)"),
        "report_command": shlex.join(["reflectrl", "report", str(root), "--reps", str(reps)]),
        "written_by": process_command(),
        "versions": versions(),
        "machine": machine(),
        "statistics": statistics(reps),
        "runs_recorded": _runs_recorded(spec, root),
    }


def to_json(data: dict) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


def bench_provenance(out: Path, command: str, statistics_extra: dict | None = None, note: str | None = None) -> dict:
    """OUT/provenance.json for a bench script's results folder (not a `compare` experiment): the
    command that made the runs, the git state, versions, machine, date and the statistics' settings
    (the bootstrap's defaults of report/stats.py, with what the script states on top)."""
    from reflectrl.report import stats

    reps = inspect.signature(stats.interval).parameters["reps"].default
    data = {"recorded": True, "experiment": out.name,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": git_state(), "command": command,
            "command_note": note or "the runs' own commands are in each run's run.json",
            "versions": versions(), "machine": machine(),
            "statistics": {**statistics(reps), **(statistics_extra or {})}}
    (out / "provenance.json").write_bytes(to_json(data))
    return data
