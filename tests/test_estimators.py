"""The one backward recursion, as GAE and as GEAR's returns-to-go, against hand-computed
values: termination drops the bootstrap, truncation and the batch end keep it, and either
kind of episode end stops the sum."""

import pytest
import torch

from reflectrl.estimators import (
    compute_gae,
    discounted_backward,
    discounted_returns,
    discounted_returns_from_ends,
    episode_continues,
)
from reflectrl.signals.gear.torch import returns_to_go, trajectory_ids


def col(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype).unsqueeze(1)  # (T, 1)


def flags(*xs):
    return col(*xs).bool()


def test_backward_recursion_by_hand():
    x, carry = col(1.0, 2.0, 3.0), col(0.5, 0.0, 0.5)  # carry[1] = 0: the sum stops after step 1
    y = discounted_backward(x, carry).squeeze(1).tolist()
    assert y == pytest.approx([1.0 + 0.5 * 2.0, 2.0, 3.0])


def test_both_loops_give_the_same_bits():
    """Few envs run a scalar loop per env, many a loop over rows: the same float32 roundings."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 8, generator=g) * 5
    carry = (torch.rand(50, 8, generator=g) > 0.1).float() * 0.97
    together = discounted_backward(x, carry)  # 8 envs: the row loop
    for n in range(8):
        alone = discounted_backward(x[:, n:n + 1], carry[:, n:n + 1])  # 1 env: the scalar loop
        assert torch.equal(together[:, n:n + 1], alone)
    assert together.dtype == torch.float32
    assert discounted_backward(x.double(), carry).dtype == torch.float64


def test_gae_by_hand_with_termination_and_truncation():
    gamma, lam = 0.9, 0.5
    rewards = col(1.0, 2.0, 0.5, 1.0, 3.0)
    values = col(0.2, 0.4, 0.6, 0.8, 1.0)
    next_values = col(0.4, 99.0, 0.8, 5.0, 2.0)  # 99 after a termination: ignored
    term, trunc = flags(0, 1, 0, 0, 0), flags(0, 0, 0, 1, 0)
    adv, ret = compute_gae(rewards, values, next_values, term, trunc, gamma, lam)
    d4 = 3.0 + 0.9 * 2.0 - 1.0        # the batch end bootstraps
    d3 = 1.0 + 0.9 * 5.0 - 0.8        # a truncation bootstraps from V(final observation)...
    d2 = 0.5 + 0.9 * 0.8 - 0.6
    d1 = 2.0 - 0.4                    # a termination does not
    d0 = 1.0 + 0.9 * 0.4 - 0.2
    a4, a3 = d4, d3                   # ...and both stop the trace
    a2 = d2 + 0.45 * a3
    a1 = d1
    a0 = d0 + 0.45 * a1
    assert adv.squeeze(1).tolist() == pytest.approx([a0, a1, a2, a3, a4])
    assert ret.squeeze(1).tolist() == pytest.approx([a + v for a, v in zip([a0, a1, a2, a3, a4],
                                                                            [0.2, 0.4, 0.6, 0.8, 1.0])])


def test_returns_to_go_by_hand_with_termination_and_truncation():
    gamma = 0.5
    rewards = col(1.0, 2.0, 4.0, 8.0, 1.0)
    next_values = col(0.0, 7.0, 0.0, 6.0, 10.0)
    term, trunc = flags(0, 1, 0, 0, 0), flags(0, 0, 0, 1, 0)
    g = discounted_returns_from_ends(rewards, next_values, term, trunc, gamma).squeeze(1).tolist()
    g4 = 1.0 + 0.5 * 10.0            # the batch end: continued with V(next state)
    g3 = 8.0 + 0.5 * 6.0             # truncated: continued with V(final observation)
    g2 = 4.0 + 0.5 * g3
    g1 = 2.0                         # terminated: nothing after it (7.0 ignored)
    g0 = 1.0 + 0.5 * g1
    assert g == pytest.approx([g0, g1, g2, g3, g4])
    assert episode_continues(term, trunc).squeeze(1).tolist() == [True, False, True, False, False]


def test_gears_returns_to_go_is_the_shared_recursion():
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(40, 3, generator=g)
    next_values = torch.randn(40, 3, generator=g)
    term = torch.rand(40, 3, generator=g) < 0.1
    trunc = (torch.rand(40, 3, generator=g) < 0.1) & ~term
    bootstrap = next_values * (1.0 - term.float())
    gear = returns_to_go(rewards, trajectory_ids(term, trunc), 0.9, bootstrap)
    assert torch.equal(gear, discounted_returns_from_ends(rewards, next_values, term, trunc, 0.9))
    assert torch.equal(returns_to_go(rewards, trajectory_ids(term, trunc), 0.9),
                       discounted_returns(rewards, 0.9, episode_continues(term, trunc)))


def test_gae_with_lambda_one_is_the_bootstrapped_return_minus_the_value():
    """With consistent values (V'(t) = V(t+1) inside an episode) the two estimators agree:
    GAE(lambda=1) + V is the discounted return, continued with V' at truncations and at the
    batch end, and with nothing at terminations."""
    g = torch.Generator().manual_seed(1)
    T, N = 30, 4
    rewards, values = torch.randn(T, N, generator=g), torch.randn(T, N, generator=g)
    term = torch.rand(T, N, generator=g) < 0.1
    trunc = (torch.rand(T, N, generator=g) < 0.1) & ~term
    next_values = torch.randn(T, N, generator=g)  # V(final observation) where an episode ends, and after the batch
    inside = ~(term | trunc)
    next_values[:-1] = torch.where(inside[:-1], values[1:], next_values[:-1])
    adv, ret = compute_gae(rewards, values, next_values, term, trunc, 0.95, 1.0)
    expected = discounted_returns_from_ends(rewards, next_values, term, trunc, 0.95)
    torch.testing.assert_close(ret, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv, expected - values, rtol=1e-5, atol=1e-5)
