"""The fast normalisers compute what Gymnasium's wrappers compute."""

import gymnasium as gym
import numpy as np

from reflectrl.envs.normalize import NormalizeObservation, NormalizeReward


def test_matches_gymnasium_wrappers():
    ours = NormalizeReward(NormalizeObservation(gym.make("Pendulum-v1")), gamma=0.99)
    ref = gym.wrappers.NormalizeReward(gym.wrappers.NormalizeObservation(gym.make("Pendulum-v1")), gamma=0.99)
    ours.reset(seed=0)
    ref.reset(seed=0)
    for t in range(400):
        action = np.array([np.sin(0.1 * t)], np.float32)
        o1, r1, *_ = ours.step(action)
        o2, r2, *_ = ref.step(action)
        np.testing.assert_allclose(o1, o2, rtol=1e-5, atol=1e-6)
        assert np.isclose(r1, r2, rtol=1e-6)
    assert o1.dtype == np.float32
    np.testing.assert_allclose(ours.env.obs_rms.var, ref.env.obs_rms.var, rtol=1e-6)
    assert np.shape(ours.return_rms.mean) == np.shape(ref.return_rms.mean)
