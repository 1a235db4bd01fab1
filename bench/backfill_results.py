"""Backfill docs/results (issue 40) for the folders published before reports kept them:

* runs.csv, in the columns `reflectrl report` writes today (render.runs_csv), where a folder's
  per-run scores are only inside its stats.json (or a scores.json of the same rows);
* provenance.json for every folder that has none, saying honestly what is known:
  "recorded": false, the statistics settings the folder's own files state, the code's defaults in
  the commit that published the numbers (labelled as such), the commands the docs pages or the
  folder's files name for it, and a note that it was written after the fact. No commit, version
  or machine is filled in that the folder does not itself state.

Files that exist are left alone (a report published with today's code writes its own).

    python bench/backfill_results.py           # write what is missing
    python bench/backfill_results.py --check   # list what would be written; exit 1 if anything
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from reflectrl.report.render import runs_csv  # noqa: E402

RESULTS = ROOT / "docs" / "results"
DOCS = ROOT / "docs"
SCRIPT = "bench/backfill_results.py"
RUN_FIELDS = {"env", "algo", "seed", "final", "auc"}  # a list of dicts with these is per-run scores

# Folders whose producing command the docs name only by its script (no --out pointing at the folder);
# the key is the folder, the value a piece of the command line that picks its commands out.
COMMANDS_BY_SCRIPT = {
    "llm": "bench/llm_learning.py",
    "llm-calibration-arith9": "bench/llm_calibration.py --tasks arith9",
    "safety": "bench/safety.py",
    "offpolicy-vs-sb3": "bench/offpolicy_vs_sb3.py --mode learn",
    "limits": "bench/limits.py",
}
NOTE = ("Written afterwards by bench/backfill_results.py: this folder was published before reports recorded "
        "their provenance. The git commit, the package versions, the machine and the date of the runs were not "
        "recorded and are not known (\"unknown\" below), except where a file of this folder states them "
        "('stated_in_files'). 'published' names the commits that added this folder and last changed its numbers: "
        "when they entered the repository, not the code that made the runs. The statistics settings are those the "
        "folder's files state; where given, 'code_defaults_when_published' are the report code's defaults in the "
        "commit that published the numbers, which the report most likely used (no --reps is named) but did not "
        "record.")


# ------------------------------------------------------------------------------------------ git


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    return done.stdout if done.returncode == 0 else ""


def commit_info(rev: str) -> dict:
    sha, date, subject = (git("log", "-1", "--format=%H%n%cI%n%s", rev).splitlines() + ["", "", ""])[:3]
    return {"commit": sha, "date": date, "subject": subject}


def published(folder: Path) -> dict:
    """The commits that added the folder and last changed its numbers (stats/json/csv/md, not pictures)."""
    rel = folder.relative_to(ROOT).as_posix()
    first = git("log", "--diff-filter=A", "--format=%H", "--", rel).split()
    numbers = [p.relative_to(ROOT).as_posix() for p in folder.iterdir()
               if p.suffix in (".json", ".csv", ".jsonl") and p.name != "provenance.json"]
    last = git("log", "-1", "--format=%H", "--", *numbers).strip() if numbers else ""
    last = last or git("log", "-1", "--format=%H", "--", rel).strip()
    out = {}
    if first:
        out["added_in"] = commit_info(first[-1])
    if last:
        out["numbers_last_changed_in"] = commit_info(last)
    return out


def code_defaults(commit: str) -> dict:
    """The report code's statistics defaults in `commit`, read from its source files."""
    def show(path):
        return git("show", f"{commit}:{path}")

    cli, stats, init = (show("src/reflectrl/cli.py"), show("src/reflectrl/report/stats.py"),
                        show("src/reflectrl/report/__init__.py"))
    analysis = show("src/reflectrl/report/analysis.py")
    out: dict = {"read_from_commit": commit}
    m = re.search(r'"--reps", type=int, default=([\w_]+)', cli)
    if m:
        value = m.group(1)
        if not value.replace("_", "").isdigit():
            m2 = re.search(rf"^{value}\s*=\s*([\d_]+)", init + cli, re.M)
            value = m2.group(1) if m2 else None
        out["bootstrap_resamples"] = int(value.replace("_", "")) if value else None
    m = re.search(r"^VERDICT_SEEDS\s*=\s*\(([^)]*)\)", stats, re.M)
    if m:
        out["verdict_bootstrap_seeds"] = [int(x) for x in m.group(1).split(",") if x.strip()]
    else:
        m = re.search(r"def stratified_bootstrap\([^)]*seed: int = (\d+)", stats, re.S)
        out["verdict_bootstrap_seeds"] = [int(m.group(1))] if m else None
    out["holm_correction"] = "def holm(" in stats
    m = re.search(r"^MARGIN_SHARE\s*=\s*([\d.]+)", analysis, re.M) or re.search(
        r"def evaluate_claims\([^)]*margin: float = ([\d.]+)", analysis, re.S)
    out["equivalence_margin_share"] = float(m.group(1)) if m else None
    return out


# ------------------------------------------------------------------------------- docs commands


def _section(lines: list[str], i: int) -> str:
    for j in range(i, -1, -1):
        if lines[j].startswith("#"):
            return lines[j].strip()
    return ""


def docs_commands() -> list[dict]:
    """Every command line the docs pages show (indented blocks, continued with backslashes, and
    `reflectrl ...` / `python bench/...` spans in backticks), with its page, line and section."""
    out = []
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            line, start = lines[i], i
            text = line.strip()
            starts = re.match(r"^(?:[A-Z_]+=\S+ )*(?:\.venv/bin/)?(?:reflectrl|python) ", text)
            if starts and (line.startswith("    ") or line.startswith(("reflectrl ", "python "))):
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1].rstrip() + " " + lines[i].strip()
                text = re.sub(r"\s+#.*$", "", text)  # a trailing comment
                out.append({"text": text, "page": page, "line": start + 1, "section": _section(lines, start)})
            else:
                for m in re.finditer(r"`((?:reflectrl|python bench/)[^`]+)`", line):
                    out.append({"text": m.group(1), "page": page, "line": i + 1, "section": _section(lines, i)})
            i += 1
    return out


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def compare_spec(text: str) -> dict | None:
    """The experiment a `reflectrl compare ...` line makes (its spec's fields), or None."""
    argv = _tokens(text)
    if argv[:2] != ["reflectrl", "compare"] or "..." in argv:
        return None
    from reflectrl.cli import build_parser
    from reflectrl.errors import UserError
    from reflectrl.experiments.spec import parse_algos

    try:
        args = build_parser().parse_args(argv[1:])
    except (SystemExit, UserError):  # a shortened example, not a whole command
        return None
    envs, algos, seeds, steps = args.env, args.algos, args.seeds, args.total_steps
    sets = [x for group in args.set or [] for x in group]
    if args.preset:
        from reflectrl.experiments.presets import get_preset

        preset = get_preset(args.preset)
        envs = envs or ",".join(preset.envs)
        algos = algos or ",".join(preset.algos)
        seeds = seeds if seeds is not None else preset.seeds
        steps = steps or preset.total_steps
        sets = [*preset.sets, *sets]
    if not envs or not algos or not steps:
        return None
    try:
        labels = [e.label for e in parse_algos(algos)]
    except UserError:
        return None
    return {"envs": envs.split(","), "algos": labels,
            "seeds": 5 if seeds is None else seeds, "total_steps": steps, "wrapper": args.wrapper, "sets": sets,
            "first_seed": args.first_seed, "out": args.out}


def spec_differences(spec: dict, docs_spec: dict) -> list[str]:
    spec = {"first_seed": 1, "wrapper": None, "sets": [], **spec}
    keys = ("envs", "algos", "seeds", "total_steps", "wrapper", "sets", "first_seed")
    return [k for k in keys if (sorted(spec[k]) if k == "sets" else spec[k])
            != (sorted(docs_spec[k]) if k == "sets" else docs_spec[k])]


def compare_command(spec: dict, out: str) -> str:
    argv = ["reflectrl", "compare", "--env", ",".join(spec["envs"]), "--algos", ",".join(spec["algos"]),
            "--seeds", str(spec["seeds"]), "--total-steps", str(spec["total_steps"])]
    if spec.get("first_seed", 1) != 1:
        argv += ["--first-seed", str(spec["first_seed"])]
    if spec.get("wrapper"):
        argv += ["--wrapper", spec["wrapper"]]
    if spec.get("sets"):
        argv += ["--set", *spec["sets"]]
    return shlex.join(argv + ["--out", out])


def _names_dir(token: str, directory: str) -> bool:
    """A command-line token that is `directory`, inside it, or a folder above it (not a bare results root)."""
    token = token.rstrip("/")
    if not token or not directory:
        return False
    return (token == directory or token.startswith(directory + "/")
            or (directory.startswith(token + "/") and len(Path(token).parts) >= 3))


# ----------------------------------------------------------------------------- the folders' files


def reports(folder: Path) -> list[tuple[Path, str]]:
    return [(p, p.name[:-len("report.md")]) for p in sorted(folder.glob("*report.md"))
            if p.name == "report.md" or p.name.endswith("-report.md")]


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def experiment_dir(report: Path) -> str | None:
    """The experiment directory (compare's --out) the report's run commands name."""
    m = re.search(r"--out (\S+?)/runs/", report.read_text())
    return m.group(1) if m else None


def stated_statistics(report: Path, stats: dict | None) -> dict:
    """The statistics settings a published report states (its stats.json, its text)."""
    text = report.read_text()
    out: dict = {}
    sources = []
    if stats and isinstance(stats.get("bootstrap"), dict):
        b = stats["bootstrap"]
        out.update({"bootstrap_resamples": b.get("reps"), "verdict_bootstrap_seeds": b.get("verdict_seeds"),
                    "alpha": b.get("alpha"), "equivalence_margin_share": b.get("margin_share")})
        sources.append("stats.json: bootstrap")
    m = re.search(r"\(([\d,]+) resamples each\)", text)
    if m and "bootstrap_resamples" not in out:
        out["bootstrap_resamples"] = int(m.group(1).replace(",", ""))
    m = re.search(r"bootstrap seeds \[([\d, ]+)\]", text)
    if m and "verdict_bootstrap_seeds" not in out:
        out["verdict_bootstrap_seeds"] = [int(x) for x in m.group(1).split(",")]
    if "Holm" in text:  # every report since Holm's correction names it
        out["holm_correction"] = True
    m = re.search(r"margin (\d+)% of each env's range", text)
    if m and "equivalence_margin_share" not in out:
        out["equivalence_margin_share"] = int(m.group(1)) / 100
    if "95% stratified bootstrap CI" in text or "95% stratified-bootstrap CI" in text:
        out["ci_level"] = 0.95
    sources.append(f"{report.name}: its text")
    missing = [k for k in ("bootstrap_resamples", "verdict_bootstrap_seeds", "holm_correction") if out.get(k) is None]
    out = {k: v for k, v in out.items() if v is not None}
    if missing:
        out["not_stated"] = missing
    out["source"] = "; ".join(sources)
    return out


def stated_phrases(folder: Path) -> list[dict]:
    """The lines of a folder's Markdown (no table rows) that state how its statistics were made."""
    out = []
    pattern = re.compile(r"resampl|bootstrap|Holm|TOST|margin|IQM|seeds", re.I)
    for md in sorted(folder.glob("*.md")):
        if (md.name == "report.md" or md.name.endswith("-report.md")):
            continue
        seen = set()
        for line in md.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("|") and pattern.search(line) and line not in seen:
                seen.add(line)
                out.append({"file": md.name, "text": line[:400]})
    return out[:8]


ENV_KEYS = ("machine", "cpus", "cores", "torch", "python", "ray", "rllib", "gpu", "device")


def stated_in_files(folder: Path) -> tuple[dict, list[dict]]:
    """What the folder's JSON files state about the software and machine, and the commands they name."""
    stated, commands = {}, []
    for path in sorted(folder.glob("*.json")):
        data = read_json(path)
        if not isinstance(data, dict):
            continue
        for where, block in (("", data), ("meta.", data.get("meta"))):
            if not isinstance(block, dict):
                continue
            found = {where + k: block[k] for k in ENV_KEYS if k in block and not isinstance(block[k], (dict, list))}
            if found:
                stated.setdefault(path.name, {}).update(found)
            if isinstance(block.get("command"), str):
                commands.append({"source": f"{path.name}: {where}command", "command": block["command"]})
    return stated, commands


def per_run_rows(folder: Path, prefix: str) -> tuple[list[dict] | None, str | None]:
    """The per-run score rows of a report (stats.json "runs", else a scores.json of the same rows)."""
    stats = read_json(folder / f"{prefix}stats.json")
    if isinstance(stats, dict) and stats.get("runs"):
        return stats["runs"], f"{prefix}stats.json"
    scores = read_json(folder / f"{prefix}scores.json")
    if isinstance(scores, list) and scores and all(isinstance(r, dict) and RUN_FIELDS <= set(r) for r in scores):
        return scores, f"{prefix}scores.json"
    return None, None


# ------------------------------------------------------------------------------------- backfill


def provenance_for(folder: Path, commands: list[dict]) -> dict:
    pub = published(folder)
    data: dict = {"recorded": False, "note": NOTE, "experiment": folder.name,
                  "git": {"commit": "unknown", "uncommitted_changes": None}, "versions": "unknown",
                  "machine": "unknown", "date": "unknown", "published": pub, "backfilled_by": SCRIPT,
                  "backfilled_on": datetime.date.today().isoformat()}
    numbers_commit = pub.get("numbers_last_changed_in", {}).get("commit")
    entries, statistics_by_report = [], {}
    for report, prefix in reports(folder):
        stats = read_json(folder / f"{prefix}stats.json")
        spec = stats.get("spec") if isinstance(stats, dict) else None
        out_dir = experiment_dir(report)
        entry: dict = {"report": report.name, "experiment_dir": out_dir}
        if spec and out_dir:
            entry["command_rebuilt_from_stats_json"] = compare_command(spec, out_dir)
        entry["run_commands"] = f"{report.name}, section Runs: each run's own 'reflectrl train' command"
        statistics = stated_statistics(report, stats)
        if not (isinstance(stats, dict) and "bootstrap" in stats) and numbers_commit:
            statistics["code_defaults_when_published"] = code_defaults(numbers_commit)
        statistics_by_report[report.name] = statistics
        for cmd in commands:
            docs_spec = compare_spec(cmd["text"])
            by_dir = any(_names_dir(t, out_dir or "") for t in _tokens(cmd["text"]))
            same = spec_differences(spec, docs_spec) if (spec and docs_spec) else None
            if by_dir or same == []:
                found = {"source": f"{cmd['page'].relative_to(ROOT).as_posix()}:{cmd['line']} ({cmd['section']})",
                         "command": cmd["text"]}
                if same is not None:
                    found["same_experiment_as_stats_json"] = not same
                    if same:
                        found["differs_in"] = same
                    elif not by_dir:
                        found["note"] = "the same settings with another --out"
                entry.setdefault("commands_in_docs", []).append(found)
        entries.append(entry)
    if entries:
        data["reports"] = entries
    else:
        name = folder.name
        piece = COMMANDS_BY_SCRIPT.get(name)
        found = [c for c in commands
                 if any(_names_dir(t, f"docs/results/{name}") or _names_dir(t, f"bench/results/{name}")
                        for t in _tokens(c["text"]))
                 or (piece and piece in c["text"])]
        if found:
            data["commands_in_docs"] = [
                {"source": f"{c['page'].relative_to(ROOT).as_posix()}:{c['line']} ({c['section']})",
                 "command": c["text"]} for c in found]
        phrases = stated_phrases(folder)
        data["statistics"] = ({"stated_in_text": phrases} if phrases else
                              {"not_stated": "no file of this folder states how its statistics were made"})
    stated, file_commands = stated_in_files(folder)
    if stated:
        data["stated_in_files"] = stated
    if file_commands:
        data["commands_in_files"] = file_commands
    if entries:  # the statistics as a recorded provenance has them; by report where there are several
        data["statistics"] = (next(iter(statistics_by_report.values())) if len(entries) == 1
                              else statistics_by_report)
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything is missing")
    args = parser.parse_args()
    commands = docs_commands()
    todo: list[tuple[Path, bytes]] = []
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir() and p.name != "archive"):
        prefixes = [prefix for _, prefix in reports(folder)] or [""]
        for prefix in prefixes:
            rows, source = per_run_rows(folder, prefix)
            target = folder / f"{prefix}runs.csv"
            if rows and not target.exists():
                todo.append((target, runs_csv(rows)))
                print(f"{target.relative_to(ROOT)}: {len(rows)} runs from {source}")
        target = folder / "provenance.json"
        if not target.exists():
            todo.append((target, (json.dumps(provenance_for(folder, commands), indent=2) + "\n").encode()))
            print(f"{target.relative_to(ROOT)}: recorded false")
    if args.check:
        return 1 if todo else 0
    for path, data in todo:
        path.write_bytes(data)
    print(f"{len(todo)} file(s) written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
