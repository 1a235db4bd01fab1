"""Where a report's numbers came from: DIR/report/provenance.json, written beside runs.csv and
stats.json by `reflectrl compare` and `reflectrl report`.

It records the git commit of the reflectrl source tree that wrote the report (and whether that
tree had uncommitted changes; "unknown" outside a git checkout or without git), the command that
makes the experiment's runs (rebuilt from DIR/experiment.json) and the command that wrote the
report, the versions of reflectrl, Python and the libraries the numbers depend on, the machine,
the date (UTC), the statistics settings (read from the report code's own constants), and what the
runs themselves recorded when they started (their reflectrl / torch / Python versions) and at each
start and resume (run.json's sessions, runs/provenance.py): which runs came from which commit, tree
state and package versions (runs_recorded.sources; the report says so in one line where they differ).

Everything is cheap and local: package versions from the installed metadata (nothing is
imported), git through three short subprocesses with a timeout, no network.
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import platform
import shlex
import socket
import sys
from collections import Counter
from pathlib import Path

from reflectrl.experiments.spec import SPEC_FILE, ExperimentSpec
from reflectrl.report import BOOTSTRAP_REPS, stats
from reflectrl.report.analysis import ALPHA, MARGIN_SHARE, MIN_SEEDS_FOR_CI
from reflectrl.runs import provenance as run_provenance
from reflectrl.runs.files import run_status
from reflectrl.runs.provenance import (  # noqa: F401 (the git state and versions a run records: importers find them here)
    GIT_TIMEOUT_S,
    MAX_CHANGED_FILES,
    OPTIONAL_PACKAGES,
    PACKAGES,
    SESSIONS,
    UNKNOWN,
    versions,
)

FILE = "provenance.json"
SOURCE_DIR = run_provenance.SOURCE_DIR  # the reflectrl package that is running
SHORT_COMMIT = 7  # hex digits of a commit in the report's line


def git_state(source: Path | None = None) -> dict:
    """runs/provenance.py's git_state of `source`, by default this module's SOURCE_DIR."""
    return run_provenance.git_state(SOURCE_DIR if source is None else source)


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


def run_sources(statuses: dict[str, dict]) -> dict:
    """Which runs came from which source: {run directory: its run.json} -> the runs counted by the commit
    (and tree state) of their sessions, the package versions that differ between runs (with the runs of each
    version), the runs resumed under another commit or other versions than they started with, and the runs
    that recorded no session (made before runs recorded theirs). `run_dirs` are listed where there is more
    than one source to tell apart."""
    commits: dict[tuple, list[str]] = {}
    by_version: dict[str, dict[str, list[str]]] = {}
    mixed, without = [], []
    for name, status in statuses.items():
        sessions = [s for s in status.get(SESSIONS) or [] if isinstance(s, dict)]
        if not sessions:
            without.append(name)
            continue
        keys = {(str((s.get("git") or {}).get("commit", UNKNOWN)), (s.get("git") or {}).get("uncommitted_changes"))
                for s in sessions}
        for key in sorted(keys, key=str):
            commits.setdefault(key, []).append(name)
        found = [s.get("versions") or {} for s in sessions]
        for package in sorted({k for v in found for k in v}):
            for version in sorted({str(v.get(package)) for v in found}):
                by_version.setdefault(package, {}).setdefault(version, []).append(name)
        if len(keys) > 1 or any(v != found[0] for v in found):
            mixed.append(name)
    differ = {package: runs for package, runs in by_version.items() if len(runs) > 1}
    several = len(commits) + bool(without) > 1
    return {
        "runs_with_sessions": len(statuses) - len(without),
        "runs_without_sessions": len(without),
        "commits": [{"commit": commit, "uncommitted_changes": dirty, "runs": len(runs),
                     **({"run_dirs": runs} if several else {})}
                    for (commit, dirty), runs in sorted(commits.items(), key=lambda kv: (-len(kv[1]), str(kv[0])))],
        "versions_differ": differ,
        "mixed_runs": mixed,
        **({"runs_without_sessions_dirs": without} if several else {}),
    }


def sources_line(sources: dict) -> str | None:
    """The report's line saying which runs came from which commit, where they did not all come from one
    clean commit with the same package versions; None where they did (or there are no runs)."""
    commits, without = sources.get("commits") or [], sources.get("runs_without_sessions", 0)
    differ, mixed = sources.get("versions_differ") or {}, sources.get("mixed_runs") or []
    clean = len(commits) == 1 and commits[0]["commit"] != UNKNOWN and commits[0]["uncommitted_changes"] is False
    if (clean or not commits) and not without and not differ and not mixed:
        return None

    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    parts = []
    if commits:
        named = [(c["commit"][:SHORT_COMMIT] if c["commit"] != UNKNOWN else UNKNOWN)
                 + (" with uncommitted changes" if c["uncommitted_changes"] else "")
                 + (" (tree state unknown)" if c["uncommitted_changes"] is None and c["commit"] != UNKNOWN else "")
                 + f" ({plural(c['runs'], 'run')})" for c in commits]
        parts.append(f"runs from {plural(len({c['commit'] for c in commits}), 'commit')}: " + ", ".join(named))
    if without:
        parts.append(f"{plural(without, 'run')} recorded no commit (made before runs recorded one)")
    for package, found in differ.items():
        parts.append(f"{package} versions differ: " + ", ".join(f"{v} ({plural(len(runs), 'run')})"
                                                              for v, runs in found.items()))
    if mixed:
        parts.append(f"{plural(len(mixed), 'run')} resumed under another commit or other package versions")
    text = "; ".join(parts)
    return f"{text[0].upper()}{text[1:]}."


def _runs_recorded(spec: ExperimentSpec, root: Path) -> dict:
    """What the runs' status files say about the software they started with, and which runs came from
    which commit (their sessions: runs/provenance.py)."""
    statuses = {_run_name(run.path, root): s for run in spec.runs(root) if (s := run_status(run.path))}
    found = list(statuses.values())
    out: dict = {"runs": len(found)}
    for key in ("reflectrl_version", "torch_version", "jax_version", "python"):
        counts = Counter(str(s[key]) for s in found if s.get(key) is not None)
        if counts or key != "jax_version":  # jax_version: JAX runs only
            out[key] = dict(sorted(counts.items()))
    created = sorted(str(s["created"]) for s in found if s.get("created"))
    out["created"] = [created[0], created[-1]] if created else []
    out["sources"] = run_sources(statuses)
    return out


def _run_name(path: Path, root: Path) -> str:
    try:
        return Path(path).relative_to(root).as_posix()
    except ValueError:
        return Path(path).as_posix()


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
