"""reflectrl's DQN and SAC against Stable-Baselines3's on the same work, in one script.

Matched settings (CleanRL's hyperparameters on both sides, 1 torch thread, CPU):
* DQN on CartPole-v1: MLP 120-84 ReLU, lr 2.5e-4, buffer 10k, batch 128, learning_starts
  10k, a gradient step every 10 env steps, hard target copy every 500, epsilon 1 -> 0.05 over
  half of training; the Huber loss on both (SB3's DQN has no MSE option) and no gradient
  clip (SB3's max_grad_norm set to 1e9).
* SAC on Hopper-v5 / HalfCheetah-v5: MLP 256-256 ReLU actor and twin critics, batch 256,
  tau 0.005, learning_starts 5k, automatic entropy tuning, a Q-step per env step; SB3
  updates the actor every step, CleanRL's SAC twice every second step (the same work).
  SB3 has one learning rate: 3e-4 for both sides here (q_lr=3e-4 on ours).

`--mode speed`: env steps per second of each, `--repeats` times interleaved, the best run
counting (shared machines); prints the ratio reflectrl / SB3.
`--mode learn`: `--seeds` seeds of each at `--steps`; each trained policy is evaluated
deterministically (greedy) on the same 10 episode seeds; prints per-run scores, the means
and the difference with a bootstrap CI.

    python bench/offpolicy_vs_sb3.py --mode speed --algo dqn --steps 50000
    python bench/offpolicy_vs_sb3.py --mode learn --algo dqn --steps 500000 --seeds 3 --json FILE
    python bench/offpolicy_vs_sb3.py --mode learn --algo dqn --steps 500000 --seeds 3 --dqn-loss mse --only reflectrl
    python bench/offpolicy_vs_sb3.py --mode learn --algo sac --env Hopper-v5 --steps 50000 --seeds 3
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import gymnasium as gym
import numpy as np
import torch

EVAL_SEEDS = list(range(10_000, 10_010))


def evaluate(act, env_id: str) -> float:
    """Mean return of `act(obs) -> action` over the 10 fixed evaluation episodes."""
    env = gym.make(env_id)
    returns = []
    for seed in EVAL_SEEDS:
        obs, _ = env.reset(seed=seed)
        done, total = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(act(obs))
            total += float(r)
            done = term or trunc
        returns.append(total)
    env.close()
    return float(np.mean(returns))


DQN_LOSS = "huber"  # --dqn-loss


def ours(algo: str, env_id: str, steps: int, seed: int, learning_starts: int | None):
    from reflectrl.registry import trainer_class
    from reflectrl.trainers.resolve import new_run_config

    if algo == "dqn":
        overrides = [f"loss={DQN_LOSS}"]
    else:
        overrides = ["q_lr=3e-4"]
    if learning_starts is not None:
        overrides.append(f"learning_starts={learning_starts}")
    cfg = new_run_config(algo=algo, env_id=env_id, seed=seed, total_steps=steps, overrides=overrides)
    trainer = trainer_class(algo)(cfg)
    start = time.perf_counter()
    trainer.train(progress=False)
    elapsed = time.perf_counter() - start
    trainer.close()
    policy = trainer.policy_module

    def act(obs):
        with torch.no_grad():
            a = policy.deterministic_action(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))[0].numpy()
        return int(a) if algo == "dqn" else a

    return trainer.global_step / elapsed, act


def sb3(algo: str, env_id: str, steps: int, seed: int, learning_starts: int | None):
    from stable_baselines3 import DQN, SAC

    torch.set_num_threads(1)
    env = gym.make(env_id)
    if algo == "dqn":
        model = DQN("MlpPolicy", env, learning_rate=2.5e-4, buffer_size=10_000,
                    learning_starts=10_000 if learning_starts is None else learning_starts, batch_size=128,
                    gamma=0.99, train_freq=10, gradient_steps=1, target_update_interval=500,
                    exploration_fraction=0.5, exploration_initial_eps=1.0, exploration_final_eps=0.05,
                    max_grad_norm=1e9, policy_kwargs=dict(net_arch=[120, 84]), device="cpu", seed=seed, verbose=0)
    else:
        model = SAC("MlpPolicy", env, learning_rate=3e-4, buffer_size=1_000_000,
                    learning_starts=5_000 if learning_starts is None else learning_starts, batch_size=256,
                    tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1, ent_coef="auto",
                    policy_kwargs=dict(net_arch=[256, 256]), device="cpu", seed=seed, verbose=0)
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    elapsed = time.perf_counter() - start

    def act(obs):
        a, _ = model.predict(obs, deterministic=True)
        return int(a) if algo == "dqn" else a

    return steps / elapsed, act


def bootstrap_diff(a, b, reps=50_000, seed=0):
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a), np.asarray(b)
    diffs = rng.choice(a, (reps, len(a))).mean(1) - rng.choice(b, (reps, len(b))).mean(1)
    return float(a.mean() - b.mean()), float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("speed", "learn"), default="speed")
    parser.add_argument("--algo", choices=("dqn", "sac"), default="dqn")
    parser.add_argument("--env", default=None, help="default: CartPole-v1 for dqn, HalfCheetah-v5 for sac")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--learning-starts", type=int, default=None, help="default: CleanRL's")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--dqn-loss", choices=("huber", "mse"), default="huber",
                        help="our DQN's loss: huber matches SB3's; mse is CleanRL's (whose published scores use it)")
    parser.add_argument("--only", choices=("reflectrl", "sb3"), default=None, help="run one side only")
    args = parser.parse_args()
    global DQN_LOSS
    DQN_LOSS = args.dqn_loss
    sides = [(n, f) for n, f in (("reflectrl", ours), ("sb3", sb3)) if args.only in (None, n)]
    torch.set_num_threads(1)
    env_id = args.env or ("CartPole-v1" if args.algo == "dqn" else "HalfCheetah-v5")
    steps = args.steps or (50_000 if args.algo == "dqn" else 10_000)
    out = {"algo": args.algo, "env": env_id, "steps": steps, "mode": args.mode, "dqn_loss": args.dqn_loss,
           "machine": platform.processor()
           or platform.machine(), "torch": torch.__version__}
    if args.mode == "speed":
        best = {"reflectrl": 0.0, "sb3": 0.0}
        for r in range(args.repeats):
            for name, fn in sides:
                sps, _ = fn(args.algo, env_id, steps, 1, args.learning_starts)
                best[name] = max(best[name], sps)
                print(f"repeat {r + 1} {name:9s} {sps:8.1f} env steps/s", flush=True)
        out.update(best, ratio=best["reflectrl"] / best["sb3"])
        print(f"{args.algo} on {env_id}, {steps:,} steps: reflectrl {best['reflectrl']:.1f}/s, "
              f"SB3 {best['sb3']:.1f}/s, ratio {out['ratio']:.2f}x")
    else:
        scores: dict[str, list[float]] = {"reflectrl": [], "sb3": []}
        for seed in range(1, args.seeds + 1):
            for name, fn in sides:
                sps, act = fn(args.algo, env_id, steps, seed, args.learning_starts)
                score = evaluate(act, env_id)
                scores[name].append(score)
                print(f"seed {seed} {name:9s} greedy return {score:9.2f} ({sps:.0f} steps/s)", flush=True)
        scores = {k: v for k, v in scores.items() if v}
        out.update(scores=scores)
        for name, s in scores.items():
            print(f"{name:9s} mean {np.mean(s):9.2f} +- {np.std(s):.2f} over {len(s)} seeds: {s}")
        if len(scores) == 2:
            # [mean, lo, hi]; "diff" is the old name of the field
            diff = out["diff_mean_ci95"] = out["diff"] = bootstrap_diff(scores["reflectrl"], scores["sb3"])
            print(f"reflectrl - SB3: {diff[0]:+.2f} [95% bootstrap CI {diff[1]:+.2f}, {diff[2]:+.2f}]")
    if args.json:
        import datetime
        import shlex
        import sys

        from reflectrl.report.provenance import git_state, machine, versions

        # where and from what code the numbers came (issue 40): a results folder holds several of these files
        out["provenance"] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "command": shlex.join([sys.executable, *sys.argv]), "git": git_state(),
                             "versions": versions(), "machine": machine(),
                             "statistics": {"bootstrap": "percentile CI of the difference of seed means",
                                            "bootstrap_reps": 50_000, "bootstrap_seed": 0}}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
