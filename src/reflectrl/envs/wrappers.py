"""Reward wrappers that make an environment's extrinsic reward sparser, and an observation wrapper that
hides its velocities (a memory task).

These reproduce the "delayed reward" protocol used to evaluate learned
intrinsic rewards (e.g. LIRPG's delayed MuJoCo): the agent still receives the
full episode return, but only in lumps, so credit assignment gets harder.

Both wrappers preserve the episode return exactly: the sum of paid rewards over
an episode equals the sum of the wrapped env's rewards, so logged episodic
returns stay comparable with the unwrapped task.

`parse_reward_wrapper` turns a CLI string ("sparse", "delayed:K", "velocity-cost[:V]", "mask_velocity",
or several joined by commas, applied left to right) into a picklable `env -> wrapped env` callable.
`velocity-cost` adds a cost channel (info["cost"], envs/cost.py) and leaves rewards alone.
`mask_velocity` zeroes the velocities in the observation (sb3-contrib's MaskVelocityWrapper): the task
becomes partially observable, what a recurrent policy (policy=gru, lstm) can solve and a feed-forward
one cannot; it stays in the env `reflectrl eval` and the Python API's predict act in
(`observation_wrappers`), which leave the reward wrappers out.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np


class DelayedReward(gym.Wrapper):
    """Pay the accumulated reward every `k` steps and on the episode's final step.

    Steps are counted from the episode start, 1-based, so payments happen on
    steps k, 2k, 3k, ... plus the terminal/truncated step. `k=1` is the identity.
    """

    def __init__(self, env: gym.Env, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"DelayedReward k must be an integer >= 1, got {k!r}")
        super().__init__(env)
        self.k = int(k)
        self._accumulated = 0.0
        self._t = 0

    def reset(self, **kwargs: Any):
        self._accumulated = 0.0
        self._t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._t += 1
        self._accumulated += float(reward)
        if terminated or truncated or self._t % self.k == 0:
            paid, self._accumulated = self._accumulated, 0.0
        else:
            paid = 0.0
        return obs, paid, terminated, truncated, info


class SparseReward(gym.Wrapper):
    """Pay the whole episode return on the final step and 0 everywhere else."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._accumulated = 0.0

    def reset(self, **kwargs: Any):
        self._accumulated = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._accumulated += float(reward)
        if terminated or truncated:
            paid, self._accumulated = self._accumulated, 0.0
        else:
            paid = 0.0
        return obs, paid, terminated, truncated, info


# the velocities in each env's observation (sb3-contrib's MaskVelocityWrapper), by the env's name (any version)
VELOCITY_INDICES = {
    "CartPole": (1, 3),            # cart velocity, pole angular velocity
    "Pendulum": (2,),              # angular velocity (the observation is cos, sin, velocity)
    "LunarLander": (2, 3, 5),      # horizontal and vertical velocity, angular velocity
    "LunarLanderContinuous": (2, 3, 5),
    "MountainCar": (1,),
    "MountainCarContinuous": (1,),
}


class MaskVelocity(gym.ObservationWrapper):
    """Observations with the env's velocities set to 0 (VELOCITY_INDICES), so that only a policy with a
    memory can tell where the system is going (sb3-contrib's MaskVelocityWrapper)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        spec = env.unwrapped.spec
        name = spec.name if spec is not None else type(env.unwrapped).__name__
        if name not in VELOCITY_INDICES:
            raise ValueError(f"--wrapper mask_velocity: no velocity indices known for '{name}'; it masks "
                             f"{', '.join(VELOCITY_INDICES)}")
        self.mask = np.ones(env.observation_space.shape, dtype=env.observation_space.dtype)
        self.mask[list(VELOCITY_INDICES[name])] = 0

    def observation(self, observation):
        return observation * self.mask


_WRAPPER_HELP = ("use 'sparse', 'delayed:K' (K a positive integer) or 'velocity-cost[:V]' (a cost channel; V a "
                 "speed limit), 'mask_velocity' to hide the velocities, or several joined by commas, e.g. "
                 "velocity-cost,delayed:20")
OBSERVATION_WRAPPERS = ("mask_velocity",)  # what changes the observations: kept where evaluation acts


def _chain(env: gym.Env, wrappers: tuple) -> gym.Env:
    for wrap in wrappers:
        env = wrap(env)
    return env


def parse_reward_wrapper(spec: str | None) -> Callable[[gym.Env], gym.Env] | None:
    """Parse a --wrapper value into a picklable `env -> wrapped env` callable.

    None, "" and "none" mean no wrapper and return None.
    """
    if spec is None:
        return None
    text = spec.strip().lower()
    if text in ("", "none"):
        return None
    if "," in text:
        parts = [parse_reward_wrapper(part) for part in text.split(",")]
        if any(part is None for part in parts):
            raise ValueError(f"unknown --wrapper {spec!r}: an empty or 'none' part; {_WRAPPER_HELP}")
        return functools.partial(_chain, wrappers=tuple(parts))
    if text == "sparse":
        return SparseReward
    if text == "mask_velocity":
        return MaskVelocity
    name, sep, arg = text.partition(":")
    if name == "velocity-cost":
        from reflectrl.envs.cost import VelocityCost

        if not sep:
            return VelocityCost
        try:
            limit = float(arg)
        except ValueError:
            limit = float("nan")
        if limit > 0 and limit != float("inf"):
            return functools.partial(VelocityCost, threshold=limit)
        raise ValueError(f"--wrapper {spec!r}: the speed limit must be a positive number, e.g. velocity-cost:3.2")
    if name == "delayed" and sep:
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k >= 1:
            # A partial (not a lambda) so vector-env workers can pickle it.
            return functools.partial(DelayedReward, k=k)
    raise ValueError(f"unknown --wrapper {spec!r}: {_WRAPPER_HELP}")


def observation_wrappers(spec: str | None) -> str | None:
    """The parts of a --wrapper that change observations (mask_velocity), joined as given: what an
    evaluation's env keeps (it leaves the reward wrappers and cost channels out); None without any."""
    if spec is None:
        return None
    parts = [part for part in spec.strip().lower().split(",") if part.strip() in OBSERVATION_WRAPPERS]
    return ",".join(part.strip() for part in parts) or None
