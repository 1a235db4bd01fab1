"""Write an experiment's report: DIR/report/index.html (self-contained: plots embedded as
base64 PNGs, no scripts or links to fetch, opens offline), DIR/report/report.md (the same
tables and claims, with the PNGs beside it), DIR/report/stats.json (every number) and
DIR/report/runs.csv (each run's own scores, from which every table can be recomputed) and
DIR/report/provenance.json (git commit, commands, versions, machine, date, statistics settings)."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import re
import warnings
from pathlib import Path

from reflectrl.errors import UserError
from reflectrl.outputs import check_writable
from reflectrl.registry import TRAINERS, parse_algo
from reflectrl.report import plots, provenance, stats
from reflectrl.report.analysis import (
    ALPHA,
    BASELINE,
    MARGIN_SHARE,
    MIN_SEEDS_FOR_CI,
    NO_SPARSE_ENV,
    Claim,
    evaluate_claims,
    few_seed_rows,
    identical_entries,
    load_experiment,
    per_run_scores,
    summary_table,
)
from reflectrl.report.analysis import claims_intro as analysis_claims_intro
from reflectrl.runs import atomic_write_bytes
from reflectrl.runs.rundir import atomic_dir


def _num(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "not reached"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"


def _ci(pair) -> str:
    return "–" if not pair else f"[{_num(pair[0])}, {_num(pair[1])}]"


FEW_SEEDS_MARK = "†"
FEW_SEEDS_NOTE = (f"{FEW_SEEDS_MARK} With fewer than {MIN_SEEDS_FOR_CI} seeds the interval is the range of the seeds' "
                  "bootstrap, not a reliable 95% CI: a bootstrap over 2-4 values can only resample those values.")


def headers(table: list[dict]) -> list[str]:
    """The table's column names: "vs ppo" where every entry's baseline is ppo, "vs baseline"
    where some entry is compared with its own trainer's plain entry (dqn, sac)."""
    if all(r.get("baseline", BASELINE) == BASELINE for r in table):
        return HEADERS
    return [h.replace("over ppo", "over baseline").replace("vs ppo", "vs baseline") for h in HEADERS]


def _table_rows(table: list[dict]) -> list[list[str]]:
    base_seeds = {(r["env"], r["algo"]): r["seeds"] for r in table}
    out = []
    for r in table:
        if not r.get("seeds"):
            why = f" ({r['why']})" if r.get("why") else ""
            out.append([r["env"], r["algo"], f"0{why}"] + ["–"] * (len(HEADERS) - 3))
            continue
        mark = f" {FEW_SEEDS_MARK}" if r["seeds"] < MIN_SEEDS_FOR_CI else ""
        # P(improve) resamples this entry's seeds and the baseline's
        baseline_seeds = base_seeds.get((r["env"], r.get("baseline", BASELINE)), 0)
        p_mark = f" {FEW_SEEDS_MARK}" if min(r["seeds"], baseline_seeds) < MIN_SEEDS_FOR_CI else ""
        out.append([r["env"], r["algo"], str(r["seeds"]), _num(r["final_iqm"]), _ci(r["final_ci"]) + mark,
                    _num(r["auc_iqm"]), _ci(r["auc_ci"]) + mark,
                    "–" if r["p_improve_over_ppo"] is None
                    else f"{_num(r['p_improve_over_ppo'])} {_ci(r['p_improve_ci'])}{p_mark}",
                    _reach_text(r),
                    "–" if r.get("unique_states_iqm") is None
                    else f"{_count(r['unique_states_iqm'])} {_ci_count(r['unique_states_ci'])}{mark}",
                    _versus_text(r)])
    return out


SOLVED_TITLE = "Which entries solve each env (seeds whose final policy solves it: final return >= the solved score):"
NOT_RECOMPUTED = "– (not recomputed across parts)"


def _reach_text(r: dict) -> str:
    if r["threshold"] is None:  # a merged report: the threshold needs every run's learning curve
        return NOT_RECOMPUTED
    if not math.isfinite(r["threshold"]):
        return "– (every return the same)"
    return (f"{_num(r['steps_to_threshold_median'])} ({r['reached']}/{r['seeds']} reach "
            f"{_num(r['threshold'])})")


HEADERS = ["env", "algo", "seeds", "final return IQM", "95% CI", "norm. AUC IQM", "95% CI",
           "P(improve over ppo)", "steps to threshold (median)", "unique states IQM [95% CI]", "vs ppo (final)"]
UNSTABLE_MARK = "‡"


def _versus_text(r: dict) -> str:
    """An entry's verdict against ppo, with the difference's CI; ‡ where the verdict changes
    with the bootstrap seed. An inconclusive verdict whose CI excludes 0 also shows the
    Holm-corrected p that makes it so, and over how many comparisons."""
    if r.get("vs_ppo") is None:
        return "–"
    lo, hi = r["vs_ppo_ci"]
    mark = "" if r["vs_ppo_stable"] else f" {UNSTABLE_MARK}"
    versus = "" if r.get("baseline", BASELINE) == BASELINE else f" vs {r['baseline']}"
    holm = ""
    if r["vs_ppo"] == "inconclusive" and (lo > 0 or hi < 0) and r.get("vs_ppo_p_holm") is not None:
        holm = f"; Holm p {r['vs_ppo_p_holm']:.3g} over {r['vs_ppo_tests']} comparisons"
    norm = "" if r.get("vs_ppo_diff_normalised") is None else f"; normalised {r['vs_ppo_diff_normalised']:+.3g}"
    verdict = r.get("vs_ppo_untestable") or r["vs_ppo"]
    return f"{verdict}{versus} ({r['vs_ppo_diff']:+.3g} [{lo:+.3g}, {hi:+.3g}]{norm}{holm}){mark}"


def versus_note(table: list[dict]) -> str:
    """How the "vs ppo" column is decided, with each env's margin in its return units."""
    few = [r for r in table if r.get("vs_ppo") == "too few seeds"]
    few_text = (f" 'too few seeds': fewer than {MIN_SEEDS_FOR_CI} seeds on either side, where a bootstrap "
                "would find differences a rank test over the seeds could not; the difference and its interval "
                "are shown, no verdict is drawn." if few else "")
    rows = [r for r in table if r.get("vs_ppo") is not None and r.get("vs_ppo_tests")]
    if not rows:
        return (untestable_note(table) + few_text).strip()
    margins = {r["env"]: r["margin"] for r in rows}
    flips = [f"{r['algo']} on {r['env']}" for r in rows if not r["vs_ppo_stable"]]
    others = sorted({r["baseline"] for r in rows if r.get("baseline", BASELINE) != BASELINE})
    lead = ("vs ppo: the IQM difference of final returns (entry - ppo)" if not others else
            "vs baseline: the IQM difference of final returns (entry - its baseline: the plain "
            f"{' / '.join(others)} entry for that trainer's signals, ppo for the rest)")
    text = (f"{lead} with its 95% CI; 'better' or 'worse' when a "
            f"two-sided bootstrap test of the difference holds at {ALPHA:g} after Holm's correction over the "
            f"{rows[0]['vs_ppo_tests']} comparisons of this table; else 'equivalent' when a TOST (two one-sided "
            f"tests, each at {ALPHA:g}) puts the difference inside the margin, +-{MARGIN_SHARE:.0%} of the env's "
            f"observed return range ("
            + "; ".join(f"{env}: +-{m:.3g}" for env, m in margins.items())
            + "), also Holm-corrected; 'inconclusive' otherwise. Each verdict is taken at bootstrap seeds "
            f"{list(stats.VERDICT_SEEDS)}")
    text += (f"; {UNSTABLE_MARK} marks one that changes with the seed ({'; '.join(flips)}), written inconclusive."
             if flips else "; none changes with the seed.")
    return text + untestable_note(table) + few_text


def reference_note(table: list[dict]) -> str:
    """What each env is normalised by (the table's "reference" lines), or "" for a table without them."""
    lines = list(dict.fromkeys(r["reference"] for r in table if r.get("reference")))
    return (" Normalised by: " + "; ".join(lines) + ".") if lines else ""


def untestable_note(table: list[dict]) -> str:
    """How many of the table's comparisons are untestable (decided before any test, out of Holm), or ""."""
    rows = [r for r in table if r.get("vs_ppo") == "untestable"]
    if not rows:
        return ""
    return (f" {len(rows)} comparison(s) 'untestable', decided before any test and left out of the Holm family: the "
            "data cannot inform them (both entries within the margin of the env's fixed floor or ceiling, every run "
            "of both scoring the same, or identical runs); each says why.")


def runs_csv(scores: list[dict], extra: list[str] | None = None) -> bytes:
    """Every run's scores as CSV (env, entry, seed, final score, AUC, steps to threshold,
    status, ..., each run's params_sha256 where the runs recorded one): what the summary table is computed
    from (unfinished runs are listed, and excluded from the table). `extra`: more columns, last (a merged
    report's "part")."""
    fields = ["env", "algo", "seed", "status", "final", "auc", "early_auc", "steps_to_threshold",
              "unique_states_total", "first_reward_step", "rooms_visited"]
    if any(row.get("params_sha256") for row in scores):  # (reports from before issue 59 kept no hashes: their
        fields.append("params_sha256")                   # files stay as they were published)
    fields += list(extra or [])
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in scores:
        writer.writerow({k: "" if row.get(k) is None or (isinstance(row.get(k), float) and math.isnan(row[k]))
                         else row[k] for k in fields})
    return buf.getvalue().encode()


def excluded_text(exp) -> str | None:
    """One line listing the runs left out of the statistics (not finished), or None."""
    if not exp.excluded:
        return None
    return (f"{len(exp.excluded)} run(s) excluded from the statistics (not finished): "
            + "; ".join(f"{spec.env_id} / {spec.entry.label} / seed {spec.seed} ({status})"
                        for spec, status in exp.excluded))


def _ci_count(pair) -> str:
    return f"[{_count(pair[0])}, {_count(pair[1])}]"


def few_seeds_warning(table: list[dict]) -> str | None:
    """One line naming the (env, algo entry) rows with fewer than MIN_SEEDS_FOR_CI seeds, or None."""
    rows = few_seed_rows(table)
    if not rows:
        return None
    if len(rows) == sum(1 for r in table if r.get("seeds")):  # all of them: say so, not list them
        lo, hi = min(r["seeds"] for r in rows), max(r["seeds"] for r in rows)
        which = f"every env and algo entry: {lo if lo == hi else f'{lo}-{hi}'}"
    else:
        which = "; ".join(f"{r['algo']} on {r['env']}: {r['seeds']}" for r in rows)
    return (f"fewer than {MIN_SEEDS_FOR_CI} seeds ({which}): their 95% CIs are the range of the seeds' bootstrap, "
            f"not reliable intervals; run --seeds {MIN_SEEDS_FOR_CI} or more")


def not_testable_text(claims: list[Claim]) -> str | None:
    """One line naming the claims the experiment cannot test (entries or envs missing), or None."""
    missing = [c for c in claims if not c.testable]
    if not missing:
        return None
    what = "entries or envs missing" if any(c.missing == NO_SPARSE_ENV for c in missing) else "entries missing"
    return f"not testable here ({what}): " + "; ".join(f"{c.statement} (needs {c.missing})" for c in missing)


def claims_text(claims: list[Claim]) -> str:
    """The claims the experiment can test, as a table of verdicts, then one line naming the others."""
    tested = [c for c in claims if c.testable]
    lines = []
    if tested:
        width = max(len(c.statement) for c in tested)
        lines.append(f"{'claim':<{width}}  verdict")
        lines += [f"{c.statement:<{width}}  {c.untestable or c.verdict}" for c in tested]
    else:
        lines.append("no claim can be tested by this experiment")
    line = not_testable_text(claims)
    return "\n".join(lines + ([line] if line else []))


def _count(value) -> str:
    """A step or state count with thousands separators; – for none."""
    return "–" if value is None else f"{value:,.0f}"


def solved_text(table: list[dict]) -> str:
    """Which entries solve each env: how many of their seeds' final policies do (the final return,
    the mean over the last 10% of training, at or above the solved score of the env's fixed
    reference: references.REFERENCES), never a share of the best return seen, never "reached once".
    An env with no solved score says so; a table written before solved counts (no "solved") is skipped."""
    lines = []
    for env_id in dict.fromkeys(r["env"] for r in table):
        rows = [r for r in table if r["env"] == env_id and r.get("seeds")]
        if not rows or "solved" not in rows[0]:
            continue
        score = rows[0].get("solved_score")
        if score is None:
            lines.append(f"{env_id}: no solved score (no fixed reference with one): no entry is counted as solving it")
            continue
        groups = {"every seed": [], "some seeds": [], "no seed": []}
        for r in rows:
            which = "every seed" if r["solved"] >= r["seeds"] else "some seeds" if r["solved"] else "no seed"
            groups[which].append(f"{r['algo']} ({r['solved']}/{r['seeds']})")
        lines.append(f"{env_id}: final return >= {_num(score)} (the solved score of its fixed reference) reached by")
        lines += [f"  {name}: {', '.join(entries)}" for name, entries in groups.items() if entries]
    return "\n".join(lines)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def final_figure(table: list[dict], env_id: str) -> tuple[str, str, bytes]:
    """An env's final-return figure, drawn from the table alone: (section title, file name, png)."""
    return f"{env_id}: final return", f"final_{_slug(env_id)}.png", plots.final_intervals(table, env_id)


def figures_markdown(figures: list[tuple[str, str, bytes | None]], notes: dict[str, str] | None = None) -> list[str]:
    """Each figure's section: its image (none where nothing was left to draw), then its note."""
    notes = notes or {}
    return [f"### {title}\n" + (f"\n![{title}]({name})\n" if png is not None else "")
            + (f"\n{notes[title]}\n" if title in notes else "") for title, name, png in figures]


def identical_text(exp) -> str | None:
    """One line naming the entries whose runs are another entry's, seed by seed (drawn dashed
    over it in the learning curves), or None."""
    pairs = [f"{label} = {other} on {env_id}" for env_id in exp.spec.envs
             for label, other in identical_entries(exp, env_id).items()]
    if not pairs:
        return None
    return ("identical runs (every seed logged the same returns at the same steps; drawn dashed over the other "
            "in the learning curves): " + "; ".join(pairs))


def constant_text(constant: dict[str, dict[str, float]]) -> str | None:
    """One line naming the diagnostics left out of the figure as flat lines, with their values
    (per entry where they differ), or None."""
    if not constant:
        return None

    def values(by_entry: dict[str, float]) -> str:
        if len(set(by_entry.values())) == 1:
            return f"{next(iter(by_entry.values())):.4g}"
        return ", ".join(f"{v:.4g} ({label})" for label, v in by_entry.items())

    return "constant, not drawn: " + "; ".join(f"{key} {values(by_entry)}" for key, by_entry in constant.items())


def _strict_json(x):
    """JSON has no inf or nan: write them as null (a threshold never reached, a missing score)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict_json(v) for v in x]
    return x


PROVENANCE_LINE = ("Provenance (git commit, the commands, package versions, machine, date, statistics settings): "
                   f"[{provenance.FILE}]({provenance.FILE}) beside this file.")


def write_report(root: Path, reps: int = stats.BOOTSTRAP_REPS) -> tuple[Path, list[Claim]]:
    """Write the report; returns the HTML page's path and the claims (all of them, testable or
    not). Warns (UserWarning) when an (env, algo entry) has fewer than MIN_SEEDS_FOR_CI seeds.
    The report is written whole or not at all: into a sibling folder that then replaces it."""
    root = Path(root)
    final = check_writable(root / "report", "report", directory=True)  # before the bootstrap's minutes
    with atomic_dir(final) as out:
        out.mkdir()
        claims = _write_report(root, out, reps)
    return final / "index.html", claims


def results_markdown(table: list[dict], claims: list[Claim], reps: int, notes: str, excluded: str | None,
                     remarks: list[str] | None = None) -> list[str]:
    """The report's Markdown from its results table to its claims (the lines under "## Results");
    `remarks`: lines quoted under the notes (identical runs)."""
    few_seeds = few_seeds_warning(table)
    md = [f"> **Warning:** {few_seeds}", ""] if few_seeds else []
    columns = headers(table)
    md += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    md += ["| " + " | ".join(r) + " |" for r in _table_rows(table)]
    solved = solved_text(table)
    md += ["", SOLVED_TITLE, "", "```", solved, "```"] if solved else []
    versus = versus_note(table)
    md += ["", notes, ""] + ([versus, ""] if versus else []) + ([f"> {excluded}", ""] if excluded else [])
    md += [line for remark in remarks or [] for line in (f"> {remark}", "")]
    md += ["## Claims", ""]
    tested = [c for c in claims if c.testable]
    if tested:
        md += [analysis_claims_intro(claims, reps), ""]
        md += ["| claim | verdict | evidence |", "|---|---|---|"]
        md += [f"| {c.statement} | **{c.verdict}** | {c.evidence} |" for c in tested]
    else:
        md += ["No claim can be tested by this experiment."]
    untestable = not_testable_text(claims)
    return md + (["", untestable] if untestable else [])


STYLE = ("<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
         "table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px}"
         "th{background:#f3f3f3}.supported{color:#0a7a22;font-weight:bold}.not{color:#b00020;font-weight:bold}"
         ".inconclusive{color:#8a6d00;font-weight:bold}.equivalent{color:#1f5fa8;font-weight:bold}"
         ".untested{color:#777}img{max-width:100%}"
         ".warning{background:#fff4d6;border-left:4px solid #d9a400;padding:6px 10px}"
         "pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}</style>")
VERDICT_CSS = {"supported": "supported", "not supported": "not", "equivalent": "equivalent",
               "inconclusive": "inconclusive", "not tested": "untested", "untestable": "untested"}


def html_table(columns: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in columns) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")


def html_page(title: str, intro: str, table: list[dict], claims: list[Claim], reps: int, notes: str,
              excluded: str | None, figures: list[tuple[str, str, bytes | None]], *,
              figure_notes: dict[str, str] | None = None, remarks: list[str] | None = None,
              before: list[str] | None = None, after: list[str] | None = None) -> bytes:
    """The report as one self-contained HTML page (plots embedded as base64 PNGs, no scripts
    or links to fetch): the same results, claims and plots as report.md. `before`: HTML put
    between the intro and the results (a merged report's parts); `after`: after the plots
    (an experiment's runs)."""
    e = html.escape
    few_seeds = few_seeds_warning(table)
    solved = solved_text(table)
    versus = versus_note(table)
    tested = [c for c in claims if c.testable]
    untestable = not_testable_text(claims)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>", STYLE, "</head><body>",
             f"<h1>{e(title)}</h1><p>{e(intro)}</p>", *(before or []), "<h2>Results</h2>"]
    if few_seeds:
        parts.append(f"<p class='warning'><b>Warning:</b> {e(few_seeds)}</p>")
    parts.append(html_table(headers(table), _table_rows(table)))
    parts += [f"<p>{e(SOLVED_TITLE)}</p><pre>{e(solved)}</pre>"] if solved else []
    parts += [f"<p><small>{e(notes)}</small></p>"]
    parts += [f"<p><small>{e(versus)}</small></p>"] if versus else []
    parts += [f"<p class='warning'>{e(excluded)}</p>"] if excluded else []
    parts += [f"<p class='warning'>{e(remark)}</p>" for remark in remarks or []]
    parts += ["<h2>Claims</h2>"]
    if tested:
        parts += [f"<p>{e(analysis_claims_intro(claims, reps))}</p>"]
        parts += ["<table><tr><th>claim</th><th>verdict</th><th>evidence</th></tr>"]
        parts += [f"<tr><td>{e(c.statement)}</td><td class='{VERDICT_CSS[c.verdict]}'>{e(c.verdict)}</td>"
                  f"<td>{e(c.evidence)}</td></tr>" for c in tested]
        parts += ["</table>"]
    else:
        parts += ["<p>No claim can be tested by this experiment.</p>"]
    if untestable:
        parts += [f"<p class='untested'>{e(untestable)}</p>"]
    parts += ["<h2>Plots</h2>"]
    for section, _, png in figures:
        parts.append(f"<h3>{e(section)}</h3>")
        if png is not None:
            data = base64.b64encode(png).decode()
            parts.append(f"<img class='plot' alt='{e(section)}' src='data:image/png;base64,{data}'>")
        if section in (figure_notes or {}):
            parts.append(f"<p><small>{e(figure_notes[section])}</small></p>")
    parts += [*(after or []), "</body></html>"]
    return "".join(parts).encode()


def _write_report(root: Path, out: Path, reps: int) -> list[Claim]:
    """The report's files, written into `out`; the claims."""
    exp = load_experiment(root)
    if not exp.runs:
        raise UserError(f"no run in {root} has logged anything yet; run 'reflectrl compare' first")
    if not exp.finished:
        raise UserError(f"no run in {root} has finished yet (the statistics use finished runs only); "
                        "let 'reflectrl compare' finish, or re-run it to resume")
    table = summary_table(exp, reps)
    claims = evaluate_claims(exp, reps)
    few_seeds = few_seeds_warning(table)
    if few_seeds:
        warnings.warn(few_seeds, UserWarning, stacklevel=3)

    keys = plots.diagnostic_keys(exp)
    figures: list[tuple[str, str, bytes | None]] = []  # (section, file name, png: None where nothing is drawn)
    figure_notes: dict[str, str] = {}  # section -> the line under its figure
    for env_id in exp.spec.envs:
        if not any(r.spec.env_id == env_id for r in exp.finished):
            continue
        s = _slug(env_id)
        figures.append((f"{env_id}: learning curves", f"curves_{s}.png", plots.learning_curves(exp, env_id)))
        figures.append(final_figure(table, env_id))
        section = f"{env_id}: diagnostics"
        curves = plots.diagnostic_curves(exp, env_id, keys)  # read once: for the figure and its note
        figures.append((section, f"diagnostics_{s}.png", plots.diagnostics(exp, env_id, keys, curves)))
        constant = constant_text(plots.constant_diagnostics(curves))
        if constant:
            figure_notes[section] = constant
        if plots.exploration_keys(exp, env_id):
            figures.append((f"{env_id}: exploration", f"exploration_{s}.png", plots.exploration(exp, env_id)))
    for _, name, png in figures:
        if png is not None:
            atomic_write_bytes(out / name, png)

    spec = exp.spec
    done = len(exp.finished)
    intro = (f"{len(spec.envs)} env(s) x {len(spec.algos)} algo entries x {spec.seeds} seeds, "
             f"{spec.total_steps:,} env steps each; {done} of {len(spec.runs(root))} runs finished"
             + (f"; wrapper {spec.wrapper}" if spec.wrapper else ""))
    notes = ("Final return: mean true episodic return over the last 10% of training. Norm. AUC: mean of the "
             "learning curve, normalised per env by its fixed reference (0: its floor, 1: its ceiling), or min-max "
             "over every run of the experiment for an env with none. IQM and 95% "
             "stratified-bootstrap CIs over seeds. P(improve): probability that a run of the algo ends above a run "
             "of ppo. Steps to threshold: the first step from which the return, averaged over the next 10% of "
             "training, reaches 80% of the way from the worst to the best return seen in the env (how soon, not "
             "whether a run solves it: the solved counts above are of final returns). Unique states: "
             "the distinct exploration state keys a run visited over training (unique_states_total: the grid "
             "world's or MiniGrid's cell, heading and carried object, Montezuma's room and position, else a "
             "SimHash of the observation).")
    notes += reference_note(table)
    if headers(table) is not HEADERS:
        notes = notes.replace("ends above a run of ppo", "ends above a run of its baseline")
    parsed = {e.label: parse_algo(e.algo) for e in spec.entries()}
    replay = sorted(label for label, a in parsed.items()
                    if a.signals and TRAINERS[a.trainer].step_kinds == ("transition",))
    if replay:
        notes += (f" Replay trainers' signals ({', '.join(replay)}): their reward terms are applied to the "
                  "transitions sampled from the replay buffer at learning time, computed with the signal's heads as "
                  "they are then (the target shaper, the current reflection net), and never stored in the buffer.")
    if few_seeds:
        notes += " " + FEW_SEEDS_NOTE
    excluded = excluded_text(exp)
    identical = identical_text(exp)
    remarks = [identical] if identical else []

    # ---- Markdown
    prov = provenance.collect(root, spec, reps)
    sources = provenance.sources_line(prov["runs_recorded"]["sources"])  # runs of several commits say so
    md = [f"# reflectrl experiment report: {root.name}", "", intro, "",
          PROVENANCE_LINE + (f" {sources}" if sources else ""), "", "## Results", ""]
    md += results_markdown(table, claims, reps, notes, excluded, remarks)
    md += ["", "## Plots", ""] + figures_markdown(figures, figure_notes)
    scores = per_run_scores(exp)
    md += ["## Per-run scores", "", 'What the table above is computed from (runs.csv; stats.json holds them under '
           '"runs"); runs not finished are listed here and left out of the table.', "",
           "| env | algo | seed | status | final return | AUC | steps to threshold | unique states | first reward |",
           "|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['env']} | {r['algo']} | {r['seed']} | {r['status']} | {_num(r['final'])} | {_num(r['auc'])} | "
           f"{_count(r['steps_to_threshold'])} | {_count(r['unique_states_total'])} | "
           f"{_count(r['first_reward_step'])} |" for r in scores]
    md += ["", "## Runs", "", "| env | algo | seed | status | command |", "|---|---|---|---|---|"]
    md += [f"| {r.spec.env_id} | {r.spec.entry.label} | {r.spec.seed} | {r.status} | `{' '.join(r.command)}` |"
           for r in exp.runs]
    atomic_write_bytes(out / "report.md", ("\n".join(md) + "\n").encode())

    # ---- HTML (self-contained)
    e = html.escape
    runs = [f"<details><summary>{e(r.spec.env_id)} / {e(r.spec.entry.label)} / seed {r.spec.seed}: {e(r.status)}"
            f"</summary><p>command:</p><pre>{e(' '.join(r.command))}</pre><p>config:</p>"
            f"<pre>{e(json.dumps(r.config, indent=2))}</pre></details>" for r in exp.runs]
    atomic_write_bytes(out / "index.html", html_page(
        f"reflectrl experiment report: {root.name}", intro, table, claims, reps, notes, excluded, figures,
        figure_notes=figure_notes, remarks=remarks, before=[f"<p>{e(sources)}</p>"] if sources else None,
        after=["<h2>Runs</h2>", *runs]))

    atomic_write_bytes(out / "runs.csv", runs_csv(scores))
    atomic_write_bytes(out / provenance.FILE, provenance.to_json(prov))
    data = {"spec": spec.to_dict(), "table": table, "runs": scores, "claims": [c.__dict__ for c in claims],
            "bootstrap": {"reps": reps, "verdict_seeds": list(stats.VERDICT_SEEDS), "alpha": ALPHA,
                          "margin_share": MARGIN_SHARE},
            "excluded": [{"env": sp.env_id, "algo": sp.entry.label, "seed": sp.seed, "status": st}
                         for sp, st in exp.excluded],
            "warnings": [w for w in (few_seeds, excluded) if w],
            "identical": {env_id: same for env_id in spec.envs if (same := identical_entries(exp, env_id))}}
    atomic_write_bytes(out / "stats.json", (json.dumps(_strict_json(data), indent=2) + "\n").encode())
    return claims
