"""policy=gru on backend=jax (issue 61): the rollout keeps the GRU's hidden state and zeroes it where an
episode starts, the update re-runs each env's sequence from the rollout's initial hidden state, a run resumes
exactly (the hidden state is in the checkpoint) and `eval` carries the hidden state; policy=mlp's program is
the one of before; what cannot work is refused in one line. Tiny shapes; the compiled programs are shared."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("gymnax")

import jax.numpy as jnp  # noqa: E402

from reflectrl.cli import main  # noqa: E402
from reflectrl.trainers.ppo_jax import ppo  # noqa: E402
from reflectrl.trainers.ppo_jax.evaluate import act, initial_hidden, load_actor  # noqa: E402
from reflectrl.trainers.ppo_jax.trainer import JaxGroup  # noqa: E402
from reflectrl.trainers.resolve import new_run_config  # noqa: E402

TINY = ["backend=jax", "num_envs=2", "num_steps=16", "num_minibatches=2", "update_epochs=2", "hidden_sizes=8,8"]
GRU = [*TINY, "policy=gru"]


def config(extra, total: int = 256, seed: int = 3):
    return new_run_config(algo="ppo", env_id="gymnax:CartPole-v1", seed=seed, total_steps=total,
                          overrides=[*extra, "checkpoint_every=64"])


@pytest.mark.parametrize("extra, says", [
    (["policy=lstm"], "policy=lstm runs on the torch backend; on backend=jax use policy=gru"),
    (["policy=gru", "num_envs=3", "num_minibatches=2"],
     "policy=gru splits the num_envs=3 envs into num_minibatches=2 minibatches of whole sequences"),
])
def test_a_combination_that_cannot_work_is_one_line(tmp_path, capsys, extra, says):
    out = tmp_path / "run"
    assert main(["train", "--env", "gymnax:CartPole-v1", "--out", str(out), "--set", "backend=jax", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_the_rollout_zeroes_the_hidden_state_where_an_episode_starts_and_the_update_replays_it():
    """A random policy's CartPole episodes last ~20 steps: a rollout of 2 x 64 steps starts several."""
    group = JaxGroup([config([*GRU, "num_steps=64"])], [None])
    setup = group.setup
    state = jax.tree_util.tree_map(lambda x: x[0], group.states)
    state = {**state, "hidden": jnp.full_like(state["hidden"], 0.5)}  # as if mid-episode: the reset must show
    after, traj = jax.jit(lambda s: ppo.rollout(setup, s))(state)
    params, done = state["params"], np.asarray(traj["done"])
    starts = np.asarray(ppo.episode_starts(traj["done"]))
    assert done.sum() >= 2 and starts[1:].sum() == done[:-1].sum() and not starts[0].any()
    np.testing.assert_array_equal(traj["initial_hidden"], state["hidden"])
    # the update's replay of the sequences gives the features the rollout acted on
    replay = jax.jit(ppo.unroll)(params, traj["initial_hidden"], traj["obs"], jnp.asarray(starts))
    np.testing.assert_allclose(replay, traj["features"], rtol=1e-5, atol=1e-6)
    # where an episode starts, the features come from a zero hidden state, not from the step before
    t, n = np.argwhere(starts)[0]
    fresh = ppo.recurrent_features(params, jnp.zeros_like(state["hidden"][n]), traj["obs"][t, n])
    carried = ppo.recurrent_features(params, traj["features"][t - 1, n], traj["obs"][t, n])
    np.testing.assert_allclose(traj["features"][t, n], fresh, rtol=1e-5, atol=1e-6)
    assert not np.allclose(fresh, carried)
    # the state carries the next rollout's hidden state: zero where the last step ended an episode
    expected = np.where(done[-1][:, None], 0.0, np.asarray(traj["features"][-1]))
    np.testing.assert_array_equal(after["hidden"], expected)


# policy=mlp's whole state after two iterations (params, optimiser, envs, signals' states, metrics' tables),
# recorded with the program of before policy=gru existed (jax 0.10.2 on CPU; float rounding may differ on another
# kind of machine: record its hash here where the code of before gives it there)
MLP_STATE_SHA256 = {"1caab5044d7855f741f4b5e456d29b3702e2b0e6be19f4d6f74c67dae4e962ff"}


def state_sha256(state) -> str:
    h = hashlib.sha256()
    for path, leaf in sorted(jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0],
                             key=lambda kv: jax.tree_util.keystr(kv[0])):
        h.update(jax.tree_util.keystr(path).encode())
        h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return h.hexdigest()


def test_the_mlp_program_is_the_one_of_before():
    group = JaxGroup([config(TINY, total=64)], [None])
    group.train(progress=False)
    assert "hidden" not in group.states and not group.setup.recurrent
    assert state_sha256(group.states) in MLP_STATE_SHA256


@pytest.mark.slow
def test_a_gru_run_resumes_exactly_and_eval_and_act_carry_its_hidden_state(tmp_path, capsys, ctrl_c_after_rows,
                                                                           monkeypatch):
    """Ctrl-C mid-run, resumed: the parameters of a run never stopped (the hidden state is in the checkpoint).
    `eval` reads the run's policy; `act` steps a batch with its hidden state."""
    base = ["train", "--env", "gymnax:CartPole-v1", "--total-steps", "256", "--no-progress", "--set", *GRU,
            "checkpoint_every=64"]
    assert main([*base, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "run"
    ctrl_c_after_rows(3)
    assert main([*base, "--out", str(out)]) == 130
    monkeypatch.undo()
    from reflectrl.runs.rundir import RunDir

    saved = RunDir(out).load_checkpoint()
    assert 0 < saved["global_step"] < 256
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    a, b = (json.loads((d / "run.json").read_text()) for d in (tmp_path / "whole", out))
    assert a["status"] == b["status"] == "finished" and a["params_sha256"] == b["params_sha256"]
    capsys.readouterr()
    assert main(["eval", str(out), "--episodes", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["returns"]) == 3 and result["params_sha256"] == b["params_sha256"]
    # act: a batch of 2 observations, the hidden state carried from one call to the next
    from reflectrl.config import RunConfig

    run = RunDir(out)
    group, params, normalise = load_actor(RunConfig.from_dict(run.config()), run.load_checkpoint())
    hidden = initial_hidden(group.setup, (2,))
    obs = jnp.ones((2, group.env.obs_dim))
    action, h1 = act(group.setup, params, normalise, obs, True, None, hidden)
    _, h2 = act(group.setup, params, normalise, obs, True, None, h1)
    assert action.shape == (2,) and h1.shape == hidden.shape and not np.allclose(h1, h2)
    # the Python API's predict: sb3-contrib's convention, the hidden state given back and taken again
    import reflectrl

    policy = reflectrl.load(out).policy
    actions, state = policy.predict(np.ones((2, group.env.obs_dim), np.float32), deterministic=True)
    assert policy.recurrent and actions.shape == (2,) and state.shape == (1, 2, 8)
    np.testing.assert_allclose(state[0], h1, rtol=1e-5, atol=1e-6)
    _, again = policy.predict(np.ones((2, group.env.obs_dim), np.float32), state, np.array([True, False]),
                              deterministic=True)
    np.testing.assert_allclose(again[0, 0], h1[0], rtol=1e-5, atol=1e-6)  # env 0 began again: from zeros
    np.testing.assert_allclose(again[0, 1], h2[1], rtol=1e-5, atol=1e-6)
