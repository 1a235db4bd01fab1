"""Reward wrappers that make an environment's extrinsic reward sparser.

These reproduce the "delayed reward" protocol used to evaluate learned
intrinsic rewards (e.g. LIRPG's delayed MuJoCo): the agent still receives the
full episode return, but only in lumps, so credit assignment gets harder.

Both wrappers preserve the episode return exactly: the sum of paid rewards over
an episode equals the sum of the wrapped env's rewards, so logged episodic
returns stay comparable with the unwrapped task.

`parse_reward_wrapper` turns a CLI string ("sparse", "delayed:K") into a
picklable `env -> wrapped env` callable.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from typing import Any

import gymnasium as gym


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


_WRAPPER_HELP = "use 'sparse' or 'delayed:K' (K a positive integer)"


def parse_reward_wrapper(spec: str | None) -> Callable[[gym.Env], gym.Env] | None:
    """Parse a --wrapper value into a picklable `env -> wrapped env` callable.

    None, "" and "none" mean no wrapper and return None.
    """
    if spec is None:
        return None
    text = spec.strip().lower()
    if text in ("", "none"):
        return None
    if text == "sparse":
        return SparseReward
    name, sep, arg = text.partition(":")
    if name == "delayed" and sep:
        try:
            k = int(arg)
        except ValueError:
            k = 0
        if k >= 1:
            # A partial (not a lambda) so vector-env workers can pickle it.
            return functools.partial(DelayedReward, k=k)
    raise ValueError(f"unknown --wrapper {spec!r}: {_WRAPPER_HELP}")
