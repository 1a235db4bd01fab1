"""The episodic count bonus (issue 15 item 5): hand-computed counts with the episodic reset,
neutral = PPO bit for bit, composition with GEAR, resume."""

import numpy as np
import pytest
import torch
from test_exploration import _config, resume_matches

from reflectrl.errors import UserError
from reflectrl.signals import Batch, SignalContext
from reflectrl.signals.count.torch import CountBonus, CountConfig


def _bound(**knobs):
    signal = CountBonus(CountConfig(**knobs))
    signal.bind(SignalContext(obs_dim=4, action_dim=2, discrete=True, feature_dim=4, learning_rate=1e-3, gamma=0.99,
                              gae_lambda=0.95, seed=1, total_iterations=10))
    return signal


# env 0: 0 -> 1 -> 2 -> 1 -> 0 (episode ends), then a new episode starts in 7 and steps to 8;
# env 1 stays in state 3 throughout.
STATE = np.array([[0, 3], [1, 3], [2, 3], [1, 3], [7, 3]])
NEXT = np.array([[1, 3], [2, 3], [1, 3], [0, 3], [8, 3]])
ENDED = np.array([[0, 0], [0, 0], [0, 0], [1, 0], [0, 0]], dtype=bool)


def test_episodic_counts_by_hand():
    signal = _bound(beta=0.5)
    n = signal.visits(STATE, NEXT, ENDED)
    # env 0: counts start {0: 1}; 1 -> 1, 2 -> 1, 1 -> 2, 0 -> 2 (its first state counted); reset {7: 1}, 8 -> 1
    # env 1: counts start {3: 1}; 3 -> 2, 3, 4, 5, 6
    assert n.tolist() == [[1, 2], [1, 3], [2, 4], [2, 5], [1, 6]]
    # the next rollout continues the running episodes: env 0 is in {7: 1, 8: 1}, env 1 in {3: 6}
    n = signal.visits(np.array([[8, 3]]), np.array([[7, 3]]), np.array([[1, 0]], dtype=bool))
    assert n.tolist() == [[2, 7]]
    # env 0's episode ended: its next step starts from fresh counts
    n = signal.visits(np.array([[7, 3]]), np.array([[8, 3]]), np.array([[0, 0]], dtype=bool))
    assert n.tolist() == [[1, 8]]


def test_bonus_is_beta_over_sqrt_count_as_a_reward_term():
    signal = _bound(beta=0.5)
    zeros = torch.zeros(5, 2)
    ended = torch.from_numpy(ENDED)
    batch = Batch(obs=torch.zeros(5, 2, 4), actions=zeros.long(), rewards=zeros, terminations=ended,
                  truncations=torch.zeros(5, 2, dtype=torch.bool), values=zeros, next_values=zeros,
                  state_keys=torch.from_numpy(STATE), next_state_keys=torch.from_numpy(NEXT))
    bonus = signal.shape_rewards(batch)
    expected = 0.5 / np.sqrt(np.array([[1, 2], [1, 3], [2, 4], [2, 5], [1, 6]]))
    assert bonus.dtype == torch.float32 and np.allclose(bonus.numpy(), expected)
    assert signal.metrics()["count_new_frac"] == pytest.approx(3 / 10)


def test_non_episodic_counts_span_episodes_and_envs():
    signal = _bound(episodic=False)
    n = signal.visits(STATE, NEXT, ENDED)
    # one table: env 0 counts 0:1, then 1, 2, 1, 0 -> 1, 1, 2, 2; then start 7 (1), 8 -> 1; env 1: 3 counted once
    # at its start, then 2..6
    assert n.tolist() == [[1, 2], [1, 3], [2, 4], [2, 5], [1, 6]]
    n = signal.visits(np.array([[1, 3]]), np.array([[2, 3]]), np.array([[0, 0]], dtype=bool))
    assert n.tolist() == [[2, 7]]  # 2 was seen in the earlier episode


def test_bad_beta():
    with pytest.raises(UserError, match="count.beta=-1"):
        CountConfig(beta=-1).validate()


def test_neutral_count_is_ppo_bit_for_bit_and_default_is_not():
    from reflectrl.trainers.policies import params_sha256
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    sha = {}
    for name, algo, extra in (("ppo", "ppo", ()), ("neutral", "ppo+count", ("count.beta=0",)),
                              ("count", "ppo+count", ())):
        trainer = PPOTrainer(_config(algo, extra=extra))
        trainer.train(progress=False)
        sha[name] = params_sha256(trainer.agent)
    assert sha["neutral"] == sha["ppo"] != sha["count"]


def test_count_with_gear_runs_and_resumes_bit_identically(tmp_path, monkeypatch):
    rows, trainer = resume_matches(tmp_path, monkeypatch, "ppo+count+gear", env="MiniGrid-Empty-5x5-v0")
    assert "count_bonus_mean" in rows[-1] and "weights_mean" in rows[-1]
    assert len(trainer.signal.members[0].counts) == 2  # per-env episode counts came back from the checkpoint
