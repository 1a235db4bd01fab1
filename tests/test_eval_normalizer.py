"""Evaluation normalises observations with the statistics frozen in the checkpoint: the
normaliser starts from exactly the checkpoint's mean, var and count, never moves during
the eval episodes, and the policy sees (obs - mean) / sqrt(var + eps), clipped."""

import shutil

import gymnasium as gym
import numpy as np
import pytest

from reflectrl import evaluate as evaluate_module
from reflectrl.runs import RunDir
from reflectrl.trainers.policies import ActorCritic

EPISODES = 2


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory):
    """A tiny Pendulum run with the continuous defaults' norm_obs (two updates of 1024 steps)."""
    from reflectrl.cli import main

    out = tmp_path_factory.mktemp("eval-norm") / "run"
    code = main(["train", "--env", "Pendulum-v1", "--total-steps", "2048", "--seed", "4", "--out", str(out),
                 "--no-progress", "--set", "num_steps=1024", "num_minibatches=4", "update_epochs=1"])
    assert code == 0
    return out


def checkpoint_stats(run_dir):
    state = RunDir.open(run_dir).load_checkpoint()
    norm = state["obs_normalizer"]
    assert norm is not None
    return np.array(norm["mean"]), np.array(norm["var"]), float(norm["count"])


def spy(monkeypatch):
    """Record every eval normaliser and, at each policy call, the policy's input, the raw
    observation the normaliser last saw and the normaliser's statistics at that moment."""
    normalisers, calls = [], []

    base = gym.wrappers.NormalizeObservation  # reflectrl.envs' normaliser subclasses it too
    init = base.__init__

    def spy_init(self, env, *args, **kwargs):
        init(self, env, *args, **kwargs)
        self.last_raw = None
        observation = self.observation

        def recording_observation(obs):
            self.last_raw = np.array(obs, dtype=np.float64)
            return observation(obs)

        self.observation = recording_observation  # what ObservationWrapper.step and reset call
        normalisers.append(self)

    def record(x):
        norm = normalisers[-1]
        rms = norm.obs_rms
        calls.append({"input": x[0].numpy().copy(), "raw": norm.last_raw.copy(), "mean": np.array(rms.mean),
                      "var": np.array(rms.var), "count": float(rms.count)})

    act, deterministic = ActorCritic.act, ActorCritic.deterministic_action

    def spy_act(self, obs, generator=None):
        record(obs)
        return act(self, obs, generator)

    def spy_deterministic(self, obs):
        record(obs)
        return deterministic(self, obs)

    monkeypatch.setattr(base, "__init__", spy_init)
    monkeypatch.setattr(ActorCritic, "act", spy_act)
    monkeypatch.setattr(ActorCritic, "deterministic_action", spy_deterministic)
    return normalisers, calls


@pytest.mark.parametrize("deterministic", [True, False])
def test_eval_normaliser_is_the_checkpoints_frozen_one(pendulum_run, monkeypatch, deterministic):
    mean, var, count = checkpoint_stats(pendulum_run)
    # statistics a default normaliser would not have: the checks below can tell them apart
    assert count > 2000 and np.abs(mean).max() > 0.05 and np.abs(var - 1).max() > 0.1

    normalisers, calls = spy(monkeypatch)
    result = evaluate_module.evaluate(str(pendulum_run), episodes=EPISODES, deterministic=deterministic, seed=11)
    assert len(normalisers) == 1
    assert len(calls) == EPISODES * 200  # Pendulum's episodes are 200 steps long

    clip = 10.0  # the run's clip_obs (the default)
    for call in calls:
        # at every step: exactly the checkpoint's statistics, never updated by eval's observations
        assert np.array_equal(call["mean"], mean) and np.array_equal(call["var"], var)
        assert call["count"] == count
        expected = np.clip(np.float32((call["raw"] - mean) / np.sqrt(var + 1e-8)), -clip, clip)
        np.testing.assert_allclose(call["input"], expected, rtol=1e-6, atol=1e-6)
    rms = normalisers[0].obs_rms
    assert np.array_equal(rms.mean, mean) and np.array_equal(rms.var, var) and rms.count == count
    # the raw observations vary: the comparison above covered many different inputs
    raws = np.stack([c["raw"] for c in calls])
    assert raws.std(0).min() > 0.1
    assert len(result["returns"]) == EPISODES


def test_eval_is_repeatable_and_does_not_touch_the_checkpoint(pendulum_run):
    before = checkpoint_stats(pendulum_run)
    first = evaluate_module.evaluate(str(pendulum_run), episodes=EPISODES, seed=5)
    second = evaluate_module.evaluate(str(pendulum_run), episodes=EPISODES, seed=5)
    assert first["returns"] == second["returns"]  # stochastic actions too: the same seed, the same episodes
    other = evaluate_module.evaluate(str(pendulum_run), episodes=EPISODES, seed=6)
    assert other["returns"] != first["returns"]
    after = checkpoint_stats(pendulum_run)
    assert all(np.array_equal(a, b) for a, b in zip(before[:2], after[:2])) and before[2] == after[2]


def test_eval_clips_the_normalised_observations(pendulum_run, tmp_path, monkeypatch):
    """A checkpoint whose variances are 10^4 times smaller: normalised observations reach
    far beyond clip_obs = 10, and the policy sees them clipped to +-10."""
    run_dir = tmp_path / "run"
    shutil.copytree(pendulum_run, run_dir)
    run = RunDir.open(run_dir)
    state = run.load_checkpoint()
    state["obs_normalizer"]["var"] = state["obs_normalizer"]["var"] * 1e-4
    run.save_checkpoint(state)
    mean, var, count = checkpoint_stats(run_dir)

    normalisers, calls = spy(monkeypatch)
    evaluate_module.evaluate(str(run_dir), episodes=1, deterministic=True, seed=11)
    inputs = np.stack([c["input"] for c in calls])
    unclipped = np.stack([(c["raw"] - mean) / np.sqrt(var + 1e-8) for c in calls])
    assert (np.abs(unclipped) > 10).mean() > 0.3  # the clip binds on many inputs
    np.testing.assert_allclose(inputs, np.clip(np.float32(unclipped), -10, 10), rtol=1e-6, atol=1e-6)
    assert np.abs(inputs).max() == 10.0
