"""GEAR advantage reweighting: batch geometry, winners and ties, weights, the value head's
fit, temperature=inf equals PPO bit for bit, knob validation."""

import json
import math

import pytest
import torch

from reflectrl.signals import Batch, SignalContext
from reflectrl.signals.reweighting import (GEARConfig, GEARReweighting, returns_to_go, reweight, select_winners,
                                           trajectory_ids)


def col(*xs, dtype=torch.float32):
    return torch.tensor(xs, dtype=dtype).unsqueeze(1)


def test_trajectory_ids_split_at_episode_ends_env_by_env():
    term = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 1]], dtype=torch.bool)
    trunc = torch.tensor([[0, 0], [0, 0], [1, 0], [0, 0]], dtype=torch.bool)
    ids = trajectory_ids(term, trunc)
    # env 0: steps 0-1 | 2 | 3 ; env 1: steps 0-3
    assert ids[:, 0].tolist() == [0, 0, 1, 2]
    assert ids[:, 1].tolist() == [3, 3, 3, 3]


def test_winners_and_tie_rule():
    outcomes = torch.tensor([1.0, 0.0, 1.0, 1.0])
    lengths = torch.tensor([5, 3, 2, 5])
    # k = 2 of 4: all three with outcome 1 tie; the shorter (index 2) first, then the earlier (0)
    assert select_winners(outcomes, lengths, 0.5).tolist() == [True, False, True, False]
    assert select_winners(outcomes, lengths, 0.01).tolist() == [False, False, True, False]  # at least one
    assert select_winners(outcomes, lengths, 1.0).all()


def test_returns_to_go_within_trajectories():
    rewards = col(1.0, 2.0, 3.0, 4.0)
    ids = col(0, 0, 1, 1, dtype=torch.long)
    g = returns_to_go(rewards, ids, 0.5)
    assert g.squeeze(1).tolist() == pytest.approx([1 + 0.5 * 2, 2, 3 + 0.5 * 4, 4])


def test_weight_formula_clipping_and_renormalisation():
    v_d = torch.tensor([[1.0], [0.0], [3.0], [-3.0]])
    v = torch.zeros(4, 1)
    w, clipped = reweight(v_d, v, 2.0, 0.5, 2.0)
    expect = [math.exp(0.5), 1.0, 2.0, 0.5]  # exp(1.5) and exp(-1.5) clip
    assert w.squeeze(1).tolist() == pytest.approx(expect)
    assert clipped.squeeze(1).tolist() == [False, False, True, True]
    ids = torch.tensor([[0], [0], [1], [1]])
    w, _ = reweight(v_d, v, 2.0, 0.5, 2.0, ids, renormalize=True)
    assert (w[:2].mean().item(), w[2:].mean().item()) == pytest.approx((1.0, 1.0))
    assert w[0, 0].item() / w[1, 0].item() == pytest.approx(math.exp(0.5))  # ratios kept
    w, clipped = reweight(v_d, v, math.inf, 0.5, 2.0)
    assert w.eq(1).all() and not clipped.any()


def ctx(feature_dim=4, iterations=10):
    return SignalContext(obs_dim=3, action_dim=2, discrete=True, feature_dim=feature_dim, learning_rate=1e-3,
                         gamma=0.9, gae_lambda=0.95, seed=0, total_iterations=iterations)


def synthetic_batch(gen, T=64, N=8):
    features = torch.rand(T, N, 4, generator=gen) * 2 - 1
    ends = torch.rand(T, N, generator=gen) < 0.1
    rewards = (2 * features[..., 0] - features[..., 1]) * ends.float()  # paid at episode ends
    return Batch(obs=torch.zeros(T, N, 3), actions=torch.zeros(T, N, dtype=torch.long), rewards=rewards,
                 terminations=ends, truncations=torch.zeros_like(ends), values=torch.zeros(T, N),
                 next_values=torch.zeros(T, N), advantages=torch.randn(T, N, generator=gen), features=features)


def test_value_head_learns_a_known_return_function():
    gen = torch.Generator().manual_seed(0)
    signal = GEARReweighting(GEARConfig(distill_on="all", return_kind="trajectory", head="mlp", epochs=10,
                                        lr_multiplier=5.0))
    signal.bind(ctx())
    losses = []
    for _ in range(30):
        b = synthetic_batch(gen)
        # a known return function of the features: the trajectory outcome of each step
        b.features = b.features.clone()
        b.rewards = torch.zeros_like(b.rewards)
        b.terminations = torch.ones_like(b.terminations)  # one-step trajectories: outcome = reward
        b.rewards = 2 * b.features[..., 0] - b.features[..., 1] + 0.5
        signal.after_update(b)
        losses.append(signal.metrics()["value_head_loss"])
    variance = float((2 * torch.rand(10000, generator=gen) - 1).var() * 5)  # var(2x0 - x1) for uniform inputs
    assert losses[0] > 0.5 * variance
    assert losses[-1] < 0.02 * variance


def test_frozen_head_is_used_and_no_weights_before_first_distillation():
    gen = torch.Generator().manual_seed(1)
    signal = GEARReweighting(GEARConfig())
    signal.bind(ctx())
    b = synthetic_batch(gen)
    assert signal.after_advantages(b) is None  # not distilled yet: w = 1
    signal.after_update(b)
    frozen = {k: v.clone() for k, v in signal.frozen.state_dict().items()}
    out = signal.after_advantages(synthetic_batch(gen))
    assert out.weights.shape == (64, 8)
    assert out.weights.min() >= 0.5 and out.weights.max() <= 2.0
    # fitting the live head again must not move the frozen one until the refresh
    with torch.no_grad():
        for p in signal.head.parameters():
            p.add_(1.0)
    assert all(torch.equal(frozen[k], v) for k, v in signal.frozen.state_dict().items())


FAST = ["--env", "CartPole-v1", "--total-steps", "2048", "--no-progress"]


def test_temperature_inf_equals_ppo_bit_for_bit(cli, tmp_path):
    sha = lambda d: json.loads((d / "run.json").read_text())["params_sha256"]  # noqa: E731
    assert cli("train", "--algo", "ppo", *FAST, "--out", tmp_path / "ppo")[0] == 0
    assert cli("train", "--algo", "gear", *FAST, "--out", tmp_path / "inf", "--set", "gear.temperature=inf")[0] == 0
    assert cli("train", "--algo", "gear", *FAST, "--out", tmp_path / "on")[0] == 0
    assert sha(tmp_path / "inf") == sha(tmp_path / "ppo")
    assert sha(tmp_path / "on") != sha(tmp_path / "ppo")
    row = json.loads((tmp_path / "on" / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("weights_mean", "weights_std", "weights_min", "weights_max", "weights_clipped_frac", "value_head_loss"):
        assert row[key] is not None


@pytest.mark.parametrize("knob, needle", [
    ("gear.top_frac=0", "gear.top_frac=0.0"),
    ("gear.temperature=0", "gear.temperature=0.0"),
    ("gear.w_min=1.5", "w_min=1.5"),
    ("gear.distill_on=losers", "gear.distill_on='losers'"),
    ("gear.return_kind=mc", "gear.return_kind='mc'"),
    ("gear.head=transformer", "gear.head='transformer'"),
    ("gear.epochs=0", "gear.epochs=0"),
])
def test_bad_knobs(cli, tmp_path, knob, needle):
    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "gear", *FAST, "--out", out, "--set", knob)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not out.exists()


def test_returns_to_go_bootstrap_where_a_trajectory_is_cut():
    rewards = col(1.0, 1.0, 1.0)
    ids = col(0, 0, 1, dtype=torch.long)  # trajectory 0 ends at step 1, trajectory 1 is cut by the batch end
    boot = col(0.0, 10.0, 20.0)          # values after steps 1 and 2 (0 would be a termination)
    g = returns_to_go(rewards, ids, 0.5, boot)
    assert g.squeeze(1).tolist() == pytest.approx([1 + 0.5 * (1 + 0.5 * 10), 1 + 0.5 * 10, 1 + 0.5 * 20])
