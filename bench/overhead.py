"""Time per env step of each algo against PPO: same env, same budget, same script.

    python bench/overhead.py [--algos ppo,refgrpo] [--envs HalfCheetah-v5,LunarLander-v3]
                             [--steps 20480] [--repeats 3] [--json FILE]

Each (env, algo) trains `--steps` env steps with the algo's defaults, in-process, no run
directory; algos run interleaved, `--repeats` times, and the fastest run of each counts.
Overhead = time per step of the algo / time per step of ppo - 1.

Time is the process's CPU time (training is single-threaded: 1 torch thread, envs in
process), which on a shared machine is far steadier than wall time; both are printed.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def seconds_per_step(algo: str, env_id: str, steps: int, sets: list[str]) -> tuple[float, float]:
    from reflectrl.config import PPOConfig, RunConfig, apply_overrides
    from reflectrl.control.ppo import PPOTrainer, resolve_config

    cfg = RunConfig(algo=algo, env_id=env_id, seed=1, total_steps=steps, ppo=PPOConfig())
    apply_overrides(cfg, sets)
    resolve_config(cfg)
    trainer = PPOTrainer(cfg)
    start, cpu = time.perf_counter(), time.process_time()
    trainer.train(progress=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    trainer.close()
    return cpu / trainer.global_step, wall / trainer.global_step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", default="ppo,refgrpo")
    parser.add_argument("--envs", default="HalfCheetah-v5,LunarLander-v3")
    parser.add_argument("--steps", type=int, default=20480)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="knobs for every run")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    algos = args.algos.split(",")
    if algos[0] != "ppo":
        parser.error("the first algo must be ppo, the baseline")
    results = []
    for env_id in args.envs.split(","):
        best = {a: float("inf") for a in algos}
        best_wall = dict(best)
        for _ in range(args.repeats):
            for algo in algos:
                cpu, wall = seconds_per_step(algo, env_id, args.steps, args.set)
                best[algo], best_wall[algo] = min(best[algo], cpu), min(best_wall[algo], wall)
        for algo in algos:
            overhead = best[algo] / best["ppo"] - 1
            wall_overhead = best_wall[algo] / best_wall["ppo"] - 1
            results.append(dict(env=env_id, algo=algo, cpu_us_per_step=round(best[algo] * 1e6, 1),
                                wall_us_per_step=round(best_wall[algo] * 1e6, 1), overhead_cpu=round(overhead, 4),
                                overhead_wall=round(wall_overhead, 4)))
            print(f"{env_id:18s} {algo:10s} cpu {best[algo] * 1e6:8.1f} us/step (overhead {overhead:+.1%})  "
                  f"wall {best_wall[algo] * 1e6:8.1f} us/step (overhead {wall_overhead:+.1%})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
