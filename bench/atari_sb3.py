"""Env-steps per second of reflectrl's PPO and Stable-Baselines3's PPO on Atari (issue 15, item 10).

Matched settings, CleanRL's ppo_atari.py on both sides: 8 envs x 128 steps, 4 epochs of
minibatches of 256, lr 2.5e-4, clip 0.1, ent 0.01, the Nature CNN (SB3's CnnPolicy),
SB3's `make_atari_env` (noop reset, max-and-skip 4, episodic life, fire reset, 84x84
grayscale, reward clipping) with a 4-frame `VecFrameStack` against reflectrl's own chain
(see envs/atari.py), 1 torch thread, CPU. `--backend envpool` runs reflectrl's envs through
EnvPool's C++ Atari (same preprocessing, on one thread). Each side runs `--repeats` times, interleaved,
and the best time counts (the machines are shared). `--profile FILE` writes cProfile
statistics of one reflectrl run (`python -m pstats FILE`). `--baseline-src DIR` (the `src` folder of
another checkout, e.g. `git worktree add /tmp/before HEAD~1` then `/tmp/before/src`) also runs reflectrl
from that code, interleaved (before, after, SB3, ...: the same load on all three), both reflectrl sides
in child processes, and prints the before/after ratio beside each one's ratio to SB3.

    python bench/atari_sb3.py [--env ALE/Breakout-v5] [--steps 8192] [--repeats 1] [--profile FILE]
                              [--backend gymnasium|envpool] [--baseline-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

N_ENVS, N_STEPS, EPOCHS, MINIBATCH = 8, 128, 4, 256


def run_reflectrl(env_id: str, total: int, backend: str = "gymnasium", envpool_threads: int = 1) -> float:
    from reflectrl.config import RunConfig
    from reflectrl.trainers.ppo.config import PPOConfig
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import resolve_config

    # EnvPool steps its envs on min(envs, cores) threads unless told: one, as every other part here
    cfg = RunConfig(env_id=env_id, seed=1, total_steps=total, backend=backend, envpool_threads=envpool_threads,
                    knobs=PPOConfig(
        num_envs=N_ENVS, num_steps=N_STEPS, update_epochs=EPOCHS, num_minibatches=N_ENVS * N_STEPS // MINIBATCH))
    resolve_config(cfg)
    assert cfg.ppo.encoder == "cnn" and cfg.ppo.clip_coef == 0.1
    trainer = PPOTrainer(cfg)
    start = time.perf_counter()
    trainer.train(progress=False)
    elapsed = time.perf_counter() - start
    trainer.close()
    return trainer.global_step / elapsed


def run_reflectrl_from(src: str | None, env_id: str, total: int, backend: str, envpool_threads: int) -> float:
    """run_reflectrl in a child process, with the reflectrl package of `src` (None: this tree's)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), *filter(None, [env.get("PYTHONPATH")])])
    out = subprocess.run([sys.executable, __file__, "--env", env_id, "--steps", str(total), "--backend", backend,
                          "--envpool-threads", str(envpool_threads), "--reflectrl-only"],
                         env=env, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def run_sb3(env_id: str, total: int) -> float:
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    # frameskip=1: SB3's AtariWrapper skips 4 frames itself
    env = VecFrameStack(make_atari_env(env_id, n_envs=N_ENVS, seed=1, env_kwargs={"frameskip": 1}), n_stack=4)
    model = PPO("CnnPolicy", env, n_steps=N_STEPS, batch_size=MINIBATCH, n_epochs=EPOCHS, learning_rate=2.5e-4,
                clip_range=0.1, ent_coef=0.01, vf_coef=0.5, device="cpu", seed=1, verbose=0)
    start = time.perf_counter()
    model.learn(total_timesteps=total)
    elapsed = time.perf_counter() - start
    env.close()
    return model.num_timesteps / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="ALE/Breakout-v5")
    parser.add_argument("--steps", type=int, default=8192, help="env steps per run (a multiple of 1024)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--profile", default=None, help="write cProfile stats of one reflectrl run here")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--backend", default="gymnasium", choices=["gymnasium", "envpool"],
                        help="reflectrl's env backend (SB3 always runs its own Gymnasium wrappers)")
    parser.add_argument("--envpool-threads", type=int, default=1,
                        help="EnvPool's worker threads (0: its default, min(envs, cores); 1: as the rest)")
    parser.add_argument("--baseline-src", default=None,
                        help="also run reflectrl from this src folder (another checkout's), interleaved")
    parser.add_argument("--reflectrl-only", action="store_true", help=argparse.SUPPRESS)  # a child's run: its rate
    args = parser.parse_args()
    torch.set_num_threads(1)
    total = max(N_ENVS * N_STEPS, args.steps // (N_ENVS * N_STEPS) * N_ENVS * N_STEPS)
    if args.reflectrl_only:
        print(run_reflectrl(args.env, total, args.backend, args.envpool_threads))
        return

    if args.profile:
        import cProfile

        cProfile.runctx("run_reflectrl(args.env, total)", globals(), {"args": args, "total": total},
                        filename=args.profile)
    best = {"reflectrl": 0.0, "sb3": 0.0}
    if args.baseline_src:
        best["baseline"] = 0.0
    for _ in range(args.repeats):
        if args.baseline_src:
            best["baseline"] = max(best["baseline"], run_reflectrl_from(args.baseline_src, args.env, total,
                                                                        args.backend, args.envpool_threads))
            rate = run_reflectrl_from(None, args.env, total, args.backend, args.envpool_threads)
        else:
            rate = run_reflectrl(args.env, total, args.backend, args.envpool_threads)
        best["reflectrl"] = max(best["reflectrl"], rate)
        best["sb3"] = max(best["sb3"], run_sb3(args.env, total))
    ratio = best["reflectrl"] / best["sb3"]
    print(f"{args.env}, {total} env steps, {N_ENVS} envs x {N_STEPS} steps, {EPOCHS} epochs of {MINIBATCH}, "
          f"1 torch thread, {platform.processor() or platform.machine()}")
    if args.baseline_src:
        print(f"  baseline  {best['baseline']:8.1f} steps/s ({args.baseline_src}; "
              f"{best['baseline'] / best['sb3']:.2f}x SB3; this tree {best['reflectrl'] / best['baseline']:.2f}x it)")
    print(f"  reflectrl {best['reflectrl']:8.1f} steps/s (backend {args.backend})")
    print(f"  sb3       {best['sb3']:8.1f} steps/s")
    print(f"  ratio     {ratio:8.2f}x (target >= 1.5x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"env": args.env, "steps": total, "backend": args.backend, **best, "ratio": ratio}, f, indent=2)


if __name__ == "__main__":
    main()
