"""The hard-exploration suite at full size on a lent accelerator (issue 39), in one script that
finishes inside a 10-minute device window and writes its report.

    python examples/experiments/jax_device.py [--out $OUT/hard-exploration] [--steps 10000000] [--seeds 16]
                               [--tasks doorkey16,blockedunlock,lockedroom,craftax] [--budget 540]
                               [--suite seeds|variants]

`--suite variants` (issue 42) runs the exploration forms of the seed signals instead, against the
baselines with and without a decay schedule: ppo, ppo+count, ppo+count[schedule=linear], ppo+rnd,
ppo+rnd[schedule=linear], ppo+calibration[mode=uncertainty], ppo+count+shaping[mode=potential]
(with count, distill=total is the same run), ppo+rnd+shaping[mode=potential;distill=total],
ppo+rnd+gear[advantage=total], and the seed forms ppo+calibration and ppo+rnd+gear for reference,
on DoorKey-8x8 and the tasks below.

On the JAX backend: ppo, ppo+count, ppo+rnd, each seed signal alone and on top of the count bonus,
on DoorKey-16x16 (navix's -Random- DoorKey, MiniGrid's settings), BlockedUnlockPickup and the
multi-room LockedRoom (xland-minigrid's ports: navix has neither) and Craftax-Classic, each entry's
seeds one vectorised program, with the larger env counts a compiled program affords on an
accelerator (`--set num_envs=...`). It first times one short entry per task
and cuts `--steps` so that the whole suite fits `--budget` seconds (saying so), then runs
`reflectrl compare` per task (which resumes across calls), and `reflectrl claims` over the results.
On a CPU-only machine it says so and plans the same way with the CPU's knobs (there the suite
does not fit 540 s at 1M steps: it says so and runs nothing; docs/exploration.md's background
runs are the CPU's version), unless --force-size.

The plan (`plan()`): each task's probe gives its program's steady rate (env steps per second over
all seeds, from the runs' `steps_per_second` after the first call) and its fixed cost (the probe's
wall time less its steps at that rate: the process's start-up and the compilation, which every
entry pays again: its program differs); a task's report costs REPORT_SECONDS. An entry costs the
fixed cost plus its steps at the rate times SIGNAL_COST; `--workers` entries run at once (their
compilations overlap on the host's cores; the device's throughput is assumed not to grow), and
SAFETY of the budget left after the probes is planned. Tasks are dropped from the end of the list
(saying which) until the rest fit at `--min-steps` or more; where none does, nothing runs. Each
task's time, planned and taken, is printed, so the next window's plan can be checked.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TASKS = {
    "doorkey8": "navix:Navix-DoorKey-Random-8x8-v0",
    "doorkey16": "navix:Navix-DoorKey-Random-16x16-v0",
    "blockedunlock": "xminigrid:MiniGrid-BlockedUnlockPickUp",
    "lockedroom": "xminigrid:MiniGrid-LockedRoom",
    "craftax": "craftax:Craftax-Classic-Symbolic-v1",
}
# tasks once in the suite that cannot be run, and why (a line instead of a failed window)
UNRUNNABLE = {
    "keycorridor": ("navix's KeyCorridorS3R3 cannot be solved (its doors sit in walls, its goal never pays: "
                    "reflectrl.envs.jax_envs.key_corridor_defects); the suite runs blockedunlock in its place"),
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
PROBE_ALGO = "ppo+count"
PROBE_CALLS = 3     # calls of the compiled program a probe makes (the first compiles; the others give the rate)
SIGNAL_COST = 1.5   # an entry's steady cost against the probe's ppo+count: the mean over the suite's entries
#                     (on the CPU, ppo+shaping[mode=potential]'s distillation made it 2-2.5x ppo+calibration)
SAFETY = 0.75       # the share of the budget left after the probes that the plan fills
REPORT_SECONDS = 60.0  # a task's report and its plots after its runs (the probes write none)


@dataclass
class Probe:
    task: str
    steps: int      # env steps per seed
    seeds: int
    wall: float     # seconds of the whole `reflectrl compare`: start-up, compilation and the steps
    rate: float     # env steps per second over all seeds, after the program's first call

    @property
    def fixed(self) -> float:
        """Seconds an entry pays whatever its length: start-up and compilation."""
        return max(0.0, self.wall - self.steps * self.seeds / self.rate)


@dataclass
class Plan:
    steps: int                 # env steps per seed of every entry
    tasks: list[str]           # the tasks that fit, in order
    dropped: list[str]         # the tasks left out to fit the budget
    seconds: dict[str, float]  # task -> planned seconds


def task_seconds(probe: Probe, entries: int, seeds: int, steps: int, workers: int) -> float:
    waves = math.ceil(entries / max(1, workers))
    return REPORT_SECONDS + waves * probe.fixed + entries * SIGNAL_COST * seeds * steps / probe.rate


def plan(probes: list[Probe], entries: int, seeds: int, budget: float, workers: int, max_steps: int,
         min_steps: int, batch: int) -> Plan:
    """The most steps (a multiple of `batch`, at most `max_steps`) at which the tasks fit SAFETY of
    `budget` seconds; tasks dropped from the end until the rest fit at `min_steps` or more."""
    kept = list(probes)
    while kept:
        fixed = sum(task_seconds(p, entries, seeds, 0, workers) for p in kept)
        per_step = sum(task_seconds(p, entries, seeds, 1, workers) for p in kept) - fixed
        steps = min(max_steps, int((SAFETY * budget - fixed) / per_step) // batch * batch)
        if steps >= min_steps:
            return Plan(steps, [p.task for p in kept], [p.task for p in probes[len(kept):]],
                        {p.task: task_seconds(p, entries, seeds, steps, workers) for p in kept})
        kept.pop()
    return Plan(0, [], [p.task for p in probes], {})


def steady_rate(root: Path, seeds: int) -> float | None:
    """Env steps per second over all seeds after the program's first call, from the seeds'
    metrics (`steps_per_second` is per seed: the seeds run in one program); None if the probe made
    one call only."""
    rates = []
    for metrics in sorted(root.glob("runs/*/*/seed*/metrics.jsonl")):
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        first = rows[0].get("steps_per_second") if rows else None
        rates += [r["steps_per_second"] for r in rows if r.get("steps_per_second") not in (None, first)]
    return statistics.median(rates) * seeds if rates else None


def accelerator() -> str | None:
    import jax

    kinds = {d.platform for d in jax.devices()}
    return next((k for k in ("gpu", "cuda", "rocm", "tpu") if k in kinds), None)


def command(env: str, algos: str, steps: int, seeds: int, out: Path, knobs: list[str], workers: int,
            report: bool = True) -> list[str]:
    return [sys.executable, "-m", "reflectrl", "compare", "--env", env, "--algos", algos, "--seeds", str(seeds),
            "--total-steps", str(steps), "--out", str(out), "--no-progress", "--workers", str(workers),
            *([] if report else ["--no-report"]), "--set", "backend=jax", *knobs]


def run_all(commands: list[list[str]], at_once: int, env: dict) -> list[float]:
    """Run the commands, `at_once` at a time; each one's wall seconds. A failure stops the script."""
    started: dict[int, tuple[subprocess.Popen, float]] = {}
    seconds = [0.0] * len(commands)
    pending = list(range(len(commands)))
    while pending or started:
        while pending and len(started) < at_once:
            i = pending.pop(0)
            started[i] = (subprocess.Popen(commands[i], env=env), time.perf_counter())
        time.sleep(0.2)
        for i, (proc, t0) in list(started.items()):
            if proc.poll() is not None:
                del started[i]
                seconds[i] = time.perf_counter() - t0
                if proc.returncode != 0:
                    for other, _ in started.values():  # none left running behind the script
                        other.terminate()
                        other.wait()
                    raise SystemExit(f"jax_device: {' '.join(commands[i][2:6])} ... failed "
                                     f"(exit {proc.returncode}); its output is above")
    return seconds


def main() -> int:
    start = time.perf_counter()
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/hard-exploration-device", help="default: %(default)s")
    parser.add_argument("--steps", type=int, default=10_000_000, help="env steps per seed at most; default: "
                        "%(default)s")
    parser.add_argument("--min-steps", type=int, default=1_000_000, help="the fewest steps worth running: "
                        "tasks are dropped (from the end) until the rest fit at this many or more; default: "
                        "%(default)s")
    parser.add_argument("--seeds", type=int, default=16, help="default: %(default)s")
    parser.add_argument("--tasks", default=None, help="default: doorkey16,blockedunlock,lockedroom,craftax "
                        "(suite variants: doorkey8 too)")
    parser.add_argument("--suite", choices=sorted(SUITES), default="seeds", help="default: %(default)s")
    parser.add_argument("--algos", default=None, help="entries to run instead of the suite's (comma-separated); "
                        "default: the suite's")
    parser.add_argument("--workers", type=int, default=None, help="entries trained at once (compilations "
                        "overlap on the host's cores); default: 8 on an accelerator (16 host cores), 1 on the CPU")
    parser.add_argument("--budget", type=float, default=540.0, help="seconds the whole suite may take, probes "
                        "included; default: %(default)s")
    parser.add_argument("--force-size", action="store_true", help="run --steps on every task even where the "
                        "timing says it will not fit the budget (default: off)")
    args = parser.parse_args()
    algos = args.algos or SUITES[args.suite]
    tasks = (args.tasks or ("doorkey8,doorkey16,blockedunlock,lockedroom,craftax" if args.suite == "variants"
                            else "doorkey16,blockedunlock,lockedroom,craftax")).split(",")
    refused = [t for t in tasks if t in UNRUNNABLE]
    if refused:
        print(f"jax_device: {refused[0]}: {UNRUNNABLE[refused[0]]}", file=sys.stderr)
        return 2
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        print(f"jax_device: unknown task {', '.join(unknown)}; use some of {', '.join(TASKS)}", file=sys.stderr)
        return 2
    kind = accelerator()
    knobs = ACCELERATOR_KNOBS if kind else CPU_KNOBS
    workers = args.workers or (8 if kind else 1)
    print(f"jax devices: {kind or 'cpu only'}; knobs {' '.join(knobs)}; {workers} entries at once", flush=True)
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE",
                                                                         "false")}  # processes share the device
    entries = len(algos.split(","))
    root = Path(args.out)
    knob = dict(k.split("=") for k in knobs)
    batch = int(knob["num_envs"]) * int(knob["num_steps"])
    from reflectrl.trainers.ppo_jax.trainer import CHUNK_STEPS

    # time one short entry per task, as many at once as the entries will run
    probe_steps = PROBE_CALLS * max(batch, CHUNK_STEPS)
    walls = run_all([command(TASKS[t], PROBE_ALGO, probe_steps, args.seeds, root / "probe" / t, knobs, 1,
                             report=False) for t in tasks], workers, env)
    probes = []
    for task, wall in zip(tasks, walls):
        rate = steady_rate(root / "probe" / task, args.seeds) or probe_steps * args.seeds / wall
        probes.append(Probe(task, probe_steps, args.seeds, wall, rate))
        print(f"probe {task}: {wall:.1f} s for {args.seeds} x {probe_steps:,} steps of {PROBE_ALGO}: "
              f"{rate:,.0f} steps/s over the seeds after the first call, {probes[-1].fixed:.1f} s fixed "
              "(start-up and compilation)", flush=True)
    left = args.budget - (time.perf_counter() - start)
    if args.force_size:
        chosen = Plan(args.steps, tasks, [], {p.task: task_seconds(p, entries, args.seeds, args.steps, workers)
                                             for p in probes})
    else:
        chosen = plan(probes, entries, args.seeds, left, workers, args.steps, args.min_steps, batch)
    if not chosen.tasks:
        print(f"jax_device: no task fits {left:.0f} s left of the budget at --min-steps {args.min_steps:,} "
              f"({entries} entries x {args.seeds} seeds): raise --budget, or lower --seeds or --min-steps, "
              "or pass --algos or --tasks with fewer", file=sys.stderr)
        return 1
    if chosen.steps < args.steps or chosen.dropped:
        print(f"the suite at {args.steps:,} steps does not fit the {left:.0f} s left here: running "
              f"{chosen.steps:,} steps per seed on {', '.join(chosen.tasks)}"
              + (f"; left out: {', '.join(chosen.dropped)}" if chosen.dropped else ""), flush=True)
    for task in chosen.tasks:
        (seconds,) = run_all([command(TASKS[task], algos, chosen.steps, args.seeds, root / task, knobs, workers)],
                             1, env)
        print(f"{task}: {entries} entries x {args.seeds} seeds x {chosen.steps:,} steps in {seconds:.0f} s "
              f"(planned {chosen.seconds[task]:.0f} s)", flush=True)
    subprocess.run([sys.executable, "-m", "reflectrl", "claims", *[str(root / t) for t in chosen.tasks],
                    "--out", str(root / "claims.md")], check=False)
    print(f"reports: {', '.join(str(root / t / 'report' / 'report.md') for t in chosen.tasks)}; "
          f"{time.perf_counter() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
