"""The cost channel: `info["cost"]`, a per-step cost that a constrained learner keeps below a
limit on its expected episode cost (`--set cost_limit=25`; seed 002 section 6.3).

Safety-Gymnasium, which defines such tasks, does not install on this project's stack (its 1.0
pins gymnasium 0.28, gymnasium-robotics 1.2 and pygame 2.1, which has no wheel for Python 3.11
and does not build), so its definitions are reproduced here:

* `--wrapper velocity-cost` on a MuJoCo locomotion task (Safety-Gymnasium's velocity tasks,
  v1 thresholds): cost 1 on each step whose speed exceeds the task's threshold, 0 otherwise.
  The speed is the forward (x) velocity, or for Ant and Humanoid the planar speed
  sqrt(vx^2 + vy^2), as Safety-Gymnasium's; Gymnasium's v5 envs report both velocities in
  their info. `velocity-cost:V` sets the threshold V for any env that reports `x_velocity`.
* `--set env.hazards=...` on the grid world (gridworld.py): cost 1 on each step that ends on a
  hazard cell, as Safety-Gymnasium's hazard areas.

`CostTracker` is the trainers' side: each step's costs from a vector env's info (the finished
episode's last step from `final_info` under same-step autoreset), and the cost of every
episode that ended, for the metrics `episode_cost` and `cost_limit_violations`.
"""

from __future__ import annotations

import math
import re

import gymnasium as gym
import numpy as np

# Safety-Gymnasium's Safety*Velocity-v1 thresholds (tasks/safe_velocity/), by Gymnasium env name
VELOCITY_THRESHOLDS = {"HalfCheetah": 3.2096, "Hopper": 0.7402, "Walker2d": 2.3415, "Ant": 2.6222,
                       "Humanoid": 1.4149, "Swimmer": 0.2282}
PLANAR = ("Ant", "Humanoid")  # their speed is the planar one


def _env_name(env_id: str) -> str:
    return re.sub(r"-v\d+$", "", env_id.split("/")[-1])


def velocity_threshold(env_id: str) -> float | None:
    return VELOCITY_THRESHOLDS.get(_env_name(env_id))


class VelocityCost(gym.Wrapper):
    """info["cost"] = 1.0 when the step's speed exceeds `threshold`, else 0.0 (rewards untouched)."""

    def __init__(self, env: gym.Env, threshold: float | None = None) -> None:
        super().__init__(env)
        env_id = env.spec.id if env.spec is not None else ""
        self.threshold = velocity_threshold(env_id) if threshold is None else float(threshold)
        if self.threshold is None:
            known = ", ".join(f"{name}-v5" for name in VELOCITY_THRESHOLDS)
            raise ValueError(f"--wrapper velocity-cost has no speed limit for '{env_id}' (known: {known}); "
                             "give one: --wrapper velocity-cost:LIMIT")
        self.planar = _env_name(env_id) in PLANAR

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if "x_velocity" not in info:
            raise ValueError("--wrapper velocity-cost needs an env that reports info['x_velocity'] "
                             "(Gymnasium's MuJoCo v5 locomotion tasks do)")
        speed = float(info["x_velocity"])
        if self.planar:
            speed = math.hypot(speed, float(info.get("y_velocity", 0.0)))
        return obs, reward, terminated, truncated, {**info, "cost": float(speed > self.threshold)}


def has_cost_channel(env: gym.Env, seed: int = 0) -> bool:
    """Whether one step of the env (a sampled action after a reset) reports info["cost"]."""
    env.reset(seed=seed)
    env.action_space.seed(seed)
    *_, info = env.step(env.action_space.sample())
    return "cost" in info


class CostTracker:
    """Per-step costs of a vector env's rollout and the costs of the episodes it finished."""

    def __init__(self, num_envs: int):
        self.running = np.zeros(num_envs, dtype=np.float64)
        self.costs = None
        self.seen = False  # whether any step reported a cost

    def start(self, num_steps: int) -> None:
        self.costs = np.zeros((num_steps, len(self.running)), dtype=np.float32)
        self.finished: list[float] = []

    def record(self, t: int, info: dict, done: np.ndarray) -> None:
        """After step t: its costs (the final step's from `final_info` where an episode ended)."""
        final = info.get("final_info")
        if "cost" not in info and (final is None or "cost" not in final):
            return  # no cost channel (most envs): the row stays the zeros `start` made
        cost = np.zeros(len(self.running))
        if "cost" in info:
            self.seen = True
            mask = info.get("_cost", np.ones(len(cost), dtype=bool))
            cost[mask] = np.asarray(info["cost"], dtype=np.float64)[mask]
        if final is not None and "cost" in final:
            self.seen = True
            for i in np.flatnonzero(final["_cost"]):
                cost[i] = float(final["cost"][i])
        self.costs[t] = cost
        self.running += cost
        for i in np.flatnonzero(done):
            self.finished.append(float(self.running[i]))
            self.running[i] = 0.0

    def metrics(self, cost_limit: float) -> dict:
        """episode_cost: the mean cost of the episodes that ended in this rollout; cost_limit_violations:
        how many of them cost more than the limit (and their share: cost_limit_violation_rate)."""
        if not self.seen:
            return {}
        out = {"step_cost": float(self.costs.mean())}
        if self.finished:
            over = sum(c > cost_limit for c in self.finished)
            out.update(episode_cost=float(np.mean(self.finished)), cost_limit_violations=int(over),
                       cost_limit_violation_rate=over / len(self.finished))
        return out

    def state_dict(self) -> dict:
        return {"running": self.running.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.running = np.asarray(state["running"], dtype=np.float64)
