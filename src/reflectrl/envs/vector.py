"""Gymnasium's SyncVectorEnv with a leaner per-step path for the trainers' case.

The trainers step their envs with same-step autoreset, flat (Box) observations and Discrete,
MultiDiscrete or Box actions. For that case `step` does what SyncVectorEnv.step does, in the
same order and with the same results (the same sub-env calls, arrays and info entries:
tests/test_vector_env.py steps both side by side), without its per-step generic machinery:
the action space's `iterate` generator, the single-dispatch `concatenate` of the
observations, a `deepcopy` of the observation array, and the info merge of sub-envs that
returned an empty info. Those cost ~20-40 us per vector step of 4 CartPoles, a tenth of the
training loop's step (bench/limits.py). Every other case is SyncVectorEnv's own step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode


class FastSyncVectorEnv(gym.vector.SyncVectorEnv):
    def __init__(self, env_fns, **kwargs):
        super().__init__(env_fns, **kwargs)
        self._fast = (self.autoreset_mode == AutoresetMode.SAME_STEP
                      and type(self.single_observation_space) is spaces.Box
                      and isinstance(self._observations, np.ndarray)
                      and type(self.single_action_space) in (spaces.Discrete, spaces.MultiDiscrete, spaces.Box))

    def step(self, actions):
        if not self._fast:
            return super().step(actions)
        infos: dict = {}
        observations, env_obs = self._observations, self._env_obs
        rewards, terminations, truncations = self._rewards, self._terminations, self._truncations
        for i, env in enumerate(self.envs):
            obs, rewards[i], terminations[i], truncations[i], info = env.step(actions[i])
            if terminations[i] or truncations[i]:
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                obs, info = env.reset()
            if info:
                infos = self._add_info(infos, info, i)
            env_obs[i] = obs
            observations[i] = obs
        self._autoreset_envs = np.logical_or(terminations, truncations)
        return (observations.copy() if self.copy else observations, rewards.copy(), terminations.copy(),
                truncations.copy(), infos)
