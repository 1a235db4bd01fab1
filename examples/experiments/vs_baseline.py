"""Each entry of an experiment against the baselines it must beat, from the report's runs.csv:
the question of issue 42 ("does a variant beat the best baseline?"), where the report itself
compares every entry with `ppo` only.

    python examples/experiments/vs_baseline.py DIR/report/runs.csv [MORE.csv ...] --pairs 'VARIANT:BASELINE,...'
        [--metric auc] [--margin 0.05] [--summary] [--out FILE.md]

For each pair: the IQM difference (variant - baseline) of the metric over seeds with its 95%
stratified-bootstrap CI (report/stats.py, 50,000 resamples), the one-sided bootstrap p-values of
"above" and "below", Holm-corrected over every test of the table (both sides of every pair), and a
TOST of equivalence within +-margin x the env's fixed reference range (report/references.py; the
observed range of the metric in the file where the env has none, or the file holds several envs),
also Holm-corrected. A pair that cannot inform (the report's rule, analysis.untestable_reason: both
at the floor or the ceiling, no spread in either) is 'untestable', with the reason, decided before
any test and left out of the Holm families. The verdict: 'better' / 'worse' where a Holm-corrected
one-sided p is below 0.025 (and the CI is on that side); else 'equivalent' where the Holm-corrected
TOST p is below 0.05; else 'inconclusive'. Unfinished runs are left out and counted. Writes a
Markdown table.

Several runs.csv files are read as one experiment: the entries of an experiment published in
parts (one session's finished entries each, the same command and settings) are compared across
the parts. A run (env, entry, seed) finished in two files is an error, not a silent duplicate.
`--summary` adds a table per entry: finished seeds, the metric's IQM [95% CI], and every seed's
value (the per-run scores behind the verdicts).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from reflectrl.report.analysis import TWO_SIDED, untestable_reason
from reflectrl.report.references import reference_for
from reflectrl.report.stats import (
    holm,
    interval,
    iqm,
    iqm_difference,
    p_value_above,
    p_value_below,
    stratified_bootstrap,
    tost_p_value,
)

REPS = 50_000


def scores(rows: list[dict], algo: str, metric: str) -> np.ndarray:
    values = [float(r[metric]) for r in rows if r["algo"] == algo and r["status"] == "finished" and r[metric] != ""]
    return np.asarray(values, dtype=float)


def read_rows(paths: list[str]) -> list[dict]:
    """The rows of every file; a run finished in two of them raises ValueError."""
    rows, seen = [], {}
    for path in paths:
        for row in csv.DictReader(open(path)):
            key = (row["env"], row["algo"], row["seed"])
            if row["status"] == "finished":
                if key in seen:
                    raise ValueError(f"{'/'.join(key)} is finished in both {seen[key]} and {path}; "
                                     "pass each run's scores once")
                seen[key] = path
            rows.append(row)
    return rows


def summary(rows: list[dict], algos: list[str], metric: str) -> list[str]:
    """Per entry: finished seeds, the metric's IQM [95% CI] and each seed's value, by seed."""
    lines = [f"| entry | seeds | {metric} IQM [95% CI] | per seed (seed: value) |", "|---|---|---|---|"]
    for algo in algos:
        done = sorted((int(r["seed"]), float(r[metric])) for r in rows
                      if r["algo"] == algo and r["status"] == "finished" and r[metric] != "")
        if not done:
            lines.append(f"| {algo} | 0 | - | - |")
            continue
        x = np.asarray([v for _, v in done])
        mid, lo, hi = interval([x[:, None]], iqm, reps=REPS)
        lines.append(f"| {algo} | {len(done)} | {mid:.4g} [{lo:.4g}, {hi:.4g}] | "
                     + ", ".join(f"{seed}: {v:.3g}" for seed, v in done) + " |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs_csv", nargs="+", help="one or more runs.csv files of the same experiment")
    ap.add_argument("--pairs", required=True, help="VARIANT:BASELINE,... (algo entries as runs.csv names them)")
    ap.add_argument("--metric", default="auc", help="a runs.csv column: auc, final, early_auc, ...")
    ap.add_argument("--margin", type=float, default=0.05, help="equivalence margin, share of the observed range")
    ap.add_argument("--summary", action="store_true", help="also a per-entry table with every seed's value")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        rows = read_rows(args.runs_csv)
    except ValueError as err:
        print(f"vs_baseline: {err}", file=sys.stderr)
        return 2
    source = " + ".join(args.runs_csv)
    unfinished = sum(r["status"] != "finished" for r in rows)
    observed = [float(r[args.metric]) for r in rows if r["status"] == "finished" and r[args.metric] != ""]
    if not observed:
        print(f"vs_baseline: no finished run has a '{args.metric}' in {source}", file=sys.stderr)
        return 2
    envs = sorted({r["env"] for r in rows})
    refs = [reference_for(e) for e in envs]
    if len(envs) == 1 and refs[0] is not None:  # the env's fixed reference (report/references.py)
        margin, scale = args.margin * (refs[0].ceiling - refs[0].floor), "of the env's fixed reference range"
    else:
        margin, scale = args.margin * (max(observed) - min(observed)), "of the observed range"
    pairs = [p.split(":", 1) for p in args.pairs.split(",")]
    names = {r["algo"] for r in rows}
    missing = [n for pair in pairs for n in pair if n not in names]
    if missing:
        print(f"vs_baseline: no entry {missing[0]!r} in {source}; entries: {', '.join(sorted(names))}",
              file=sys.stderr)
        return 2
    results, untestable = [], {}
    for variant, base in pairs:
        x, y = scores(rows, variant, args.metric), scores(rows, base, args.metric)
        mid, lo, hi = interval([x[:, None], y[:, None]], iqm_difference, reps=REPS)
        samples = stratified_bootstrap([x[:, None], y[:, None]], iqm_difference, REPS, seed=0)
        # decided before any test, and kept out of the Holm families: the report's one rule
        why = untestable_reason(TWO_SIDED, envs, x[:, None], y[:, None], margin=args.margin) if len(envs) == 1 else ""
        if why:
            untestable[len(results)] = why
        results.append((variant, base, len(x), len(y), mid, lo, hi, p_value_above(samples, 0.0),
                        p_value_below(samples, 0.0), tost_p_value(samples, margin)))
    tested = [i for i in range(len(results)) if i not in untestable]
    n = len(tested)
    sided = dict(zip([("above", i) for i in tested] + [("below", i) for i in tested],
                     holm([results[i][7] for i in tested] + [results[i][8] for i in tested])))
    tost = dict(zip(tested, holm([results[i][9] for i in tested]) if margin > 0 else [1.0] * n))
    lines = [f"{args.metric}: variant - baseline, IQM over seeds [95% CI]; Holm over the {2 * n} one-sided tests "
             f"(and over the {n} TOSTs, margin +-{margin:.4g} = {args.margin:.0%} {scale}); "
             f"{REPS:,} bootstrap resamples; {unfinished} unfinished run(s) left out; comparisons that cannot inform "
             "are 'untestable' (decided before any test, outside the Holm families)", "",
             "| variant | baseline | seeds | difference [95% CI] | p above (Holm) | p below (Holm) | TOST p (Holm) "
             "| verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for i, (variant, base, nx, ny, mid, lo, hi, *_rest) in enumerate(results):
        if i in untestable:
            lines.append(f"| {variant} | {base} | {nx} / {ny} | {mid:+.3f} [{lo:+.3f}, {hi:+.3f}] | | | | "
                         f"**{untestable[i]}** |")
            continue
        above, below = sided[("above", i)], sided[("below", i)]
        verdict = ("better" if above < 0.025 and lo > 0 else "worse" if below < 0.025 and hi < 0
                   else "equivalent" if tost[i] < 0.05 else "inconclusive")
        lines.append(f"| {variant} | {base} | {nx} / {ny} | {mid:+.3f} [{lo:+.3f}, {hi:+.3f}] | {above:.4f} | "
                     f"{below:.4f} | {tost[i]:.4f} | **{verdict}** |")
    if args.summary:
        lines += ["", *summary(rows, sorted({n for pair in pairs for n in pair}), args.metric)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
