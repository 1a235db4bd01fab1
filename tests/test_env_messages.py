"""make_env's messages (issue 13): missing packages, image and mission observations, time limits."""

import warnings

import gymnasium as gym
import numpy as np
import pytest

import reflectrl.envs as envs
from reflectrl.cli import config_from_train_argv, main
from reflectrl.envs import episode_step_limit, has_time_limit, make_env, make_vector_env
from reflectrl.errors import UserError


@pytest.fixture(autouse=True)
def fresh_warnings():
    """Each warning is given once per process per env id: forget which were given."""
    envs._WARNED.clear()
    yield
    envs._WARNED.clear()


def messages(record, needle: str) -> list[str]:
    return [str(w.message) for w in record if needle in str(w.message)]


class PixelEnv(gym.Env):
    """A tiny env with an RGB image observation."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((8, 8, 3), np.uint8), {}

    def step(self, action):
        return np.zeros((8, 8, 3), np.uint8), 0.0, False, False, {}


def _raise_dependency(**kwargs):
    raise gym.error.DependencyNotInstalled('Box2D is not installed, run `pip install "gymnasium[box2d]"`')


gym.register(id="reflectrl-test/Pixels-v0", entry_point=PixelEnv, max_episode_steps=10)
gym.register(id="reflectrl-test/NoModule-v0", entry_point="reflectrl_no_such_module:Env")
gym.register(id="reflectrl-test/NoClass-v0", entry_point="reflectrl.envs:NoSuchEnv")
gym.register(id="reflectrl-test/NeedsBox2D-v0", entry_point=_raise_dependency)


# 7: ids whose extra package is missing --------------------------------------------------


@pytest.mark.parametrize("env_id, package", [
    ("phys2d/CartPole-v1", "jax"),
    ("tabular/Blackjack-v0", "jax"),
    ("Hopper-v2", "mujoco-py"),
    ("GymV26Environment-v0", "shimmy"),
])
def test_missing_package_is_one_line(capsys, tmp_path, env_id, package):
    if package == "jax":
        try:
            import jax  # noqa: F401
            pytest.skip("jax is installed")
        except ImportError:
            pass
    out = tmp_path / "r"
    code = main(["train", "--env", env_id, "--out", str(out), "--total-steps", "1000"])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("reflectrl: error: ")
    assert package in lines[0], lines[0]
    assert "Traceback" not in err
    assert not out.exists()


def test_mujoco_v2_points_to_v5():
    with pytest.raises(UserError, match="Hopper-v5"):
        make_env("Hopper-v3")


@pytest.mark.parametrize("env_id, needles", [
    ("reflectrl-test/NoModule-v0", ["reflectrl_no_such_module", "not installed"]),
    ("reflectrl-test/NoClass-v0", ["cannot load env", "AttributeError"]),
    ("reflectrl-test/NeedsBox2D-v0", ["needs an extra package", "gymnasium[box2d]"]),
])
def test_entry_point_errors_are_user_errors(env_id, needles):
    with pytest.raises(UserError) as info:
        make_env(env_id)
    for needle in needles:
        assert needle in str(info.value)
    assert "\n" not in str(info.value)


# 14: image observations -------------------------------------------------------------------


def test_image_observation_warns_once():
    with pytest.warns(UserWarning, match=r"image observation of shape \(8, 8, 3\) is flattened") as record:
        env = make_env("reflectrl-test/Pixels-v0")
        make_env("reflectrl-test/Pixels-v0")
    assert env.observation_space.shape == (192,)
    found = messages(record, "image observation")
    assert len(found) == 1 and "\n" not in found[0] and "CNN" in found[0] and "--set encoder=cnn" in found[0]


def test_image_kept_for_the_cnn_does_not_warn(recwarn):
    assert make_env("reflectrl-test/Pixels-v0", keep_image=True).observation_space.shape == (8, 8, 3)
    assert not messages(recwarn, "image observation")


def test_car_racing_warns_about_its_image():
    pytest.importorskip("Box2D")
    with pytest.warns(UserWarning, match=r"\(96, 96, 3\)"):
        make_env("CarRacing-v3").close()


def test_flat_observation_does_not_warn(recwarn):
    make_env("CartPole-v1")
    assert not messages(recwarn, "image observation")


# 15: MiniGrid / BabyAI missions -----------------------------------------------------------


def test_babyai_mission_dropped_warns():
    pytest.importorskip("minigrid")
    raw = gym.make("BabyAI-GoToLocal-v0")
    missions = {raw.reset(seed=seed)[0]["mission"] for seed in range(5)}
    assert len(missions) > 1  # the goal is in the mission text
    with pytest.warns(UserWarning, match="mission text is dropped") as record:
        env = make_env("BabyAI-GoToLocal-v0")
        make_env("BabyAI-GoToLocal-v0")
    assert len(messages(record, "mission")) == 1
    assert env.observation_space.shape == (147,)
    assert not messages(record, "image observation")  # the symbolic view is flattened on purpose


def test_minigrid_placeholder_mission_warns():
    pytest.importorskip("minigrid")
    with pytest.warns(UserWarning, match="mission text is dropped"):
        make_env("MiniGrid-Fetch-5x5-N2-v0")


def test_minigrid_fixed_mission_does_not_warn(recwarn):
    pytest.importorskip("minigrid")
    env = make_env("MiniGrid-Empty-5x5-v0")
    assert env.observation_space.shape == (147,)
    assert not messages(recwarn, "mission")
    assert not messages(recwarn, "image observation")


# 1b: time limits ----------------------------------------------------------------------------


def _config(env_id: str, *extra: str):
    return config_from_train_argv(["--env", env_id, "--out", "unused", "--set", "num_envs=2", *extra])


def test_no_time_limit_warns_once_when_training_envs_are_built():
    cfg = _config("CliffWalking-v1")
    with pytest.warns(UserWarning, match="no time limit") as record:
        make_vector_env(cfg).close()
        make_vector_env(cfg).close()
    found = messages(record, "no time limit")
    assert len(found) == 1
    assert "--set env.max_episode_steps=N" in found[0] and "\n" not in found[0]


@pytest.mark.parametrize("env_id, extra", [
    ("CartPole-v1", []),
    ("CliffWalking-v1", ["env.max_episode_steps=50"]),  # the fix the warning suggests
    ("reflectrl/GridWorld-v0", []),
])
def test_time_limited_envs_do_not_warn(recwarn, env_id, extra):
    make_vector_env(_config(env_id, *extra)).close()
    assert not messages(recwarn, "time limit")


def test_minigrid_truncates_itself():
    pytest.importorskip("minigrid")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        make_vector_env(_config("BabyAI-GoToLocal-v0")).close()
        assert episode_step_limit(make_env("MiniGrid-Empty-5x5-v0")) == 100
    assert not messages(record, "time limit")


def test_episode_step_limit():
    assert episode_step_limit(make_env("CartPole-v1")) == 500
    assert episode_step_limit(make_env("CliffWalking-v1")) is None
    assert not has_time_limit(make_env("CliffWalking-v1"))
    assert episode_step_limit(make_env("CliffWalking-v1", env_kwargs={"max_episode_steps": 50})) == 50
    assert episode_step_limit(make_env("reflectrl/GridWorld-v0", env_kwargs={"size": 5})) == 100


def test_grid_world_max_episode_steps_reaches_the_env():
    env = make_env("reflectrl/GridWorld-v0", env_kwargs={"size": 5, "max_episode_steps": 500})
    assert env.unwrapped.max_episode_steps == 500
    assert episode_step_limit(env) == 500


# issue 57: unknown ids, keywords an env does not take -------------------------------------


@pytest.mark.parametrize("env_id, means", [
    ("NoSuchEnv-v0", None),          # was "did you mean UpNDown-v0, Pong-v0, SpaceInvaders-v0?"
    ("Corridor-v0", None),           # was "did you mean BabyAI-KeyCorridor-v0, ..."
    ("CartPol-v1", "CartPole-v1"),
    ("CartPole-v7", "CartPole-v1"),  # the name is right, the version is not
    ("LunarLander-v2", "LunarLander-v3"),
])
def test_unknown_ids_suggest_only_close_names(env_id, means):
    with pytest.raises(UserError) as info:
        make_env(env_id)
    text = str(info.value)
    assert f"unknown env id '{env_id}'" in text and "\n" not in text
    if means is None:
        assert "did you mean" not in text and f"--env MODULE:{env_id}" in text  # how to use an env of your own
    else:
        assert f"did you mean {means}" in text


def test_a_navix_knob_on_a_torch_minigrid_id_says_what_it_is():
    """Issue 57: env.minigrid on the torch backend returned MiniGrid's raw TypeError."""
    pytest.importorskip("minigrid")
    with pytest.raises(UserError) as info:
        config_from_train_argv(["--env", "MiniGrid-Empty-5x5-v0", "--set", "env.minigrid=false"])
    text = str(info.value)
    assert text.startswith("--set env.minigrid:") and "navix" in text and "backend=jax" in text
    assert "unexpected keyword" not in text and "\n" not in text


def test_a_keyword_the_env_does_not_take_is_named_with_the_ones_it_takes():
    with pytest.raises(UserError) as info:
        make_env("CartPole-v1", env_kwargs={"lenght": 3})
    assert str(info.value) == ("--set env.lenght: 'CartPole-v1' takes no keyword 'lenght': drop it "
                               "(it takes: sutton_barto_reward)")
