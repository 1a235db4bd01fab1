"""Env steps per second with backend=envpool vs Gymnasium's vector env (issue 15, item 10).

Both sides are the project's own `make_vector_env` with the same wrappers and observations
(MiniGrid's flattened view, Atari's 4x84x84 frame stack, the exploration state keys), so the
difference is the backend alone:

1. MiniGrid-DoorKey-8x8-v0, 8 envs, random actions: env steps/s of each backend;
2. reflectrl PPO training on it (8 envs x 128 steps, the default MLP), env steps/s end to end;
3. Pong (ALE/Pong-v5), 8 envs, random actions, where ale-py and OpenCV are installed.

Each measurement runs `--repeats` times, the backends interleaved, and the best counts (the
machines are shared, so the least-disturbed run is the fairest). torch runs on 1 thread, and
numpy's BLAS too unless OPENBLAS_NUM_THREADS is set: the SimHash state key of an Atari frame
stack is a numpy matmul, and a multi-threaded OpenBLAS next to EnvPool's worker threads made it
10 to 500 times slower on a 2-core machine (0.4 ms -> 5-300 ms per 8 frames).

    python bench/minigrid_backend.py [--env-steps 20000] [--train-steps 20480] [--repeats 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import time
import warnings

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads its BLAS: see the docstring

import numpy as np  # noqa: E402
import torch  # noqa: E402

BACKENDS = ("gymnasium", "envpool")


def _config(env_id: str, backend: str, total_steps: int, num_envs: int = 8):
    from reflectrl.trainers.resolve import new_run_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return new_run_config(env_id=env_id, seed=1, total_steps=total_steps,
                              overrides=[f"backend={backend}", f"num_envs={num_envs}", "num_steps=128"])


def env_steps_per_second(env_id: str, backend: str, env_steps: int, num_envs: int = 8) -> float:
    from reflectrl.envs import make_vector_env

    envs = make_vector_env(_config(env_id, backend, 1024, num_envs))
    envs.reset(seed=1)
    n = envs.single_action_space.n
    actions = np.random.default_rng(0).integers(n, size=(env_steps // num_envs, num_envs))
    for a in actions[:20]:  # warm-up
        envs.step(a)
    start = time.perf_counter()
    for a in actions:
        envs.step(a)
    elapsed = time.perf_counter() - start
    envs.close()
    return len(actions) * num_envs / elapsed


def training_steps_per_second(env_id: str, backend: str, total_steps: int) -> float:
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    trainer = PPOTrainer(_config(env_id, backend, total_steps))
    start = time.perf_counter()
    while not trainer.finished():
        trainer.run_iteration()
    elapsed = time.perf_counter() - start
    trainer.close()
    return trainer.global_step / elapsed


def best(fn, repeats: int, *args) -> dict[str, float]:
    """The best of `repeats` runs per backend, the backends interleaved."""
    out = {b: 0.0 for b in BACKENDS}
    for _ in range(repeats):
        for backend in BACKENDS:
            out[backend] = max(out[backend], fn(*args[:1], backend, *args[1:]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=20_000, help="env steps per env-stepping measurement")
    parser.add_argument("--train-steps", type=int, default=20_480, help="env steps of each PPO training run")
    parser.add_argument("--atari-steps", type=int, default=8_000, help="env steps per Atari measurement")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)

    results = {}
    results["MiniGrid-DoorKey-8x8-v0 env steps/s (8 envs, random actions)"] = best(
        env_steps_per_second, args.repeats, "MiniGrid-DoorKey-8x8-v0", args.env_steps)
    results[f"MiniGrid-DoorKey-8x8-v0 PPO training steps/s (8x128, {args.train_steps} steps)"] = best(
        training_steps_per_second, args.repeats, "MiniGrid-DoorKey-8x8-v0", args.train_steps)
    if importlib.util.find_spec("ale_py") and importlib.util.find_spec("cv2"):
        results["ALE/Pong-v5 env steps/s (8 envs, random actions)"] = best(
            env_steps_per_second, args.repeats, "ALE/Pong-v5", args.atari_steps)

    print(f"{'measurement':<68} {'gymnasium':>10} {'envpool':>10} {'ratio':>7}")
    for name, figures in results.items():
        figures["ratio"] = figures["envpool"] / figures["gymnasium"]
        print(f"{name:<68} {figures['gymnasium']:>10.0f} {figures['envpool']:>10.0f} {figures['ratio']:>6.2f}x")
    print(f"({platform.processor() or platform.machine()}, torch threads 1, best of {args.repeats})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
