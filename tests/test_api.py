"""The Python API (issue 58, item 3): reflectrl.train on an unregistered gymnasium.Env subclass instance, saved,
loaded, predicted and evaluated; the CLI's eval and train --resume read the same run directory; the same
params_sha256 through the API as through the CLI; a bad knob gives the CLI's one-line UserError; a callback
stops training and the run resumes; env objects the CLI cannot rebuild; examples/python_api.py runs."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from api_env import Corridor

import reflectrl
from reflectrl.api import StopTraining, set_items
from reflectrl.envs import registered_id
from reflectrl.envs.objects import EnvSource, env_source
from reflectrl.errors import UserError

TESTS = Path(__file__).parent
ROOT = TESTS.parent
# 2 iterations of 2 envs x 64 steps: a few seconds
TINY = dict(num_envs=2, num_steps=64, num_minibatches=2, update_epochs=1, hidden_sizes=(8, 8))
TINY_SET = ["num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1", "hidden_sizes=8,8"]
CORRIDOR = gym.wrappers.TimeLimit(Corridor(length=5), max_episode_steps=20)


def test_knobs_become_the_set_items_the_cli_takes():
    assert set_items({"learning_rate": 0.001, "calibration": {"alpha": 0.05, "mode": "uncertainty"},
                      "calibration.beta": 0.5, "hidden_sizes": (8, 8), "norm_obs": False, "env": {"size": 12},
                      "max_grad_norm": None}) == [
        "learning_rate=0.001", "calibration.alpha=0.05", "calibration.mode=uncertainty", "calibration.beta=0.5",
        "hidden_sizes=8,8", "norm_obs=false", "env.size=12", "max_grad_norm=none"]


def test_env_objects_become_ids_a_new_process_makes():
    assert env_source(CORRIDOR) == EnvSource("api_env:Corridor", {"length": 5, "max_episode_steps": 20})
    assert env_source(Corridor).env_id == "api_env:Corridor"
    assert env_source(functools.partial(Corridor, length=3)).kwargs == {"length": 3}
    assert env_source(gym.make("CartPole-v1", max_episode_steps=50)).kwargs == {"max_episode_steps": 50}
    vector = env_source(gym.vector.SyncVectorEnv([lambda: Corridor(6)] * 3))
    assert (vector.env_id, vector.kwargs, vector.num_envs) == ("api_env:Corridor", {"length": 6}, 3)
    assert env_source(gym.make_vec("CartPole-v1", 2)).num_envs == 2
    for obj, why in ((lambda: Corridor(), "is a lambda"), (gym.wrappers.FlattenObservation(Corridor()),
                                                          "wrapped in FlattenObservation")):
        source = env_source(obj)
        assert source.env_id.startswith("object:") and why in source.why_not
    assert registered_id("api_env:Corridor") == "api_env:Corridor"  # MODULE:CLASS, as a new process makes it


def test_train_save_load_predict_evaluate_an_unregistered_env_instance(cli, tmp_path):
    run = reflectrl.train("ppo+calibration", CORRIDOR, 256, seed=3, out=tmp_path / "run", **TINY)
    assert run.status["status"] == "finished" and run.global_step == 256
    assert (run.config.env_id, run.config.env) == ("api_env:Corridor", {"length": 5, "max_episode_steps": 20})
    assert [row["global_step"] for row in run.metrics] == [128, 256]
    assert run.status["command"][:2] == ["reflectrl", "train"]

    saved = run.save(tmp_path / "saved")
    loaded = reflectrl.load(saved)
    assert loaded.params_sha256 == run.params_sha256
    one = loaded.policy.predict(np.zeros(1, np.float32), deterministic=True)
    batch = loaded.policy.predict(np.zeros((4, 1), np.float32), deterministic=True)
    assert one.shape == () and batch.shape == (4,) and batch.dtype == np.int64
    assert (batch == one).all() and set(loaded.policy.predict(np.zeros((64, 1), np.float32))) <= {0, 1}
    with pytest.raises(UserError, match=r"predict: an observation of shape \(2, 3\)"):
        loaded.policy.predict(np.zeros((2, 3)))
    result = loaded.evaluate(episodes=2)
    assert result["episodes"] == 2 and result["params_sha256"] == run.params_sha256
    assert loaded.evaluate(episodes=1, env=Corridor(length=2))["env_id"] == "api_env:Corridor"
    gym.registry.pop("api_env:Corridor")  # as a new process starts: `reflectrl eval` imports api_env again
    code, out, err = cli("eval", saved, "--episodes", "2", "--json")
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["params_sha256"] == run.params_sha256  # (after train's own lines)


def test_same_params_sha256_through_the_api_and_the_cli(cli, tmp_path):
    api = reflectrl.train("ppo+calibration", CORRIDOR, 256, seed=3, out=tmp_path / "api", **TINY)
    code, _, err = cli("train", "--algo", "ppo+calibration", "--env", "api_env:Corridor", "--seed", "3",
                       "--total-steps", "256", "--out", tmp_path / "cli", "--no-progress",
                       "--set", "env.length=5", "env.max_episode_steps=20", *TINY_SET)
    assert code == 0, err
    cli_status = json.loads((tmp_path / "cli" / "run.json").read_text())
    assert api.params_sha256 == cli_status["params_sha256"]
    assert (tmp_path / "api" / "config.json").read_text() == (tmp_path / "cli" / "config.json").read_text()


def test_a_bad_knob_is_the_cli_s_one_line_error(cli):
    with pytest.raises(UserError) as err:
        reflectrl.train("ppo+calibration", CORRIDOR, 256, calibration={"alpah": 0.1})
    code, _, stderr = cli("train", "--algo", "ppo+calibration", "--env", "api_env:Corridor", "--out", "unused",
                          "--set", "calibration.alpah=0.1")
    assert code == 2 and stderr.strip() == f"reflectrl: error: {err.value}"
    with pytest.raises(UserError, match="--set learning_rate=fast: expected a number"):
        reflectrl.train("ppo", "CartPole-v1", 256, learning_rate="fast")
    with pytest.raises(UserError, match="gives calibration.alpha=0.1 and --set calibration.alpha=0.2"):
        reflectrl.train("ppo+calibration[alpha=0.1]", "CartPole-v1", 256, **{"calibration.alpha": 0.2})


def test_a_callback_stops_training_and_the_run_resumes_to_the_same_parameters(cli, tmp_path):
    whole = reflectrl.train("ppo+calibration", CORRIDOR, 384, seed=3, **TINY)
    seen = []

    def stop_after_first(run, row):
        seen.append((run.trainer.global_step, row["global_step"]))
        return False

    run = reflectrl.train("ppo+calibration", CORRIDOR, 384, seed=3, out=tmp_path / "run",
                          callbacks=stop_after_first, **TINY)
    assert seen == [(128, 128)]
    assert run.status["status"] == "interrupted" and run.global_step == 128 and run.trainer is None
    assert run.policy.global_step == 128  # checkpointed where it stopped

    class Raises:
        def on_iteration(self, run, row):
            raise StopTraining

    run.resume(callbacks=[Raises()])  # an object's on_iteration, stopping by raising: one iteration on
    assert run.status["status"] == "interrupted" and run.global_step == 256
    code, _, err = cli("train", "--resume", tmp_path / "run", "--no-progress")  # the CLI continues it as well
    assert code == 0, err
    assert run.status["status"] == "finished" and run.params_sha256 == whole.params_sha256
    run.resume(total_steps=512)  # a larger budget: a finished run trains on
    assert run.status["status"] == "finished" and run.global_step == 512


def test_an_env_no_other_process_can_make_trains_and_the_cli_says_why(tmp_path):
    class Local(Corridor):
        pass

    with pytest.warns(UserWarning, match="Local is defined inside a function"):
        run = reflectrl.train("ppo", gym.wrappers.TimeLimit(Local(3), 20), 128, out=tmp_path / "run", **TINY)
    env_id = run.config.env_id
    assert env_id.startswith("object:") and run.status["status"] == "finished"
    assert any("defined inside a function" in w for w in run.status["warnings"])
    from reflectrl.envs import objects

    gym.registry.pop(env_id)  # what another process knows of it: nothing
    objects._OBJECTS.pop(env_id)
    with pytest.raises(UserError, match=r"was an object given to reflectrl.train \(defined inside a function\)"):
        run.evaluate(episodes=1)
    loaded = reflectrl.load(tmp_path / "run", env=gym.wrappers.TimeLimit(Local(3), 20))
    assert loaded.evaluate(episodes=1)["params_sha256"] == run.params_sha256


def _cli_process(*argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "reflectrl", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.slow
def test_the_cli_s_eval_and_resume_read_a_run_of_the_api(tmp_path):
    run = reflectrl.train("ppo+calibration", CORRIDOR, 256, seed=3, out=tmp_path / "run",
                          callbacks=lambda run, row: False, **TINY)
    assert run.status["status"] == "interrupted"
    done = _cli_process("eval", tmp_path / "run", "--episodes", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["global_step"] == 128
    done = _cli_process("train", "--resume", tmp_path / "run", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert run.status["status"] == "finished" and run.global_step == 256


@pytest.mark.slow
def test_the_example_runs(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "python_api.py"), "2048"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "mean return" in done.stdout


@pytest.mark.slow
def test_compare_returns_the_report_s_claims(tmp_path):
    data = reflectrl.compare("CartPole-v1", ["ppo", "ppo+calibration"], seeds=2, total_steps=256, out=tmp_path / "exp",
                             **TINY)
    assert data["failed"] == [] and Path(data["report"]).is_file()
    assert {r["algo"] for r in data["table"]} == {"ppo", "ppo+calibration"}
    claim = data["claims"][0]
    assert {"statement", "verdict", "evidence", "p_holm"} <= set(claim)


@pytest.mark.slow
def test_a_jax_run_predicts_and_refuses_callbacks():
    pytest.importorskip("gymnax")
    run = reflectrl.train("ppo", "gymnax:CartPole-v1", 512, backend="jax", num_envs=4, num_steps=64,
                          num_minibatches=2, update_epochs=1)
    assert run.policy.params_sha256 == run.params_sha256
    assert run.policy.predict(np.zeros((3, 4), np.float32), deterministic=True).shape == (3,)
    with pytest.raises(UserError, match="backend=jax trains its iterations in compiled chunks"):
        reflectrl.train("ppo", "gymnax:CartPole-v1", 512, backend="jax", callbacks=print)
