"""An env of a user's own for tests/test_api.py: a gymnasium.Env subclass that no import registers, defined in a
module the CLI's new processes can import (PYTHONPATH=tests), so the Python API records it as api_env:Corridor."""

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right to the end of a corridor of `length` cells: reward 1 there."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 4):
        self.length, self.pos = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos >= self.length
        return np.array([self.pos / self.length], np.float32), float(done), done, False, {}
