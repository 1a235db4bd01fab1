"""What a signal costs: time per env step of each algo against PPO, or the signal's share
of each iteration.

    python bench/overhead.py [--algos ppo,refgrpo] [--envs HalfCheetah-v5,LunarLander-v3]
                             [--steps 20480] [--repeats 3] [--json FILE]
    python bench/overhead.py --fraction [--algos refgrpo]
                             [--envs LunarLander-v3,reflectrl/GridWorld-v0@env.size=12]
                             [--steps 50000] [--repeats 1] [--json FILE] [--baseline-src DIR]

Per-step mode: each (env, algo) trains `--steps` env steps with the algo's defaults,
in-process, no run directory; algos run interleaved, `--repeats` times, and the fastest run
of each counts. Overhead = time per step of the algo / time per step of ppo - 1. Time is
the process's CPU time (training is single-threaded: 1 torch thread, envs in process),
which on a shared machine is far steadier than wall time; both are printed.

--fraction: runs `reflectrl train --algo ALGO --env ENV --total-steps STEPS` as the command
line does (run directory, logs, checkpoints) and reads `signal_time_fraction`, the
signal's share of each iteration's wall time (its hooks and the advantage re-estimates they
cause, not the estimate the trainer makes anyway), from metrics.jsonl:
the median over iterations, then over repeats. `--baseline-src DIR` (the `src` folder of another
checkout, e.g. `git worktree add /tmp/before HEAD~1` then `/tmp/before/src`) also runs each one
from that code, interleaved with this tree's (before, after, before, after, ...: the same load on
both), and prints both medians: a change's before/after on a shared machine.

An env may carry its own knobs: `ID@key=value@key=value` (e.g. the grid world's size).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def parse_env(spec: str) -> tuple[str, list[str]]:
    env_id, *sets = spec.split("@")
    return env_id, sets


def seconds_per_step(algo: str, env_id: str, steps: int, sets: list[str]) -> tuple[float, float]:
    from reflectrl.config import RunConfig, apply_overrides
    from reflectrl.trainers.ppo.config import PPOConfig
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import resolve_config

    cfg = RunConfig(algo=algo, env_id=env_id, seed=1, total_steps=steps, knobs=PPOConfig())
    apply_overrides(cfg, sets)
    resolve_config(cfg)
    trainer = PPOTrainer(cfg)
    start, cpu = time.perf_counter(), time.process_time()
    trainer.train(progress=False)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    trainer.close()
    return cpu / trainer.global_step, wall / trainer.global_step


def signal_time_fraction(algo: str, env_id: str, steps: int, sets: list[str], src: str | None = None) -> float:
    """Median `signal_time_fraction` of one `reflectrl train` run (of the package in `src` when given)."""
    env = None if src is None else {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(src).resolve()), *filter(None, [os.environ.get("PYTHONPATH")])])}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "reflectrl", "train", "--algo", algo, "--env", env_id, "--total-steps", str(steps),
               "--out", str(out), "--no-progress"] + (["--set", *sets] if sets else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["signal_time_fraction"] for r in rows if r.get("signal_time_fraction") is not None)


def per_step(args, parser) -> list[dict]:
    torch.set_num_threads(1)
    algos = args.algos.split(",")
    if algos[0] != "ppo":
        parser.error("the first algo must be ppo, the baseline")
    results = []
    for spec in args.envs.split(","):
        env_id, env_sets = parse_env(spec)
        best = {a: float("inf") for a in algos}
        best_wall = dict(best)
        for _ in range(args.repeats):
            for algo in algos:
                cpu, wall = seconds_per_step(algo, env_id, args.steps, args.set + env_sets)
                best[algo], best_wall[algo] = min(best[algo], cpu), min(best_wall[algo], wall)
        for algo in algos:
            overhead = best[algo] / best["ppo"] - 1
            wall_overhead = best_wall[algo] / best_wall["ppo"] - 1
            results.append(dict(env=spec, algo=algo, cpu_us_per_step=round(best[algo] * 1e6, 1),
                                wall_us_per_step=round(best_wall[algo] * 1e6, 1), overhead_cpu=round(overhead, 4),
                                overhead_wall=round(wall_overhead, 4)))
            print(f"{spec:18s} {algo:10s} cpu {best[algo] * 1e6:8.1f} us/step (overhead {overhead:+.1%})  "
                  f"wall {best_wall[algo] * 1e6:8.1f} us/step (overhead {wall_overhead:+.1%})", flush=True)
    return results


def fractions(args) -> list[dict]:
    results = []
    for spec in args.envs.split(","):
        env_id, env_sets = parse_env(spec)
        for algo in args.algos.split(","):
            if algo == "ppo":
                continue
            runs, before = [], []
            for _ in range(args.repeats):
                if args.baseline_src:
                    before.append(signal_time_fraction(algo, env_id, args.steps, args.set + env_sets,
                                                       args.baseline_src))
                runs.append(signal_time_fraction(algo, env_id, args.steps, args.set + env_sets))
            median = statistics.median(runs)
            results.append(dict(env=spec, algo=algo, steps=args.steps, signal_time_fraction=round(median, 4),
                                runs=[round(r, 4) for r in runs]))
            if before:
                results[-1].update(baseline_src=args.baseline_src,
                                   baseline_fraction=round(statistics.median(before), 4),
                                   baseline_runs=[round(r, 4) for r in before])
                print(f"{spec:40s} {algo:10s} baseline signal_time_fraction {statistics.median(before):.2%}  (runs: "
                      f"{', '.join(f'{r:.2%}' for r in before)})", flush=True)
            print(f"{spec:40s} {algo:10s} signal_time_fraction {median:.2%}  (runs: "
                  f"{', '.join(f'{r:.2%}' for r in runs)})", flush=True)
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", action="store_true", help="the signal's share of an iteration (run as the CLI)")
    parser.add_argument("--algos", default=None, help="default: ppo,refgrpo (per step), refgrpo (--fraction)")
    parser.add_argument("--envs", default=None,
                        help="default: HalfCheetah-v5,LunarLander-v3 (per step), "
                             "LunarLander-v3,reflectrl/GridWorld-v0@env.size=12 (--fraction)")
    parser.add_argument("--steps", type=int, default=None, help="default: 20480 (per step), 50000 (--fraction)")
    parser.add_argument("--repeats", type=int, default=None, help="default: 3 (per step), 1 (--fraction)")
    parser.add_argument("--set", nargs="*", default=[], help="knobs for every run")
    parser.add_argument("--json", default=None)
    parser.add_argument("--baseline-src", default=None,
                        help="--fraction: also run the package in this src folder (another checkout's), interleaved")
    args = parser.parse_args()
    defaults = (dict(algos="refgrpo", envs="LunarLander-v3,reflectrl/GridWorld-v0@env.size=12", steps=50000, repeats=1)
                if args.fraction else dict(algos="ppo,refgrpo", envs="HalfCheetah-v5,LunarLander-v3", steps=20480,
                                           repeats=3))
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    results = fractions(args) if args.fraction else per_step(args, parser)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
