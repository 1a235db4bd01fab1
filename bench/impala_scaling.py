"""How `--algo impala` scales with its actors on this machine, and where the time goes.

For each actor count (default 1, 2, 4) and collection mode, one run of `--steps` env steps on
`--env` (CartPole-v1 by default: cheap steps, so the overheads show); the figures are medians
over the run's learner updates after the first `--warmup` (Ray's start and the actors'
imports excluded):

* steps/s: env steps the learner learnt from per wall second (the run's throughput);
* one actor's steps/s while it steps (its unroll's steps / the unroll's time on the actor);
* the learner's wait share (time blocked on unrolls / time per update) and its update time;
* the policy lag (learner updates between the weights an unroll used and the update using it).

Modes: `async` (IMPALA: actors always busy), `sync` (the learner waits for unrolls made with
its current weights), `inline` (the actors stepped in the learner's process: no Ray, the
reference for what one process does). Runs are interleaved `--repeats` times and the best
of each configuration is reported (a shared machine's noise only ever slows a run down).

    python bench/impala_scaling.py                          # CartPole-v1, 1/2/4 actors
    python bench/impala_scaling.py --env reflectrl/GridWorld-v0 --set env.size=12
    python bench/impala_scaling.py --actors 1,2,4,8 --modes async --out docs/results/impala-scaling
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np


def one_run(env: str, actors: int, mode: str, steps: int, warmup: int, extra: list[str]) -> dict:
    from reflectrl.trainers.impala.trainer import IMPALATrainer
    from reflectrl.trainers.resolve import new_run_config

    knobs = [f"num_actors={actors}", *extra]
    knobs.append("actors=inline" if mode == "inline" else f"synchronous={'true' if mode == 'sync' else 'false'}")
    cfg = new_run_config(algo="impala", env_id=env, total_steps=steps, seed=1, overrides=knobs)
    trainer = IMPALATrainer(cfg)
    started = time.perf_counter()
    trainer.prepare()
    startup = time.perf_counter() - started
    rows = []
    while not trainer.finished():
        rows.append(trainer.run_iteration())
    trainer.close()
    steady = rows[warmup:] or rows
    med = lambda key: float(np.median([r[key] for r in steady]))  # noqa: E731
    return {
        "env": env, "actors": actors, "mode": mode, "steps": trainer.global_step, "updates": len(rows),
        "startup_seconds": startup, "wall_seconds": rows[-1]["wall_time"],
        "steps_per_second": med("steps_per_second"),
        "one_actor_steps_per_second": med("actor_steps_per_second") / actors,
        "learner_wait_fraction": med("learner_wait_fraction"),
        "learner_update_ms": 1000 * med("learner_update_seconds"),
        "policy_lag_mean": med("policy_lag_mean"),
        "final_return": float(np.mean(trainer.recent_returns)) if trainer.recent_returns else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--actors", default="1,2,4")
    ap.add_argument("--modes", default="async,sync,inline")
    ap.add_argument("--steps", type=int, default=60_000)
    ap.add_argument("--warmup", type=int, default=5, help="learner updates left out of the medians")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", nargs="*", default=[], help="extra knobs, e.g. env.size=12 envs_per_actor=8")
    ap.add_argument("--out", default=None, help="folder for results.json and summary.md")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    configs = [(a, m) for m in args.modes.split(",") for a in map(int, args.actors.split(","))]
    best: dict = {}
    every = []
    for rep in range(args.repeats):
        for actors, mode in configs:
            row = one_run(args.env, actors, mode, args.steps, args.warmup, args.set)
            row["repeat"] = rep
            every.append(row)
            key = (actors, mode)
            if key not in best or row["steps_per_second"] > best[key]["steps_per_second"]:
                best[key] = row
            print(f"  {mode:>6} x{actors}: {row['steps_per_second']:,.0f} steps/s, wait "
                  f"{row['learner_wait_fraction']:.2f}, lag {row['policy_lag_mean']:.2f}", flush=True)
    base = best.get((1, "inline"), best.get((1, "async")))
    lines = [f"IMPALA steps/s on {args.env}, {args.steps:,} env steps a run, best of {args.repeats} "
             f"({platform.node()}, {os.cpu_count()} cores)", "",
             "| mode | actors | steps/s | vs 1-actor inline | one actor's steps/s | learner wait | update ms | "
             "policy lag | Ray start s |", "|---|---|---|---|---|---|---|---|---|"]
    for (actors, mode), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ratio = r["steps_per_second"] / base["steps_per_second"] if base else float("nan")
        lines.append(f"| {mode} | {actors} | {r['steps_per_second']:,.0f} | {ratio:.2f} | "
                     f"{r['one_actor_steps_per_second']:,.0f} | {r['learner_wait_fraction']:.2f} | "
                     f"{r['learner_update_ms']:.1f} | {r['policy_lag_mean']:.2f} | {r['startup_seconds']:.1f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"command": "python bench/impala_scaling.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, [])), "runs": every},
            indent=1))
        (out / "summary.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
