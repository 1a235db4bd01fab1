"""`reflectrl sweep --vmap-trials` against one trial at a time, on the same sweep (backend=jax).

    python bench/sweep_vmap.py [--env gymnax:CartPole-v1] [--trials 8] [--seeds 2] [--steps 50000]

Runs the sweep twice, whole processes timed: one trial at a time (`--no-prune`, so both do the
same work) and all trials as one program (`--vmap-trials TRIALS`). Each gets a fresh JAX
compilation cache, so both pay their compilations: one trial at a time compiles a program per
trial (a trial's knobs are constants of its program), the batch compiles one. Prints each
sweep's seconds, its trials' objectives, and the ratio. The samplers differ (a batch is asked
together, with TPE's constant liar), so the knobs tried differ; the work per trial does not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SPACE = ["learning_rate=loguniform(1e-4,1e-2)", "ent_coef=uniform(0,0.05)"]


def sweep(out: Path, args, vmap: int) -> tuple[float, list[float]]:
    cmd = [sys.executable, "-m", "reflectrl", "sweep", "--env", args.env, "--algo", "ppo", "--space", *SPACE,
           "--trials", str(args.trials), "--seeds", str(args.seeds), "--total-steps", str(args.steps),
           "--rerun-seeds", "0", "--no-prune", "--vmap-trials", str(vmap), "--out", str(out),
           "--set", "backend=jax", f"num_envs={args.num_envs}", "--workers", "1"]
    env = {**os.environ, "REFLECTRL_JAX_CACHE": str(out.parent / f"cache-{vmap}")}
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    rows = (out / "report" / "trials.csv").read_text().splitlines()[1:]
    header = (out / "report" / "trials.csv").read_text().splitlines()[0].split(",")
    objective = header.index("objective")
    return seconds, [float(r.split(",")[objective]) for r in rows]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="gymnax:CartPole-v1")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=50_000)
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    steps = args.trials * args.seeds * args.steps
    with tempfile.TemporaryDirectory() as tmp:
        one, one_scores = sweep(Path(tmp) / "one", args, 1)
        batch, batch_scores = sweep(Path(tmp) / "batch", args, args.trials)
    print(f"{args.env}: {args.trials} trials x {args.seeds} seeds x {args.steps:,} steps, PPO, whole processes")
    print("| sweep | seconds | env steps/s | trials' objectives (AUC) |")
    print("|---|---|---|---|")
    for name, seconds, scores in (("one trial at a time", one, one_scores),
                                  (f"--vmap-trials {args.trials}", batch, batch_scores)):
        print(f"| {name} | {seconds:.1f} | {steps / seconds:,.0f} | {', '.join(f'{s:.1f}' for s in scores)} |")
    print(f"--vmap-trials / one at a time: {one / batch:.2f}x faster")
    if args.json:
        Path(args.json).write_text(json.dumps({"one": one, "batch": batch, "ratio": one / batch,
                                               "one_scores": one_scores, "batch_scores": batch_scores,
                                               "args": vars(args)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
