"""`reflectrl report PART PART ... --out DIR`: one report of an experiment run in parts.

An experiment too long for one session runs as several `reflectrl compare`s of the same
settings, each a share of its entries or seeds (docs/jax.md's DoorKey-16x16 experiment: one
session's finished entries each). Each part's report keeps every run's scores (stats.json
"runs", runs.csv) and each env's observed return range. Merged, they give the report the whole
experiment would have had: the summary table, its vs-ppo verdicts and the seed claims over the
finished runs of every part, Holm-corrected together, the scores normalised by each env's
fixed reference (report/references.py), or for an env with none by its range over all the parts
(the union of the parts' ranges is the range over all their runs).

A PART is a report folder (holding stats.json: an experiment's DIR/report, or a published
docs/results/NAME) or an experiment directory whose report has been written. What needs the
learning curves is not recomputed and the report says so: the steps to threshold (the
threshold moves with the range) and the calibration loss's fall (per-iteration losses), which
stay in the parts' own reports. One figure per env, drawn from the per-run scores: the final
return of every entry (IQM, 95% CI, each seed; final_<env>.png); the learning curves and
diagnostics stay in the parts' reports.

Refused, in one line each: parts whose settings differ (total steps, wrapper, --set), a run
finished in two parts, a part with no report, an --out that is a part or holds other files.
"""

from __future__ import annotations

import datetime
import json
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from reflectrl.errors import UserError
from reflectrl.experiments.spec import SPEC_FILE, ExperimentSpec
from reflectrl.outputs import check_writable
from reflectrl.report import provenance, stats
from reflectrl.report.analysis import ALPHA, MARGIN_SHARE, Claim, evaluate_claims, summary_table
from reflectrl.report.claims import RUNS_FILE, STATS_FILE, _float, _per_run_scores, stored_ranges
from reflectrl.runs import atomic_write_bytes
from reflectrl.runs.rundir import atomic_dir

REPORT_DIR = "report"  # an experiment's report folder (render.write_report)
FINISHED = "finished"
EXTRA_COLUMNS = ["part"]  # runs.csv's columns after a report's own: the part each run came from


@dataclass
class Part:
    folder: Path                               # the report folder
    spec: dict                                 # its experiment's spec (stats.json "spec")
    runs: list[dict]                           # its per-run scores
    ranges: dict[str, tuple[float, float]]     # env -> observed return range over its finished runs
    provenance: dict                           # its provenance.json ({} where it has none)


def _report_folder(path: Path) -> Path:
    if (path / STATS_FILE).is_file():
        return path
    if (path / SPEC_FILE).is_file():
        if (path / REPORT_DIR / STATS_FILE).is_file():
            return path / REPORT_DIR
        raise UserError(f"{path} has no report yet; run 'reflectrl report {path}' first")
    raise UserError(f"{path} is neither a report folder (no {STATS_FILE}) nor an experiment directory (no {SPEC_FILE})")


def read_part(path: str | Path) -> Part:
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a folder; give the parts' report folders or experiment directories")
    folder = _report_folder(path)
    try:
        data = json.loads((folder / STATS_FILE).read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {folder / STATS_FILE}: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("spec"), dict) or not isinstance(data.get("table"), list):
        raise UserError(f"{folder / STATS_FILE} is not a report's stats.json (no spec or table)")
    if "parts" in data:
        raise UserError(f"{folder} is itself a merged report; give its parts instead")
    runs = _per_run_scores(data, folder)
    if runs is None:
        raise UserError(f"{folder} keeps no per-run scores (no \"runs\" in {STATS_FILE}, no {RUNS_FILE}); "
                        f"write its report again with 'reflectrl report'")
    rows = []
    for r in runs:
        # a part's steps to threshold are against its own threshold: not carried into the merge
        row = {k: (v if k in ("env", "algo", "status") else _float(v)) for k, v in r.items()
               if k not in ("part", "steps_to_threshold")}
        row["seed"] = int(row["seed"])
        rows.append(row)
    ranges = stored_ranges(data)
    lacking = sorted({r["env"] for r in rows if r["status"] == FINISHED} - set(ranges))
    if lacking:
        raise UserError(f"{folder / STATS_FILE} keeps no observed return range of {', '.join(lacking)} (an older "
                        "report), which the merged scores are normalised by; write its report again with "
                        "'reflectrl report'")
    prov = {}
    if (folder / provenance.FILE).is_file():
        try:
            prov = json.loads((folder / provenance.FILE).read_text())
        except (OSError, ValueError):
            prov = {}
    return Part(folder, data["spec"], rows, ranges, prov if isinstance(prov, dict) else {})


def _same(parts: list[Part], key: str, flag: str, norm=lambda v: v) -> None:
    first = norm(parts[0].spec.get(key))
    for p in parts[1:]:
        if norm(p.spec.get(key)) != first:
            raise UserError(f"{parts[0].folder} and {p.folder} differ in {flag} ({first} vs {norm(p.spec.get(key))}): "
                            "the parts of one experiment share its settings; merge only parts of the same command")


class Merged:
    """The parts' per-run scores as one experiment: what summary_table and evaluate_claims read
    (the methods of analysis.Experiment)."""

    def __init__(self, parts: list[Part]):
        if len(parts) < 2:
            raise UserError("give two or more parts to merge (one experiment's report needs no merging)")
        _same(parts, "total_steps", "--total-steps")
        _same(parts, "wrapper", "--wrapper")
        _same(parts, "sets", "--set", lambda v: sorted(v or []))
        self.parts = parts
        envs = list(dict.fromkeys(e for p in parts for e in p.spec.get("envs", [])))
        algos = list(dict.fromkeys(a for p in parts for a in p.spec.get("algos", [])))
        self.finished: dict[tuple[str, str, int], dict] = {}
        where: dict[tuple[str, str, int], Path] = {}
        for p in parts:
            for row in p.runs:
                key = (row["env"], row["algo"], row["seed"])
                if row["status"] != FINISHED:
                    continue
                if key in where:
                    raise UserError(f"{' / '.join(map(str, key[:2]))} / seed {key[2]} is finished in both {where[key]} "
                                    f"and {p.folder}: give each run once (a part re-run on fresh seeds takes "
                                    "--first-seed)")
                where[key] = p.folder
                self.finished[key] = {**row, "part": p.folder.as_posix()}
        self.runs = [{**row, "part": p.folder.as_posix()} for p in parts for row in p.runs
                     if row["status"] == FINISHED or (row["env"], row["algo"], row["seed"]) not in where]
        self.seed_list = sorted({row["seed"] for row in self.runs})
        self.ranges = {}
        for env in envs:
            found = [p.ranges[env] for p in parts if env in p.ranges]
            self.ranges[env] = (min(lo for lo, _ in found), max(hi for _, hi in found)) if found else (0.0, 0.0)
        spec = parts[0].spec
        self.spec = ExperimentSpec(envs=envs, algos=algos, seeds=len(self.seed_list),
                                   total_steps=int(spec["total_steps"]), wrapper=spec.get("wrapper"),
                                   sets=list(spec.get("sets") or []), first_seed=min(self.seed_list, default=1))

    # --- what the table and the claims read (analysis.Experiment's methods)

    def score(self, env_id: str, label: str, seed: int, key: str) -> float:
        row = self.finished.get((env_id, label, seed))
        return math.nan if row is None else _float(row.get(key))

    def finished_count(self, env_id: str, label: str) -> int:
        return sum(1 for (e, a, _) in self.finished if e == env_id and a == label)

    def observed_range(self, env_id: str) -> tuple[float, float]:
        return self.ranges.get(env_id, (0.0, 0.0))

    def threshold(self, env_id: str) -> None:
        return None  # needs every run's learning curve

    def steps_to_threshold(self, env_id: str, label: str) -> None:
        return None

    def calibration_losses(self, label: str) -> None:
        return None  # a report keeps no per-iteration losses

    @property
    def excluded(self) -> list[dict]:
        return [r for r in self.runs if r["status"] != FINISHED]


def _part_line(m: Merged, part: Part) -> dict:
    """What the merged report says of one part: where, what it finished, the code and date of its report."""
    finished = [r for r in part.runs if r["status"] == FINISHED]
    by_entry: dict[str, list[int]] = {}
    for r in finished:
        by_entry.setdefault(r["algo"], []).append(r["seed"])
    git = part.provenance.get("git") or {}
    return {"folder": part.folder.as_posix(), "entries": {a: sorted(s) for a, s in by_entry.items()},
            "runs_finished": len(finished), "runs": len(part.runs), "commit": git.get("commit"),
            "uncommitted_changes": git.get("uncommitted_changes"), "date": part.provenance.get("date"),
            "command": part.provenance.get("command")}


def _seeds_text(seeds: list[int]) -> str:
    """1-5, 7, 9-10"""
    out, start = [], None
    for i, s in enumerate(seeds):
        if start is None:
            start = s
        if i + 1 == len(seeds) or seeds[i + 1] != s + 1:
            out.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ", ".join(out)


def _check_out(out: Path, parts: list[Part]) -> Path:
    out = check_writable(out, "--out", directory=True)
    resolved = out.resolve()
    for p in parts:
        f = p.folder.resolve()
        if resolved == f or resolved in f.parents or f == resolved / REPORT_DIR:
            raise UserError(f"--out {out}: it holds the part {p.folder}; choose a folder of its own")
    if out.exists() and any(out.iterdir()):
        try:
            merged_before = "parts" in json.loads((out / STATS_FILE).read_text())
        except (OSError, ValueError, TypeError):
            merged_before = False
        if not merged_before:
            raise UserError(f"--out {out}: the folder holds other files (not a merged report, which would be "
                            "replaced); choose an empty or new folder")
    return out


def merge_command(dirs: list[str], out: str, reps: int) -> str:
    return shlex.join(["reflectrl", "report", *dirs, "--out", out, "--reps", str(reps)])


def write_merged(dirs: list[str], out: str | Path, reps: int = stats.BOOTSTRAP_REPS) -> tuple[Path, list[Claim]]:
    """Merge the parts' reports into OUT (index.html, report.md, stats.json, runs.csv, provenance.json),
    written whole or not at all; returns OUT/report.md and the claims."""
    parts = [read_part(d) for d in dirs]
    m = Merged(parts)
    out = _check_out(Path(out), parts)
    if not m.finished:
        raise UserError("no run of any part has finished; merge the parts once some have")
    table = summary_table(m, reps)
    claims = evaluate_claims(m, reps)
    with atomic_dir(out) as tmp:
        tmp.mkdir()
        _write(m, tmp, out, table, claims, reps, merge_command([str(d) for d in dirs], str(out), reps))
    return out / "report.md", claims


def _write(m: Merged, tmp: Path, out: Path, table: list[dict], claims: list[Claim], reps: int, command: str) -> None:
    from reflectrl.report.render import (
        PROVENANCE_LINE,
        _count,
        _num,
        _strict_json,
        figures_markdown,
        final_figure,
        html_page,
        html_table,
        results_markdown,
        runs_csv,
    )

    lines = [_part_line(m, p) for p in m.parts]
    spec = m.spec
    intro = (f"{len(spec.envs)} env(s) x {len(spec.algos)} algo entries, seeds {_seeds_text(m.seed_list)}, "
             f"{spec.total_steps:,} env steps each; {len(m.finished)} runs finished over {len(m.parts)} parts"
             + (f"; wrapper {spec.wrapper}" if spec.wrapper else "") + (f"; --set {' '.join(spec.sets)}"
                                                                          if spec.sets else ""))
    notes = ("Merged from the parts' per-run scores (each part's runs.csv), as if one experiment: final return "
             "(mean true episodic return over the last 10% of training) and AUC (mean of the learning curve, "
             "normalised per env by its fixed reference (0: its floor, 1: its ceiling), or min-max over every run "
             "of every part (the union of the parts' observed return ranges) for an env with none). IQM and 95% "
             "stratified-bootstrap CIs over seeds. P(improve): probability that a run of the "
             "algo ends above a run of ppo. Steps to threshold are not recomputed: the threshold (80% of the way "
             "from the worst to the best return seen) moves with the merged range and needs the learning curves; "
             "each part's report has its own.")
    excluded = m.excluded
    excluded_line = (f"{len(excluded)} run(s) excluded from the statistics (not finished): "
                     + "; ".join(f"{r['env']} / {r['algo']} / seed {r['seed']} ({r['status']}, in {r['part']})"
                                 for r in excluded)) if excluded else None
    title = f"reflectrl experiment report: {out.name} (merged from {len(m.parts)} parts)"
    part_columns = ["part", "finished (entry: seeds)", "report's code", "report written"]
    part_rows = []
    for line in lines:
        entries = "; ".join(f"{a}: {_seeds_text(s)}" for a, s in line["entries"].items()) or "none"
        commit = (line["commit"] or "unknown")[:7] + (" (uncommitted changes)" if line["uncommitted_changes"] else "")
        part_rows.append([line["folder"], entries, commit, line["date"] or "unknown"])
    md = [f"# {title}", "", intro, "", PROVENANCE_LINE, "", "## Parts", "", "| " + " | ".join(part_columns) + " |",
          "|---|---|---|---|"] + ["| " + " | ".join(row) + " |" for row in part_rows]
    md += ["", "## Results", ""] + results_markdown(table, claims, reps, notes, excluded_line)
    figures = [final_figure(table, env) for env in spec.envs
               if any(r["env"] == env and r.get("seeds") for r in table)]
    for _, name, png in figures:
        atomic_write_bytes(tmp / name, png)
    plots_note = "From the per-run scores; the learning curves and diagnostics are in the parts' own reports."
    md += ["", "## Plots", "", plots_note, ""] + figures_markdown(figures)
    score_columns = ["env", "algo", "seed", "status", "final return", "AUC", "unique states", "first reward", "part"]
    md += ["", "## Per-run scores", "", "What the tables above are computed from (runs.csv; stats.json holds them "
           'under "runs"), each with the part it came from.', "", "| " + " | ".join(score_columns) + " |",
           "|---|---|---|---|---|---|---|---|---|"]

    def count(x):
        return _count(_float(x) if math.isfinite(_float(x)) else None)

    runs = sorted(m.runs, key=lambda r: (r["env"], spec.algos.index(r["algo"]), r["seed"]))
    score_rows = [[r["env"], r["algo"], str(r["seed"]), r["status"], _num(_float(r.get("final"))),
                   _num(_float(r.get("auc"))), count(r.get("unique_states_total")), count(r.get("first_reward_step")),
                   r["part"]] for r in runs]
    md += ["| " + " | ".join(row) + " |" for row in score_rows]
    atomic_write_bytes(tmp / "report.md", ("\n".join(md) + "\n").encode())
    # the same self-contained page a single experiment's report has, with the parts and the per-run scores
    atomic_write_bytes(tmp / "index.html", html_page(
        title, intro, table, claims, reps, notes, excluded_line, figures,
        before=["<h2>Parts</h2>", html_table(part_columns, part_rows)],
        after=["<h2>Per-run scores</h2>", html_table(score_columns, score_rows)]))
    atomic_write_bytes(tmp / RUNS_FILE, runs_csv(runs, extra=EXTRA_COLUMNS))
    data = {"spec": spec.to_dict(), "parts": lines, "table": table, "runs": runs,
            "claims": [c.__dict__ for c in claims],
            "bootstrap": {"reps": reps, "verdict_seeds": list(stats.VERDICT_SEEDS), "alpha": ALPHA,
                          "margin_share": MARGIN_SHARE},
            "excluded": [{"env": r["env"], "algo": r["algo"], "seed": r["seed"], "status": r["status"],
                          "part": r["part"]} for r in excluded],
            "warnings": [w for w in (excluded_line,) if w]}
    atomic_write_bytes(tmp / STATS_FILE, (json.dumps(_strict_json(data), indent=2) + "\n").encode())
    prov = {"recorded": True, "experiment": out.name,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git": provenance.git_state(), "command": command,
            "command_note": "a merge of the parts' reports; each part's own provenance (the command that made its "
                            "runs, its code) is under \"parts\"",
            "report_command": command, "written_by": provenance.process_command(),
            "versions": provenance.versions(), "machine": provenance.machine(),
            "statistics": provenance.statistics(reps),
            "parts": [{"folder": p.folder.as_posix(), **{k: p.provenance.get(k) for k in
                                                          ("experiment", "date", "git", "command", "report_command")}}
                      for p in m.parts]}
    atomic_write_bytes(tmp / provenance.FILE, provenance.to_json(prov))
