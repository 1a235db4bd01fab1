"""Exploration state keys and metrics (issue 15 item 6): keys per env kind, the metrics on a
scripted walk in the grid world, their survival through a resume, and their place in a run's
log and in the report."""

import json
import math

import gymnasium as gym
import numpy as np
import pytest

from reflectrl.envs import make_env
from reflectrl.envs.statekey import (
    SIMHASH_BITS,
    StateKey,
    gridworld_key,
    key_function,
    minigrid_key,
    montezuma_key,
    room_of_key,
    simhash,
)
from reflectrl.trainers.exploration_metrics import METRICS, ExplorationTracker, RolloutKeys

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3


def _grid_envs(n=1, size=5):
    env_fn = lambda: StateKey(make_env("reflectrl/GridWorld-v0", env_kwargs={"size": size, "layout": "empty"}))  # noqa: E731
    return gym.vector.SyncVectorEnv([env_fn] * n, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def _walk(envs, keys, actions):
    """Step a 1-env vector env through actions; returns the (T, 1) rewards."""
    keys.start(len(actions))
    rewards = np.zeros((len(actions), 1))
    for t, a in enumerate(actions):
        obs, r, *_, info = envs.step(np.array([a]))
        keys.record(t, obs, info)
        rewards[t] = r
    return rewards


def test_metrics_of_a_scripted_walk_in_the_grid_world():
    envs = _grid_envs()
    obs, info = envs.reset(seed=0)
    keys = RolloutKeys(obs, info)
    assert keys.current.tolist() == [0]  # the start cell (0, 0)
    tracker = ExplorationTracker()

    # along the top row to (0, 4) and back to (0, 1): cells 0,1,2,3,4,3,2,1
    rewards = _walk(envs, keys, [RIGHT] * 4 + [LEFT] * 3)
    assert keys.state_keys[:, 0].tolist() == [0, 1, 2, 3, 4, 3, 2]
    assert keys.next_state_keys[:, 0].tolist() == [1, 2, 3, 4, 3, 2, 1]
    row = tracker.update(keys.state_keys, rewards, step_before=0)
    # visits: 0 once, 1 once, 2 twice, 3 twice, 4 once (7 steps)
    p = np.array([1, 1, 2, 2, 1]) / 7
    entropy = -(p * np.log(p)).sum()
    assert row == {"unique_states": 5, "unique_states_total": 5, "visitation_entropy": pytest.approx(entropy),
                   "first_reward_step": None}

    # from (0, 1): down the column to (4, 1), right to the goal (4, 4) -- an episode end -- then one step
    rewards = _walk(envs, keys, [DOWN] * 4 + [RIGHT] * 3 + [RIGHT])
    assert keys.state_keys[:, 0].tolist() == [1, 6, 11, 16, 21, 22, 23, 0]  # after the goal: the new episode's start
    assert keys.next_state_keys[:, 0].tolist() == [6, 11, 16, 21, 22, 23, 24, 1]  # the goal, not the reset state
    row = tracker.update(keys.state_keys, rewards, step_before=7)
    assert row["unique_states"] == 8 and row["unique_states_total"] == 11  # new: 6, 11, 16, 21, 22, 23
    assert row["first_reward_step"] == 7 + 7  # the 7th step of the second walk, one env
    # the window holds both iterations: 15 steps over 10 cells
    counts = np.array([2, 2, 2, 2, 1] + [1] * 6) / 15
    counts = counts[counts > 0]
    assert row["visitation_entropy"] == pytest.approx(-(counts * np.log(counts)).sum())
    assert math.isclose(counts.sum(), 1.0)

    # the first reward step stays the first
    row = tracker.update(keys.state_keys, rewards, step_before=100)
    assert row["first_reward_step"] == 14 and row["unique_states"] == 8 and row["unique_states_total"] == 11


def test_visitation_entropy_window_forgets_old_iterations():
    tracker = ExplorationTracker(window=2)
    tracker.update(np.arange(8).reshape(4, 2), np.zeros((4, 2)), 0)  # 8 states once
    assert tracker.visitation_entropy() == pytest.approx(math.log(8))
    tracker.update(np.zeros((4, 2), dtype=np.int64), np.zeros((4, 2)), 8)
    tracker.update(np.zeros((4, 2), dtype=np.int64), np.zeros((4, 2)), 16)  # the first iteration has left
    assert tracker.visitation_entropy() == 0.0
    assert tracker.update(np.zeros((4, 2), dtype=np.int64), np.zeros((4, 2)), 24)["unique_states_total"] == 8


def test_keys_of_minigrid_follow_position_heading_and_carried_object():
    env = make_env("MiniGrid-DoorKey-5x5-v0")
    env.reset(seed=3)
    assert key_function(env) is minigrid_key
    base = env.unwrapped
    before = minigrid_key(env)
    base.agent_dir = (base.agent_dir + 1) % 4
    turned = minigrid_key(env)
    from minigrid.core.world_object import Key

    base.carrying = Key("yellow")
    carrying = minigrid_key(env)
    assert len({before, turned, carrying}) == 3
    x, y = base.agent_pos
    assert turned & 0xFF == x and (turned >> 8) & 0xFF == y and (turned >> 16) & 3 == base.agent_dir


def test_montezuma_key_reads_room_and_position_from_ram():
    ale_py = pytest.importorskip("ale_py")
    gym.register_envs(ale_py)
    env = gym.make("ALE/MontezumaRevenge-v5")
    wrapped = StateKey(env, "ALE/MontezumaRevenge-v5")
    assert wrapped.key_fn is montezuma_key
    _, info = wrapped.reset(seed=0)
    ram = env.unwrapped.ale.getRAM()
    assert info["state_key"] == (int(ram[3]) << 16) | (int(ram[42]) << 8) | int(ram[43])
    assert room_of_key(np.array([info["state_key"]])).tolist() == [1]  # the game starts in room 1
    env.close()


def test_simhash_is_fixed_and_sign_sensitive():
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((6, 10)).astype(np.float32)
    keys = simhash(obs)
    assert keys.dtype == np.int64 and (keys >= 0).all() and (keys < 2**SIMHASH_BITS).all()
    assert np.array_equal(keys, simhash(obs.copy()))  # the same projection every time
    assert np.array_equal(simhash(-obs), (2**SIMHASH_BITS - 1) - keys)  # every sign flips
    assert np.array_equal(simhash(obs * 3.0), keys)  # directions, not magnitudes
    # elsewhere than the grid world, MiniGrid and Montezuma the wrapper hashes the observation
    env = StateKey(make_env("CartPole-v1"))
    assert env.key_fn is None
    obs0, info = env.reset(seed=1)
    assert info["state_key"] == simhash(obs0[None])[0]
    assert key_function(make_env("reflectrl/GridWorld-v0")) is gridworld_key


def _config(algo, env="reflectrl/GridWorld-v0", extra=()):
    from reflectrl.trainers.resolve import new_run_config

    return new_run_config(algo=algo, env_id=env, total_steps=640,
                          overrides=["num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1",
                                     "env.size=6", *extra] if env.startswith("reflectrl") else
                          ["num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1", *extra])


def resume_matches(tmp_path, monkeypatch, algo, env="reflectrl/GridWorld-v0", extra=(), stop_at=2):
    """A run stopped after `stop_at` iterations and resumed from its checkpoint ends with the
    weights and metrics of an uninterrupted one; returns (uninterrupted rows, the trainer resumed)."""
    from reflectrl.runs import RunDir
    from reflectrl.runs.rundir import read_metrics
    from reflectrl.runs.session import Terminated
    from reflectrl.trainers import base as loop_module
    from reflectrl.trainers.policies import params_sha256
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    full_run = RunDir.create(tmp_path / "full", _config(algo, env, extra).to_dict())
    full = PPOTrainer(_config(algo, env, extra), full_run)
    full.train(progress=False)
    run = RunDir.create(tmp_path / "run", _config(algo, env, extra).to_dict())
    first = PPOTrainer(_config(algo, env, extra), run)
    monkeypatch.setattr(loop_module, "stop_requested", lambda: first.iteration >= stop_at)
    with pytest.raises(Terminated):
        first.train(progress=False)
    monkeypatch.undo()
    second = PPOTrainer(_config(algo, env, extra), run)
    second.load_state_dict(run.load_checkpoint())
    second.train(progress=False)
    assert params_sha256(second.agent) == params_sha256(full.agent)
    rows, resumed = read_metrics(full_run.path), read_metrics(run.path)
    for key in ("policy_loss", "value_loss", *METRICS):
        assert [r.get(key) for r in resumed] == [r.get(key) for r in rows], key
    return rows, second


def test_unique_states_total_survives_resume(tmp_path, monkeypatch):
    rows, _ = resume_matches(tmp_path, monkeypatch, "ppo")
    totals = [r["unique_states_total"] for r in rows]
    assert totals == sorted(totals) and totals[-1] > totals[0]  # cumulative, and growing here


@pytest.mark.slow
def test_a_tiny_comparison_logs_and_plots_the_exploration_metrics(cli, tmp_path):
    out = tmp_path / "exp"
    code, _, err = cli("compare", "--algos", "ppo,ppo+count", "--out", out, "--no-progress", "--env",
                       "reflectrl/GridWorld-v0", "--seeds", "1", "--total-steps", "512", "--set", "env.size=5",
                       "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1")
    assert code == 0, err
    for algo in ("ppo", "ppo+count"):
        rows = [json.loads(x) for x in (out / f"runs/reflectrl_GridWorld-v0/{algo}/seed1/metrics.jsonl")
                .read_text().splitlines()]
        for row in rows:
            assert {"unique_states", "unique_states_total", "visitation_entropy", "first_reward_step"} <= set(row)
            assert "rooms_visited" not in row  # Montezuma only
            assert 1 <= row["unique_states"] <= row["unique_states_total"] <= 21  # the 5x5 rooms maze's free cells
    assert (out / "report/exploration_reflectrl_GridWorld_v0.png").is_file()
    assert "exploration" in (out / "report/report.md").read_text()


def test_exploration_figure_draws_each_entry(tmp_path):
    from reflectrl.report import plots

    class Spec:
        algos = ["ppo", "ppo+count"]

    class Run:
        def __init__(self, label, seed, first):
            self.spec = type("S", (), {"env_id": "e", "seed": seed, "entry": type("E", (), {"label": label})})
            self.rows = [{"global_step": s, "unique_states_total": s // 10, "unique_states": 3,
                          "visitation_entropy": 1.0, "first_reward_step": first if s >= (first or 1e9) else None}
                         for s in range(100, 1100, 100)]

    class Exp:
        spec = Spec()
        grid = np.linspace(0, 1000, 51)[1:]
        runs = [Run("ppo", 1, None), Run("ppo", 2, 500), Run("ppo+count", 1, 200)]
        finished = runs

        def select(self, env_id, label):
            return [r for r in self.runs if r.spec.entry.label == label]

    fig = plots.exploration_figure(Exp(), "e")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["unique_states_total", "unique_states", "visitation_entropy",
                      "seeds with a non-zero reward by then"]
    share = {line.get_label(): line.get_ydata() for line in fig.axes[3].get_lines()}
    assert share["ppo"][-1] == 0.5 and share["ppo+count"][-1] == 1.0 and share["ppo"][0] == 0.0


def test_large_observations_are_hashed_on_a_subsample_and_atari_games_on_their_ram():
    from reflectrl.envs.statekey import HASH_MAX_INPUTS, StateKey, hash_input, simhash_observations

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(3, 4, 84, 84)).astype(np.float32)  # (B, C, H, W) stacked frames
    rows = hash_input(frames[0])
    assert rows.shape[0] == 1 and 0 < rows.shape[1] <= HASH_MAX_INPUTS
    keys = simhash_observations(frames)
    assert keys.shape == (3,) and keys[0] == simhash(rows)[0] and len(set(keys.tolist())) == 3
    nudged = frames.copy()
    nudged[0, :, 1, 1] += 100.0  # a pixel off the subsampling grid: the same key
    assert simhash_observations(nudged)[0] == keys[0]
    nudged[0, :, 0, 0] += 500.0  # on the grid: a different key
    assert simhash_observations(nudged)[0] != keys[0]

    pytest.importorskip("ale_py")
    import gymnasium as gym

    from reflectrl.envs import make_env

    env = StateKey(make_env("ALE/Pong-v5", keep_image=True))
    try:
        _, info = env.reset(seed=0)
        ram = env.unwrapped.ale.getRAM().astype(np.float32)[None] - 128.0
        assert info["state_key"] == simhash(ram)[0]
    finally:
        env.close()
    assert isinstance(env, gym.Wrapper)


@pytest.mark.parametrize("env_id, sets", [("CartPole-v1", []), ("Pendulum-v1", ["num_envs=3"])])
def test_deferred_simhash_keys_equal_the_per_step_keys(env_id, sets):
    """The training envs defer their SimHash keys to one product per rollout (issue 38): the
    keys, the next keys and the current keys across rollouts and episode ends are the same as
    keying every step in the wrapper (the Pendulum envs normalise their observations: the keys
    read the raw ones)."""
    from reflectrl.envs import make_vector_env, statekey
    from reflectrl.trainers.resolve import new_run_config

    cfg = new_run_config(env_id=env_id, seed=3, total_steps=4096, overrides=["num_steps=64", *sets])
    results = []
    for deferred in (True, False):
        envs = make_vector_env(cfg)
        if not deferred:
            for env in envs.envs:
                while not isinstance(env, statekey.StateKey):
                    env = env.env
                env.deferred = False
        assert (statekey.deferred_wrappers(envs) is not None) == deferred
        obs, info = envs.reset(seed=3)
        keys = RolloutKeys(obs, info)
        space = envs.single_action_space
        space.seed(0)
        out = []
        for _ in range(3):  # rollouts of 80 steps: CartPole's episodes end inside them
            keys.start(80, envs)
            for t in range(80):
                obs, _, _, _, info = envs.step(np.stack([space.sample() for _ in range(envs.num_envs)]))
                keys.record(t, obs, info)
            keys.finish()
            out.append((keys.state_keys.copy(), keys.next_state_keys.copy(), keys.current.copy()))
        envs.close()
        results.append(out)
    for (a, b, c), (x, y, z) in zip(*results):
        assert np.array_equal(a, x) and np.array_equal(b, y) and np.array_equal(c, z)
    assert len(np.unique(results[0][0][0])) > 10  # the keys vary: the check compares something


def test_the_exploration_metrics_log_their_share_of_the_iteration(cli, tmp_path):
    out = tmp_path / "r"
    assert cli("train", "--env", "CartPole-v1", "--total-steps", "1024", "--out", out, "--no-progress",
               "--set", "num_envs=2", "num_steps=128")[0] == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shares = [r["exploration_time_fraction"] for r in rows]
    assert len(shares) == 4 and all(0 < s < 1 for s in shares)
