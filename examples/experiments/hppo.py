"""Hierarchical vs flat (seed 002 section 6.1): hppo and hppo+shaping against flat ppo and flat SDRS
(ppo+shaping) on the hardest grid layouts, 5 seeds, one `reflectrl compare --preset hppo-TASK` per task
(the presets in reflectrl/experiments/presets.py hold each task's env, entries, budget and --set):

    python examples/experiments/hppo.py --out bench/results/hppo               # every task
    python examples/experiments/hppo.py --out bench/results/hppo --tasks maze15

Tasks (the grid world; the only reward is 1 at the goal):
  maze15   the 15x15 maze of `make demo`, episodes of 900 steps, 200k env steps: flat PPO never
           finds the goal in 100k (docs/exploration.md)
  rooms16  16x16 four rooms with 300-step episodes (a quarter of the default limit), 150k env steps
  rooms9   9x9 four rooms with 100-step episodes, 50k env steps
  maze15-ablations  the maze with ppo+count (the exploration baseline), potential-mode shaping flat and
           in the hierarchy, and hppo's shaping at one level only (not in the default --tasks)

Each runs (resumable: re-run the same command after a stop)

    reflectrl compare --preset hppo-TASK --seeds 5 --workers 2 --out OUT/TASK

(sized for 2 shared CPU cores), then prints a table per task: the IQM over seeds of the final return
(the mean over the last 10% of training) and of the AUC (the mean return over training), with 95%
stratified-bootstrap CIs, the seeds that solve the task (final return >= 0.8), and three contrasts,
each as the IQM difference of the final return with its CI, P(a > b) and the TOST p-value of "equal
within 5% of the observed return range", and the same difference and P(a > b) of the AUC:
hppo - ppo (the hierarchy), hppo+shaping - hppo (the distilled shapers inside it) and
hppo+shaping - ppo+shaping (hierarchical vs flat SDRS). Per-run scores go to OUT/TASK/scores.json,
the tables to OUT/table.md.

    python examples/experiments/hppo.py --overhead

trains each entry for 40k steps on the 15x15 maze in this process, one after another (one torch
thread), and prints its env steps per second, its ratio to ppo's and its mean signal_time_fraction.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from reflectrl.experiments.presets import PRESETS

TASKS = ("maze15", "rooms16", "rooms9", "maze15-ablations")  # each the preset hppo-TASK
ENV = PRESETS["hppo-maze15"].envs[0]
ALGOS = list(PRESETS["hppo-maze15"].algos)
MAZE15 = list(PRESETS["hppo-maze15"].sets)
CONTRASTS = [("hppo", "ppo"), ("hppo+shaping", "hppo"), ("hppo+shaping", "ppo+shaping")]
# the ablations are contrasted with an entry of another task's experiment (the same env, settings and seeds 1..N)
REFERENCE = {"maze15-ablations": ("maze15", "hppo")}
SOLVED = 0.8


def _fmt(ci) -> str:
    point, lo, hi = ci
    return f"{point:.3g} [{lo:.3g}, {hi:.3g}]"


def table(task: str, root: Path, reps: int = 5000) -> tuple[str, list[dict]]:
    from reflectrl.report import stats
    from reflectrl.report.analysis import load_experiment, margin_of, per_run_scores

    exp = load_experiment(root)
    scores = per_run_scores(exp)
    unfinished = [f"{s['algo']} seed {s['seed']}" for s in scores if s["status"] != "finished"]
    scores = [s for s in scores if s["status"] == "finished"]
    labels = [label for label in exp.spec.algos if any(s["algo"] == label for s in scores)]
    col = {label: {k: np.array([[s[k]] for s in scores if s["algo"] == label]) for k in ("final", "auc")}
           for label in labels}
    margin = margin_of(exp, ENV) if scores else float("nan")
    env_set = " ".join(PRESETS[f"hppo-{task}"].sets)
    lines = [f"### {task}: {env_set}, {exp.spec.total_steps:,} env steps",
             "",
             f"IQM over seeds, 95% stratified-bootstrap CI ({reps} resamples); equivalence margin {margin:.3g}"
             + (f"; unfinished, excluded: {', '.join(unfinished)}" if unfinished else ""),
             "",
             f"| entry | seeds | solved (final >= {SOLVED}) | final return | AUC | per-seed final |",
             "|---|---|---|---|---|---|"]
    for label in labels:
        final, auc = col[label]["final"], col[label]["auc"]
        per_seed = ", ".join(f"{s['final']:.2f}" for s in sorted((s for s in scores if s["algo"] == label),
                                                                   key=lambda s: s["seed"]))
        cis = [_fmt(stats.interval([x], stats.iqm, reps)) for x in (final, auc)]
        lines.append(f"| `{label}` | {len(final)} | {int((final >= SOLVED).sum())}/{len(final)} | {cis[0]} | {cis[1]} "
                     f"| {per_seed} |")
    lines += ["", "| contrast | final: IQM difference | P(a > b) | TOST p (equal) | AUC: IQM difference | P(a > b) |",
              "|---|---|---|---|---|---|"]
    pairs = CONTRASTS
    if task in REFERENCE and (root.parent / REFERENCE[task][0] / "experiment.json").exists():
        other, ref = REFERENCE[task]
        ref_scores = [x for x in per_run_scores(load_experiment(root.parent / other))
                      if x["status"] == "finished" and x["algo"] == ref]
        col[ref] = {k: np.array([[x[k]] for x in ref_scores]) for k in ("final", "auc")}
        pairs = [(label, ref) for label in labels]
        lines[-2:-2] = [f"Contrasts with `{ref}` of the `{other}` experiment ({len(ref_scores)} seeds).", ""]
    for a, b in pairs:
        if a in col and b in col:
            fa, fb = col[a]["final"], col[b]["final"]
            aa, ab = col[a]["auc"], col[b]["auc"]
            tost = stats.tost_p_value(stats.stratified_bootstrap([fa, fb], stats.iqm_difference, reps), margin)
            lines.append(f"| `{a}` - `{b}` | {_fmt(stats.interval([fa, fb], stats.iqm_difference, reps))} | "
                         f"{stats.probability_of_improvement(fa, fb):.2f} | {tost:.3f} | "
                         f"{_fmt(stats.interval([aa, ab], stats.iqm_difference, reps))} | "
                         f"{stats.probability_of_improvement(aa, ab):.2f} |")
    return "\n".join(lines), scores


def overhead(steps: int = 40_000) -> str:
    import time

    from reflectrl.config import trainer_name
    from reflectrl.registry import trainer_class
    from reflectrl.trainers.resolve import new_run_config

    lines = [f"15x15 maze, {steps:,} env steps each, one process, one torch thread", "",
             "| entry | steps/s | / ppo | signal_time_fraction |", "|---|---|---|---|"]
    base = None
    for algo in ALGOS:
        cfg = new_run_config(algo=algo, env_id=ENV, total_steps=steps, overrides=MAZE15)
        trainer = trainer_class(trainer_name(cfg))(cfg)
        start, fractions = time.perf_counter(), []
        while not trainer.finished():
            row = trainer.run_iteration()
            if row.get("signal_time_fraction") is not None:
                fractions.append(row["signal_time_fraction"])
        rate = trainer.global_step / (time.perf_counter() - start)
        base = base or rate
        frac = f"{np.mean(fractions):.3f}" if fractions else ""
        lines.append(f"| `{algo}` | {rate:,.0f} | {rate / base:.2f} | {frac} |")
        print(lines[-1], flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/hppo")
    parser.add_argument("--tasks", default="maze15,rooms16,rooms9", help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--report-only", action="store_true", help="print the tables of what has finished")
    parser.add_argument("--overhead", action="store_true", help="measure each entry's env steps per second")
    args = parser.parse_args()
    if args.overhead:
        print(overhead())
        return
    tasks = args.tasks.split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown task {unknown[0]}; tasks: {', '.join(TASKS)}")
    out = Path(args.out)
    texts = []
    for task in tasks:
        root = out / task
        if not args.report_only:
            cmd = [sys.executable, "-m", "reflectrl", "compare", "--preset", f"hppo-{task}", "--seeds",
                   str(args.seeds), "--workers", str(args.workers), "--no-progress", "--out", str(root)]
            print("$", " ".join(cmd), flush=True)
            code = subprocess.call(cmd)
            if code != 0:
                print(f"compare exited {code}; the table below holds the runs that finished", flush=True)
        if not (root / "experiment.json").exists():
            continue
        text, scores = table(task, root)
        print(text, flush=True)
        texts.append(text)
        (root / "scores.json").write_text(json.dumps(scores, indent=1) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text("\n\n".join(texts) + "\n")


if __name__ == "__main__":
    main()
