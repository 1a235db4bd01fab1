"""Atari (issue 15): the preprocessing's semantics, the CNN policies, Atari's defaults, resume, bad input."""

import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from reflectrl.config import RunConfig  # noqa: E402
from reflectrl.envs import atari, episode_step_limit, has_time_limit, make_env, make_vector_env  # noqa: E402
from reflectrl.errors import UserError  # noqa: E402
from reflectrl.trainers.cnn import CNNActorCritic, make_policy  # noqa: E402
from reflectrl.trainers.policies import ActorCritic, params_sha256  # noqa: E402
from reflectrl.trainers.ppo.config import PPOConfig
from reflectrl.trainers.ppo.trainer import PPOTrainer  # noqa: E402
from reflectrl.trainers.resolve import new_run_config, resolve_config  # noqa: E402

# ------------------------------------------------------------------------- preprocessing


def _chain(env):
    names = []
    while isinstance(env, gym.Wrapper):
        names.append(type(env).__name__)
        env = env.env
    return names


def test_chain_skips_frames_once_and_keeps_sticky_actions():
    env = make_env("ALE/Breakout-v5", keep_image=True)
    assert _chain(env)[:6] == ["FrameStackObservation", "TransformReward", "FireReset", "EpisodicLife",
                               "AtariPreprocessing", "RecordEpisodeStatistics"]
    assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
    assert env.unwrapped._frameskip == 1  # the max-and-skip below is the only skip
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
    assert episode_step_limit(env) == 108_000 // 4 and has_time_limit(env)
    classic = make_env("BreakoutNoFrameskip-v4", keep_image=True)
    assert classic.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    assert classic.unwrapped._frameskip == 1
    # flattened for an MLP unless the CNN keeps the image
    with pytest.warns(UserWarning, match="encoder=cnn"):
        assert make_env("ALE/Pong-v5").observation_space.shape == (4 * 84 * 84,)
    assert "TransformReward" not in _chain(make_env("ALE/Pong-v5", keep_image=True, learning=False))


def test_true_score_is_logged_while_lives_and_clipping_are_for_learning_only():
    """SpaceInvaders pays 5 to 30 per invader and has 3 lives: a random game shows both."""
    cfg = new_run_config(env_id="ALE/SpaceInvaders-v5", total_steps=1024, overrides=["num_envs=1"])
    envs = make_vector_env(cfg)
    envs.reset(seed=3)
    rng = np.random.default_rng(0)
    learn_rewards, terminations, episodes = [], 0, []
    for _ in range(5000):
        _, reward, term, trunc, info = envs.step(rng.integers(envs.single_action_space.n, size=1))
        learn_rewards.append(float(reward[0]))
        terminations += int(term[0])
        if "final_info" in info and "episode" in info["final_info"] and info["final_info"]["_episode"][0]:
            episodes.append(float(info["final_info"]["episode"]["r"][0]))
            break
    assert len(episodes) == 1, "the game did not end in 5000 steps"
    assert set(learn_rewards) <= {0.0, 1.0}  # clipped to their sign for learning
    assert terminations == 3  # every lost life ends a learning episode, the game's end is logged once
    assert episodes[0] > sum(learn_rewards) >= 1  # the logged return is the game's score, unclipped
    assert episodes[0] % 5 == 0


def test_eval_env_pays_the_true_rewards_and_plays_on_through_lives():
    env = make_env("ALE/SpaceInvaders-v5", keep_image=True, learning=False)
    env.reset(seed=5)
    rng = np.random.default_rng(1)
    total, lives_lost = 0.0, 0
    while True:
        _, reward, term, trunc, info = env.step(int(rng.integers(env.action_space.n)))
        total += reward
        if term or trunc:
            if atari.life_lost(env):
                lives_lost += 1
                env.reset()
                continue
            break
    assert lives_lost == 2 and total == info["episode"]["r"] > 0


def test_montezuma_can_be_created_and_stepped():
    env = make_env("ALE/MontezumaRevenge-v5", keep_image=True)
    obs, _ = env.reset(seed=0)
    for _ in range(50):
        obs, *_ = env.step(env.action_space.sample())
    assert obs.shape == (4, 84, 84) and env.action_space.n == 18


# ------------------------------------------------------------------------- CNN policies


@pytest.mark.slow
def test_nature_cnn_shapes_and_features():
    torch.manual_seed(0)
    agent = make_policy((4, 84, 84), 6, False, "cnn")
    assert isinstance(agent, CNNActorCritic) and agent.pixels and agent.feature_dim == 512
    convs = [m for m in agent.trunk if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]
    # CleanRL's ppo_atari Agent on Pong has 1,687,719 parameters
    assert sum(p.numel() for p in agent.parameters()) == 1_687_719
    obs = torch.randint(0, 256, (5, 4, 84, 84)).float()
    action, logprob = agent.act(obs, torch.Generator().manual_seed(0))
    assert action.shape == (5,) and logprob.shape == (5,)
    assert agent.value(obs).shape == (5,) and agent.features(obs).shape == (5, 512)
    # flat or shaped input, the same numbers; obs are scaled by 1/255
    torch.testing.assert_close(agent.value(obs.reshape(5, -1)), agent.value(obs), rtol=0, atol=0)
    manual = agent.trunk(obs / 255.0)
    torch.testing.assert_close(agent.features(obs), manual)
    logprob2, entropy, value, features = agent.evaluate(obs, action, with_features=True)
    torch.testing.assert_close(logprob2, logprob)
    torch.testing.assert_close(value, agent.value(obs))
    assert features.shape == (5, 512) and features.requires_grad and entropy.shape == (5,)


@pytest.mark.slow
def test_the_update_batch_layout_is_channels_last_and_changes_no_value():
    torch.manual_seed(0)
    agent = make_policy((4, 84, 84), 6, False, "cnn")
    flat = torch.randint(0, 256, (12, 4 * 84 * 84)).float()
    batch = agent.batch_layout(flat)
    assert batch.shape == (12, 4, 84, 84) and batch.is_contiguous(memory_format=torch.channels_last)
    idx = torch.tensor([3, 0, 7, 7, 11])
    assert batch[idx].is_contiguous(memory_format=torch.channels_last)  # each minibatch's gather stays so
    action = torch.tensor([0, 1, 2, 3, 4])
    for got, want in zip(agent.evaluate(batch[idx], action), agent.evaluate(flat[idx], action)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # bit for bit: the same convolution inputs
    assert batch.dtype == torch.uint8  # whole pixel values: a quarter of the bytes per gather (issue 61)
    for odd in (0.5, 256.0, -1.0):  # a fraction or a value out of 0..255 keeps the batch in floats
        changed = flat.clone()
        changed[11, -1] = odd
        kept = agent.batch_layout(changed)
        assert kept.dtype == torch.float32 and kept.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(kept, changed.reshape(12, 4, 84, 84), rtol=0, atol=0)
    mlp = make_policy((6,), 2, False, "mlp")
    obs = torch.rand(3, 6)
    assert mlp.batch_layout(obs) is obs
    hwc = make_policy((7, 7, 3), 7, False, "cnn", (64, 64))
    view = torch.rand(3, 7 * 7 * 3)
    assert hwc.batch_layout(view) is view  # HWC images are permuted to channels-last views already


@pytest.mark.slow
def test_small_cnn_for_minigrid_views_and_hwc_pixels():
    torch.manual_seed(0)
    agent = make_policy((7, 7, 3), 7, False, "cnn", (64, 64))
    assert not agent.pixels and agent.channels_last and agent.scale == 1.0
    convs = [m for m in agent.trunk if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(16, (2, 2)), (32, (2, 2)), (64, (2, 2))]
    assert any(isinstance(m, torch.nn.MaxPool2d) for m in agent.trunk)
    view = torch.randint(0, 11, (3, 7, 7, 3)).float()
    assert agent.encode(view).shape == (3, 64)  # 7 -> 6 -> 3 -> 2 -> 1: 64 units
    assert agent.features(view).shape == (3, 64) and agent.feature_dim == 64
    car = make_policy((96, 96, 3), 3, True, "cnn")  # CarRacing: channels last, continuous actions
    assert car.pixels and car.channels_last
    assert car.act(torch.rand(2, 96, 96, 3) * 255)[0].shape == (2, 3)
    assert type(make_policy((147,), 7, False, "mlp")) is ActorCritic
    with pytest.raises(UserError, match="too small for a CNN"):
        make_policy((5, 5, 3), 7, False, "cnn")


# ------------------------------------------------------------------------- defaults


def test_atari_ids_get_cleanrl_ppo_atari_defaults_unless_set():
    p = new_run_config(env_id="ALE/Pong-v5", total_steps=1024).ppo
    assert (p.num_envs, p.num_steps, p.num_minibatches, p.update_epochs) == (8, 128, 4, 4)
    assert (p.learning_rate, p.anneal_lr, p.clip_coef, p.ent_coef, p.vf_coef) == (2.5e-4, True, 0.1, 0.01, 0.5)
    assert p.encoder == "cnn" and not p.norm_obs and not p.norm_reward
    assert new_run_config(env_id="PongNoFrameskip-v4", total_steps=1024).ppo.clip_coef == 0.1
    mine = new_run_config(env_id="ALE/Pong-v5", total_steps=1024, overrides=["clip_coef=0.2", "num_envs=4"]).ppo
    assert (mine.clip_coef, mine.num_envs, mine.num_steps) == (0.2, 4, 128)
    assert new_run_config(env_id="ALE/Pong-v5", total_steps=1024, overrides=["encoder=mlp"]).ppo.encoder == "mlp"
    plain = new_run_config(env_id="CartPole-v1", total_steps=1024).ppo
    assert (plain.clip_coef, plain.num_envs, plain.encoder) == (0.2, 4, "mlp")


def test_encoder_choice_by_observation():
    pytest.importorskip("minigrid")
    assert new_run_config(env_id="MiniGrid-Empty-5x5-v0", total_steps=1024).ppo.encoder == "mlp"  # the default
    cnn = new_run_config(env_id="MiniGrid-Empty-5x5-v0", total_steps=1024, overrides=["encoder=cnn"])
    trainer = PPOTrainer(cnn)
    assert trainer.obs_shape == (7, 7, 3) and isinstance(trainer.agent, CNNActorCritic)
    trainer.close()
    with pytest.raises(UserError, match="not an image"):
        new_run_config(env_id="CartPole-v1", total_steps=1024, overrides=["encoder=cnn"])
    with pytest.raises(UserError, match="encoder='conv'"):
        new_run_config(env_id="CartPole-v1", total_steps=1024, overrides=["encoder=conv"])


def test_car_racing_gets_the_cnn():
    pytest.importorskip("Box2D")
    assert new_run_config(env_id="CarRacing-v3", total_steps=4096).ppo.encoder == "cnn"


# ------------------------------------------------------------------------- bad input


def test_unknown_game_is_one_line():
    with pytest.raises(UserError) as info:
        make_env("ALE/NotAGame-v5")
    assert "unknown env id 'ALE/NotAGame-v5'" in str(info.value) and "\n" not in str(info.value)


def test_ale_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setattr(atari, "ale_installed", lambda: False)
    with pytest.raises(UserError) as info:
        make_env("ALE/SomeUnregisteredGame-v5")
    text = str(info.value)
    assert "needs ale-py" in text and "pip install 'reflectrl[envs]'" in text and "\n" not in text


def test_frameskip_kwarg_is_refused():
    with pytest.raises(UserError, match="drop env.frameskip"):
        make_env("ALE/Pong-v5", env_kwargs={"frameskip": 4})


# ------------------------------------------------------------------------- training, resume, eval

TINY = ["num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=1"]


def _trainer(total_steps=192, algo="ppo"):
    cfg = RunConfig(algo=algo, env_id="ALE/Breakout-v5", seed=3, total_steps=total_steps,
                    knobs=PPOConfig(num_envs=2, num_steps=32, num_minibatches=2, update_epochs=1))
    return PPOTrainer(resolve_config(cfg))


@pytest.mark.slow
def test_resume_from_a_checkpoint_is_bit_identical():
    reference = _trainer()
    while not reference.finished():
        reference.run_iteration()
    first = _trainer()
    first.run_iteration()
    state = first.state_dict()
    first.close()
    resumed = _trainer()
    resumed.load_state_dict(state)
    while not resumed.finished():
        resumed.run_iteration()
    assert params_sha256(resumed.agent) == params_sha256(reference.agent)
    assert torch.equal(resumed.next_obs, reference.next_obs)


@pytest.mark.slow
def test_train_eval_and_video_end_to_end(cli, tmp_path):
    pytest.importorskip("imageio")
    run = tmp_path / "pong"
    code, out, err = cli("train", "--env", "ALE/Pong-v5", "--total-steps", 256, "--out", run, "--no-progress",
                         "--set", *TINY)
    assert code == 0, err
    config = json.loads((run / "config.json").read_text())
    assert config["ppo"]["encoder"] == "cnn" and config["ppo"]["clip_coef"] == 0.1
    code, out, err = cli("eval", run, "--episodes", 1, "--json", "--video", tmp_path / "pong.mp4",
                         "--max-steps", 300)
    assert code == 0, err
    result = json.loads(out)
    assert result["episodes"] == 1 and (tmp_path / "pong.mp4").stat().st_size > 0


@pytest.mark.slow
def test_sigkill_and_resume_gives_identical_weights(cli, tmp_path):
    argv = ["--env", "ALE/Breakout-v5", "--total-steps", 1024, "--set", *TINY, "checkpoint_every=100"]
    reference = tmp_path / "reference"
    assert cli("train", *argv, "--out", reference, "--no-progress")[0] == 0

    def rows(path):
        log = path / "metrics.jsonl"
        return len(log.read_text().splitlines()) if log.exists() else 0

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl", "train", *map(str, argv), "--out", str(killed),
                             "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while rows(killed) < rows(reference) // 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; raise --total-steps"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    code, _, err = cli("train", "--resume", killed, "--no-progress")
    assert code == 0, err
    sha = [json.loads(cli("eval", run, "--episodes", 1, "--json", "--max-steps", 50)[1])["params_sha256"]
           for run in (reference, killed)]
    assert sha[0] == sha[1]
    ref = [json.loads(x)["policy_loss"] for x in (reference / "metrics.jsonl").read_text().splitlines()]
    res = [json.loads(x)["policy_loss"] for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert ref == res


# ------------------------------------------------------------------------- signals on a CNN policy


@pytest.mark.parametrize("algo", ["ppo+calibration", "ppo+gear", "ppo+shaping"])
def test_signals_read_the_cnn_features(algo):
    """On images read by a CNN the heads read the policy's features (shaping: of s and s')."""
    pytest.importorskip("minigrid")
    cfg = new_run_config(algo=algo, env_id="MiniGrid-Empty-5x5-v0", total_steps=512,
                         overrides=["encoder=cnn", "num_envs=2", "num_steps=64", "num_minibatches=2",
                                    "update_epochs=1", *(["shaping.update_every=1"] if "shaping" in algo else [])])
    trainer = PPOTrainer(cfg)
    signal = trainer.signal
    assert signal.ctx.image_obs and signal.ctx.obs_shape == (7, 7, 3) and signal.ctx.feature_dim == 64
    width = {"ppo+calibration": lambda: signal.net[0].in_features, "ppo+gear": lambda: signal.head[0].in_features,
             "ppo+shaping": lambda: signal.shaper.net[0].in_features}[algo]()
    # the features (and the one-hot action), never the 147 inputs of the view
    n = signal.ctx.action_dim
    assert width == {"ppo+calibration": 64 + n, "ppo+gear": 64, "ppo+shaping": 2 * 64 + n}[algo]
    # what it asks of the trainer is its registry entry's for its knobs, fixed when it was built: calibration
    # (inputs=obs_action) asks for no features and reads them through Batch.features_fn on images
    from reflectrl.registry import signal_spec

    name = algo.split("+")[1]
    assert signal.wants == signal_spec(name).wants_for(cfg.sections[name])
    assert signal.wants_features == (algo == "ppo+gear")
    while not trainer.finished():
        row = trainer.run_iteration()
    assert np.isfinite(row["policy_loss"])
    if algo == "ppo+shaping":
        assert row.get("label_loss") is not None  # the shaper was fit on encoded transitions
    trainer.close()
