"""envs/vector.FastSyncVectorEnv steps as Gymnasium's SyncVectorEnv does: the same observations,
rewards, flags and infos (final observations and episode statistics included), step by step."""

import gymnasium as gym
import numpy as np
import pytest

from reflectrl.envs import register_gridworld
from reflectrl.envs.statekey import StateKey
from reflectrl.envs.vector import FastSyncVectorEnv


def _equal(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            if k != "t":  # RecordEpisodeStatistics' wall-clock seconds
                _equal(a[k], b[k])
    elif isinstance(a, (tuple, list)) or (isinstance(a, np.ndarray) and a.dtype == object):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("env_id,kwargs", [("CartPole-v1", {}), ("Pendulum-v1", {}),
                                           ("reflectrl/GridWorld-v0", {"size": 5})])
def test_fast_vector_env_steps_as_gymnasium(env_id, kwargs):
    register_gridworld()

    def make():
        return StateKey(gym.wrappers.RecordEpisodeStatistics(gym.make(env_id, max_episode_steps=20, **kwargs)))

    same = gym.vector.AutoresetMode.SAME_STEP
    ours, theirs = FastSyncVectorEnv([make] * 3, autoreset_mode=same), gym.vector.SyncVectorEnv([make] * 3,
                                                                                              autoreset_mode=same)
    assert ours._fast
    _equal(ours.reset(seed=5), theirs.reset(seed=5))
    ours.action_space.seed(1)
    ended = 0
    for _ in range(120):
        actions = ours.action_space.sample()
        a, b = ours.step(actions), theirs.step(actions)
        for x, y in zip(a, b):
            _equal(x, y)
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype
        ended += int("final_obs" in a[4])
    assert ended > 0  # the autoreset path ran


def test_other_layouts_take_gymnasium_step():
    envs = FastSyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)  # next-step autoreset
    assert not envs._fast
