"""Gymnasium's observation and reward normalisers with the per-step update written out.

Same statistics and the same formula as `gymnasium.wrappers.NormalizeObservation` /
`NormalizeReward` (Chan et al.'s parallel update with a batch of one), but without the
`np.mean` / `np.var` calls on a one-row batch, which cost more than a MuJoCo step. They
subclass Gymnasium's wrappers, so `obs_rms`, `return_rms` and `update_running_mean` work
as documented there.
"""

from __future__ import annotations

import numpy as np
from gymnasium import wrappers


def _update_one(rms, x) -> None:
    delta = x - rms.mean
    total = rms.count + 1
    rms.mean = rms.mean + delta / total
    rms.var = (rms.var * rms.count + np.square(delta) * (rms.count / total)) / total
    rms.count = total


class NormalizeObservation(wrappers.NormalizeObservation):
    def observation(self, observation):
        if self._update_running_mean:
            _update_one(self.obs_rms, observation)
        return ((observation - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + self.epsilon)).astype(np.float32)


class NormalizeReward(wrappers.NormalizeReward):
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.discounted_reward = self.discounted_reward * self.gamma * (1 - terminated) + float(reward)
        if self._update_running_mean:
            # Gymnasium keeps the running return as a one-element array; its statistics are scalars.
            _update_one(self.return_rms, float(np.asarray(self.discounted_reward).reshape(-1)[0]))
        return obs, reward / np.sqrt(self.return_rms.var + self.epsilon), terminated, truncated, info
