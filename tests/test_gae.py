"""GAE against hand-computed values, including termination vs truncation."""

import pytest
import torch

from reflectrl.estimators import compute_gae


def col(*xs):
    return torch.tensor(xs, dtype=torch.float32).unsqueeze(1)  # (T, 1)


def test_no_episode_end_matches_hand_computation():
    gamma, lam = 0.9, 0.8
    rewards, values = col(1.0, 0.0, 2.0), col(0.5, 1.0, 1.5)
    next_values = col(1.0, 1.5, 3.0)  # V(s1), V(s2), V(s3) bootstrap
    zeros = torch.zeros_like(rewards, dtype=torch.bool)
    adv, ret = compute_gae(rewards, values, next_values, zeros, zeros, gamma, lam)
    d0 = 1.0 + 0.9 * 1.0 - 0.5   # 1.4
    d1 = 0.0 + 0.9 * 1.5 - 1.0   # 0.35
    d2 = 2.0 + 0.9 * 3.0 - 1.5   # 3.2
    a2 = d2
    a1 = d1 + 0.72 * a2
    a0 = d0 + 0.72 * a1
    assert adv.squeeze(1).tolist() == pytest.approx([a0, a1, a2])
    assert ret.squeeze(1).tolist() == pytest.approx([a0 + 0.5, a1 + 1.0, a2 + 1.5])


def test_termination_drops_bootstrap_and_cuts_trace():
    gamma, lam = 0.9, 0.8
    rewards, values = col(1.0, 5.0, 2.0), col(0.5, 1.0, 1.5)
    next_values = col(1.0, 99.0, 3.0)  # 99 = value of the next episode's start: must be ignored
    term = col(0, 1, 0).bool()
    trunc = torch.zeros_like(term)
    adv, _ = compute_gae(rewards, values, next_values, term, trunc, gamma, lam)
    a2 = 2.0 + 0.9 * 3.0 - 1.5
    a1 = 5.0 - 1.0                      # no bootstrap, no trace from step 2
    a0 = (1.0 + 0.9 * 1.0 - 0.5) + 0.72 * a1
    assert adv.squeeze(1).tolist() == pytest.approx([a0, a1, a2])


def test_truncation_bootstraps_from_final_value_but_cuts_trace():
    gamma, lam = 0.9, 0.8
    rewards, values = col(1.0, 5.0, 2.0), col(0.5, 1.0, 1.5)
    next_values = col(1.0, 4.0, 3.0)  # 4.0 = V(final observation) of the truncated episode
    term = torch.zeros((3, 1), dtype=torch.bool)
    trunc = col(0, 1, 0).bool()
    adv, _ = compute_gae(rewards, values, next_values, term, trunc, gamma, lam)
    a2 = 2.0 + 0.9 * 3.0 - 1.5
    a1 = 5.0 + 0.9 * 4.0 - 1.0          # bootstraps, but step 2 is another episode
    a0 = (1.0 + 0.9 * 1.0 - 0.5) + 0.72 * a1
    assert adv.squeeze(1).tolist() == pytest.approx([a0, a1, a2])


def test_truncation_differs_from_termination():
    rewards, values, next_values = col(0.0, 0.0), col(0.0, 0.0), col(0.0, 10.0)
    flag = col(0, 1).bool()
    none = torch.zeros_like(flag)
    adv_term, _ = compute_gae(rewards, values, next_values, flag, none, 0.99, 0.95)
    adv_trunc, _ = compute_gae(rewards, values, next_values, none, flag, 0.99, 0.95)
    assert adv_term[1, 0].item() == 0.0
    assert adv_trunc[1, 0].item() == pytest.approx(9.9)


def test_envs_are_independent_columns():
    gamma, lam = 0.99, 0.95
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    values = torch.tensor([[0.2, 0.3], [0.4, 0.5]])
    next_values = torch.tensor([[0.4, 0.5], [0.7, 0.9]])
    term = torch.tensor([[False, True], [False, False]])
    trunc = torch.zeros_like(term)
    adv, _ = compute_gae(rewards, values, next_values, term, trunc, gamma, lam)
    for n in range(2):
        a, _ = compute_gae(rewards[:, n:n + 1], values[:, n:n + 1], next_values[:, n:n + 1],
                           term[:, n:n + 1], trunc[:, n:n + 1], gamma, lam)
        assert torch.allclose(adv[:, n:n + 1], a)
