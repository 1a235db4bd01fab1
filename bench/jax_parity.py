"""Learning parity of the two backends (issue 39): PPO on CartPole-v1 and DoorKey-5x5, the torch
backend on Gymnasium/MiniGrid and backend=jax on gymnax/navix, the same knobs (PPOConfig's discrete
defaults, 4 envs x 128 steps), 10 seeds each. Prints each run's final return (the report's
definition: the mean of the last 10% of the learning curve), the IQM difference (jax - torch)
with its 95% bootstrap CI, and the verdict of the report's tests: equivalent within 5% of the
range of returns either backend logged (TOST), different, or inconclusive.

    python bench/jax_parity.py [--out runs/jax-parity] [--seeds 10]

The experiments resume (`compare` skips finished runs), so a stopped script picks up where it was.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from reflectrl.report import stats
from reflectrl.report.analysis import ALPHA, MARGIN_SHARE, load_experiment, observed_range, run_scores

PAIRS = [  # (name, torch env, jax env, total steps)
    ("CartPole-v1", "CartPole-v1", "gymnax:CartPole-v1", 500_000),
    ("DoorKey-5x5", "MiniGrid-DoorKey-5x5-v0", "navix:Navix-DoorKey-Random-5x5-v0", 300_000),
]


def run(out: Path, env: str, steps: int, seeds: int, jax: bool) -> None:
    cmd = [sys.executable, "-m", "reflectrl", "compare", "--env", env, "--algos", "ppo", "--seeds", str(seeds),
           "--total-steps", str(steps), "--out", str(out), "--no-progress"]
    if jax:
        cmd += ["--set", "backend=jax"]
    subprocess.run(cmd, check=True)


def finals(out: Path) -> tuple[list[int], np.ndarray, tuple[float, float]]:
    """The finished runs' seeds, final returns, and the worst and best return logged (the report's range)."""
    exp = load_experiment(out)
    runs = sorted(exp.finished, key=lambda r: r.spec.seed)
    return ([r.spec.seed for r in runs], np.array([run_scores(r)["final"] for r in runs]),
            observed_range(exp, exp.spec.envs[0]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/jax-parity")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--json", default=None, help="also write the table here")
    args = parser.parse_args()
    root = Path(args.out)
    table = []
    for name, torch_env, jax_env, steps in PAIRS:
        run(root / f"{name}-torch", torch_env, steps, args.seeds, jax=False)
        run(root / f"{name}-jax", jax_env, steps, args.seeds, jax=True)
        seeds_t, torch_final, range_t = finals(root / f"{name}-torch")
        seeds_j, jax_final, range_j = finals(root / f"{name}-jax")
        lo, hi = min(range_t[0], range_j[0]), max(range_t[1], range_j[1])
        margin = MARGIN_SHARE * (hi - lo if hi > lo else 1.0)  # the report's margin: 5% of the returns seen
        samples = stats.stratified_bootstrap([jax_final[:, None], torch_final[:, None]], stats.iqm_difference,
                                             stats.BOOTSTRAP_REPS, 0)
        lo, hi = np.percentile(samples, [2.5, 97.5])
        p_diff = min(1.0, 2 * min(stats.p_value_above(samples, 0.0), stats.p_value_below(samples, 0.0)))
        p_equiv = stats.tost_p_value(samples, margin)
        # the report's rule: different where the two-sided test says so, else equivalent where TOST does; a
        # difference that is both detectable and inside the margin is said as both
        verdict = "different" if p_diff < ALPHA else "equivalent" if p_equiv < ALPHA else "inconclusive"
        if p_diff < ALPHA and p_equiv < ALPHA:
            verdict = "different, and within the equivalence margin"
        row = {"task": name, "steps": steps, "torch_env": torch_env, "jax_env": jax_env,
               "torch_final": dict(zip(seeds_t, torch_final.round(3).tolist(), strict=True)),
               "jax_final": dict(zip(seeds_j, jax_final.round(3).tolist(), strict=True)),
               "iqm_difference": float(np.mean(samples)), "ci": [float(lo), float(hi)], "margin": margin,
               "p_diff": p_diff, "p_equiv": p_equiv, "verdict": verdict}
        table.append(row)
        print(f"{name} ({steps:,} steps, {len(torch_final)} torch / {len(jax_final)} jax seeds): "
              f"torch IQM {stats.iqm(torch_final[:, None]):.3f}, jax IQM {stats.iqm(jax_final[:, None]):.3f}, "
              f"difference {np.mean(samples):+.3f} [{lo:+.3f}, {hi:+.3f}], margin {margin:.3f}, "
              f"p(differ) {p_diff:.3f}, p(equivalent) {p_equiv:.3f}: {verdict}")
        print(f"  torch per seed: {row['torch_final']}")
        print(f"  jax per seed:   {row['jax_final']}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
