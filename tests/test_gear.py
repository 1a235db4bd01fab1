"""GEAR advantage reweighting: batch geometry, winners and ties, weights, the value head's
fit, temperature=inf equals PPO bit for bit, knob validation."""

import json
import math

import pytest
import torch

from reflectrl.signals import Batch, SignalContext
from reflectrl.signals.gear.torch import (
    GEARConfig,
    GEARReweighting,
    returns_to_go,
    reweight,
    select_winners,
    trajectory_ids,
)


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


def test_no_weights_before_the_first_distillation():
    gen = torch.Generator().manual_seed(1)
    signal = GEARReweighting(GEARConfig())
    signal.bind(ctx())
    b = synthetic_batch(gen)
    assert signal.after_advantages(b) is None  # not distilled yet: w = 1
    assert signal.metrics()["weights_mean"] == 1.0 and signal.metrics()["weights_clipped_frac"] == 0.0
    signal.after_update(b)
    assert signal.after_advantages(synthetic_batch(gen)).weights.shape == (64, 8)


# log-weights chosen on both sides of the clip bounds [log 0.5, log 2] = [-0.69, 0.69], none near them
LOG_W = torch.tensor([-3.0, -2.0, -1.0, -0.5, 0.0, 0.3, 0.5, 1.0, 2.0, 3.0])


def test_weights_come_from_the_frozen_head_and_are_clipped():
    """w = clip(exp((V_frozen - V) / temperature)): by hand from the frozen head; editing the
    live head changes nothing until the next distillation refreshes the frozen copy."""
    gen = torch.Generator().manual_seed(1)
    signal = GEARReweighting(GEARConfig(diff_scale="none", temperature=2.0, w_min=0.5, w_max=2.0))
    signal.bind(ctx())
    signal.after_update(synthetic_batch(gen))
    b = synthetic_batch(gen)
    x = b.features.reshape(-1, 4)
    with torch.no_grad():
        v_frozen = signal.frozen(x).reshape(64, 8)
    # critic values that put the raw weights exp(z) well inside and well outside [0.5, 2]
    z = LOG_W[torch.arange(64 * 8) % len(LOG_W)].reshape(64, 8)
    b.values = v_frozen - 2.0 * z
    expected = torch.exp(z).clamp(0.5, 2.0)
    out = signal.after_advantages(b)
    assert torch.allclose(out.weights, expected, rtol=1e-5)
    inside = z.abs() < math.log(2)
    assert torch.allclose(out.weights[inside], torch.exp(z[inside]), rtol=1e-5)  # unclipped: the formula itself
    assert out.weights[z >= 1].eq(2.0).all() and out.weights[z <= -1].eq(0.5).all()
    m = signal.metrics()
    assert m["weights_clipped_frac"] == pytest.approx((~inside).float().mean().item())
    assert 0.3 < m["weights_clipped_frac"] < 0.9
    assert (m["weights_min"], m["weights_max"]) == (0.5, 2.0)

    # a change to the live head after the freeze does not reach the weights ...
    with torch.no_grad():
        for p in signal.head.parameters():
            p.add_(0.3)
        v_live = signal.head(x).reshape(64, 8)
    live = torch.exp((v_live - b.values) / 2.0).clamp(0.5, 2.0)
    assert not torch.allclose(live, expected, atol=1e-3)  # the live head would give other weights
    assert torch.equal(signal.after_advantages(b).weights, out.weights)

    # ... until the next distillation refreshes the frozen copy from the live head
    signal.after_update(synthetic_batch(gen))
    head, frozen = signal.head.state_dict(), signal.frozen.state_dict()
    assert all(torch.equal(head[k], frozen[k]) for k in head)
    with torch.no_grad():
        v_new = signal.head(x).reshape(64, 8)
    refreshed = signal.after_advantages(b).weights
    assert torch.allclose(refreshed, torch.exp((v_new - b.values) / 2.0).clamp(0.5, 2.0), rtol=1e-5)
    assert not torch.allclose(refreshed, out.weights, atol=1e-3)


class FixedHead(torch.nn.Module):
    """A stand-in frozen head that outputs given values, one per step."""

    def __init__(self, values):
        super().__init__()
        self.values = torch.tensor(values).unsqueeze(-1)

    def forward(self, x):
        return self.values[: x.shape[0]]


V = [0.0, 2.0, 4.0, 6.0]        # critic values; sample std sqrt(20/3) = 2.5820
D = [3.5, 2.5, 3.25, 2.75]      # V_d - V: a batch-wide offset 3 plus +-0.5, +-0.25; sample std 0.45644
# standardize: z = (D - 3) / 0.45644 = [1.0954, -1.0954, 0.5477, -0.5477]; w = exp(z / 2)
# (the offset is gone: two weights above 1, two below)
# value_std:   w = exp(D / (2 * 2.5820)) = exp([0.6778, 0.4841, 0.6294, 0.5325])
# none:        w = exp(D / 2) = exp([1.75, 1.25, 1.625, 1.375]), all above w_max = 2
@pytest.mark.parametrize("diff_scale, weights, clipped_frac", [
    ("standardize", [1.72931, 0.57827, 1.31503, 0.76044], 0.0),
    ("value_std", [1.96948, 1.62275, 1.87641, 1.70324], 0.0),
    ("none", [2.0, 2.0, 2.0, 2.0], 1.0),
])
def test_diff_scale_by_hand(diff_scale, weights, clipped_frac):
    signal = GEARReweighting(GEARConfig(diff_scale=diff_scale, temperature=2.0, w_min=0.5, w_max=2.0))
    signal.bind(ctx())
    signal.frozen = FixedHead([v + d for v, d in zip(V, D)])
    signal.distilled = True
    b = Batch(obs=torch.zeros(4, 1, 3), actions=torch.zeros(4, 1, dtype=torch.long), rewards=torch.zeros(4, 1),
              terminations=torch.zeros(4, 1, dtype=torch.bool), truncations=torch.zeros(4, 1, dtype=torch.bool),
              values=col(*V), next_values=torch.zeros(4, 1), advantages=torch.ones(4, 1),
              features=torch.zeros(4, 1, 4))
    out = signal.after_advantages(b)
    assert out.weights.squeeze(1).tolist() == pytest.approx(weights, abs=1e-5)
    assert signal.metrics()["weights_clipped_frac"] == clipped_frac


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
    ("gear.temperature_start=-1", "gear.temperature_start=-1.0"),
    ("gear.warmup_steps=-5", "gear.warmup_steps=-5"),
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


def test_temperature_schedule_known_answers():
    from reflectrl.signals.gear.torch import scheduled_temperature

    cfg = GEARConfig(temperature=2.0, warmup_steps=100, temperature_steps=200)
    assert math.isinf(scheduled_temperature(0, cfg)) and math.isinf(scheduled_temperature(99, cfg))
    assert math.isinf(scheduled_temperature(100, cfg))  # the ramp starts at 1 / inf = 0
    assert scheduled_temperature(200, cfg) == pytest.approx(4.0)  # halfway: 1/T = 0.25
    assert scheduled_temperature(300, cfg) == pytest.approx(2.0) and scheduled_temperature(10**6, cfg) == 2.0
    ramp = GEARConfig(temperature=1.0, temperature_start=4.0, temperature_steps=100)
    assert scheduled_temperature(0, ramp) == pytest.approx(4.0)
    assert scheduled_temperature(50, ramp) == pytest.approx(1 / (0.5 / 4 + 0.5 / 1))
    assert scheduled_temperature(7, GEARConfig(temperature=3.0)) == 3.0  # no schedule


def test_warm_up_keeps_weights_at_one_while_the_head_distils():
    gen = torch.Generator().manual_seed(1)
    signal = GEARReweighting(GEARConfig(warmup_steps=1000))
    signal.bind(ctx())
    signal.after_update(synthetic_batch(gen))
    assert signal.distilled
    b = synthetic_batch(gen)
    b.global_step = 999
    assert signal.after_advantages(b) is None and math.isinf(signal.metrics()["gear_temperature"])
    b.global_step = 1000
    out = signal.after_advantages(b)
    assert out.weights.shape == (64, 8) and not out.weights.eq(1).all()
    assert signal.metrics()["gear_temperature"] == 2.0
