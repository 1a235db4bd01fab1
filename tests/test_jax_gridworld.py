"""The built-in maze on the JAX backend (reflectrl:GridWorld-v0, issue 42): the same task as the torch
env step for step, one-line refusals, and a run whose state map and claims read it as the maze."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from reflectrl.cli import main  # noqa: E402
from reflectrl.envs.gridworld import GridWorldEnv  # noqa: E402
from reflectrl.envs.jax_envs import make_env, vector_step  # noqa: E402
from reflectrl.report.analysis import SPARSE_ENV_PREFIXES  # noqa: E402


@pytest.mark.parametrize("kwargs", [
    {"size": 7, "layout": "maze"},
    {"size": 6, "layout": "rooms", "obs_mode": "coords", "max_episode_steps": 30},
    {"layout": "S..#/.#../.#../...G"},
])
def test_steps_equal_the_torch_env(kwargs):
    """Random actions through both envs: observation, reward, end flags and state key agree on every
    step, across episodes (the JAX env reset where the torch one ends)."""
    jenv, tenv = make_env("reflectrl:GridWorld-v0", kwargs), GridWorldEnv(**kwargs)
    actions = np.random.default_rng(0).integers(0, 4, size=600)

    def body(carry, action):
        state = carry
        out = vector_step(jenv, jax.random.PRNGKey(0), state, action[None])
        return out.env_state, (out.obs[0], out.final_obs[0], out.reward[0], out.terminated[0], out.truncated[0],
                               out.reached_key[0])

    _, state, _ = jax.vmap(jenv.reset)(jax.random.split(jax.random.PRNGKey(0), 1))
    _, (obs, final, reward, term, trunc, key) = jax.lax.scan(body, state, jax.numpy.asarray(actions))
    tenv.reset(seed=0)
    episodes = 0
    for t, a in enumerate(actions):
        to, tr, tt, ttr, info = tenv.step(int(a))
        np.testing.assert_array_equal(np.asarray(final[t]), to)
        assert (float(reward[t]), bool(term[t]), bool(trunc[t])) == (tr, tt, ttr), t
        assert int(key[t]) == info["cell"][0] * tenv.size + info["cell"][1]
        if tt or ttr:
            episodes += 1
            to, _ = tenv.reset()
        np.testing.assert_array_equal(np.asarray(obs[t]), to)  # the next episode's first where one ended
    assert episodes >= 2
    assert jenv.key_space == tenv.size ** 2 and jenv.max_steps == tenv.max_episode_steps


MAZE = ["--env", "reflectrl:GridWorld-v0", "--set", "backend=jax"]


@pytest.mark.parametrize("argv, says", [
    ([*MAZE, "env.hazards=3"], "env.hazards (a cost channel) is torch-only"),
    ([*MAZE, "env.size=2", "env.layout=maze"], "size must be an integer"),
    ([*MAZE, "env.layout=S.H/.../..G"], "is torch-only"),
    (["--env", "reflectrl:Maze-v9", "--set", "backend=jax"], "built-in env is reflectrl:GridWorld-v0"),
    (["--env", "gymnax:CartPole-v1"], "is a JAX env: add --set backend=jax"),
])
def test_refusals_are_one_line(tmp_path, capsys, argv, says):
    out = tmp_path / "run"
    assert main(["train", *argv, "--total-steps", "256", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("given", ["reflectrl/GridWorld-v0", "reflectrl:GridWorld-v0"])
@pytest.mark.parametrize("backend, recorded", [("gymnasium", "reflectrl/GridWorld-v0"),
                                               ("jax", "reflectrl:GridWorld-v0")])
def test_each_backend_takes_both_spellings_of_the_maze_and_records_its_own(given, backend, recorded):
    """Issue 57: the torch side refused reflectrl:GridWorld-v0 and the JAX side reflectrl/GridWorld-v0."""
    from reflectrl.cli import config_from_train_argv

    cfg = config_from_train_argv(["--env", given, "--set", f"backend={backend}", "--total-steps", "512"])
    assert cfg.env_id == recorded


def test_compare_refuses_both_spellings_of_the_maze_at_once(cli, tmp_path):
    out = tmp_path / "exp"
    code, _, err = cli("compare", "--env", "reflectrl/GridWorld-v0,reflectrl:GridWorld-v0", "--algos", "ppo",
                       "--total-steps", "512", "--out", out)
    assert code == 2 and "two of these name one env" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_the_claims_count_the_jax_maze_and_navix_as_sparse():
    for env_id in ("reflectrl:GridWorld-v0", "navix:Navix-DoorKey-Random-8x8-v0", "reflectrl/GridWorld-v0"):
        assert env_id.startswith(SPARSE_ENV_PREFIXES)
    assert not "gymnax:CartPole-v1".startswith(SPARSE_ENV_PREFIXES)


@pytest.mark.slow
def test_a_count_bonus_run_explores_the_maze_and_draws_its_state_map(tmp_path):
    """A tiny maze run: the count bonus is paid from the first iteration, the state keys are the
    maze's cells, and `plot state-map` reads them as the grid."""
    out = tmp_path / "run"
    assert main(["train", "--env", "reflectrl:GridWorld-v0", "--algo", "ppo+count", "--total-steps", "512",
                 "--set", "backend=jax", "env.size=5", "env.layout=maze", "num_envs=2", "num_steps=32",
                 "num_minibatches=2", "update_epochs=1", "hidden_sizes=8,8", "--no-progress",
                 "--out", str(out)]) == 0
    from reflectrl.runs.rundir import read_metrics

    rows = read_metrics(out)
    assert rows[0]["count_bonus_mean"] > 0
    free = int((~GridWorldEnv(size=5, layout="maze").walls).sum())
    assert 1 < rows[-1]["unique_states_total"] <= free
    from reflectrl.report.state_map import state_maps

    _, snapshots, *_ = state_maps(out)
    panel = snapshots[-1][2]["visits (log10 1+n)"]
    assert panel.shape[0] <= 5 and panel.shape[1] <= 5 and np.nansum(panel) > 0
