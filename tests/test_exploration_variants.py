"""Issue 42's exploration forms of the seed signals, on the torch backend: the uncertainty bonus
(calibration.mode=uncertainty), decay schedules (count/rnd/calibration.schedule), shaping's
distill=total and GEAR's advantage/select over the reward streams. Each is checked against its
definition on hand-made tensors, its neutral setting against today's run bit for bit, and its
refusals for one clear line."""

import json
import math

import pytest
import torch

from reflectrl.errors import UserError
from reflectrl.signals import Batch, SignalContext, build_signals
from reflectrl.signals.calibration.torch import CalibrationBonus, CalibrationConfig
from reflectrl.signals.count.torch import CountBonus, CountConfig
from reflectrl.signals.gear.torch import GEARConfig, reward_parts
from reflectrl.signals.rnd import RndConfig
from reflectrl.signals.schedule import progress, schedule_factor
from reflectrl.signals.shaping import ShapingConfig

GRID = "reflectrl/GridWorld-v0"


def ctx(obs_dim=4, action_dim=2, iterations=10):
    return SignalContext(obs_dim=obs_dim, action_dim=action_dim, discrete=True, feature_dim=4, learning_rate=1e-3,
                         gamma=0.9, gae_lambda=0.95, seed=1, total_iterations=iterations)


def batch(T=6, N=2, obs_dim=4, rewards=None, iteration=1, global_step=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (T, N)
    return Batch(obs=torch.randn(T, N, obs_dim, generator=g), actions=torch.randint(0, 2, shape, generator=g),
                 rewards=torch.zeros(shape) if rewards is None else rewards,
                 terminations=torch.zeros(shape, dtype=torch.bool), truncations=torch.zeros(shape, dtype=torch.bool),
                 values=torch.randn(shape, generator=g), next_values=torch.randn(shape, generator=g),
                 advantages=torch.randn(shape, generator=g), iteration=iteration, global_step=global_step)


# ------------------------------------------------------------------------------ schedules

def test_schedule_factors():
    assert schedule_factor("constant", 0.7) == 1.0
    assert schedule_factor("linear", 0.25) == pytest.approx(0.75)
    assert schedule_factor("linear", 1.5) == 0.0
    assert schedule_factor("exponential", 0.0) == 1.0
    assert schedule_factor("exponential", 1.0) == pytest.approx(0.01)
    assert schedule_factor("exponential", 0.5) == pytest.approx(0.1)
    # progress: by steps where schedule_steps is given, else by iterations
    assert progress(1000, global_step=250, iteration=1, total_iterations=99) == 0.25
    assert progress(0, global_step=250, iteration=3, total_iterations=12) == 0.25


def test_count_schedule_scales_the_bonus():
    keys = torch.arange(12).reshape(6, 2)  # every state new: n = 1 everywhere
    b = batch(iteration=5)
    b.state_keys, b.next_state_keys = keys, keys + 100
    for schedule, factor in (("constant", 1.0), ("linear", 0.5), ("exponential", 0.01 ** 0.5)):
        signal = CountBonus(CountConfig(beta=0.2, schedule=schedule))
        signal.bind(ctx(iterations=10))
        bonus = signal.shape_rewards(b)
        assert torch.allclose(bonus, torch.full((6, 2), 0.2 * factor)), schedule
        assert signal.metrics()["count_beta"] == pytest.approx(0.2 * factor)


@pytest.mark.parametrize("section,config", [("count", CountConfig), ("rnd", RndConfig),
                                            ("calibration", CalibrationConfig)])
def test_schedule_refusals(section, config):
    with pytest.raises(UserError, match=rf"^{section}\.schedule='cosine': use one of constant, linear, exponential$"):
        config(schedule="cosine").validate()
    with pytest.raises(UserError, match=rf"^{section}\.schedule_steps=-1"):
        config(schedule_steps=-1).validate()


# ------------------------------------------------------------------------------ uncertainty

def uncertainty(**knobs):
    signal = CalibrationBonus(CalibrationConfig(mode="uncertainty", **knobs))
    signal.bind(ctx())
    return signal


def test_uncertainty_bonus_is_the_heads_disagreement_before_their_fit():
    signal = uncertainty(alpha=0.3, beta=2.0, ensemble=4)
    b = batch()
    x = signal._inputs(b.obs.reshape(12, -1), None, b.actions.reshape(-1))
    with torch.no_grad():
        before = torch.stack([h.head(x).squeeze(-1) for h in signal.heads])
    weights = [h.flat.detach().clone() for h in signal.heads]
    out = signal.after_advantages(b)
    expected = 2.0 * 0.3 * before.std(0, unbiased=False)
    assert torch.allclose(out.reward.reshape(-1), expected, atol=1e-6)
    assert out.recompute
    # zero rewards (no reward yet): the bonus is there all the same, and the heads were fit after it
    assert out.reward.abs().min() > 0
    assert all(not torch.equal(w, h.flat) for w, h in zip(weights, signal.heads))
    m = signal.metrics()
    assert m["bonus_to_reward"] is None  # no reward to compare with
    assert m["ensemble_std"] == pytest.approx(before.std(0, unbiased=False).mean().item(), rel=1e-5)
    assert m["bonus_mean"] == pytest.approx(expected.mean().item(), rel=1e-5)


def test_uncertainty_heads_differ_and_learn_where_they_are_fit():
    """Fit on one batch again and again, the heads agree there (the disagreement falls) while
    they still disagree on rows they have never seen."""
    signal = uncertainty(alpha=1.0, epochs=20, bootstrap=0.8)
    b = batch(T=16, N=4, seed=1)
    first = signal.after_advantages(b).reward.mean().item()
    for _ in range(15):
        last = signal.after_advantages(b).reward.mean().item()
    unseen = batch(T=16, N=4, seed=2)
    unseen.obs = unseen.obs * 3.0
    novel = signal.after_advantages(unseen).reward.mean().item()
    assert last < 0.5 * first
    assert novel > 2 * last


def test_uncertainty_raw_target_agrees_where_the_agent_has_been():
    """ensemble_target=raw: with no reward the advantages are ~0, so fitting them makes the heads
    agree on the rows they were fit on, while rows never seen keep their disagreement."""
    signal = uncertainty(alpha=1.0, epochs=20, bootstrap=0.8, ensemble_target="raw")
    b = batch(T=16, N=4, seed=1)
    b.advantages = torch.zeros_like(b.advantages)
    first = signal.after_advantages(b).reward.mean().item()
    for _ in range(15):
        last = signal.after_advantages(b).reward.mean().item()
    unseen = batch(T=16, N=4, seed=2)
    unseen.obs = unseen.obs * 3.0
    assert last < 0.2 * first
    assert signal.after_advantages(unseen).reward.mean().item() > 3 * last
    with pytest.raises(UserError, match="^calibration.ensemble_target='scaled': use one of normalized, raw$"):
        CalibrationConfig(ensemble_target="scaled").validate()


def test_uncertainty_schedule_and_alpha_zero():
    signal = uncertainty(alpha=0.5, schedule="linear")
    signal.after_advantages(batch(iteration=5))  # progress 0.5 of 10 iterations
    assert signal.metrics()["calibration_alpha"] == pytest.approx(0.25)
    zero = uncertainty(alpha=0.0)
    assert torch.count_nonzero(zero.after_advantages(batch()).reward) == 0


def test_uncertainty_checkpoint_round_trip():
    a, b = uncertainty(), uncertainty()
    a.after_advantages(batch())
    b.load_state_dict(a.state_dict())
    for ha, hb in zip(a.heads, b.heads):
        assert torch.equal(ha.flat, hb.flat)
    nxt = batch(seed=3)
    a.generator.manual_seed(5), b.generator.manual_seed(5)
    assert torch.equal(a.after_advantages(nxt).reward, b.after_advantages(nxt).reward)


@pytest.mark.parametrize("knobs,message", [
    ({"ensemble": 1}, "calibration.ensemble=1: needs at least 2 heads"),
    ({"bootstrap": 0.0}, "calibration.bootstrap=0.0: must be in (0, 1]"),
    ({"mode": "novelty"}, "calibration.mode='novelty': use one of miscalibration, uncertainty"),
    ({"mode": "uncertainty", "shared_trunk": True, "inputs": "features_action"},
     "calibration.shared_trunk=true trains the actor's trunk"),
])
def test_uncertainty_refusals(knobs, message):
    with pytest.raises(UserError, match=f"^{message}".replace("(", r"\(").replace(")", r"\)")):
        CalibrationConfig(**knobs).validate()


# ------------------------------------------------------------------------------ streams

def stream_batch():
    b = batch(rewards=torch.tensor([[0.0, 1.0]] * 6))
    b.terminations[2, 0] = True
    b.stream_weights = {"rnd": 0.5}
    v, v_next = torch.full((6, 2), 2.0), torch.full((6, 2), 3.0)
    b.stream_values = lambda: {"rnd": (v, v_next, False)}
    b.stream_rewards = {"rnd": torch.full((6, 2), 4.0)}
    return b


def test_reward_parts():
    b = stream_batch()
    r, v, boot = reward_parts(b, "extrinsic")
    assert r is b.rewards and v is b.values
    assert boot[2, 0] == 0 and boot[0, 0] == b.next_values[0, 0]
    r, v, boot = reward_parts(b, "intrinsic")
    assert torch.equal(r, torch.full((6, 2), 2.0)) and torch.equal(v, torch.full((6, 2), 1.0))
    assert torch.equal(boot, torch.full((6, 2), 1.5))  # a non-episodic stream runs on past the termination
    r, v, boot = reward_parts(b, "total")
    assert torch.equal(r, b.rewards + 2.0) and torch.equal(v, b.values + 1.0)
    assert boot[2, 0] == 1.5 and boot[0, 1] == pytest.approx(b.next_values[0, 1] + 1.5)
    # no stream: total is the extrinsic part
    plain = batch()
    assert reward_parts(plain, "total")[0] is plain.rewards


def test_gear_refuses_streams_it_cannot_read():
    with pytest.raises(UserError, match="^gear.advantage/select=total reads the reward streams of rnd, written after"):
        build_signals(["gear", "rnd"], {"gear": GEARConfig(advantage="total")})
    with pytest.raises(UserError, match="^gear.advantage=intrinsic needs a reward stream"):
        build_signals(["count", "gear"], {"gear": GEARConfig(advantage="intrinsic")})
    build_signals(["rnd", "gear"], {"gear": GEARConfig(advantage="intrinsic", select="total")})  # accepted
    with pytest.raises(UserError, match="^shaping.distill='all'"):
        ShapingConfig(distill="all").validate()


# ------------------------------------------------------------------------------ whole runs

def _train(cli, tmp_path, name, *argv):
    out = tmp_path / name
    code, _, err = cli("train", *argv, "--seed", "3", "--no-progress", "--out", out)
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "run.json").read_text())["params_sha256"], rows


def test_uncertainty_acts_before_the_first_reward_on_the_maze(cli, tmp_path):
    """The issue's check: on the 15x15 maze, a non-zero bonus from the first iteration, before any reward."""
    _, rows = _train(cli, tmp_path, "u", "--algo", "ppo+calibration", "--env", GRID, "--total-steps", "1024",
                     "--set", "env.size=15", "env.layout=maze", "calibration.mode=uncertainty")
    first = rows[0]
    assert first["iteration"] == 1 and first["bonus_mean"] > 0 and first["ensemble_std"] > 0
    assert first["bonus_to_reward"] is None  # no reward in the batch yet


@pytest.mark.slow
@pytest.mark.parametrize("algo,neutral", [
    ("ppo+calibration", "calibration.mode=uncertainty calibration.alpha=0"),
    ("ppo+count", "count.schedule=constant count.schedule_steps=5000"),
    ("ppo+count+shaping", "shaping.mode=potential shaping.update_every=1 shaping.distill=total"),
    ("ppo+count+gear", "gear.advantage=total gear.select=total"),
])
def test_neutral_settings_equal_todays_runs(cli, tmp_path, algo, neutral):
    """alpha=0 in the ensemble mode is plain PPO; a constant schedule, and total where the run has no
    reward stream (count's bonus is already a term of the trainer's reward), are today's runs."""
    base = {"ppo+calibration": "ppo", "ppo+count": "ppo+count"}.get(algo, algo)
    common = ["--env", GRID, "--total-steps", "1024"]
    extra = [] if base != "ppo+count+shaping" else ["--set", "shaping.mode=potential", "shaping.update_every=1"]
    today, _ = _train(cli, tmp_path, "today", "--algo", base, *common, *extra)
    variant, _ = _train(cli, tmp_path, "variant", "--algo", algo, *common, "--set", *neutral.split())
    assert variant == today


@pytest.mark.slow
def test_stream_variants_train_and_differ(cli, tmp_path):
    """With RND's stream, total and intrinsic change what GEAR and shaping learn from."""
    common = ["--env", GRID, "--total-steps", "1024"]
    gear, _ = _train(cli, tmp_path, "g", "--algo", "ppo+rnd+gear", *common)
    gear_total, rows = _train(cli, tmp_path, "gt", "--algo", "ppo+rnd+gear", *common, "--set",
                              "gear.advantage=total", "gear.select=total")
    assert gear_total != gear and all(math.isfinite(r["weights_mean"]) for r in rows)
    shaping, _ = _train(cli, tmp_path, "s", "--algo", "ppo+rnd+shaping", *common, "--set", "shaping.mode=potential",
                        "shaping.update_every=1")
    shaping_total, _ = _train(cli, tmp_path, "st", "--algo", "ppo+rnd+shaping", *common, "--set",
                              "shaping.mode=potential", "shaping.update_every=1", "shaping.distill=total")
    assert shaping_total != shaping
