"""MAPPO vs MAPPO + per-agent shapers distilled from the team or from each agent's own advantage
(seed 002 section 4.3) on MPE's simple_spread, 5 seeds, one `reflectrl compare`:

    python examples/experiments/mappo.py --out bench/results/mappo

runs (resumable: re-run the same command after a stop) the preset mappo-spread
(reflectrl/experiments/presets.py: pettingzoo:mpe2.simple_spread_v3,
'mappo,mappo+shaping[labels=team],mappo+shaping[labels=own]', 5 seeds x 150k, --set env.max_cycles=25 env.N=3)

    reflectrl compare --preset mappo-spread --workers 1 --out bench/results/mappo

(sized for 2 shared CPU cores: about 20 minutes), then prints a table per entry: the IQM over
seeds of the final team return (the mean over the last 10% of training) and of the AUC, with
95% stratified-bootstrap CIs, and for each shaping entry against plain mappo: the IQM difference
with its CI, P(entry > mappo) and the TOST p-value of "equal within 5% of the observed return
range". Per-run scores go to OUT/scores.json, the table to OUT/table.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from reflectrl.experiments.presets import PRESETS

PRESET = "mappo-spread"
ENV = PRESETS[PRESET].envs[0]
BASE = "mappo"


def _fmt(ci) -> str:
    point, lo, hi = ci
    return f"{point:.2f} [{lo:.2f}, {hi:.2f}]"


def table(root: Path, reps: int = 2000) -> tuple[str, list[dict]]:
    from reflectrl.report import stats
    from reflectrl.report.analysis import load_experiment, margin_of, per_run_scores

    exp = load_experiment(root)
    scores = [s for s in per_run_scores(exp) if s["status"] == "finished"]
    labels = [label for label in exp.spec.algos if any(s["algo"] == label for s in scores)]
    col = {label: {k: np.array([[s[k]] for s in scores if s["algo"] == label]) for k in ("final", "auc")}
           for label in labels}
    margin = margin_of(exp, ENV) if scores else float("nan")
    lines = [f"{ENV}, {exp.spec.total_steps:,} env steps, team return (sum over agents); IQM over seeds, 95% "
             f"bootstrap CI; equivalence margin {margin:.2f}",
             "",
             "| entry | seeds | final | AUC | final - mappo | P(entry > mappo) | TOST p (equal) |",
             "|---|---|---|---|---|---|---|"]
    for label in labels:
        final, auc = col[label]["final"], col[label]["auc"]
        row = [f"`{label}`", str(len(final)), _fmt(stats.interval([final], stats.iqm, reps)),
               _fmt(stats.interval([auc], stats.iqm, reps))]
        if label != BASE and BASE in col and len(col[BASE]["final"]):
            base = col[BASE]["final"]
            row.append(_fmt(stats.interval([final, base], stats.iqm_difference, reps)))
            row.append(f"{stats.probability_of_improvement(final, base):.2f}")
            samples = stats.stratified_bootstrap([final, base], stats.iqm_difference, reps)
            row.append(f"{stats.tost_p_value(samples, margin):.3f}")
        else:
            row += ["", "", ""]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines), scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/mappo")
    parser.add_argument("--seeds", type=int, default=PRESETS[PRESET].seeds)
    parser.add_argument("--total-steps", type=int, default=PRESETS[PRESET].total_steps)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], help="more knobs, after the preset's "
                        f"({' '.join(PRESETS[PRESET].sets)})")
    parser.add_argument("--report-only", action="store_true", help="print the table of what has finished")
    args = parser.parse_args()
    root = Path(args.out)
    if not args.report_only:
        cmd = [sys.executable, "-m", "reflectrl", "compare", "--preset", PRESET, "--seeds", str(args.seeds),
               "--total-steps", str(args.total_steps), "--workers", str(args.workers), "--no-progress",
               "--no-report", "--out", str(root), *(["--set", *args.set] if args.set else [])]
        print("$", " ".join(cmd), flush=True)
        code = subprocess.call(cmd)
        if code != 0:
            print(f"compare exited {code}; the table below holds the runs that finished", flush=True)
    text, scores = table(root)
    print(text)
    (root / "table.md").write_text(text + "\n")
    (root / "scores.json").write_text(json.dumps(scores, indent=1) + "\n")


if __name__ == "__main__":
    main()
