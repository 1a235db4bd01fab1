"""Tests for the sparse/delayed reward wrappers and their CLI parser."""

from __future__ import annotations

import functools
import pickle

import gymnasium as gym
import numpy as np
import pytest

from reflectrl.envs.gridworld import GridWorldEnv
from reflectrl.envs.wrappers import DelayedReward, SparseReward, parse_reward_wrapper


class CountingEnv(gym.Env):
    """Reward on step t (1-based) is t, or a seeded random value; fixed episode length."""

    def __init__(self, length: int = 7, truncate: bool = False, random_rewards: bool = False) -> None:
        self.length = length
        self.truncate = truncate
        self.random_rewards = random_rewards
        self.observation_space = gym.spaces.Discrete(length + 1)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return 0, {}

    def step(self, action):
        self._t += 1
        reward = float(self.np_random.normal()) if self.random_rewards else float(self._t)
        done = self._t >= self.length
        return self._t, reward, done and not self.truncate, done and self.truncate, {}


def rollout(env: gym.Env, seed: int = 0) -> tuple[list[float], list[bool]]:
    """Run one full episode; return paid rewards and the per-step 'done' flags."""
    env.reset(seed=seed)
    rewards, dones = [], []
    while True:
        _, r, term, trunc, _ = env.step(0)
        rewards.append(r)
        dones.append(term or trunc)
        if term or trunc:
            return rewards, dones


@pytest.mark.parametrize("truncate", [False, True])
def test_sparse_pays_sum_on_final_step(truncate: bool) -> None:
    rewards, dones = rollout(SparseReward(CountingEnv(7, truncate=truncate)))
    assert rewards == [0.0] * 6 + [28.0]
    assert dones == [False] * 6 + [True]


@pytest.mark.parametrize("truncate", [False, True])
def test_delayed_pays_every_k_and_at_end(truncate: bool) -> None:
    rewards, _ = rollout(DelayedReward(CountingEnv(7, truncate=truncate), k=3))
    assert rewards == [0.0, 0.0, 6.0, 0.0, 0.0, 15.0, 7.0]


def test_delayed_episode_ending_on_payment_step_pays_once() -> None:
    rewards, _ = rollout(DelayedReward(CountingEnv(6), k=3))
    assert rewards == [0.0, 0.0, 6.0, 0.0, 0.0, 15.0]


def test_delayed_k1_is_identity() -> None:
    assert rollout(DelayedReward(CountingEnv(7), k=1))[0] == rollout(CountingEnv(7))[0]
    assert rollout(DelayedReward(CountingEnv(7), k=1))[0] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def test_delayed_k_longer_than_episode_behaves_like_sparse() -> None:
    assert rollout(DelayedReward(CountingEnv(7), k=100))[0] == [0.0] * 6 + [28.0]


@pytest.mark.parametrize(
    "make", [SparseReward] + [functools.partial(DelayedReward, k=k) for k in (1, 3, 4)]
)
def test_paid_sum_equals_true_return(make) -> None:
    for seed in range(3):
        true_rewards, _ = rollout(CountingEnv(11, random_rewards=True), seed=seed)
        paid, _ = rollout(make(CountingEnv(11, random_rewards=True)), seed=seed)
        assert sum(paid) == pytest.approx(sum(true_rewards))


def test_paid_sum_equals_true_return_on_gridworld() -> None:
    def episode_returns(env: gym.Env) -> list[float]:
        rng = np.random.default_rng(0)
        returns = []
        for ep in range(4):
            env.reset(seed=ep)
            total, done = 0.0, False
            while not done:
                _, r, term, trunc, _ = env.step(int(rng.integers(4)))
                total += r
                done = term or trunc
            returns.append(total)
        return returns

    base = episode_returns(GridWorldEnv(size=4, layout="empty", max_episode_steps=30))
    assert 0.0 < sum(base) < 4.0  # a mix of successes and timeouts
    wrapped = DelayedReward(GridWorldEnv(size=4, layout="empty", max_episode_steps=30), k=5)
    assert episode_returns(wrapped) == base


@pytest.mark.parametrize("env, final_payment", [(SparseReward(CountingEnv(7)), 28.0),
                                                 (DelayedReward(CountingEnv(7), k=3), 7.0)])
def test_reset_clears_accumulator(env: gym.Env, final_payment: float) -> None:
    env.reset(seed=0)
    env.step(0)
    env.step(0)  # 3.0 accumulated, then the episode is abandoned
    paid, _ = rollout(env)
    assert paid[-1] == final_payment
    assert sum(paid) == 28.0


def test_reset_clears_step_count() -> None:
    env = DelayedReward(CountingEnv(7), k=3)
    env.reset(seed=0)
    env.step(0)  # counter would be off by one if reset did not clear it
    assert rollout(env)[0] == [0.0, 0.0, 6.0, 0.0, 0.0, 15.0, 7.0]


def test_wrappers_pickle() -> None:
    env = DelayedReward(CountingEnv(7), k=3)
    env.reset(seed=0)
    env.step(0)
    clone = pickle.loads(pickle.dumps(env))
    rest = [clone.step(0)[1] for _ in range(6)]
    assert rest == [0.0, 6.0, 0.0, 0.0, 15.0, 7.0]


@pytest.mark.parametrize("k", [0, -1, 1.5, "3", True])
def test_delayed_rejects_bad_k(k) -> None:
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        DelayedReward(CountingEnv(), k=k)


@pytest.mark.parametrize("spec", [None, "", "none", "None", "  "])
def test_parse_no_wrapper(spec) -> None:
    assert parse_reward_wrapper(spec) is None


def test_parse_wrappers() -> None:
    sparse = parse_reward_wrapper("sparse")
    assert isinstance(sparse(CountingEnv()), SparseReward)
    delayed = parse_reward_wrapper("delayed:3")
    wrapped = delayed(CountingEnv())
    assert isinstance(wrapped, DelayedReward) and wrapped.k == 3
    assert rollout(wrapped)[0] == [0.0, 0.0, 6.0, 0.0, 0.0, 15.0, 7.0]
    # Vector-env workers pickle the factory, so it must not be a lambda.
    assert pickle.loads(pickle.dumps(delayed))(CountingEnv()).k == 3
    assert pickle.loads(pickle.dumps(sparse)) is SparseReward


@pytest.mark.parametrize("spec", ["foo", "delayed", "delayed:", "delayed:0", "delayed:-2", "delayed:x",
                                  "delayed:1.5", "sparse:3", "sparse,", "sparse,foo"])
def test_parse_errors(spec: str) -> None:
    expected = r"unknown --wrapper .*use 'sparse', 'delayed:K' \(K a positive integer\) or 'velocity-cost\[:V\]'"
    with pytest.raises(ValueError, match=expected):
        parse_reward_wrapper(spec)


def test_wrappers_chain_with_commas_and_velocity_cost_takes_a_limit() -> None:
    from reflectrl.envs.cost import VelocityCost

    chained = parse_reward_wrapper("velocity-cost:2.5,delayed:3")
    env = pickle.loads(pickle.dumps(chained))(CountingEnv())
    assert isinstance(env, DelayedReward) and isinstance(env.env, VelocityCost) and env.env.threshold == 2.5
    for bad in ("velocity-cost:0", "velocity-cost:x", "velocity-cost:inf"):
        with pytest.raises(ValueError, match="speed limit must be a positive number"):
            parse_reward_wrapper(bad)
