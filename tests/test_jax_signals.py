"""The JAX signals against the torch ones (issue 39): on shared fixtures (a fixed, seeded batch,
torch heads' weights copied in) GAE, the count bonus, the calibration term, the shaping terms and
labels, GEAR's weights and winners and RND's intrinsic rewards equal torch's to float tolerance;
every signal runs inside jax.jit(jax.vmap(...)) over seeds; the torch-only knobs are refused."""

import math

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402

from reflectrl.errors import UserError  # noqa: E402
from reflectrl.estimators import compute_gae  # noqa: E402
from reflectrl.nets_jax import from_torch  # noqa: E402
from reflectrl.trainers.ppo_jax.resolve import jax_signal_class, jax_signal_names, make_signal  # noqa: E402

JAX_SIGNALS = {name: jax_signal_class(name) for name in jax_signal_names()}
from reflectrl.signals import Batch, SignalContext  # noqa: E402
from reflectrl.signals import jax_base as jb  # noqa: E402
from reflectrl.signals.calibration.jax import calibration_inputs, calibration_term  # noqa: E402
from reflectrl.signals.calibration.torch import CalibrationBonus, CalibrationConfig  # noqa: E402
from reflectrl.signals.count.torch import CountBonus, CountConfig  # noqa: E402
from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting, returns_to_go, select_winners, trajectory_ids  # noqa: E402
from reflectrl.signals.rnd.torch import RND, RndConfig  # noqa: E402
from reflectrl.signals.shaping.jax import shaper_forward  # noqa: E402
from reflectrl.signals.shaping.torch import SelfDistilledShaping, ShapingConfig  # noqa: E402

T, N, OBS, ACTIONS, FEATURES, KEYS = 16, 4, 6, 3, 5, 10
GAMMA, LAM, LR, ITERATIONS = 0.99, 0.95, 1e-3, 10
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_arrays(seed: int, discrete: bool = True) -> dict:
    """One rollout's arrays (numpy): several episode ends, terminations and truncations, sparse rewards with ties."""
    rng = np.random.default_rng(seed)
    term = rng.random((T, N)) < 0.12
    trunc = (rng.random((T, N)) < 0.06) & ~term
    term[3, 0] = True
    trunc[9, 1] = True
    rewards = np.where(rng.random((T, N)) < 0.3, rng.choice([0.5, 1.0, -1.0], (T, N)), 0.0).astype(np.float32)
    actions = (rng.integers(0, ACTIONS, (T, N)).astype(np.int32) if discrete
               else rng.normal(size=(T, N, 2)).astype(np.float32))
    return {
        "obs": rng.normal(size=(T, N, OBS)).astype(np.float32),
        "next_obs": rng.normal(size=(T, N, OBS)).astype(np.float32),
        "actions": actions,
        "rewards": rewards,
        "terminations": term, "truncations": trunc,
        "values": rng.normal(size=(T, N)).astype(np.float32),
        "next_values": (rng.normal(size=(T, N)) * ~term).astype(np.float32),
        "features": rng.normal(size=(T, N, FEATURES)).astype(np.float32),
        "state_keys": rng.integers(0, KEYS, (T, N)), "next_state_keys": rng.integers(0, KEYS, (T, N)),
    }


def with_gae(a: dict) -> dict:
    adv, ret = compute_gae(*(torch.from_numpy(a[k]) for k in ("rewards", "values", "next_values", "terminations",
                                                               "truncations")), GAMMA, LAM)
    return {**a, "advantages": adv.numpy(), "returns": ret.numpy()}


@pytest.fixture(scope="module")
def arrays():
    return [with_gae(make_arrays(0)), with_gae(make_arrays(1))]


@pytest.fixture(scope="module")
def continuous():
    return with_gae(make_arrays(2, discrete=False))


def torch_batch(a: dict, iteration: int = 1, global_step: int = T * N) -> Batch:
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in a.items()}
    gae = lambda r, v, nv, te, tr: compute_gae(r, v, nv, te, tr, GAMMA, LAM)  # noqa: E731
    return Batch(obs=t["obs"], actions=t["actions"].long() if t["actions"].dim() == 2 else t["actions"],
                 rewards=t["rewards"], terminations=t["terminations"], truncations=t["truncations"],
                 values=t["values"], next_values=t["next_values"], advantages=t.get("advantages"),
                 returns=t.get("returns"), features=t["features"], next_obs=t["next_obs"], iteration=iteration,
                 global_step=global_step, state_keys=t["state_keys"].long(),
                 next_state_keys=t["next_state_keys"].long(), gae=gae,
                 estimate=lambda r: compute_gae(r, t["values"], t["next_values"], t["terminations"],
                                                t["truncations"], GAMMA, LAM))


def jax_batch(a: dict, iteration: int = 0, global_step: int = 0) -> jb.Batch:
    f = lambda k: jnp.asarray(a[k], jnp.float32)  # noqa: E731
    zeros = jnp.zeros((T, N))
    return jb.Batch(obs=f("obs"), actions=jnp.asarray(a["actions"]), rewards=f("rewards"),
                    terminations=f("terminations"), truncations=f("truncations"), values=f("values"),
                    next_values=f("next_values"), next_obs=f("next_obs"), features=f("features"),
                    state_keys=jnp.asarray(a["state_keys"], jnp.int32),
                    next_state_keys=jnp.asarray(a["next_state_keys"], jnp.int32),
                    advantages=f("advantages") if "advantages" in a else zeros,
                    returns=f("returns") if "returns" in a else zeros,
                    iteration=jnp.asarray(iteration, jnp.int32), global_step=jnp.asarray(global_step, jnp.int32))


def torch_ctx(discrete=True, action_dim=ACTIONS) -> SignalContext:
    return SignalContext(obs_dim=OBS, action_dim=action_dim, discrete=discrete, feature_dim=FEATURES,
                         learning_rate=LR, gamma=GAMMA, gae_lambda=LAM, seed=3, total_iterations=ITERATIONS)


def jax_ctx(discrete=True, action_dim=ACTIONS) -> jb.Context:
    return jb.Context(obs_dim=OBS, action_dim=action_dim, discrete=discrete, feature_dim=FEATURES, learning_rate=LR,
                      gamma=GAMMA, gae_lambda=LAM, num_steps=T, num_envs=N, total_iterations=ITERATIONS,
                      key_space=KEYS)


def close(jax_value, torch_value, **tol):
    np.testing.assert_allclose(np.asarray(jax_value), np.asarray(torch_value), **{**TOL, **tol})


def estimate_for(batch: jb.Batch):
    from reflectrl.estimators_jax import gae

    return lambda r: gae(r, batch.values, batch.next_values, batch.terminations, batch.truncations, GAMMA, LAM)


# ----------------------------------------------------------------------------- GAE


def test_gae_equals_torch(arrays):
    from reflectrl.estimators_jax import gae

    a = arrays[0]
    b = jax_batch(a)
    adv, ret = gae(b.rewards, b.values, b.next_values, b.terminations, b.truncations, GAMMA, LAM)
    close(adv, a["advantages"])
    close(ret, a["returns"])


# ----------------------------------------------------------------------------- count


@pytest.mark.parametrize("episodic", [True, False])
def test_count_bonus_equals_torch_across_rollouts(arrays, episodic):
    cfg = CountConfig(beta=0.3, episodic=episodic)
    columns = slice(None) if episodic else slice(0, 1)  # non-episodic: torch counts env-major, here time-major
    torch_signal = CountBonus(cfg)
    torch_signal.bind(torch_ctx())
    signal = make_signal("count", cfg)
    ctx = jax_ctx()
    if not episodic:
        ctx = ctx._replace(num_envs=1)
    state = signal.init(jax.random.PRNGKey(0), ctx)
    for a in arrays:  # the counts carry over from one rollout to the next
        a = {k: (v[:, columns] if isinstance(v, np.ndarray) and v.ndim >= 2 else v) for k, v in a.items()}
        expected = torch_signal.shape_rewards(torch_batch(a))
        state, bonus, metrics = signal.shape_rewards(state, jax_batch(a), None)
        close(bonus, expected)
        for name, value in torch_signal.metrics().items():
            close(metrics[name], value)


def test_global_count_table_equals_torch_at_the_end_of_each_rollout(arrays):
    cfg = CountConfig(episodic=False)
    torch_signal = CountBonus(cfg)
    torch_signal.bind(torch_ctx())
    signal = make_signal("count", cfg)
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    for a in arrays:
        torch_signal.shape_rewards(torch_batch(a))
        state, _, _ = signal.shape_rewards(state, jax_batch(a), None)
        table = np.zeros(KEYS, np.int64)
        for k, v in torch_signal.counts[0].items():
            table[k] = v
        assert np.asarray(state["counts"]).tolist() == table.tolist()


# ----------------------------------------------------------------------------- calibration

CALIBRATION_CASES = [
    {},
    {"adaptive": True, "clip": "absolute", "clip_value": 0.05, "max_ratio": 0.2},
    {"bonus_target": "seed", "clip": "none", "alpha": 0.5},
    {"inputs": "obs_action_features", "recompute_advantages": False},
    {"inputs": "features_action", "epochs": 3, "minibatch_size": 24},
]


@pytest.mark.parametrize("knobs", CALIBRATION_CASES)
def test_calibration_term_equals_torch_with_the_fitted_head(arrays, knobs):
    cfg = CalibrationConfig(hidden_sizes=(16, 16), **knobs)
    signal = CalibrationBonus(cfg)
    signal.bind(torch_ctx())
    signal.after_advantages(torch_batch(arrays[0]))  # a first fit, so that the head predicts something
    out = signal.after_advantages(torch_batch(arrays[1]))
    expected = out.reward if cfg.recompute_advantages else out.advantage
    a, b = arrays[1], jax_batch(arrays[1])
    x = calibration_inputs(cfg.inputs, b.obs, b.features, b.actions, jax_ctx())
    term, stats = calibration_term(from_torch(signal.net), x, b.advantages.reshape(-1), b.rewards.reshape(-1), cfg)
    close(term.reshape(T, N), expected)
    last = signal.metrics()
    for name, value in (("train_loss", "calibration_loss"), ("alpha", "calibration_alpha"),
                        ("budget_scale", "calibration_budget_scale")):
        close(stats[name], last[value])
    assert float(stats["clip"]) == pytest.approx(last["calibration_clip"], rel=1e-5)
    assert abs(a["advantages"]).sum() > 0 and float(jnp.abs(term).max()) > 1e-6  # not a trivially zero term


def test_calibration_term_equals_torch_on_continuous_actions(continuous):
    cfg = CalibrationConfig(hidden_sizes=(16,))
    signal = CalibrationBonus(cfg)
    signal.bind(torch_ctx(discrete=False, action_dim=2))
    out = signal.after_advantages(torch_batch(continuous))
    b = jax_batch(continuous)
    x = calibration_inputs(cfg.inputs, b.obs, b.features, b.actions, jax_ctx(discrete=False, action_dim=2))
    term, _ = calibration_term(from_torch(signal.net), x, b.advantages.reshape(-1), b.rewards.reshape(-1), cfg)
    close(term.reshape(T, N), out.reward)


def test_calibration_fit_reduces_the_loss(arrays):
    cfg = CalibrationConfig(hidden_sizes=(32, 32), epochs=60)
    signal = make_signal("calibration", cfg)
    state = signal.init(jax.random.PRNGKey(1), jax_ctx())
    batch = jax_batch(arrays[0])
    hook = jax.jit(lambda s, k: signal.after_advantages(s, batch, k, None))
    state, out, metrics = hook(state, jax.random.PRNGKey(2))
    assert out.reward.shape == (T, N) and out.recompute
    assert float(metrics["calibration_loss"]) < 0.8 * float(metrics["calibration_loss_heldout"])
    assert math.isnan(float(metrics["calibration_loss_prev_batch"]))
    _, _, metrics = hook(state, jax.random.PRNGKey(3))
    assert np.isfinite(float(metrics["calibration_loss_prev_batch"]))


def test_calibration_shared_trunk_is_torch_only():
    with pytest.raises(UserError, match="calibration.shared_trunk is torch-only on backend=jax"):
        make_signal("calibration", CalibrationConfig(shared_trunk=True, inputs="features_action"))


# ----------------------------------------------------------------------------- shaping


def perturbed(net: torch.nn.Module, seed: int) -> None:
    """Weights of a useful size (a fresh head's output is near zero: nothing to compare)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


@pytest.mark.parametrize("mode", ["direct", "potential"])
def test_shaping_terms_equal_torch(arrays, mode):
    cfg = ShapingConfig(mode=mode, hidden_sizes=(16,), eta=0.3, warmup_steps=T * N, ramp_steps=4 * T * N,
                        hard_clip=0.25 if mode == "direct" else math.inf)
    signal = SelfDistilledShaping(cfg)
    signal.bind(torch_ctx())
    perturbed(signal.target.net, 0)
    jax_signal = make_signal("shaping", cfg)
    state = jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    state = {**state, "target": from_torch(signal.target.net)}
    for global_step in (0, 2 * T * N):  # torch's global_step counts the rollout's steps: weight 0, then 1/4
        expected = signal.shape_rewards(torch_batch(arrays[0], global_step=global_step + T * N))
        _, term, metrics = jax_signal.shape_rewards(state, jax_batch(arrays[0], global_step=global_step), None)
        close(term, expected)
        for name, value in signal.metrics().items():
            if value is None:
                assert math.isnan(float(metrics[name]))
            else:
                close(metrics[name], value)
    assert float(jnp.abs(term).max()) > 1e-3
    # the term itself, weight 1: potential-based terms keep gamma Phi(s') at a truncation, drop it at a termination
    b = jax_batch(arrays[0])
    rows = jax_signal._rows(b)
    f = shaper_forward(state["target"], *rows, mode, cfg.eta, GAMMA, cfg.hard_clip)
    tr = signal._transitions(torch_batch(arrays[0]))
    with torch.no_grad():
        close(f, signal.target(tr["obs"], tr["actions"], tr["next_obs"], tr["terminations"]))


def test_shaping_labels_equal_torch(arrays):
    cfg = ShapingConfig(hidden_sizes=(16,), update_every=100, buffer_rollouts=4)
    signal = SelfDistilledShaping(cfg)
    signal.bind(torch_ctx())
    jax_signal = make_signal("shaping", cfg)
    state = jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    w = np.random.default_rng(5).normal(size=(OBS,)).astype(np.float32)
    torch_value = lambda obs: obs.reshape(-1, OBS) @ torch.from_numpy(w)  # noqa: E731
    jax_value = lambda obs: obs @ jnp.asarray(w)  # noqa: E731
    for a in arrays:  # two of the buffer's four slots filled
        signal.after_update(torch_batch(a))
        state, metrics = jax_signal.after_update(state, jax_batch(a), jax.random.PRNGKey(1), jax_value, None)
        assert math.isnan(float(metrics["label_loss"]))  # not distilled: update_every=100
    *_, expected = signal.distillation_set(torch_value, torch_batch(arrays[0]).gae)
    labels, mask = jax_signal.labels(state["buffer"], state["filled"], jax_value)
    assert int(mask.sum()) == 2 * T * N
    close(labels[:2].reshape(-1), expected)


# ----------------------------------------------------------------------------- GEAR


def gear_pair(cfg: GEARConfig):
    signal = GEARReweighting(cfg)
    signal.bind(torch_ctx())
    signal.distilled = True
    perturbed(signal.frozen, 1)
    jax_signal = make_signal("gear", cfg)
    state = jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    return signal, jax_signal, {**state, "frozen": from_torch(signal.frozen), "distilled": jnp.asarray(True)}


@pytest.mark.parametrize("knobs", [{}, {"diff_scale": "value_std", "temperature": 0.7},
                                   {"diff_scale": "none", "renormalize": True},
                                   {"renormalize": True, "inputs": "obs", "head": "linear"},
                                   {"warmup_steps": 10, "temperature_steps": 3 * T * N, "temperature": 0.5}])
def test_gear_weights_equal_torch(arrays, knobs):
    cfg = GEARConfig(hidden_sizes=(16,), **{"inputs": "features", **knobs})
    signal, jax_signal, state = gear_pair(cfg)
    out = signal.after_advantages(torch_batch(arrays[0], global_step=2 * T * N))
    _, jax_out, metrics = jax_signal.after_advantages(state, jax_batch(arrays[0], global_step=T * N), None, None)
    close(jax_out.weights, out.weights)
    assert float(jnp.std(jax_out.weights)) > 0.01  # a real reweighting
    for name, value in signal.metrics().items():
        close(metrics[name], value)


def test_gear_weights_are_one_before_the_first_distillation(arrays):
    signal = make_signal("gear", GEARConfig(hidden_sizes=(8,)))
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    _, out, metrics = signal.after_advantages(state, jax_batch(arrays[0]), None, None)
    assert np.all(np.asarray(out.weights) == 1.0) and float(metrics["weights_std"]) == 0.0


def tied_arrays(a: dict) -> dict:
    """Many trajectories, outcomes tied (0 and 1 each many times) with lengths tied too."""
    term = np.zeros((T, N), bool)
    term[[1, 3, 5, 7, 9, 11, 13], 0] = True
    term[[3, 7, 11], 1] = True
    term[[1, 5, 6, 10], 2] = True
    trunc = np.zeros((T, N), bool)
    trunc[[7, 12], 3] = True
    rewards = np.zeros((T, N), np.float32)
    rewards[[1, 5, 9], 0] = 1.0
    rewards[[3, 11], 1] = 1.0
    rewards[10, 2] = 1.0
    rewards[7, 3] = 1.0
    return {**a, "terminations": term, "truncations": trunc, "rewards": rewards}


@pytest.mark.parametrize("top_frac", [0.1, 0.25, 0.5, 1.0])
def test_gear_winners_and_targets_equal_torch(arrays, top_frac):
    for a in (arrays[0], tied_arrays(arrays[0])):
        cfg = GEARConfig(top_frac=top_frac, hidden_sizes=(8,))
        tb = torch_batch(a)
        ids = trajectory_ids(tb.terminations, tb.truncations)
        flat = ids.reshape(-1)
        n = int(flat.max()) + 1
        outcomes = torch.zeros(n).index_add_(0, flat, tb.rewards.reshape(-1))
        lengths = torch.zeros(n, dtype=torch.long).index_add_(0, flat, torch.ones_like(flat))
        expected = select_winners(outcomes, lengths, top_frac)
        signal = make_signal("gear", cfg)
        signal.init(jax.random.PRNGKey(0), jax_ctx())
        b = jax_batch(a)
        jax_ids, winners, _, jax_n = signal.winners(b)
        assert np.asarray(jax_ids).tolist() == ids.tolist() and int(jax_n) == n
        assert np.asarray(winners)[:n].tolist() == expected.tolist() and not np.asarray(winners)[n:].any()
        bootstrap = tb.next_values * (1.0 - tb.terminations.float())
        close(signal.targets(b, jax_ids, None), returns_to_go(tb.rewards, ids, GAMMA, bootstrap).reshape(-1))


def test_gear_distillation_fits_the_winners(arrays):
    cfg = GEARConfig(hidden_sizes=(16,), epochs=30, lr_multiplier=10.0)
    signal = make_signal("gear", cfg)
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    hook = jax.jit(lambda s, b, k: signal.after_update(s, b, k, None, None))
    state, first = hook(state, jax_batch(arrays[0]), jax.random.PRNGKey(1))
    assert math.isnan(float(first["value_head_heldout_loss"])) and bool(state["distilled"])
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(lambda a, b: bool(jnp.all(a == b)), state["frozen"],
                                                         state["head"]))  # the first: a copy
    state, second = hook(state, jax_batch(arrays[0]), jax.random.PRNGKey(2))
    assert float(second["value_head_loss"]) < float(second["value_head_heldout_loss"])


@pytest.mark.parametrize("knobs,knob", [({"history": 2}, "gear.history=2"),
                                        ({"rank_groups": True}, "gear.rank_groups")])
def test_gear_torch_only_knobs(knobs, knob):
    with pytest.raises(UserError, match=f"{knob} is torch-only on backend=jax"):
        make_signal("gear", GEARConfig(**knobs))


# ----------------------------------------------------------------------------- RND


def test_rnd_intrinsic_rewards_equal_torch(arrays):
    cfg = RndConfig(hidden_sizes=(16, 16), embedding_dim=8)
    signal = RND(cfg)
    signal.bind(torch_ctx())
    jax_signal = make_signal("rnd", cfg)
    assert jax_signal.stream == jb.Stream("rnd", gamma=0.99, episodic=False, coef=1.0, extrinsic_coef=2.0)
    state = jax_signal.init(jax.random.PRNGKey(0), jax_ctx())
    state = {**state, "target": from_torch(signal.target), "predictor": from_torch(signal.predictor)}
    for i, a in enumerate(arrays):  # the first rollout initialises the statistics; the second uses them
        out = signal.after_advantages(torch_batch(a, iteration=i + 1))
        state, jax_out, metrics = jax_signal.after_advantages(state, jax_batch(a, iteration=i), None, None)
        close(jax_out.stream, out.streams["rnd"])
        for name, value in signal.metrics().items():
            close(metrics[name], value)
        close(state["obs_rms"]["mean"], signal.obs_rms.mean)
        close(state["obs_rms"]["var"], signal.obs_rms.var)
        signal.after_update(torch_batch(a, iteration=i + 1))
        state = {**state, "predictor": from_torch(signal.predictor)}  # the fits' random draws differ


@pytest.mark.parametrize("shape", [(6, 16), (16, 16), (16, 8)])
def test_the_orthogonal_init_is_orthogonal(shape):
    from reflectrl.nets_jax import orthogonal

    q = np.asarray(jax.vmap(lambda k: orthogonal(k, shape, 2.0))(jax.random.split(jax.random.PRNGKey(0), 3)))
    assert q.shape == (3, *shape)
    gram = q @ q.transpose(0, 2, 1) if shape[0] < shape[1] else q.transpose(0, 2, 1) @ q
    np.testing.assert_allclose(gram, 4.0 * np.broadcast_to(np.eye(min(shape)), gram.shape), atol=1e-5)
    assert not np.allclose(q[0], q[1])


def test_rnd_predictor_training_reduces_its_error(arrays):
    cfg = RndConfig(hidden_sizes=(32,), embedding_dim=8, epochs=20, lr_multiplier=5.0, update_proportion=1.0)
    signal = make_signal("rnd", cfg)
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    batch = jax_batch(arrays[0])
    state, _, before = signal.after_advantages(state, batch, None, None)
    state, m = jax.jit(lambda s, k: signal.after_update(s, batch, k, None, None))(state, jax.random.PRNGKey(1))
    error_after = signal.intrinsic(state, batch)[1].mean()
    assert float(error_after) < 0.5 * float(before["rnd_error_mean"]) and np.isfinite(float(m["rnd_predictor_loss"]))


def test_rnd_without_intrinsic_coef_has_no_stream(arrays):
    signal = make_signal("rnd", RndConfig(int_coef=0.0, hidden_sizes=(8,), embedding_dim=4))
    assert signal.stream is None
    state = signal.init(jax.random.PRNGKey(0), jax_ctx())
    _, out, _ = signal.after_advantages(state, jax_batch(arrays[0]), None, None)
    assert out == jb.Output()


# ----------------------------------------------------------------------------- all five, compiled


def test_unknown_signal_and_torch_only_shaping_modes():
    with pytest.raises(UserError, match="signal .verdict. has no JAX implementation; backend=jax runs calibration, "):
        make_signal("verdict", None)
    for knobs, knob in (({"mode": "bootstrap"}, "shaping.mode=bootstrap"), ({"mode": "advice"}, "shaping.mode=advice"),
                        ({"encoder": "cnn"}, "shaping.encoder=cnn"), ({"imagined_fraction": 0.5},
                                                                     "shaping.imagined_fraction")):
        with pytest.raises(UserError, match=f"{knob} is torch-only on backend=jax"):
            make_signal("shaping", ShapingConfig(**knobs))
    assert make_signal("shaping", ShapingConfig(mode="off")).shape_rewards({}, None, None) == ({}, None, {})


SMALL = {"count": CountConfig(beta=0.1),
         "calibration": CalibrationConfig(hidden_sizes=(8,), epochs=2),
         "shaping": ShapingConfig(hidden_sizes=(8,), update_every=1, buffer_rollouts=2, epochs=2),
         "gear": GEARConfig(hidden_sizes=(8,), epochs=2),
         "rnd": RndConfig(hidden_sizes=(8,), embedding_dim=4, epochs=1)}


@pytest.mark.parametrize("name", list(JAX_SIGNALS))
def test_every_signal_runs_jitted_and_vmapped_over_seeds(arrays, name):
    signal = make_signal(name, SMALL[name])
    ctx = jax_ctx()
    batches = [jax_batch(a, iteration=i, global_step=i * T * N) for i, a in enumerate(arrays)]
    value_fn = lambda obs: obs.sum(-1) * 0.1  # noqa: E731

    def step(state, batch, keys):
        estimate = estimate_for(batch)
        state, term, m1 = signal.shape_rewards(state, batch, keys[0])
        rewards = batch.rewards if term is None else batch.rewards + term
        adv, ret = estimate(rewards)
        batch = batch._replace(rewards=rewards, advantages=adv, returns=ret)
        state, out, m2 = signal.after_advantages(state, batch, keys[1], estimate)
        state, m3 = signal.after_update(state, batch, keys[2], value_fn, estimate)
        return state, (term, out, {**m1, **m2, **m3})

    seeds = jax.random.split(jax.random.PRNGKey(0), 2)
    state = jax.jit(jax.vmap(lambda k: signal.init(k, ctx)))(seeds)
    step = jax.jit(jax.vmap(step, in_axes=(0, None, 0)))  # one program for both iterations
    outs = []
    for i, batch in enumerate(batches):  # two iterations: the second sees what the first fit
        state, out = step(state, batch, jax.vmap(lambda k, i=i: jax.random.split(jax.random.fold_in(k, i), 3))(seeds))
        outs.append(out)
    for leaf in jax.tree_util.tree_leaves(state):
        assert leaf.shape[:1] == (2,) and np.isfinite(np.asarray(leaf, np.float64)).all()
    for term, out, metrics in outs:
        for value in jax.tree_util.tree_leaves((term, out)):
            assert np.isfinite(np.asarray(value)).all() and value.shape[:1] == (2,)
        assert metrics and all(v.shape == (2,) for v in metrics.values())
    term, out, metrics = outs[-1]  # the second iteration: what each signal gives once its heads have fit
    given = {"count": term, "calibration": out.reward, "shaping": term, "gear": out.weights, "rnd": out.stream}[name]
    assert given is not None and given.shape == (2, T, N)
    if name in ("shaping", "gear", "rnd"):
        finite = [k for k, v in metrics.items() if np.isfinite(np.asarray(v)).all()]
        assert len(finite) == len(metrics), f"non-finite metrics: {set(metrics) - set(finite)}"


def test_a_streams_coefficients_per_seed_give_its_weight():
    """Signal.seed_stream: RND's stream as one seed sees it, its coefficients that seed's where they
    differ between a program's seeds; Stream.weight (k_s) traced equals its constant form, 0 included."""
    rnd = JAX_SIGNALS["rnd"](RndConfig(int_coef=1.0, ext_coef=2.0))
    assert rnd.seed_stream(None) is rnd.stream and rnd.seed_stream({"count.beta": 0.1}) is rnd.stream
    seed = rnd.seed_stream({"rnd.int_coef": jnp.float32(0.5), "count.beta": 0.1})
    assert float(seed.coef) == 0.5 and seed.extrinsic_coef == 2.0 and seed.gamma == rnd.stream.gamma

    @jax.jit
    def weight(coef, extrinsic):
        return rnd.stream._replace(coef=coef, extrinsic_coef=extrinsic).weight

    for coef, extrinsic in [(1.0, 2.0), (0.5, 0.0), (0.3, 1.5)]:
        constant = rnd.stream._replace(coef=coef, extrinsic_coef=extrinsic).weight
        assert float(weight(coef, extrinsic)) == pytest.approx(constant, rel=1e-6)
