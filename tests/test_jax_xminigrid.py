"""xland-minigrid's MiniGrid tasks on the JAX backend (`xminigrid:<id>`, issue 39): its episodes
against MiniGrid's own env, the state keys, the auto-reset and a run directory (the refusals:
tests/test_jax_backend.py).
Shapes are tiny; the env's programs are shared within the module."""

from __future__ import annotations

import json

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("xminigrid")

from reflectrl.cli import main  # noqa: E402
from reflectrl.envs.jax_envs import make_env  # noqa: E402
from reflectrl.envs.statekey import unpack_navix_key  # noqa: E402
from reflectrl.runs.rundir import read_metrics  # noqa: E402

# xland-minigrid's actions (forward, right, left, pick up, put down, toggle) as MiniGrid's
# (left 0, right 1, forward 2, pick up 3, drop 4, toggle 5)
TO_MINIGRID = {0: 2, 1: 1, 2: 0, 3: 3, 4: 4, 5: 5}


@pytest.fixture(scope="module")
def empty5():
    env = make_env("xminigrid:MiniGrid-Empty-5x5")
    return env, jax.jit(env.reset), jax.jit(env.step)


def cell(key) -> tuple[int, int]:
    col, row = unpack_navix_key(np.asarray(key))
    return int(row), int(col)


def minigrid_episode(actions):
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("minigrid")
    env = gym.make("MiniGrid-Empty-5x5-v0")
    env.reset(seed=0)
    steps = []
    for a in actions:
        _, reward, terminated, truncated, _ = env.step(TO_MINIGRID[a])
        col, row = env.unwrapped.agent_pos
        steps.append((round(float(reward), 6), bool(terminated), bool(truncated), (int(row), int(col))))
    return steps


def xminigrid_episode(empty5, actions):
    _, reset, step = empty5
    _, state, key = reset(jax.random.PRNGKey(0))
    steps, keys = [], [int(key)]
    for i, a in enumerate(actions):
        out = step(jax.random.PRNGKey(i), state, a)
        state = out.env_state
        steps.append((round(float(out.reward), 6), bool(out.terminated), bool(out.truncated), cell(out.reached_key)))
        keys.append(int(out.key))
    return steps, keys


def test_an_episode_to_the_goal_matches_minigrid(empty5):
    env = empty5[0]
    assert (env.obs_dim, env.action_dim, env.max_steps) == (7 * 7 * 2, 6, 4 * 5 * 5)  # MiniGrid's limit
    actions = [0, 0, 1, 0, 0]   # forward twice, turn right, forward twice: the goal in the corner
    steps, keys = xminigrid_episode(empty5, actions)
    assert steps == minigrid_episode(actions)
    assert steps[-1][:2] == (round(1 - 0.9 * 5 / 100, 6), True)   # MiniGrid's reward 1 - 0.9 t / max_steps
    assert cell(keys[-1]) == cell(keys[0]) == (1, 1)   # the next episode starts where the first did


def test_the_step_limit_truncates_as_minigrid_does(empty5):
    actions = [1] * 100   # turning in place until the limit
    steps, keys = xminigrid_episode(empty5, actions)
    assert steps == minigrid_episode(actions)
    assert [s[2] for s in steps].index(True) == 99 and not any(s[1] for s in steps)
    headings = {int(k) // 2 % 4 for k in keys[:5]}
    assert len(headings) == 4   # the key tells the headings apart


def test_the_key_says_whether_something_is_carried():
    env = make_env("xminigrid:MiniGrid-DoorKey-5x5")
    _, state, key = jax.jit(env.reset)(jax.random.PRNGKey(3))
    assert int(key) % 2 == 0
    carrying = state.replace(state=state.state.replace(agent=state.state.agent.replace(
        pocket=np.asarray([7, 5], np.uint8))))   # a yellow key in the pocket
    assert int(env._key(carrying.state)) == int(key) + 1


@pytest.mark.slow
def test_a_run_on_lockedroom_writes_its_run_directory(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--algo", "ppo+count", "--env", "xminigrid:MiniGrid-LockedRoom", "--total-steps", "128",
                 "--set", "backend=jax", "num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=1",
                 "hidden_sizes=8,8", "--out", str(out), "--no-progress"]) == 0
    rows = read_metrics(out)
    assert rows[-1]["global_step"] == 128
    # the exploration metrics, counted in the program from the player's cell, heading and pocket
    assert 1 <= rows[-1]["unique_states_total"] <= 128
    assert json.loads((out / "config.json").read_text())["env_id"] == "xminigrid:MiniGrid-LockedRoom"
