"""Issue 42's signal variants on the JAX side against the torch ones: decay schedules (count, rnd,
calibration), calibration's uncertainty mode, shaping's distill=total and GEAR's advantage/select
over a reward stream. On the shared fixtures of test_jax_signals (weights copied in; the torch
bootstrap masks replayed from the torch signal's generator and passed in) the JAX outputs equal
torch's to float tolerance; the refusals are one line; two tiny jax-backend runs train."""

import dataclasses
import math
import types

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
from test_jax_signals import (  # noqa: E402
    ITERATIONS,
    N,
    T,
    close,
    gear_pair,
    jax_batch,
    jax_ctx,
    make_arrays,
    torch_batch,
    torch_ctx,
    with_gae,
)

from reflectrl.errors import UserError  # noqa: E402
from reflectrl.nets_jax import from_torch  # noqa: E402
from reflectrl.signals._jax import schedule_factor  # noqa: E402
from reflectrl.signals.calibration.jax import calibration_inputs, calibration_term, uncertainty_term  # noqa: E402
from reflectrl.signals.calibration.torch import CalibrationBonus, CalibrationConfig  # noqa: E402
from reflectrl.signals.count.torch import CountBonus, CountConfig  # noqa: E402
from reflectrl.signals.gear.jax import NEEDS_STREAM  # noqa: E402
from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting  # noqa: E402
from reflectrl.signals.rnd.torch import RND, RndConfig  # noqa: E402
from reflectrl.signals.schedule import factor_at  # noqa: E402
from reflectrl.signals.shaping.torch import SelfDistilledShaping, ShapingConfig  # noqa: E402
from reflectrl.trainers.ppo_jax.resolve import make_signal  # noqa: E402

K = 0.5  # the stream's weight k_s = coef / extrinsic_coef (RND's defaults: 1 / 2)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def arrays():
    return [with_gae(make_arrays(0)), with_gae(make_arrays(1))]


@pytest.fixture(scope="module")
def stream():
    """A reward stream's per-step parts: rewards, V_s, V'_s (non-episodic: not zeroed at terminations), A_s."""
    rng = np.random.default_rng(7)
    f = lambda: rng.normal(size=(T, N)).astype(np.float32)  # noqa: E731
    return {"rewards": np.abs(f()), "values": f(), "next_values": f(), "advantages": f()}


def with_stream(tb, s: dict, episodic: bool = False):
    """The torch Batch with the trainer's stream fields filled (what trainers/ppo gives the signals)."""
    t = {k: torch.from_numpy(v) for k, v in s.items()}
    tb.stream_weights = {"rnd": K}
    tb.stream_values = lambda: {"rnd": (t["values"], t["next_values"], episodic)}
    tb.stream_rewards = {"rnd": t["rewards"]}
    tb.stream_advantages = {"rnd": t["advantages"]}
    return tb


def jax_with_stream(b, s: dict, episodic: bool = False):
    """The JAX Batch with its intrinsic parts, as trainers/ppo_jax/ppo fills them (k_s-weighted; V'_s by the
    episodic rule)."""
    next_values = s["next_values"] * ((1.0 - b.terminations) if episodic else 1.0)
    return b._replace(intrinsic_values=K * jnp.asarray(s["values"]), intrinsic_next_values=K * next_values,
                      intrinsic_rewards=K * jnp.asarray(s["rewards"]),
                      intrinsic_advantages=K * jnp.asarray(s["advantages"]))


# ----------------------------------------------------------------------------- A. schedules


@pytest.mark.parametrize("schedule,steps", [("linear", 0), ("exponential", 0), ("linear", 5 * T * N),
                                            ("exponential", 3 * T * N)])
def test_schedule_factor_equals_torch(schedule, steps):
    cfg = CountConfig(schedule=schedule, schedule_steps=steps)
    for it in (0, 3, 9, 14):  # past the run's end / past schedule_steps too
        b = jax_batch(make_arrays(0), iteration=it, global_step=it * T * N)
        got = float(schedule_factor(cfg, b, jax_ctx()))
        expected = factor_at(cfg, torch_batch(make_arrays(0), iteration=it + 1, global_step=(it + 1) * T * N),
                             ITERATIONS)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert schedule_factor(CountConfig(), jax_batch(make_arrays(0)), jax_ctx()) is None  # constant: nothing


def test_schedule_factor_values():
    ctx = jax_ctx()
    at = lambda schedule, it: float(schedule_factor(CountConfig(schedule=schedule), jax_batch(make_arrays(0),  # noqa: E731
                                                                                           iteration=it), ctx))
    assert at("linear", ITERATIONS - 1) == 0.0 and at("linear", 4) == pytest.approx(0.5)
    assert at("exponential", ITERATIONS - 1) == pytest.approx(0.01) and at("exponential", 4) == pytest.approx(0.1)
    assert at("linear", 2 * ITERATIONS) == 0.0 and at("exponential", 2 * ITERATIONS - 1) == pytest.approx(1e-4)


@pytest.mark.parametrize("schedule", ["linear", "exponential"])
def test_scheduled_count_bonus_equals_torch(arrays, schedule):
    cfg = CountConfig(beta=0.3, schedule=schedule)
    torch_signal = CountBonus(cfg)
    torch_signal.bind(torch_ctx())
    signal = make_signal("count", cfg)
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    for i, a in enumerate(arrays):
        expected = torch_signal.shape_rewards(torch_batch(a, iteration=i + 3, global_step=(i + 3) * T * N))
        state, bonus, metrics = signal.shape_rewards(state, jax_batch(a, iteration=i + 2, global_step=(i + 2) * T * N),
                                                     None)
        close(bonus, expected)
        for name, value in torch_signal.metrics().items():
            close(metrics[name], value)
    assert 0 < float(metrics["count_beta"]) < 0.3


def test_scheduled_rnd_stream_equals_torch(arrays):
    cfg = RndConfig(hidden_sizes=(16,), embedding_dim=8, schedule="exponential", schedule_steps=4 * T * N)
    signal = RND(cfg)
    signal.bind(torch_ctx())
    jax_signal = make_signal("rnd", cfg)
    state = jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    state = {**state, "target": from_torch(signal.target), "predictor": from_torch(signal.predictor)}
    for i, a in enumerate(arrays):
        out = signal.after_advantages(torch_batch(a, iteration=i + 1, global_step=(i + 1) * T * N))
        state, jax_out, metrics = jax_signal.after_advantages(state, jax_batch(a, iteration=i, global_step=i * T * N),
                                                              None, None)
        close(jax_out.stream, out.streams["rnd"])
        for name, value in signal.metrics().items():
            close(metrics[name], value)
    assert float(metrics["rnd_schedule_factor"]) == pytest.approx(0.01 ** 0.5, rel=1e-5)


def test_constant_rnd_logs_factor_one(arrays):
    signal = make_signal("rnd", RndConfig(hidden_sizes=(8,), embedding_dim=4))
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    _, _, metrics = signal.after_advantages(state, jax_batch(arrays[0]), None, None)
    assert float(metrics["rnd_schedule_factor"]) == 1.0


def test_scheduled_calibration_term_equals_torch(arrays):
    cfg = CalibrationConfig(hidden_sizes=(16,), schedule="linear", clip="none")
    signal = CalibrationBonus(cfg)
    signal.bind(torch_ctx())
    signal.after_advantages(torch_batch(arrays[0], iteration=1))
    out = signal.after_advantages(torch_batch(arrays[1], iteration=3, global_step=3 * T * N))
    b = jax_batch(arrays[1], iteration=2, global_step=2 * T * N)
    x = calibration_inputs(cfg.inputs, b.obs, b.features, b.actions, jax_ctx())
    factor = schedule_factor(cfg, b, jax_ctx())
    term, stats = calibration_term(from_torch(signal.net), x, b.advantages.reshape(-1), b.rewards.reshape(-1), cfg,
                                   factor)
    close(term.reshape(T, N), out.reward)
    close(stats["alpha"], signal.metrics()["calibration_alpha"])
    assert float(stats["alpha"]) == pytest.approx(0.05 * 0.7)


# ----------------------------------------------------------------------------- B. calibration mode=uncertainty


def replay_masks(signal: CalibrationBonus, n: int) -> np.ndarray:
    """The bootstrap masks the torch signal's next after_advantages draws, replayed on a copy of its
    generator: per head, rand(n) < bootstrap, then (a head with rows) one randperm per epoch of its fit."""
    gen = torch.Generator()
    gen.set_state(signal.generator.get_state())
    masks = []
    for _ in signal.heads:
        mask = torch.rand(n, generator=gen) < signal.cfg.bootstrap
        for _ in range(signal.cfg.epochs if mask.any() else 0):
            torch.randperm(int(mask.sum()), generator=gen)
        masks.append(mask.numpy())
    return np.stack(masks)


def stacked(heads) -> list:
    """The torch ensemble's heads as one stacked JAX parameter pytree."""
    return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[from_torch(h.head) for h in heads])


UNCERTAINTY = CalibrationConfig(mode="uncertainty", hidden_sizes=(16,), ensemble=3, epochs=3, alpha=0.2, beta=0.5)


@pytest.mark.parametrize("knobs", [{}, {"schedule": "exponential", "recompute_advantages": False},
                                   {"ensemble_target": "raw"}])
def test_uncertainty_term_and_fit_equal_torch(arrays, knobs):
    """Two iterations: the term before the fit (fresh heads, then fitted ones), each head's fit on its
    own mask (the torch masks passed in; one minibatch, so the fit does not depend on the row order)."""
    cfg = dataclasses.replace(UNCERTAINTY, **knobs)
    signal = CalibrationBonus(cfg)
    signal.bind(torch_ctx())
    jax_signal = make_signal("calibration", cfg)
    state = jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    assert jax.tree_util.tree_leaves(state["heads"])[0].shape[0] == 3
    state = {**state, "heads": stacked(signal.heads)}
    for i, a in enumerate(arrays):
        masks = replay_masks(signal, T * N)
        out = signal.after_advantages(torch_batch(a, iteration=i + 1, global_step=(i + 1) * T * N))
        expected = out.reward if cfg.recompute_advantages else out.advantage
        b = jax_batch(a, iteration=i, global_step=i * T * N)
        adv = b.advantages.reshape(-1)
        x = calibration_inputs(cfg.inputs, b.obs, b.features, b.actions, jax_ctx())
        target = (adv - adv.mean()) / (jnp.std(adv, ddof=1) + 1e-8) if cfg.ensemble_target == "normalized" else adv
        factor = schedule_factor(cfg, b, jax_ctx())
        term, metrics = uncertainty_term(state["heads"], x, target, b.rewards.reshape(-1), cfg, factor)
        close(term.reshape(T, N), expected)
        for name, value in signal.metrics().items():
            if value is None:
                assert math.isnan(float(metrics[name]))
            else:
                close(metrics[name], value)
        heads, opt = jax_signal.fit_ensemble(state["heads"], state["opt"], x, target, jnp.asarray(masks),
                                             jax.random.PRNGKey(i))
        state = {"heads": heads, "opt": opt}
        close(jax.tree_util.tree_leaves(heads)[0], jax.tree_util.tree_leaves(stacked(signal.heads))[0],
              rtol=1e-3, atol=1e-5)
    assert float(jnp.abs(term).max()) > 1e-4


@pytest.fixture(scope="module")
def uncertainty_hook():
    """One compiled after_advantages of mode=uncertainty (shared by the property tests)."""
    signal = make_signal("calibration", UNCERTAINTY)
    state = signal.init(jax.random.PRNGKey(3), jax_ctx())
    return signal, state, jax.jit(lambda s, b, k: signal.after_advantages(s, b, k, None))


def test_uncertainty_acts_before_any_reward(arrays, uncertainty_hook):
    """The first iteration with zero rewards: a non-zero bonus, taken from the heads before they are fit."""
    signal, state, hook = uncertainty_hook
    a = with_gae({**arrays[0], "rewards": np.zeros((T, N), np.float32)})
    b = jax_batch(a)
    new, out, metrics = hook(state, b, jax.random.PRNGKey(0))
    assert out.recompute and float(metrics["bonus_mean"]) > 0 and float(metrics["ensemble_std"]) > 0
    assert math.isnan(float(metrics["bonus_to_reward"]))
    x = calibration_inputs("obs_action", b.obs, b.features, b.actions, jax_ctx())
    spread = jnp.std(jax.vmap(lambda p: from_heads(p, x))(state["heads"]), axis=0)
    close(out.reward.reshape(-1), 0.5 * 0.2 * spread)  # before the fit: the initial heads' disagreement
    moved = [float(jnp.abs(p - q).max()) for p, q in zip(jax.tree_util.tree_leaves(new["heads"]),
                                                       jax.tree_util.tree_leaves(state["heads"]), strict=True)]
    assert max(moved) > 0  # then the heads were fit


def from_heads(params, x):
    from reflectrl.nets_jax import head

    return head(params, x)


def test_a_head_with_an_empty_mask_is_not_fit(arrays):
    signal = make_signal("calibration", UNCERTAINTY)
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    b = jax_batch(arrays[0])
    x = calibration_inputs("obs_action", b.obs, b.features, b.actions, jax_ctx())
    masks = jnp.asarray(np.array([[True] * (T * N), [False] * (T * N), [i % 2 == 0 for i in range(T * N)]]))
    heads, _ = signal.fit_ensemble(state["heads"], state["opt"], x, b.advantages.reshape(-1), masks,
                                   jax.random.PRNGKey(1))
    for new, old in zip(jax.tree_util.tree_leaves(heads), jax.tree_util.tree_leaves(state["heads"]), strict=True):
        assert np.array_equal(np.asarray(new[1]), np.asarray(old[1]))
        assert not np.array_equal(np.asarray(new[0]), np.asarray(old[0]))
        assert not np.array_equal(np.asarray(new[2]), np.asarray(old[2]))


def test_uncertainty_with_alpha_zero_adds_exact_zeros(arrays):
    signal = make_signal("calibration", dataclasses.replace(UNCERTAINTY, alpha=0.0))
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    _, out, metrics = signal.after_advantages(state, jax_batch(arrays[0]), jax.random.PRNGKey(1), None)
    assert np.all(np.asarray(out.reward) == 0.0) and float(metrics["calibration_alpha"]) == 0.0


def test_bootstrap_masks_draw_each_row_with_its_probability():
    from reflectrl.signals.calibration.jax import bootstrap_masks

    masks = np.asarray(bootstrap_masks(jax.random.PRNGKey(0), 4, 5000, 0.3))
    assert masks.shape == (4, 5000) and abs(masks.mean() - 0.3) < 0.02
    assert not np.array_equal(masks[0], masks[1])
    assert np.asarray(bootstrap_masks(jax.random.PRNGKey(0), 2, 100, 1.0)).all()


# ----------------------------------------------------------------------------- C. shaping distill=total


@pytest.mark.parametrize("with_streams", [True, False])
def test_shaping_total_labels_equal_torch(arrays, stream, with_streams):
    cfg = ShapingConfig(hidden_sizes=(16,), update_every=100, buffer_rollouts=4, distill="total")
    signal = SelfDistilledShaping(cfg)
    signal.bind(torch_ctx())
    jax_signal = make_signal("shaping", cfg)
    state = jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    w = np.random.default_rng(5).normal(size=(arrays[0]["obs"].shape[-1],)).astype(np.float32)
    torch_value = lambda obs: obs.reshape(-1, w.shape[0]) @ torch.from_numpy(w)  # noqa: E731
    jax_value = lambda obs: obs @ jnp.asarray(w)  # noqa: E731
    for j, a in enumerate(arrays):
        s = {k: v * (j + 1) for k, v in stream.items()}  # each rollout its own stream advantages
        tb, b = torch_batch(a), jax_batch(a)
        if with_streams:
            tb, b = with_stream(tb, s), jax_with_stream(b, s)
        signal.after_update(tb)
        state, _ = jax_signal.after_update(state, b, jax.random.PRNGKey(1), jax_value, None)
    *_, expected = signal.distillation_set(torch_value, torch_batch(arrays[0]).gae)
    labels, _ = jax_signal.labels(state["buffer"], state["filled"], jax_value)
    close(labels[:2].reshape(-1), expected)
    plain = make_signal("shaping", ShapingConfig(hidden_sizes=(16,), update_every=100, buffer_rollouts=4))
    plain_state = plain.init(jax.random.PRNGKey(0), jax_ctx())
    for a in arrays:
        plain_state, _ = plain.after_update(plain_state, jax_batch(a), jax.random.PRNGKey(1), jax_value, None)
    extrinsic, _ = plain.labels(plain_state["buffer"], plain_state["filled"], jax_value)
    # without a stream total == extrinsic exactly; with one, the labels differ
    assert np.array_equal(np.asarray(labels), np.asarray(extrinsic)) != with_streams


# ----------------------------------------------------------------------------- D. GEAR advantage / select


@pytest.mark.parametrize("knobs", [{"advantage": "total"}, {"advantage": "intrinsic"},
                                   {"advantage": "total", "diff_scale": "value_std", "temperature": 0.7}])
def test_gear_weights_over_a_stream_equal_torch(arrays, stream, knobs):
    cfg = GEARConfig(hidden_sizes=(16,), inputs="features", **knobs)
    signal, jax_signal, state = gear_pair(cfg)
    out = signal.after_advantages(with_stream(torch_batch(arrays[0]), stream))
    _, jax_out, metrics = jax_signal.after_advantages(state, jax_with_stream(jax_batch(arrays[0]), stream), None, None)
    close(jax_out.weights, out.weights)
    for name, value in signal.metrics().items():
        close(metrics[name], value)
    extrinsic = make_signal("gear", dataclasses.replace(cfg, advantage="extrinsic"))
    extrinsic.init(jax.random.PRNGKey(0), jax_ctx())
    _, plain, _ = extrinsic.after_advantages(state, jax_with_stream(jax_batch(arrays[0]), stream), None, None)
    assert not np.allclose(np.asarray(plain.weights), np.asarray(jax_out.weights))  # another baseline, other weights


@pytest.mark.parametrize("advantage,select,return_kind,episodic", [
    ("total", "extrinsic", "discounted", False), ("intrinsic", "total", "discounted", True),
    ("extrinsic", "total", "trajectory", False), ("intrinsic", "extrinsic", "trajectory", False),
    ("total", "total", "trajectory", True)])
def test_gear_winners_and_targets_over_a_stream_equal_torch(arrays, stream, advantage, select, return_kind,
                                                            episodic):
    """The torch head's fit targets and winners, read back through its fitter (the fit itself is
    stubbed: only what it is given is compared)."""
    cfg = GEARConfig(hidden_sizes=(8,), advantage=advantage, select=select, return_kind=return_kind,
                     top_frac=0.25)
    signal = GEARReweighting(cfg)
    signal.bind(torch_ctx())
    seen = {}

    def fit(x, targets, **kwargs):
        seen["targets"] = targets
        return types.SimpleNamespace(loss_after=0.0)

    signal.fitter.fit = fit
    signal.after_update(with_stream(torch_batch(arrays[0]), stream, episodic))
    jax_signal = make_signal("gear", cfg)
    jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    b = jax_with_stream(jax_batch(arrays[0]), stream, episodic)
    ids, winners, outcomes, n = jax_signal.winners(b)
    y = jax_signal.targets(b, ids, outcomes)
    keep = np.asarray(winners[ids.reshape(-1)])
    assert keep.sum() == len(seen["targets"])
    close(np.asarray(y)[keep], seen["targets"])


def test_gear_total_without_a_stream_is_extrinsic(arrays):
    base = GEARConfig(hidden_sizes=(8,))
    b = jax_batch(arrays[0])
    results = []
    for cfg in (base, dataclasses.replace(base, advantage="total", select="total")):
        signal = make_signal("gear", cfg)
        signal.init(jax.random.PRNGKey(0), jax_ctx())
        ids, winners, outcomes, _ = signal.winners(b)
        results.append((np.asarray(winners), np.asarray(signal.targets(b, ids, outcomes))))
    assert np.array_equal(results[0][0], results[1][0]) and np.array_equal(results[0][1], results[1][1])
    intrinsic = make_signal("gear", dataclasses.replace(base, advantage="intrinsic"))
    state = intrinsic.init(jax.random.PRNGKey(0), jax_ctx())
    with pytest.raises(UserError, match="needs a reward stream"):
        intrinsic.after_advantages({**state, "distilled": jnp.asarray(True)}, b, None, None)


# ----------------------------------------------------------------------------- refusals and runs

TINY = ["backend=jax", "num_envs=2", "num_steps=16", "num_minibatches=2", "update_epochs=1", "hidden_sizes=8"]


@pytest.mark.parametrize("algo, knobs, says", [
    ("ppo+gear", ["gear.advantage=intrinsic"], NEEDS_STREAM),
    ("ppo+rnd+gear", ["rnd.int_coef=0", "gear.advantage=intrinsic"], NEEDS_STREAM),
    ("ppo+gear+rnd", ["gear.advantage=total"], "gear.advantage/select=total reads the reward streams of rnd, "
                                                "written after gear: write them before it, e.g. ppo+rnd+gear"),
    ("ppo+gear+rnd", ["gear.advantage=intrinsic", "gear.select=total"],
     "gear.advantage/select=intrinsic/total reads the reward streams of rnd, written after gear"),
    ("ppo+gear+rnd", ["gear.select=total"], "gear.advantage/select=total reads the reward streams of rnd"),
])
def test_stream_refusals_are_one_line(tmp_path, capsys, algo, knobs, says):
    pytest.importorskip("gymnax")
    from reflectrl.cli import main

    out = tmp_path / "run"
    code = main(["train", "--algo", algo, "--env", "gymnax:CartPole-v1", "--total-steps", "1024", "--out", str(out),
                 "--set", "backend=jax", *knobs])
    err = capsys.readouterr().err.strip()
    assert code == 2 and says in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_variants_resolve_on_backend_jax():
    pytest.importorskip("gymnax")
    from reflectrl.trainers.ppo_jax.resolve import resolve
    from reflectrl.trainers.resolve import new_run_config

    for algo, knobs in (("ppo+count+calibration", ["count.schedule=linear", "calibration.mode=uncertainty",
                                                   "calibration.schedule=exponential"]),
                        ("ppo+rnd+gear+shaping", ["rnd.schedule=linear", "gear.advantage=intrinsic",
                                                  "gear.select=total", "shaping.distill=total"]),
                        ("ppo+gear+rnd", ["rnd.int_coef=0", "gear.advantage=total", "gear.select=total"])):
        cfg = new_run_config(algo=algo, env_id="gymnax:CartPole-v1", seed=1, total_steps=256,
                             overrides=[*TINY, *knobs])
        resolve(cfg)


def first_rows(algo: str, env_id: str, iterations: int = 3, extra=()):
    """`iterations` iterations of 2 seeds as one program (no run directories): (group, rows (S, iterations))."""
    from reflectrl.trainers.ppo_jax.trainer import JaxGroup
    from reflectrl.trainers.resolve import new_run_config

    cfgs = [new_run_config(algo=algo, env_id=env_id, seed=s, total_steps=iterations * 32,
                           overrides=[*TINY, *extra]) for s in (1, 2)]
    group = JaxGroup(cfgs, [None, None])
    states, rows = group.program()(group.states, 0)
    group.states = states
    return group, {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in rows.items()}


@pytest.mark.slow
def test_uncertainty_run_has_a_bonus_from_the_first_iteration():
    pytest.importorskip("navix")
    group, rows = first_rows("ppo+calibration", "navix:Navix-DoorKey-5x5-v0",
                             extra=["calibration.mode=uncertainty", "calibration.hidden_sizes=8",
                                    "calibration.epochs=1", "calibration.ensemble=3"])
    assert rows["bonus_mean"].shape == (2, 3)
    assert (rows["bonus_mean"][:, 0] > 0).all() and (rows["ensemble_std"][:, 0] > 0).all()
    assert np.isfinite(rows["loss"]).all()
    assert jax.tree_util.tree_leaves(group.states["signals"][0]["heads"])[0].shape[:2] == (2, 3)  # seeds, heads


@pytest.mark.slow
def test_rnd_then_gear_on_the_total_advantage_trains():
    pytest.importorskip("gymnax")
    group, rows = first_rows("ppo+rnd+gear+shaping", "gymnax:CartPole-v1", iterations=4,
                             extra=["gear.advantage=total", "gear.select=total", "shaping.distill=total",
                                    "rnd.hidden_sizes=8", "rnd.embedding_dim=4", "gear.hidden_sizes=8",
                                    "shaping.hidden_sizes=8", "shaping.update_every=1", "shaping.epochs=1",
                                    "rnd.schedule=linear"])
    assert np.isfinite(rows["loss"]).all() and np.isfinite(rows["label_loss"]).all()
    assert (rows["weights_std"][:, 1:] > 0).all()  # reweighting after the first distillation
    np.testing.assert_allclose(rows["rnd_schedule_factor"], np.broadcast_to([0.75, 0.5, 0.25, 0.0], (2, 4)))
    for leaf in jax.tree_util.tree_leaves(group.states["params"]):
        assert np.isfinite(np.asarray(leaf)).all()
