"""Write an experiment's report: DIR/report/index.html (self-contained: plots embedded as
base64 PNGs, no scripts or links to fetch, opens offline), DIR/report/report.md (the same
tables and claims, with the PNGs beside it) and DIR/report/stats.json (every number)."""

from __future__ import annotations

import base64
import html
import json
import math
import re
from pathlib import Path

from reflectrl.errors import UserError
from reflectrl.report import plots
from reflectrl.report.analysis import Claim, evaluate_claims, load_experiment, summary_table
from reflectrl.runs import atomic_write_bytes


def _num(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "not reached"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:,.0f}"


def _ci(pair) -> str:
    return "–" if not pair else f"[{_num(pair[0])}, {_num(pair[1])}]"


def _table_rows(table: list[dict]) -> list[list[str]]:
    out = []
    for r in table:
        if not r.get("seeds"):
            out.append([r["env"], r["algo"], "0", "–", "–", "–", "–", "–", "–"])
            continue
        out.append([r["env"], r["algo"], str(r["seeds"]), _num(r["final_iqm"]), _ci(r["final_ci"]),
                    _num(r["auc_iqm"]), _ci(r["auc_ci"]),
                    "–" if r["p_improve_over_ppo"] is None else f"{_num(r['p_improve_over_ppo'])} {_ci(r['p_improve_ci'])}",
                    f"{_num(r['steps_to_threshold_median'])} ({r['reached']}/{r['seeds']} reach {_num(r['threshold'])})"])
    return out


HEADERS = ["env", "algo", "seeds", "final return IQM", "95% CI", "norm. AUC IQM", "95% CI",
           "P(improve over ppo)", "steps to threshold (median)"]


def claims_text(claims: list[Claim]) -> str:
    width = max(len(c.statement) for c in claims)
    lines = [f"{'claim':<{width}}  verdict"]
    for c in claims:
        lines.append(f"{c.statement:<{width}}  {c.verdict}")
    return "\n".join(lines)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_")


def _strict_json(x):
    """JSON has no inf or nan: write them as null (a threshold never reached, a missing score)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _strict_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict_json(v) for v in x]
    return x


def write_report(root: Path, reps: int = 2000) -> tuple[Path, list[Claim]]:
    """Write the report; returns the HTML page's path and the claims."""
    root = Path(root)
    exp = load_experiment(root)
    if not exp.runs:
        raise UserError(f"no run in {root} has logged anything yet; run 'reflectrl compare' first")
    table = summary_table(exp, reps)
    claims = evaluate_claims(exp, reps)
    out = root / "report"
    out.mkdir(exist_ok=True)

    keys = plots.diagnostic_keys(exp)
    figures: list[tuple[str, str, bytes]] = []  # (section, file name, png)
    for env_id in exp.spec.envs:
        if not any(r.spec.env_id == env_id for r in exp.runs):
            continue
        s = _slug(env_id)
        figures.append((f"{env_id}: learning curves", f"curves_{s}.png", plots.learning_curves(exp, env_id)))
        figures.append((f"{env_id}: final return", f"final_{s}.png", plots.final_intervals(table, env_id)))
        figures.append((f"{env_id}: diagnostics", f"diagnostics_{s}.png", plots.diagnostics(exp, env_id, keys)))
    for _, name, png in figures:
        atomic_write_bytes(out / name, png)

    rows = _table_rows(table)
    spec = exp.spec
    done = sum(r.done for r in exp.runs)
    intro = (f"{len(spec.envs)} env(s) x {len(spec.algos)} algo entries x {spec.seeds} seeds, "
             f"{spec.total_steps:,} env steps each; {done} of {len(spec.runs(root))} runs finished"
             + (f"; wrapper {spec.wrapper}" if spec.wrapper else ""))
    notes = ("Final return: mean true episodic return over the last 10% of training. Norm. AUC: mean of the "
             "learning curve, min-max normalised per env over every run of the experiment. IQM and 95% "
             "stratified-bootstrap CIs over seeds. P(improve): probability that a run of the algo ends above a run "
             "of ppo. Steps to threshold: the first step from which the return, averaged over the next 10% of "
             "training, reaches 80% of the way from the worst to the best return seen in the env.")

    # ---- Markdown
    md = [f"# reflectrl experiment report: {root.name}", "", intro, "", "## Results", "",
          "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", notes, "", "## Claims", "", "| claim | verdict | evidence |", "|---|---|---|"]
    md += [f"| {c.statement} | **{c.verdict}** | {c.evidence} |" for c in claims]
    md += ["", "## Plots", ""] + [f"### {title}\n\n![{title}]({name})\n" for title, name, _ in figures]
    md += ["## Runs", "", "| env | algo | seed | status | command |", "|---|---|---|---|---|"]
    md += [f"| {r.spec.env_id} | {r.spec.entry.label} | {r.spec.seed} | {r.status} | `{' '.join(r.command)}` |"
           for r in exp.runs]
    atomic_write_bytes(out / "report.md", ("\n".join(md) + "\n").encode())

    # ---- HTML (self-contained)
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>reflectrl report: {e(root.name)}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             "table{border-collapse:collapse;margin:1em 0;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px}"
             "th{background:#f3f3f3}.supported{color:#0a7a22;font-weight:bold}.not{color:#b00020;font-weight:bold}"
             ".inconclusive{color:#8a6d00;font-weight:bold}.untested{color:#777}img{max-width:100%}"
             "pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}</style></head><body>",
             f"<h1>reflectrl experiment report: {e(root.name)}</h1><p>{e(intro)}</p><h2>Results</h2><table><tr>"]
    parts += [f"<th>{e(h)}</th>" for h in HEADERS] + ["</tr>"]
    parts += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
    parts += [f"</table><p><small>{e(notes)}</small></p><h2>Claims</h2><table><tr><th>claim</th><th>verdict</th><th>evidence</th></tr>"]
    css = {"supported": "supported", "not supported": "not", "inconclusive": "inconclusive", "not tested": "untested"}
    parts += [f"<tr><td>{e(c.statement)}</td><td class='{css[c.verdict]}'>{e(c.verdict)}</td><td>{e(c.evidence)}</td></tr>"
              for c in claims]
    parts += ["</table><h2>Plots</h2>"]
    for title, name, png in figures:
        data = base64.b64encode(png).decode()
        parts.append(f"<h3>{e(title)}</h3><img class='plot' alt='{e(title)}' src='data:image/png;base64,{data}'>")
    parts.append("<h2>Runs</h2>")
    for r in exp.runs:
        parts.append(f"<details><summary>{e(r.spec.env_id)} / {e(r.spec.entry.label)} / seed {r.spec.seed}: {e(r.status)}</summary>"
                     f"<p>command:</p><pre>{e(' '.join(r.command))}</pre><p>config:</p>"
                     f"<pre>{e(json.dumps(r.config, indent=2))}</pre></details>")
    parts.append("</body></html>")
    atomic_write_bytes(out / "index.html", "".join(parts).encode())

    data = {"spec": spec.to_dict(), "table": table, "claims": [c.__dict__ for c in claims]}
    atomic_write_bytes(out / "stats.json", (json.dumps(_strict_json(data), indent=2) + "\n").encode())
    return out / "index.html", claims
