"""Learning check of the recurrent policy on the JAX backend (issue 61): PPO (policy=mlp) against
PPO-RNN (`ppo[policy=gru]`, a GRU above the encoder) with `--set backend=jax`, each entry's seeds vmapped
as one program (`reflectrl compare`).

- memory: gymnax's MemoryChain-bsuite (bsuite's memory_chain: the context bit is shown at the episode's
  start only, and the last step pays +1 for an action that matches it, -1 otherwise; a feed-forward
  policy cannot beat 0 in expectation, a policy with memory can reach 1). 5 seeds, 200k steps.
- craftax: Craftax-Classic (symbolic), 1M steps, as many seeds as fit (--craftax-seeds); beside Craftax's
  published 1M numbers where they exist (docs/jax.md, "Recurrent policy").

Prints each run's final return (the report's definition: the mean of the last 10% of the learning
curve), each entry's IQM, the IQM difference (gru - mlp) with its 95% stratified-bootstrap CI, and
the minutes each part took.

    python bench/recurrent_memory_jax.py [--out runs/recurrent-jax] [--only memory,craftax]

The experiments resume (`compare` skips finished runs), so a stopped script picks up where it was.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from reflectrl.report import stats
from reflectrl.report.analysis import load_experiment, run_scores

ENTRIES = {"mlp": "ppo", "gru": "ppo[policy=gru]"}
PARTS = {  # name: (env, total steps, default seeds, extra --set knobs)
    "memory": ("gymnax:MemoryChain-bsuite", 200_000, 5, []),
    "craftax": ("craftax:Craftax-Classic-Symbolic-v1", 1_000_000, 2, ["num_envs=16", "num_steps=64"]),
}


def run(out: Path, env: str, steps: int, seeds: int, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "reflectrl", "compare", "--env", env, "--algos", ",".join(ENTRIES.values()),
           "--seeds", str(seeds), "--total-steps", str(steps), "--out", str(out), "--no-progress",
           "--set", "backend=jax", *extra]
    subprocess.run(cmd, check=True)


def finals(out: Path) -> dict[str, dict[int, float]]:
    """{entry: {seed: final return}} of the finished runs."""
    exp = load_experiment(out)
    table: dict[str, dict[int, float]] = {name: {} for name in ENTRIES}
    for r in sorted(exp.finished, key=lambda r: r.spec.seed):
        name = "gru" if "policy=gru" in r.spec.entry.label else "mlp"
        table[name][r.spec.seed] = float(run_scores(r)["final"])
    return table


def summary(name: str, table: dict[str, dict[int, float]], minutes: float) -> dict:
    mlp, gru = (np.array(list(table[k].values())) for k in ("mlp", "gru"))
    samples = stats.stratified_bootstrap([gru[:, None], mlp[:, None]], stats.iqm_difference, stats.BOOTSTRAP_REPS, 0)
    lo, hi = np.percentile(samples, [2.5, 97.5])
    row = {"part": name, "minutes": round(minutes, 1), "mlp": table["mlp"], "gru": table["gru"],
           "iqm_mlp": float(stats.iqm(mlp[:, None])), "iqm_gru": float(stats.iqm(gru[:, None])),
           "iqm_difference": float(stats.iqm_difference(gru[:, None], mlp[:, None])), "ci": [float(lo), float(hi)]}
    for entry in ("mlp", "gru"):
        print(f"{name} {entry}: " + ", ".join(f"seed {s} {v:.3f}" for s, v in table[entry].items()))
    print(f"{name}: IQM mlp {row['iqm_mlp']:.3f}, gru {row['iqm_gru']:.3f}; difference (gru - mlp) "
          f"{row['iqm_difference']:.3f}, 95% CI [{lo:.3f}, {hi:.3f}]; {minutes:.1f} min")
    return row


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/recurrent-jax")
    parser.add_argument("--only", default="memory,craftax", help="comma-separated parts: memory, craftax")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per entry (default: memory 5, craftax 2)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for name in args.only.split(","):
        env, steps, seeds, extra = PARTS[name]
        out = Path(args.out) / name
        start = time.perf_counter()
        run(out, env, steps, args.seeds or seeds, extra)
        rows.append(summary(name, finals(out), (time.perf_counter() - start) / 60))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
