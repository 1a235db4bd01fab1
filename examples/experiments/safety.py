"""Constrained RL (seed 002 section 6.3): ppo vs ppo_lag (OmniSafe's PPOLag) vs ppo+shaping with
the safety term (`shaping.safety_beta=1`), at a cost limit of 25, on the hazard grid and on a
velocity task.

    python examples/experiments/safety.py [--seeds 5] [--out bench/results] [--summary-only]

Runs (resumably: `reflectrl compare` skips finished runs and resumes interrupted ones) the presets
safety-grid8, safety-grid12 and safety-hopper (reflectrl/experiments/presets.py: the env, the entries
ppo,ppo_lag,ppo+shaping[safety_beta=1], the budget, `--set ... cost_limit=25`, Hopper's --wrapper velocity-cost):

    reflectrl compare --preset safety-grid8 --seeds 5 --workers 1 --out OUT/safety-grid8
    reflectrl compare --preset safety-grid12 --seeds 5 --workers 1 --out OUT/safety-grid12
    reflectrl compare --preset safety-hopper --seeds 5 --workers 1 --out OUT/safety-hopper

and writes OUT/safety.md: per task and algo, the return and the episode cost at the end of
training (the mean over the last 10% of its iterations), the share of all training episodes
over the limit, each as an IQM over seeds with a 95% stratified-bootstrap CI and the
difference to ppo (P(improvement); a TOST p-value where the interval straddles 0); per-run
values in OUT/safety.json; curves in OUT/safety-<task>.png.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from reflectrl.experiments.presets import PRESETS
from reflectrl.report.stats import (
    interval,
    iqm,
    iqm_difference,
    probability_of_improvement,
    stratified_bootstrap,
    tost_p_value,
)

COST_LIMIT = 25  # the presets' cost_limit
# task: the preset safety-TASK (grid12: denser hazards on a larger map, where an exploring policy pays far
# more than the limit before it finds the goal) and the equivalence margins of its return and episode cost
TASKS = {name: PRESETS[f"safety-{name}"] for name in ("grid8", "grid12", "hopper")}
MARGINS = {"grid8": {"return": 0.05, "cost": 2.0}, "grid12": {"return": 0.05, "cost": 2.0},
           "hopper": {"return": 50.0, "cost": 5.0}}
TAIL = 0.1  # the end of training: its last 10% of iterations


def compare(out: Path, name: str, seeds: int) -> Path:
    where = out / f"safety-{name}"
    argv = [sys.executable, "-m", "reflectrl", "compare", "--preset", f"safety-{name}", "--seeds", str(seeds),
            "--out", str(where), "--workers", "1", "--no-progress", "--no-report"]
    subprocess.run(argv, check=True)
    return where


def load(run: Path) -> dict:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "global_step" in r]
    tail = rows[int(len(rows) * (1 - TAIL)):]
    mean = lambda key, rs: float(np.mean([r[key] for r in rs if r.get(key) is not None]))  # noqa: E731
    episodes = sum(r["episodes"] for r in rows if "episode_cost" in r)
    return {"run": str(run), "final_return": mean("episodic_return", tail), "final_cost": mean("episode_cost", tail),
            "violation_rate": sum(r.get("cost_limit_violations", 0) for r in rows) / max(episodes, 1),
            "mean_cost": mean("episode_cost", rows), "steps_per_second": mean("steps_per_second", rows),
            "lagrange_multiplier_final": (mean("lagrange_multiplier", tail)
                                          if any("lagrange_multiplier" in r for r in rows) else None),
            "curve": [(r["global_step"], r.get("episodic_return"), r.get("episode_cost")) for r in rows]}


def summarise(out: Path, seeds: int) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines, per_run, unfinished = [], {}, []
    for name, task in TASKS.items():
        root = out / f"safety-{name}" / "runs"
        if not root.exists():
            continue
        lines += [f"\n### {name}: {task.envs[0]}" + (f" --wrapper {task.wrapper}" if task.wrapper else "")
                  + f" {' '.join(task.sets)}, {task.total_steps} steps, {seeds} seeds\n",
                  "| algo | runs | final return, IQM [95% CI] | vs ppo | final episode cost [CI] | vs ppo | "
                  "episodes over the limit (all training) | final lambda | steps/s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        base = None
        for algo_dir in sorted(p for env_dir in root.iterdir() for p in env_dir.iterdir() if p.is_dir()):
            runs = [algo_dir / f"seed{s}" for s in range(1, seeds + 1)]
            done = [r for r in runs if (r / "run.json").exists()
                    and json.loads((r / "run.json").read_text()).get("status") == "finished"]
            unfinished += [str(r) for r in runs if r.exists() and r not in done]
            if not done:
                continue
            rows = [load(r) for r in done]
            algo = json.loads((done[0] / "config.json").read_text())["algo"]
            sections = json.loads((done[0] / "config.json").read_text()).get("sections", {})
            if sections.get("shaping", {}).get("safety_beta"):
                algo += f"[safety_beta={sections['shaping']['safety_beta']:g}]"
            per_run[f"{name}/{algo}"] = rows
            ret = np.array([[r["final_return"]] for r in rows])
            cost = np.array([[r["final_cost"]] for r in rows])
            if algo == "ppo":
                base = (ret, cost)
            cells = []
            for i, (m, key) in enumerate(((ret, "return"), (cost, "cost"))):
                mid, lo, hi = interval([m], iqm)
                cells.append(f"{mid:.2f} [{lo:.2f}, {hi:.2f}]")
                if base is None or algo == "ppo":
                    cells.append("")
                    continue
                d, dlo, dhi = interval([m, base[i]], iqm_difference)
                better = probability_of_improvement(m, base[i]) if key == "return" else \
                    probability_of_improvement(base[i], m)  # a lower cost is the better one
                text = f"{d:+.2f} [{dlo:+.2f}, {dhi:+.2f}] P(better) {better:.2f}"
                if dlo <= 0 <= dhi:
                    margin = MARGINS[name][key]
                    p = tost_p_value(stratified_bootstrap([m, base[i]], iqm_difference), margin)
                    text += f", TOST p={p:.2f} (margin {margin:g})"
                cells.append(text)
            lam = [r["lagrange_multiplier_final"] for r in rows if r["lagrange_multiplier_final"] is not None]
            lines.append(f"| {algo} | {len(rows)} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} | "
                         f"{np.mean([r['violation_rate'] for r in rows]):.1%} | "
                         f"{np.mean(lam) if lam else float('nan'):.2f} | "
                         f"{np.mean([r['steps_per_second'] for r in rows]):.0f} |")
            for ax, k in zip(axes, (1, 2)):
                width = min(len(r["curve"]) for r in rows)
                steps = [c[0] for c in rows[0]["curve"][:width]]
                ys = np.array([[np.nan if c[k] is None else c[k] for c in r["curve"][:width]] for r in rows])
                ax.plot(steps, np.nanmean(ys, 0), label=f"{algo} ({len(rows)})")
        for ax, label in zip(axes, ("episodic return", "episode cost")):
            ax.set_xlabel("env steps")
            ax.set_ylabel(label)
        axes[1].axhline(COST_LIMIT, color="k", lw=0.8, ls="--")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{name}: {task.envs[0]} (mean over seeds)", fontsize=9)
        fig.tight_layout()
        fig.savefig(out / f"safety-{name}.png", dpi=110)
        plt.close(fig)
    text = "\n".join(lines) + "\n"
    if unfinished:
        text += "\nUnfinished runs (excluded): " + ", ".join(unfinished) + "\n"
    (out / "safety.md").write_text(text)
    (out / "safety.json").write_text(json.dumps(per_run, indent=1) + "\n")
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--summary-only", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        for name in args.tasks.split(","):
            compare(out, name, args.seeds)
    print(summarise(out, args.seeds))


if __name__ == "__main__":
    main()
