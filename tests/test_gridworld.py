"""Tests for the built-in GridWorld maze env."""

from __future__ import annotations

import pickle
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from reflectrl.envs.gridworld import GridWorldEnv, register_gridworld

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3
LAYOUTS = ["empty", "rooms", "maze", "S.#/..#/..G"]


def shortest_actions(env: GridWorldEnv) -> list[int]:
    """BFS over env.next_cell; independent of the env's own reachability check."""
    parent: dict[tuple[int, int], tuple[tuple[int, int], int] | None] = {env.start: None}
    queue = deque([env.start])
    while queue:
        cell = queue.popleft()
        if cell == env.goal:
            break
        for a in range(4):
            nxt = env.next_cell(cell, a)
            if nxt not in parent:
                parent[nxt] = (cell, a)
                queue.append(nxt)
    assert env.goal in parent, "goal unreachable"
    actions, cell = [], env.goal
    while parent[cell] is not None:
        cell, a = parent[cell]
        actions.append(a)
    return actions[::-1]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("obs_mode", ["onehot", "coords"])
def test_check_env(layout: str, obs_mode: str) -> None:
    check_env(GridWorldEnv(size=7, layout=layout, obs_mode=obs_mode), skip_render_check=True)


@pytest.mark.parametrize("layout", ["empty", "rooms", "maze"])
@pytest.mark.parametrize("size", [5, 8, 11])
def test_optimal_path_reaches_goal(layout: str, size: int) -> None:
    env = GridWorldEnv(size=size, layout=layout)
    obs, info = env.reset(seed=0)
    assert env.cell_of(obs) == env.start == info["cell"]
    actions = shortest_actions(env)
    if layout == "empty":
        assert len(actions) == 2 * (size - 1)
    for i, a in enumerate(actions):
        obs, reward, terminated, truncated, info = env.step(a)
        last = i == len(actions) - 1
        assert reward == (1.0 if last else 0.0)
        assert terminated is last
        assert truncated is False
    assert env.cell_of(obs) == env.goal == info["cell"]


def test_builtin_layout_geometry() -> None:
    env = GridWorldEnv(size=8, layout="rooms")
    mid = 4
    cross = env.walls[mid, :].tolist() + env.walls[:, mid].tolist()
    assert cross.count(False) == 4  # exactly one doorway per wall segment
    assert env.walls[mid, mid]
    assert (env.start, env.goal) == ((0, 0), (7, 7))
    assert not GridWorldEnv(size=8, layout="empty").walls.any()

    # The maze depends only on size, and is perfect: free cells form a tree.
    maze = GridWorldEnv(size=9, layout="maze")
    np.testing.assert_array_equal(maze.walls, GridWorldEnv(size=9, layout="maze").walls)
    free = set(maze.free_cells())
    edges = sum((r + 1, c) in free for r, c in free) + sum((r, c + 1) in free for r, c in free)
    assert edges == len(free) - 1
    assert len(maze.free_cells()) > 9 * 9 // 2
    assert (maze.start, maze.goal) == ((0, 0), (8, 8))


def test_walls_and_edges_block_movement() -> None:
    env = GridWorldEnv(layout="S#./.#./..G")
    obs, _ = env.reset(seed=0)
    for a in (UP, LEFT, RIGHT):  # grid edge, grid edge, wall
        obs2, reward, terminated, truncated, info = env.step(a)
        np.testing.assert_array_equal(obs2, obs)
        assert info["cell"] == (0, 0)
        assert (reward, terminated, truncated) == (0.0, False, False)
    assert env.step(DOWN)[4]["cell"] == (1, 0)
    assert env.step(RIGHT)[4]["cell"] == (1, 0)  # wall at (1, 1)
    assert env.next_cell((2, 1), UP) == (2, 1)
    assert env.next_cell((2, 1), RIGHT) == (2, 2)


def test_truncation_at_max_episode_steps() -> None:
    env = GridWorldEnv(size=5, layout="empty", max_episode_steps=3)
    env.reset(seed=0)
    flags = [env.step(UP)[3] for _ in range(3)]
    assert flags == [False, False, True]
    env.reset()
    assert env.step(UP)[3] is False  # reset restarts the step count
    assert GridWorldEnv(size=5, layout="empty").max_episode_steps == 4 * 5 * 5


def test_goal_on_last_step_is_termination_not_truncation() -> None:
    env = GridWorldEnv(layout="SG/..", max_episode_steps=1)
    env.reset(seed=0)
    _, reward, terminated, truncated, _ = env.step(RIGHT)
    assert (reward, terminated, truncated) == (1.0, True, False)


@pytest.mark.parametrize("obs_mode", ["onehot", "coords"])
def test_obs_cell_round_trip(obs_mode: str) -> None:
    env = GridWorldEnv(size=6, layout="rooms", obs_mode=obs_mode)
    for cell in env.free_cells():
        obs = env.obs_for_cell(*cell)
        assert obs.dtype == np.float32 and env.observation_space.contains(obs)
        assert env.cell_of(obs) == cell
    if obs_mode == "onehot":
        assert env.obs_for_cell(1, 2).argmax() == 1 * 6 + 2
    else:
        np.testing.assert_allclose(env.obs_for_cell(5, 0), [1.0, 0.0])


def test_render() -> None:
    env = GridWorldEnv(size=5, layout="rooms", render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.shape == (80, 80, 3) and frame.dtype == np.uint8
    assert tuple(frame[8, 8]) == (220, 0, 0)  # agent at start (0, 0)
    assert tuple(frame[4 * 16 + 8, 4 * 16 + 8]) == (0, 170, 0)  # goal
    assert tuple(frame[2 * 16 + 8, 2 * 16 + 8]) == (64, 64, 64)  # wall at the centre
    assert tuple(frame[8, 16 + 8]) == (255, 255, 255)  # free
    with pytest.warns(UserWarning, match="render_mode"):
        assert GridWorldEnv(size=5).render() is None


def test_ascii_map_parse() -> None:
    text = """
        S..#
        .#.#
        .#..
        ...G
    """
    env = GridWorldEnv(layout=text, size=20)  # size is inferred from the map
    assert env.size == 4
    assert (env.start, env.goal) == ((0, 0), (3, 3))
    assert env.walls.sum() == 4 and env.walls[0, 3] and env.walls[1, 1]
    assert env.observation_space.shape == (16,)
    np.testing.assert_array_equal(GridWorldEnv(layout="S..#/.#.#/.#../...G").walls, env.walls)


@pytest.mark.parametrize(
    "layout, match",
    [
        ("S../.../..", "square"),
        ("S..G", "square"),
        ("S../.../...", "exactly one 'G'"),
        ("SSG/.../...", "exactly one 'S'"),
        ("S#./##./..G", "not reachable"),
        ("S.x/.../..G", "unknown layout"),
        ("S .//.../..G", "invalid character"),
        ("hallway", "unknown layout"),
    ],
)
def test_ascii_map_errors(layout: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GridWorldEnv(layout=layout)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"size": 2, "layout": "empty"}, r"\[3, 64\]"),
        ({"size": 65, "layout": "rooms"}, r"\[3, 64\]"),
        ({"size": 4, "layout": "maze"}, r"\[5, 64\]"),
        ({"obs_mode": "pixels"}, "obs_mode"),
        ({"render_mode": "human"}, "render_mode"),
        ({"max_episode_steps": 0}, "max_episode_steps"),
    ],
)
def test_invalid_arguments(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GridWorldEnv(**kwargs)


def test_invalid_action() -> None:
    env = GridWorldEnv(size=5)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="invalid action"):
        env.step(4)


def test_pickle_round_trip_preserves_state() -> None:
    env = GridWorldEnv(size=6, layout="maze", max_episode_steps=20)
    env.reset(seed=123)
    rng = np.random.default_rng(0)
    for a in rng.integers(4, size=7):
        env.step(int(a))
    clone = pickle.loads(pickle.dumps(env))
    assert clone._agent == env._agent  # noqa: SLF001 - state we care about
    actions = rng.integers(4, size=15)
    for a in actions:
        out, out_clone = env.step(int(a)), clone.step(int(a))
        np.testing.assert_array_equal(out[0], out_clone[0])
        assert out[1:4] == out_clone[1:4]
    assert out[3] is True  # both truncate at the same (restored) step count
    assert env.np_random.random() == clone.np_random.random()


def test_gymnasium_make() -> None:
    register_gridworld()
    register_gridworld()  # idempotent
    env = gym.make("reflectrl/GridWorld-v0", size=6)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (36,)
    assert env.unwrapped.max_episode_steps == 4 * 36
    # No TimeLimit from the registry: truncation comes from the env itself.
    assert env.spec.max_episode_steps is None
    env.close()
