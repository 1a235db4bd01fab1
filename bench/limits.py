"""How close reflectrl's training loop runs to each env family's own limit (issue 38).

For each family it prints, with the same number of envs on every line of a family:

- raw: the env's own rate, random actions, no wrappers (`gym.make_vec` with same-step
  autoreset; `envpool.make_gymnasium` for the EnvPool rows), batched action sampling;
- loop: reflectrl PPO's training loop (`trainer.train()` in this process: rollout, the
  exploration state keys, GAE, the update, the metrics log), env steps per second;
- process: a whole `reflectrl train` process (start-up, training, checkpoint, ending);
- loop/raw and process/raw: the shares of the raw rate;
- update-bound: steps / the seconds the loop spent in PPO's update (the epochs of minibatch
  steps), the rate the loop would reach if rollouts cost nothing, and its share of the raw
  rate: a loop/raw target above that share is out of reach without a cheaper update (fewer
  epochs or minibatches, a compiled update: the JAX backend);
- start-up: process seconds minus steps / loop rate (what a run costs besides training).

Each measurement runs `--repeats` times and the best counts (shared machines: the least
disturbed run is the fairest). torch runs on 1 thread, as `reflectrl train` does by default.

    python bench/limits.py [--scale 1.0] [--repeats 2] [--only CartPole] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# name, env id, num_envs, PPO --set items, training steps, backend
FAMILIES = [
    ("CartPole x4", "CartPole-v1", 4, ["num_steps=128"], 65_536, "gymnasium"),
    ("LunarLander x4", "LunarLander-v3", 4, ["num_steps=128"], 32_768, "gymnasium"),
    ("HalfCheetah x1", "HalfCheetah-v5", 1, ["num_steps=2048"], 20_480, "gymnasium"),
    ("DoorKey-8x8 x16 (EnvPool)", "MiniGrid-DoorKey-8x8-v0", 16, ["num_steps=128"], 32_768, "envpool"),
    ("Breakout x8 (EnvPool)", "ALE/Breakout-v5", 8, ["num_steps=128"], 8_192, "envpool"),
]


def _needs(backend: str, env_id: str) -> str | None:
    if backend == "envpool" and importlib.util.find_spec("envpool") is None:
        return "envpool is not installed"
    if env_id.startswith("ALE/") and importlib.util.find_spec("ale_py") is None:
        return "ale-py is not installed"
    return None


def raw_rate(env_id: str, num_envs: int, backend: str, steps: int) -> float:
    """The env's own steps per second with random actions and no wrappers."""
    if backend == "envpool":
        import envpool

        name = env_id.split("/")[-1]
        envs = envpool.make_gymnasium(name, num_envs=num_envs, seed=1)
    else:
        import gymnasium as gym

        if env_id.startswith("ALE/"):
            import ale_py

            gym.register_envs(ale_py)
        envs = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    envs.reset() if backend == "envpool" else envs.reset(seed=1)  # EnvPool is seeded at make
    space = envs.single_action_space if hasattr(envs, "single_action_space") else envs.action_space
    rng = np.random.default_rng(0)
    batches = max(1, steps // num_envs)
    if hasattr(space, "n"):
        actions = rng.integers(space.n, size=(batches, num_envs))
    else:
        actions = rng.uniform(space.low, space.high, size=(batches, num_envs, *space.shape)).astype(np.float32)
    for a in actions[: min(20, batches)]:
        envs.step(a)
    start = time.perf_counter()
    for a in actions:
        envs.step(a)
    elapsed = time.perf_counter() - start
    envs.close()
    return batches * num_envs / elapsed


def loop_rate(env_id: str, num_envs: int, sets: list[str], steps: int, backend: str) -> tuple[float, float]:
    """reflectrl PPO's training loop in this process: env steps per second of trainer.train(), and
    the seconds of it spent in the update."""
    import torch

    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import new_run_config


    try:  # what `reflectrl train` does (an older checkout, measured for comparison, has no such step)
        from reflectrl.torch_setup import optimizers_without_dynamo

        optimizers_without_dynamo()
    except ImportError:
        pass
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = new_run_config(env_id=env_id, seed=1, total_steps=steps,
                             overrides=[f"num_envs={num_envs}", f"backend={backend}", *sets])
        trainer = PPOTrainer(cfg)
        update, spent = trainer.update, [0.0]

        def timed_update(rollout):
            t0 = time.perf_counter()
            try:
                return update(rollout)
            finally:
                spent[0] += time.perf_counter() - t0

        trainer.update = timed_update
        start = time.perf_counter()
        trainer.train(progress=False)
        elapsed = time.perf_counter() - start
    done = trainer.global_step
    trainer.close()
    return done / elapsed, spent[0]


def process_seconds(env_id: str, num_envs: int, sets: list[str], steps: int, backend: str) -> float:
    """Wall seconds of a whole `reflectrl train` process."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "reflectrl", "train", "--env", env_id, "--total-steps", str(steps), "--out",
               os.path.join(tmp, "run"), "--no-progress", "--set", f"num_envs={num_envs}", f"backend={backend}",
               "checkpoint_every=1000000000", *sets]
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1:]}")
    return elapsed


def startup_seconds() -> float:
    """Wall seconds of `reflectrl --help` (the CLI's own start-up)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "reflectrl", "--help"], capture_output=True, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every step count (default 1)")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs (default 2)")
    parser.add_argument("--only", default=None, help="families whose name contains this text")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args()

    rows = []
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; best of {args.repeats}")
    help_s = min(startup_seconds() for _ in range(args.repeats))
    print(f"reflectrl --help: {help_s:.2f} s")
    header = (f"{'family':28} {'raw/s':>9} {'loop/s':>9} {'process/s':>10} {'loop/raw':>9} {'proc/raw':>9} "
              f"{'start-up s':>10} {'update-bound/s':>14} {'bound/raw':>9}")
    print(header)
    for name, env_id, n, sets, steps, backend in FAMILIES:
        if args.only and args.only.lower() not in name.lower():
            continue
        why = _needs(backend, env_id)
        if why:
            print(f"{name:28} skipped: {why}")
            continue
        per_iteration = n * int(next(s for s in sets if s.startswith("num_steps=")).split("=")[1])
        steps = -(-max(int(steps * args.scale), 2048) // per_iteration) * per_iteration  # whole iterations
        raw = max(raw_rate(env_id, n, backend, steps) for _ in range(args.repeats))
        loop, update_s = max(loop_rate(env_id, n, sets, steps, backend) for _ in range(args.repeats))
        bound = steps / update_s
        proc_s = min(process_seconds(env_id, n, sets, steps, backend) for _ in range(args.repeats))
        proc = steps / proc_s
        start = proc_s - steps / loop
        row = {"family": name, "env_id": env_id, "num_envs": n, "backend": backend, "steps": steps, "raw": raw,
               "loop": loop, "process": proc, "loop_share": loop / raw, "process_share": proc / raw,
               "startup_seconds": start, "update_seconds": update_s, "update_bound": bound,
               "update_bound_share": bound / raw}
        rows.append(row)
        print(f"{name:28} {raw:9,.0f} {loop:9,.0f} {proc:10,.0f} {loop / raw:9.1%} {proc / raw:9.1%} {start:10.2f} "
              f"{bound:14,.0f} {bound / raw:9.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"help_seconds": help_s, "rows": rows, "repeats": args.repeats, "scale": args.scale,
                       "machine": platform.platform(), "cores": os.cpu_count()}, f, indent=1)


if __name__ == "__main__":
    main()
