"""The JAX signals in anyone's loop (issue 58, signals/jax_standalone.py): init/update/after_update jit and
vmap over seeds; the JAX PPO's apply_signals and signal init are these same functions; the PureJaxRL example
at the signals' neutral settings is PureJaxRL's run bit for bit. Compiled programs are shared per module."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("gymnax")
pytest.importorskip("flax")

import jax.numpy as jnp  # noqa: E402

from reflectrl.errors import UserError  # noqa: E402
from reflectrl.estimators_jax import gae  # noqa: E402
from reflectrl.signals import jax_standalone as sj  # noqa: E402

T, N, OBS, ACTIONS, KEYS = 8, 2, 3, 2, 16
SPEC = sj.Context(obs_dim=OBS, action_dim=ACTIONS, discrete=True, feature_dim=4, learning_rate=1e-3, gamma=0.9,
                  gae_lambda=0.8, num_steps=T, num_envs=N, total_iterations=4, key_space=KEYS)
SMALL = {"count": {"beta": 0.1}, "gear": {"hidden_sizes": (8,), "epochs": 2, "inputs": "obs", "temperature": 1.0}}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "purejaxrl_ppo_signals.py"


def rollout(seed: int, iteration: int = 0) -> sj.Batch:
    rng = np.random.default_rng(seed)
    done = rng.random((T, N)) < 0.2
    f32 = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    return sj.make_batch(obs=f32(T, N, OBS), actions=jnp.asarray(rng.integers(0, ACTIONS, (T, N)), jnp.int32),
                         rewards=jnp.asarray(rng.random((T, N)) < 0.3, jnp.float32),
                         terminations=jnp.asarray(done, jnp.float32), truncations=jnp.zeros((T, N), jnp.float32),
                         values=f32(T, N), next_values=f32(T, N) * jnp.asarray(~done, jnp.float32),
                         next_obs=f32(T, N, OBS), state_keys=rng.integers(0, KEYS, (T, N)),
                         next_state_keys=rng.integers(0, KEYS, (T, N)), iteration=iteration,
                         global_step=iteration * T * N)


def same(a, b) -> bool:
    """Bit for bit, pytrees alike."""
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.asarray(x).tobytes() == np.asarray(y).tobytes() for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def over_seeds():
    """count+gear over 2 seeds: init, then two iterations of update and after_update, each jitted and vmapped."""
    tx = sj.signals("count+gear", **SMALL)
    seeds = jax.random.split(jax.random.PRNGKey(0), 2)
    state = jax.jit(jax.vmap(lambda k: tx.init(k, SPEC)))(seeds)
    value_fn = lambda obs: obs.sum(-1) * 0.1  # noqa: E731

    def step(state, batch, key):
        k1, k2 = jax.random.split(key)
        state, terms, metrics = tx.update(state, batch, k1)
        state, after = tx.after_update(state, terms.batch, k2, value_fn)
        return state, terms, {**metrics, **after}

    step = jax.jit(jax.vmap(step, in_axes=(0, None, 0)))
    outs = []
    for i in range(2):  # the second sees the head the first distilled: weights other than 1
        state, terms, metrics = step(state, rollout(i, i), jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(seeds))
        outs.append((terms, metrics))
    return tx, state, outs


def test_init_update_and_after_update_jit_and_vmap_over_seeds(over_seeds):
    tx, state, outs = over_seeds
    assert [s.name for s in tx.signals] == ["count", "gear"]
    for leaf in jax.tree_util.tree_leaves(state):
        assert leaf.shape[:1] == (2,)
    terms, metrics = outs[-1]
    for field in ("advantages", "returns", "reward", "weights"):
        value = np.asarray(getattr(terms, field))
        assert value.shape == (2, T, N) and np.isfinite(value).all(), field
    assert terms.stream is None and set(terms.by_signal) == {"count reward", "gear weight"}
    assert not np.allclose(np.asarray(terms.weights), 1.0)  # the distilled head weighs the steps
    assert not np.array_equal(np.asarray(terms.weights[0]), np.asarray(terms.weights[1]))  # each seed its own
    assert metrics["count_bonus_mean"].shape == (2,) and metrics["winners"].shape == (2,)


def test_update_composes_as_the_protocol_says(over_seeds):
    """The count bonus is added before one GAE estimate with the spec's gamma and lambda; GEAR's weights
    leave the advantages as they are; after_update reads the batch with the bonus in its rewards."""
    _, _, outs = over_seeds
    terms, _ = outs[0]
    batch = rollout(0, 0)
    bonus = terms.reward[0]
    assert np.all(np.asarray(bonus) > 0) and np.asarray(bonus).max() <= 0.1
    expected = gae(batch.rewards + bonus, batch.values, batch.next_values, batch.terminations, batch.truncations,
                   SPEC.gamma, SPEC.gae_lambda)
    np.testing.assert_allclose(np.asarray(terms.advantages[0]), np.asarray(expected[0]), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(terms.batch.rewards[0]), np.asarray(batch.rewards + bonus))
    np.testing.assert_array_equal(np.asarray(terms.weights[0]), 1.0)  # no head distilled before the first


def test_the_jax_ppo_runs_the_signals_through_these_functions():
    """trainers/ppo_jax/ppo.py: a seed's signal states are init's, and apply_signals gives update's terms
    for the same batch and key, bit for bit."""
    from reflectrl.envs.jax_envs import make_env
    from reflectrl.trainers.ppo.config import PPOConfig
    from reflectrl.trainers.ppo_jax import ppo

    env = make_env("reflectrl:GridWorld-v0")
    knobs = dataclasses.replace(PPOConfig(num_envs=N, num_steps=T, hidden_sizes=(8,)).resolved(False),
                                num_minibatches=2, update_epochs=1)
    tx = sj.signals("count+gear", count={"beta": 0.1}, gear={"hidden_sizes": (8,), "epochs": 2})
    setup = ppo.Setup(env=env, knobs=knobs, signals=tx.signals, total_iterations=4)
    seed_key = ppo.seed_key(5)
    trainer_state = jax.jit(lambda k: ppo.init_state(setup, k))(seed_key)
    own = jax.jit(lambda k: tx.init(jax.random.split(k, 4)[2], setup.context()))(seed_key)
    assert same(trainer_state["signals"], own)

    spec = setup.context()
    rng = np.random.default_rng(7)
    batch = rollout(3)._replace(obs=jnp.asarray(rng.normal(size=(T, N, spec.obs_dim)), jnp.float32),
                                features=jnp.asarray(rng.normal(size=(T, N, spec.feature_dim)), jnp.float32),
                                next_obs=jnp.asarray(rng.normal(size=(T, N, spec.obs_dim)), jnp.float32))
    key = jax.random.PRNGKey(11)
    _, trainer_terms, trainer_metrics = jax.jit(lambda s, b, k: ppo.apply_signals(setup, s, b, k))(
        {"signals": own}, batch, key)
    _, terms, metrics = jax.jit(tx.update)(own, batch, key)
    assert same(trainer_terms, terms) and same(trainer_metrics, metrics)


def load_example():
    spec = importlib.util.spec_from_file_location("purejaxrl_ppo_signals", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (flax's modules are dataclasses: theirs must be importable)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example_run():
    """final(name) -> (final parameters, metrics) of the example, tiny: without signals ("ppo"), at their
    neutral settings, and with them on (each trained once per module)."""
    example = load_example()
    tiny = {**example.CONFIG, "NUM_ENVS": 2, "NUM_STEPS": 16, "TOTAL_TIMESTEPS": 2 * 16 * 3, "NUM_MINIBATCHES": 2,
            "UPDATE_EPOCHS": 2}
    neutral = {"count": {"beta": 0.0}, "gear": {"temperature": float("inf"), "inputs": "obs", "epochs": 2}}
    on = {"count": {"beta": 0.5}, "gear": {"temperature": 0.5, "inputs": "obs", "epochs": 2}}
    configs = {"ppo": {**tiny, "SIGNALS": None}, "neutral": {**tiny, "SIGNAL_KNOBS": neutral},
               "on": {**tiny, "SIGNAL_KNOBS": on}}
    done = {}

    def final(name):
        if name not in done:
            result = jax.jit(example.make_train(configs[name]))(jax.random.PRNGKey(3))
            done[name] = (result["runner_state"][0].params, result["metrics"])
        return done[name]

    return final


def test_the_example_at_the_neutral_settings_is_purejaxrl_bit_for_bit(example_run):
    (ppo_params, _), (neutral_params, metrics) = example_run("ppo"), example_run("neutral")
    assert same(ppo_params, neutral_params)
    assert np.all(np.asarray(metrics["count_bonus_mean"]) == 0.0) and np.all(np.asarray(metrics["weights_std"]) == 0)


@pytest.mark.slow
def test_the_example_with_the_signals_on_learns_otherwise(example_run):
    (ppo_params, _), (on_params, metrics) = example_run("ppo"), example_run("on")
    assert not same(ppo_params, on_params)
    assert np.all(np.asarray(metrics["count_bonus_mean"]) > 0) and np.asarray(metrics["weights_std"])[-1] > 0


@pytest.mark.slow
def test_the_example_runs_as_written(capsys):
    load_example().main([])
    out = capsys.readouterr().out
    assert "count+gear: 40000 steps, mean return of the last 20 episodes" in out and "count_bonus_mean" in out


@pytest.mark.parametrize("call, says", [
    (lambda: sj.signals("count+lagrangian"), "signal 'lagrangian' has no JAX form"),
    (lambda: sj.signals("count+calibration", beta=0.1), "knob 'beta' is a knob of count and calibration"),
    (lambda: sj.signals("count", betta=0.1), "unknown --set key 'count.betta'"),
    (lambda: sj.signals("count", beta="lots"), "count.beta=lots"),
    (lambda: sj.signals("gear", history=4), "gear.history=4 is torch-only"),
    (lambda: sj.signals("count+gear", betta=0.1), "no signal of 'count+gear' has a knob 'betta'"),
    (lambda: sj.signals("count", gear={"temperature": 1.0}), "gear= gives the knobs of a signal 'count' does not name"),
])
def test_bad_signals_or_knobs_are_one_line(call, says):
    with pytest.raises(UserError) as err:
        call()
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_batch_without_what_a_signal_reads_is_one_line():
    tx = sj.signals("count")
    state = tx.init(jax.random.PRNGKey(0), SPEC)
    with pytest.raises(UserError, match=r"signal count reads batch.state_keys, which is None"):
        tx.update(state, rollout(0)._replace(state_keys=None), jax.random.PRNGKey(1))
