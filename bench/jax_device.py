"""The hard-exploration suite at full size on a lent accelerator (issue 39), in one script that
finishes inside a 10-minute device window and writes its report.

    python bench/jax_device.py [--out $OUT/hard-exploration] [--steps 10000000] [--seeds 16]
                               [--tasks doorkey16,keycorridor,lockedroom,craftax] [--budget 540]
                               [--suite seeds|variants]

`--suite variants` (issue 42) runs the exploration forms of the seed signals instead, against the
baselines with and without a decay schedule: ppo, ppo+count, ppo+count[schedule=linear], ppo+rnd,
ppo+rnd[schedule=linear], ppo+calibration[mode=uncertainty], ppo+count+shaping[mode=potential]
(with count, distill=total is the same run), ppo+rnd+shaping[mode=potential;distill=total],
ppo+rnd+gear[advantage=total], and the seed forms ppo+calibration and ppo+rnd+gear for reference,
on DoorKey-8x8 and the tasks below.

On the JAX backend: ppo, ppo+count, ppo+rnd, each seed signal alone and on top of the count bonus,
on DoorKey-16x16, KeyCorridorS3R3 (navix's; the -Random- DoorKey, MiniGrid's settings), the multi-room
LockedRoom (xland-minigrid's port: navix has no multi-room task) and Craftax-Classic, each entry's
seeds one vectorised program, with the larger env counts a compiled program affords on an
accelerator (`--set num_envs=...`). It first times one short entry per task
and cuts `--steps` so that the whole suite fits `--budget` seconds (saying so), then runs
`reflectrl compare` per task (which resumes across calls), and `reflectrl claims` over the results.
On a CPU-only machine it says so and runs the same suite at a size that machine finishes (the
background version in docs/exploration.md), unless --force-size.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

TASKS = {
    "doorkey8": "navix:Navix-DoorKey-Random-8x8-v0",
    "doorkey16": "navix:Navix-DoorKey-Random-16x16-v0",
    "keycorridor": "navix:Navix-KeyCorridorS3R3-v0",
    "lockedroom": "xminigrid:MiniGrid-LockedRoom",
    "craftax": "craftax:Craftax-Classic-Symbolic-v1",
}
SUITES = {
    "seeds": ("ppo,ppo+count,ppo+rnd,ppo+calibration,ppo+shaping[mode=potential],ppo+gear,"
              "ppo+count+calibration,ppo+count+shaping[mode=potential],ppo+count+gear"),
    "variants": ("ppo,ppo+count,ppo+count[schedule=linear],ppo+rnd,ppo+rnd[schedule=linear],"
                 "ppo+calibration[mode=uncertainty],ppo+count+shaping[mode=potential],"
                 "ppo+rnd+shaping[mode=potential;distill=total],ppo+rnd+gear[advantage=total],"
                 "ppo+calibration,ppo+rnd+gear"),
}
ALGOS = SUITES["seeds"]
ACCELERATOR_KNOBS = ["num_envs=256", "num_steps=128", "num_minibatches=8"]
CPU_KNOBS = ["num_envs=16", "num_steps=128", "num_minibatches=4"]


def accelerator() -> str | None:
    import jax

    kinds = {d.platform for d in jax.devices()}
    return next((k for k in ("gpu", "cuda", "rocm", "tpu") if k in kinds), None)


def compare(env: str, algos: str, steps: int, seeds: int, out: Path, knobs: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "reflectrl", "compare", "--env", env, "--algos", algos, "--seeds",
                    str(seeds), "--total-steps", str(steps), "--out", str(out), "--no-progress", "--workers", "1",
                    "--set", "backend=jax", *knobs], check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/hard-exploration-device")
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--tasks", default=None, help="default: doorkey16,keycorridor,lockedroom,craftax "
                        "(suite variants: doorkey8 too)")
    parser.add_argument("--suite", choices=sorted(SUITES), default="seeds")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds the whole suite may take")
    parser.add_argument("--force-size", action="store_true", help="run --steps even where the timing says it "
                        "will not fit the budget")
    args = parser.parse_args()
    kind = accelerator()
    knobs = ACCELERATOR_KNOBS if kind else CPU_KNOBS
    print(f"jax devices: {kind or 'cpu only'}; knobs {' '.join(knobs)}", flush=True)
    algos = SUITES[args.suite]
    tasks = (args.tasks or ("doorkey8,doorkey16,keycorridor,lockedroom,craftax" if args.suite == "variants"
                            else "doorkey16,keycorridor,lockedroom,craftax")).split(",")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        print(f"jax_device: unknown task {', '.join(unknown)}; use some of {', '.join(TASKS)}", file=sys.stderr)
        return 2
    entries = len(algos.split(","))
    root = Path(args.out)
    # time one short entry per task (compilation included) to size the suite
    probe_steps = 256 * 128 * 8 if kind else 16 * 128 * 8
    per_step = 0.0
    for task in tasks:
        seconds = compare(TASKS[task], "ppo+count", probe_steps, args.seeds, root / "probe" / task, knobs)
        per_step += seconds / (probe_steps * args.seeds)
        print(f"probe {task}: {seconds:.1f} s for {args.seeds} x {probe_steps:,} steps", flush=True)
    fits = int(args.budget / max(per_step * entries * args.seeds, 1e-12))
    steps = args.steps if args.force_size else min(args.steps, fits)
    if steps < args.steps:
        print(f"the suite at {args.steps:,} steps does not fit {args.budget:.0f} s here: running {steps:,} steps "
              f"per seed (a timing that includes compilation, so an underestimate of what fits)", flush=True)
    for task in tasks:
        seconds = compare(TASKS[task], algos, steps, args.seeds, root / task, knobs)
        print(f"{task}: {entries} entries x {args.seeds} seeds x {steps:,} steps in {seconds:.0f} s", flush=True)
    subprocess.run([sys.executable, "-m", "reflectrl", "claims", *[str(root / t) for t in tasks],
                    "--out", str(root / "claims.md")], check=False)
    print(f"reports: {', '.join(str(root / t / 'report' / 'report.md') for t in tasks)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
