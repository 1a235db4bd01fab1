"""Steps per second of the two backends on the same work (issue 39): PPO with the same knobs,
whole processes (`reflectrl train` / `reflectrl train-group`, start-up and compilation included),
1 seed and 16 seeds, on CartPole (Gymnasium vs gymnax), MiniGrid DoorKey-8x8 (EnvPool, the torch
side's fastest, vs navix's -Random- task with MiniGrid's settings) and Craftax-Classic (JAX only:
no torch port). The JAX side's compile time is shown apart (the first call of its program).

16 seeds on torch are 16 processes on this machine's cores (`compare --workers CORES`); on JAX,
one process with the seeds vectorised. Per-seed rate = seeds x steps / wall seconds.

    python bench/jax_vs_torch.py [--steps 500000] [--only cartpole,doorkey,craftax] [--seeds 1,16]
                                 [--many-steps 100000]

Prints one line per measurement and the ratios; writes nothing but a temporary folder.
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

TASKS = {  # name: (torch env, torch --set, jax env, steps)
    "cartpole": ("CartPole-v1", [], "gymnax:CartPole-v1", 500_000),
    "doorkey": ("MiniGrid-DoorKey-8x8-v0", ["backend=envpool"], "navix:Navix-DoorKey-Random-8x8-v0", 500_000),
    "craftax": (None, [], "craftax:Craftax-Classic-Symbolic-v1", 200_000),
}
KNOBS = ["num_envs=16", "num_steps=128"]  # the same on both backends (16 envs: EnvPool's MiniGrid batch)


def whole_process(cmd: list[str]) -> float:
    """Seconds of one process, with JAX's compilation cache off (every program compiled, as a first run)."""
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   env={**os.environ, "REFLECTRL_JAX_CACHE": "0"})
    return time.perf_counter() - start


def torch_rate(env: str, sets: list[str], steps: int, seeds: int, tmp: Path) -> tuple[float, float]:
    out = tmp / f"torch-{env}-{seeds}"
    cmd = [sys.executable, "-m", "reflectrl", "compare", "--env", env, "--algos", "ppo", "--seeds", str(seeds),
           "--total-steps", str(steps), "--out", str(out), "--no-progress", "--workers", str(os.cpu_count() or 1),
           "--set", *KNOBS, *sets]
    seconds = whole_process(cmd)
    return seeds * steps / seconds, seconds


def jax_rate(env: str, steps: int, seeds: int, tmp: Path) -> tuple[float, float, float]:
    """(per-seed steps/s of the whole process, its seconds, the first call's seconds: compilation)."""
    items = []
    for seed in range(1, seeds + 1):
        argv = ["--algo", "ppo", "--env", env, "--seed", str(seed), "--total-steps", str(steps),
                "--out", str(tmp / f"jax-{env.replace(':', '_')}-{seeds}" / f"seed{seed}"),
                "--set", "backend=jax", *KNOBS]
        items.append({"path": argv[argv.index("--out") + 1], "argv": argv})
    spec = tmp / f"group-{seeds}.json"
    spec.write_text(json.dumps(items))
    seconds = whole_process([sys.executable, "-m", "reflectrl", "train-group", str(spec), "--no-progress"])
    first = _first_call_seconds(Path(items[0]["path"]))
    return seeds * steps / seconds, seconds, first, _loop_rate(Path(items[0]["path"])) * seeds


def _loop_rate(run: Path) -> float:
    """One seed's steps/s after the first call (the compiled program's own rate, host work included)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    first = rows[0]["steps_per_second"]
    later = [r for r in rows if r["steps_per_second"] != first]
    if not later:
        return first
    steps = later[-1]["global_step"] - rows[len(rows) - len(later) - 1]["global_step"]
    seconds = sum(1.0 / r["steps_per_second"] * (r["global_step"] - p["global_step"])
                  for p, r in zip(rows[-len(later) - 1:-1], later, strict=True))
    return steps / seconds


def _first_call_seconds(run: Path) -> float:
    """The first program call's wall time: its rows' steps over its logged rate (compilation included)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rate = rows[0]["steps_per_second"]
    first = [r for r in rows if r["steps_per_second"] == rate]
    return first[-1]["global_step"] / rate


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None, help="override every task's env steps per seed")
    parser.add_argument("--only", default="cartpole,doorkey,craftax")
    parser.add_argument("--seeds", default="1,16")
    parser.add_argument("--many-steps", type=int, default=100_000,
                        help="env steps per seed where several seeds run (16 torch processes take long here)")
    args = parser.parse_args()
    seed_counts = [int(s) for s in args.seeds.split(",")]
    print(f"machine: {os.cpu_count()} cores; PPO {' '.join(KNOBS)}; whole processes (start-up, compilation)")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name in args.only.split(","):
            torch_env, sets, jax_env, steps = TASKS[name]
            steps = args.steps or steps
            for seeds in seed_counts:
                n = steps if seeds == 1 else min(steps, args.many_steps)
                j_rate, j_sec, compile_s, loop = jax_rate(jax_env, n, seeds, tmp)
                line = (f"{name:9s} {seeds:2d} seed(s) x {n:,} steps: jax {j_rate:9,.0f} steps/s "
                        f"({j_sec:6.1f} s, first call incl. compilation {compile_s:5.1f} s, after it {loop:,.0f} "
                        "steps/s)")
                if torch_env is None:
                    print(line + "; torch: no port of this env", flush=True)
                    continue
                t_rate, t_sec = torch_rate(torch_env, sets, n, seeds, tmp)
                print(line + f"; torch {t_rate:9,.0f} steps/s ({t_sec:6.1f} s): jax / torch = {j_rate / t_rate:.2f}x",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
