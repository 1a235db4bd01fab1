"""backend=envpool (issue 15, item 2): EnvPool's vector envs behind the Gymnasium vector-env
interface the PPO trainer uses: same-step autoreset, true returns, observations, state keys,
training end to end, resume, bad input."""

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("envpool")

from reflectrl.envs import envpool_backend, make_vector_env, snapshot  # noqa: E402
from reflectrl.envs.envpool_backend import EnvPoolVectorEnv, minigrid_keys  # noqa: E402
from reflectrl.envs.statekey import minigrid_key, room_of_key  # noqa: E402
from reflectrl.errors import UserError  # noqa: E402
from reflectrl.trainers.policies import params_sha256  # noqa: E402
from reflectrl.trainers.ppo.trainer import PPOTrainer  # noqa: E402
from reflectrl.trainers.resolve import new_run_config  # noqa: E402


def _envs(env_id, backend, *overrides, num_envs=2):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = new_run_config(env_id=env_id, total_steps=1024,
                             overrides=[f"backend={backend}", f"num_envs={num_envs}", *overrides])
        return make_vector_env(cfg)


def _play(envs, script, seed=0):
    """Reset, then step the scripted actions; every step's (obs, reward, term, trunc, info)."""
    obs, info = envs.reset(seed=seed)
    steps = [(obs, None, None, None, info)]
    for actions in script:
        steps.append(envs.step(np.array(actions)))
    envs.close()
    return steps


# MiniGrid-Empty-5x5 is deterministic: the agent starts at (1, 1) facing east, the goal is at (3, 3).
# Env 0 walks to the goal in 5 steps (forward, forward, right, forward, forward); env 1 only turns.
TO_GOAL = [(2, 0), (2, 0), (1, 0), (2, 0), (2, 0), (2, 1)]


@pytest.mark.parametrize("encoder", ["mlp", "cnn"])
def test_same_step_autoreset_and_final_obs_match_gymnasium(encoder):
    gym_steps = _play(_envs("MiniGrid-Empty-5x5-v0", "gymnasium", f"encoder={encoder}"), TO_GOAL)
    pool = _envs("MiniGrid-Empty-5x5-v0", "envpool", f"encoder={encoder}")
    assert isinstance(pool, EnvPoolVectorEnv)
    pool_steps = _play(pool, TO_GOAL)
    for t, (g, p) in enumerate(zip(gym_steps, pool_steps)):
        np.testing.assert_array_equal(p[0], g[0], err_msg=f"observation of step {t}")
        np.testing.assert_array_equal(p[4]["state_key"], g[4]["state_key"])
        if t:
            np.testing.assert_allclose(p[1], g[1], rtol=1e-6)
            np.testing.assert_array_equal(p[2], g[2])
            np.testing.assert_array_equal(p[3], g[3])
        assert ("final_obs" in p[4]) == ("final_obs" in g[4]) == (t == 5)
    end_gym, end_pool = gym_steps[5][4], pool_steps[5][4]
    np.testing.assert_array_equal(end_pool["_final_obs"], [True, False])
    np.testing.assert_array_equal(end_pool["final_obs"][0], end_gym["final_obs"][0])  # the goal reached
    np.testing.assert_array_equal(pool_steps[5][0][0], gym_steps[0][0][0])  # and the next episode's start
    ep_gym, ep_pool = end_gym["final_info"]["episode"], end_pool["final_info"]["episode"]
    np.testing.assert_array_equal(end_pool["final_info"]["_episode"], [True, False])
    assert ep_pool["l"][0] == ep_gym["l"][0] == 5
    assert ep_pool["r"][0] == pytest.approx(ep_gym["r"][0]) == pytest.approx(1 - 0.9 * 5 / 100)
    np.testing.assert_array_equal(end_pool["final_info"]["state_key"], end_gym["final_info"]["state_key"])
    assert end_pool["final_info"]["state_key"][0] == 3 | (3 << 8) | (1 << 16)  # at the goal, facing south


def test_time_limit_truncates_with_final_obs_like_gymnasium():
    script = [(1, 0)] * 4
    gym_steps = _play(_envs("MiniGrid-Empty-5x5-v0", "gymnasium", "env.max_episode_steps=3"), script)
    pool_steps = _play(_envs("MiniGrid-Empty-5x5-v0", "envpool", "env.max_episode_steps=3"), script)
    for g, p in zip(gym_steps[1:], pool_steps[1:]):
        np.testing.assert_array_equal(p[0], g[0])
        np.testing.assert_array_equal(p[2], g[2])
        np.testing.assert_array_equal(p[3], g[3])
    _, _, term, trunc, info = pool_steps[3]
    assert not term.any() and trunc.all() and info["_final_obs"].all()
    np.testing.assert_array_equal(info["final_info"]["episode"]["l"], [3, 3])
    np.testing.assert_array_equal(np.stack(info["final_obs"]), gym_steps[3][4]["final_obs"].tolist())


@pytest.mark.parametrize("encoder", ["mlp", "cnn"])
def test_minigrid_observations_have_the_gymnasium_paths_shape_and_range(encoder):
    spaces, first = [], []
    for backend in ("gymnasium", "envpool"):
        envs = _envs("MiniGrid-DoorKey-8x8-v0", backend, f"encoder={encoder}", num_envs=3)
        obs, _ = envs.reset(seed=1)
        for _ in range(20):
            obs, *_ = envs.step(np.arange(3))
        spaces.append((envs.single_observation_space, envs.single_action_space))
        first.append(obs)
        envs.close()
    assert spaces[0] == spaces[1]
    assert spaces[1][0].shape == ((147,) if encoder == "mlp" else (7, 7, 3))
    gym_obs, pool_obs = first
    assert pool_obs.shape == gym_obs.shape and pool_obs.dtype == gym_obs.dtype == np.uint8
    view = pool_obs.reshape(3, 7, 7, 3)
    # MiniGrid's encoding: object index <= 10, colour <= 5, state <= 2; walls (2) and empty (1) are seen
    assert view[..., 0].max() <= 10 and view[..., 1].max() <= 5 and view[..., 2].max() <= 2
    assert {1, 2} <= set(np.unique(view[..., 0]))


def test_minigrid_key_from_the_view_is_statekeys_key():
    """The view's agent cell shows the carried object, so EnvPool's info gives the exact key."""
    env = gym.make("MiniGrid-DoorKey-5x5-v0")
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(0)
    carried = 0
    for _ in range(3000):
        base = env.unwrapped
        key = minigrid_keys(np.array([base.agent_pos]), np.array([obs["direction"]]), obs["image"][None])[0]
        assert key == minigrid_key(env)
        carried += base.carrying is not None
        obs, _, term, trunc, _ = env.step(int(rng.choice([0, 1, 2, 3, 3, 5])))
        if term or trunc:
            obs, _ = env.reset()
    assert carried > 0, "the random walk never picked up the key; the carried-object case went untested"

    pool = _envs("MiniGrid-DoorKey-5x5-v0", "envpool", num_envs=4)
    pool.reset(seed=0)
    kinds = set()
    for _ in range(1500):
        _, _, _, _, info = pool.step(rng.choice([0, 1, 2, 3, 3, 5], size=4))
        kinds |= set(((info["state_key"] >> 18) & 0x1F).tolist())
    pool.close()
    assert kinds == {0, 6}  # nothing, or the key (OBJECT_TO_IDX["key"] + 1): EnvPool's view shows it too


def _play_atari(env_id, steps=3000, seed=3):
    envs = _envs(env_id, "envpool", num_envs=1)
    envs.reset(seed=seed)
    rng = np.random.default_rng(0)
    learn_rewards, terminations = [], 0
    for _ in range(steps):
        _, reward, term, trunc, info = envs.step(rng.integers(envs.single_action_space.n, size=1))
        learn_rewards.append(float(reward[0]))
        terminations += int(term[0])
        if "final_info" in info and "episode" in info["final_info"]:
            envs.close()
            return learn_rewards, terminations, info["final_info"]["episode"]
    raise AssertionError(f"the game did not end in {steps} steps")


def test_atari_logs_the_true_score_while_lives_and_clipping_are_for_learning():
    """SpaceInvaders pays 5 to 30 per invader and has 3 lives: a random game shows both."""
    learn_rewards, terminations, episode = _play_atari("ALE/SpaceInvaders-v5")
    assert set(learn_rewards) <= {0.0, 1.0}  # clipped to their sign for learning
    assert terminations == 3  # every lost life ends a learning episode, the game's end is logged once
    assert episode["r"][0] > sum(learn_rewards) >= 1 and episode["r"][0] % 5 == 0  # the unclipped score
    assert episode["l"][0] == 4 * len(learn_rewards)  # in emulator frames


@pytest.mark.slow
def test_pong_logs_the_whole_games_score():
    """Pong's points are +-1, so clipping changes nothing: the logged return is every point of the game."""
    learn_rewards, terminations, episode = _play_atari("PongNoFrameskip-v4")
    assert terminations == 1 and episode["r"][0] == sum(learn_rewards) and -21 <= episode["r"][0] < 0
    assert min(learn_rewards) == -1.0


def test_atari_settings_follow_the_gymnasium_id():
    v5 = _envs("ALE/Pong-v5", "envpool", num_envs=1)
    v4 = _envs("PongNoFrameskip-v4", "envpool", num_envs=1)
    assert v5.task == v4.task == "Pong-v5"
    assert v5.kwargs["repeat_action_probability"] == 0.25 and v4.kwargs["repeat_action_probability"] == 0.0
    for envs in (v5, v4):
        assert envs.kwargs["max_episode_steps"] == 108_000 // 4
        assert envs.kwargs["noop_max"] == 30 and envs.kwargs["frame_skip"] == 4 and envs.kwargs["episodic_life"]
        assert envs.single_observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    # a limit given to the env counts emulator frames, as on the Gymnasium path
    assert _envs("ALE/Pong-v5", "envpool", "env.max_episode_steps=400", num_envs=1).kwargs["max_episode_steps"] == 100


def test_montezuma_keys_give_the_room_as_on_the_gymnasium_path():
    keys = []
    for backend in ("gymnasium", "envpool"):
        envs = _envs("ALE/MontezumaRevenge-v5", backend, num_envs=2)
        _, info = envs.reset(seed=0)
        keys.append(info["state_key"])
        envs.close()
    # the start: room 1 and the same x (y differs: the FIRE of the reset is a jump, at another frame)
    np.testing.assert_array_equal(keys[1] >> 8, keys[0] >> 8)
    assert room_of_key(keys[1]).tolist() == [1, 1]


# ----------------------------------------------------------------------------- training


def test_train_and_eval_end_to_end(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("train", "--env", "MiniGrid-DoorKey-8x8-v0", "--total-steps", 2048, "--set", "backend=envpool",
                       "env.max_episode_steps=64", "--out", out, "--no-progress")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["backend"] == "envpool"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [512, 1024, 1536, 2048]
    assert all(r["episodes"] == 8 and r["episodic_length"] == 64 for r in rows)  # 4 envs x 128 steps / 64
    assert all(r["unique_states"] > 1 for r in rows)
    code, out_text, err = cli("eval", out, "--episodes", 1, "--json")  # eval plays through Gymnasium
    assert code == 0, err
    result = json.loads(out_text)
    assert result["global_step"] == 2048 and result["mean_length"] == 64  # the env's keywords hold there too


def _trainer(env_id="MiniGrid-DoorKey-5x5-v0", seed=1):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = new_run_config(env_id=env_id, seed=seed, total_steps=4096,
                             overrides=["backend=envpool", "num_steps=64"])
    return PPOTrainer(cfg)


def test_same_seed_same_run():
    first, second = _trainer(), _trainer()
    for trainer in (first, second):
        trainer.run_iteration()
        trainer.run_iteration()
    assert params_sha256(first.agent) == params_sha256(second.agent)
    assert first.recent_returns == second.recent_returns
    first.close(), second.close()


def test_resume_restarts_the_episodes_with_a_warning():
    trainer = _trainer("MiniGrid-Empty-5x5-v0")  # every episode starts at (1, 1) facing east
    trainer.run_iteration()
    state = trainer.state_dict()
    trainer.close()
    copy, stale = snapshot.loads(state["envs"])
    assert stale == [0, 1, 2, 3] and copy.num_envs == 4

    resumed = _trainer("MiniGrid-Empty-5x5-v0")
    with pytest.warns(UserWarning, match="not bit-identical"):
        resumed.load_state_dict(state)
    assert resumed.envs.seed == 1 + 256  # reseeded from the run's seed and step, as for Box2D envs
    assert resumed.keys.current.tolist() == [1 | (1 << 8)] * 4  # every episode restarted at its start
    np.testing.assert_array_equal(resumed.next_obs.numpy(), np.repeat(resumed.next_obs[:1].numpy(), 4, axis=0))
    row = resumed.run_iteration()
    assert row["global_step"] == 512 and resumed.iteration == 2
    resumed.close()


def test_envpool_threads_reach_the_pool_and_survive_a_snapshot():
    cfg = new_run_config(env_id="MiniGrid-Empty-5x5-v0", total_steps=1024,
                         overrides=["backend=envpool", "envpool_threads=1"])
    envs = make_vector_env(cfg)
    envs.reset(seed=1)
    assert envs._pool.config["num_threads"] == 1
    copy, _ = snapshot.loads(snapshot.dumps(envs))
    copy.reset(seed=1)
    assert copy._pool.config["num_threads"] == 1
    default = make_vector_env(new_run_config(env_id="MiniGrid-Empty-5x5-v0", total_steps=1024,
                                             overrides=["backend=envpool"]))
    default.reset(seed=1)
    assert default.num_threads == 0  # EnvPool's own choice
    for v in (envs, copy, default):
        v.close()


# ----------------------------------------------------------------------------- bad input


def _error(*overrides, env_id="MiniGrid-DoorKey-8x8-v0", **kwargs):
    with pytest.raises(UserError) as info:
        new_run_config(env_id=env_id, overrides=list(overrides), **kwargs)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_envpool_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setattr(envpool_backend, "envpool_installed", lambda: False)
    assert "pip install 'reflectrl[envpool]'" in _error("backend=envpool")


def test_bad_backend_input_is_one_line():
    for env_id in ("CartPole-v1", "reflectrl/GridWorld-v0", "ALE/Pong-ram-v5"):
        assert "the default backend runs it" in _error("backend=envpool", env_id=env_id)
    assert "use one of gymnasium, envpool" in _error("backend=ray")
    assert "envpool_threads=-1: must be >= 0" in _error("backend=envpool", "envpool_threads=-1")
    assert "--wrapper sparse is not supported with backend=envpool" in _error("backend=envpool", wrapper="sparse")
    assert "norm_obs/norm_reward" in _error("backend=envpool", "norm_obs=true")
    assert "with {'no_such_knob': 1}" in _error("backend=envpool", "env.no_such_knob=1")
    assert "frameskip" in _error("backend=envpool", "env.frameskip=2", env_id="ALE/Pong-v5")


def test_cli_exits_2_without_a_traceback(cli, tmp_path):
    code, _, err = cli("train", "--env", "CartPole-v1", "--set", "backend=envpool", "--out", tmp_path / "run")
    assert code == 2 and "Traceback" not in err and "default backend runs it" in err
    assert not (tmp_path / "run").exists()


def test_envpool_is_imported_without_jax():
    """envpool's XLA mixin imports jax (1.1 s of start-up); reflectrl's import leaves it out."""
    import subprocess
    import sys

    pytest.importorskip("envpool")
    code = ("import sys\nfrom reflectrl.envs.envpool_backend import import_envpool\nenvpool = import_envpool()\n"
            "envs = envpool.make_gymnasium('Breakout-v5', num_envs=1)\nenvs.reset()\n"
            "print('jax' in sys.modules, 'envpool.python.lax' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
