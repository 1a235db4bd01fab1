"""A run killed with SIGKILL and resumed ends with exactly the weights of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest

from reflectrl.envs import make_env, snapshot

CASES = {
    # discrete, no normalisation; checkpoint_every is not a multiple of the batch on purpose
    "cartpole": ["--env", "CartPole-v1", "--total-steps", "24000", "--set", "num_envs=2", "num_steps=64",
                 "num_minibatches=2", "update_epochs=2", "checkpoint_every=1000"],
    # a signal's networks, optimiser, generator and previous batch must survive the kill too
    "cartpole-refgrpo": ["--algo", "refgrpo", "--env", "CartPole-v1", "--total-steps", "24000", "--set", "num_envs=2",
                         "num_steps=64", "num_minibatches=2", "update_epochs=2", "checkpoint_every=1000"],
    "cartpole-gear": ["--algo", "gear", "--env", "CartPole-v1", "--total-steps", "16000", "--set", "num_envs=2",
                      "num_steps=64", "num_minibatches=2", "update_epochs=2", "checkpoint_every=1000"],
    "gridworld-sdrs": ["--algo", "sdrs", "--env", "reflectrl/GridWorld-v0", "--total-steps", "16000", "--set",
                       "env.size=6", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=2",
                       "checkpoint_every=1000", "shaping.update_every=2"],
    # continuous: the obs/reward normalisers and time-limit truncations must survive the kill
    "pendulum": ["--env", "Pendulum-v1", "--total-steps", "16384", "--set", "num_envs=2", "num_steps=256",
                 "num_minibatches=4", "update_epochs=2", "checkpoint_every=1500"],
}


def _metrics_rows(path):
    try:
        with open(path / "metrics.jsonl") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_sigkill_and_resume_gives_identical_weights(cli, tmp_path, case):
    argv = CASES[case]
    reference = tmp_path / "reference"
    assert cli("train", *argv, "--out", reference, "--no-progress")[0] == 0

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl", "train", *argv, "--out", str(killed), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    iterations = _metrics_rows(reference)
    deadline = time.time() + 120
    while _metrics_rows(killed) < iterations // 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; raise --total-steps"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads((killed / "run.json").read_text())["status"] == "running"

    code, _, err = cli("train", "--resume", killed, "--no-progress")
    assert code == 0, err

    sha = []
    for run in (reference, killed):
        code, out, _ = cli("eval", run, "--episodes", 1, "--json")
        assert code == 0
        sha.append(json.loads(out)["params_sha256"])
    assert sha[0] == sha[1]

    # the metrics log holds each iteration once, identical where it is deterministic
    ref_rows = [json.loads(x) for x in (reference / "metrics.jsonl").read_text().splitlines()]
    res_rows = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in res_rows] == [r["global_step"] for r in ref_rows]
    assert [r["policy_loss"] for r in res_rows] == [r["policy_loss"] for r in ref_rows]
    assert [r["episodic_return"] for r in res_rows] == [r["episodic_return"] for r in ref_rows]


def test_resume_of_finished_run_is_a_no_op(cli, tmp_path):
    out = tmp_path / "run"
    argv = ["--env", "CartPole-v1", "--total-steps", "256", "--set", "num_envs=2", "num_steps=64", "--no-progress"]
    assert cli("train", *argv, "--out", out)[0] == 0
    before = (out / "checkpoint.pt").read_bytes()
    code, _, err = cli("train", "--resume", out, "--no-progress")
    assert code == 0 and "already finished" in err
    assert (out / "checkpoint.pt").read_bytes() == before


def _rollout(env, actions):
    return [env.step(a)[0] for a in actions]


def test_mujoco_snapshot_is_exact():
    envs = gym.vector.SyncVectorEnv([lambda: make_env("HalfCheetah-v5")] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(17):
        envs.step(rng.uniform(-1, 1, (2, 6)))
    copy, stale = snapshot.loads(snapshot.dumps(envs))
    assert stale == []
    actions = rng.uniform(-1, 1, (25, 2, 6))
    for a in actions:
        o1, r1, *_ = envs.step(a)
        o2, r2, *_ = copy.step(a)
        np.testing.assert_array_equal(o1, o2)
        np.testing.assert_array_equal(r1, r2)


def test_unsnapshottable_env_is_reported_stale():
    envs = gym.vector.SyncVectorEnv([lambda: make_env("LunarLander-v3")],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.reset(seed=0)
    envs.step(np.array([1]))
    copy, stale = snapshot.loads(snapshot.dumps(envs))
    assert stale == [0]
    copy.envs[0].reset(seed=1)  # usable again after a reset
    copy.step(np.array([0]))
