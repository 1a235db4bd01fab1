"""SAC (CleanRL's sac_continuous_action.py): the squashed Gaussian's log-probability, the
entropy temperature's update, resume, bad input, and (slow) learning and kill -9 + resume."""

import copy
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from reflectrl.trainers.replay.sac import Actor, SACTrainer, temperature_loss
from reflectrl.trainers.resolve import new_run_config

SMALL = ["hidden_sizes=32,32", "learning_starts=200", "log_every=100", "batch_size=32", "buffer_size=2000"]


def test_squashed_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    low, high = np.array([-2.0, 0.0], dtype=np.float32), np.array([2.0, 1.0], dtype=np.float32)
    actor = Actor(3, low, high, (16,))
    obs = torch.randn(64, 3)
    actions, log_pi = actor.sample(obs, torch.Generator().manual_seed(1))
    assert (actions >= torch.tensor(low)).all() and (actions <= torch.tensor(high)).all()
    mean, log_std = actor(obs)
    dist = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()),
        [torch.distributions.TanhTransform(),
         torch.distributions.AffineTransform(actor.action_bias, actor.action_scale)])
    reference = dist.log_prob(actions.clamp(torch.tensor(low) + 1e-4, torch.tensor(high) - 1e-4)).sum(-1)
    # CleanRL's form adds 1e-6 inside the log of the squash's Jacobian: equal up to that
    assert torch.allclose(log_pi.detach(), reference.detach(), atol=2e-2)
    squashed = torch.tanh(mean) * actor.action_scale + actor.action_bias
    assert torch.equal(actor.deterministic_action(obs), squashed)


@pytest.mark.parametrize("log_pi, grows", [(0.5, False), (2.0, True)])
def test_entropy_temperature_moves_towards_the_target(log_pi, grows):
    # target entropy -1: a policy with entropy -log pi = -0.5 (above target) lowers alpha, one
    # with -2 (below) raises it
    log_alpha = torch.zeros(1, requires_grad=True)
    loss = temperature_loss(log_alpha, torch.full((8,), log_pi), target_entropy=-1.0)
    assert loss.item() == pytest.approx(-(log_pi - 1.0))
    loss.backward()
    assert log_alpha.grad.item() == pytest.approx(-(log_pi - 1.0))
    optimizer = torch.optim.Adam([log_alpha], lr=0.1)
    optimizer.step()
    assert (log_alpha.item() > 0) == grows


def test_autotune_updates_alpha_and_fixed_alpha_stays():
    cfg = new_run_config(algo="sac", env_id="Pendulum-v1", total_steps=600, overrides=SMALL)
    trainer = SACTrainer(cfg)
    for _ in range(3):
        row = trainer.run_iteration()
    assert row["alpha"] != 1.0 and "alpha_loss" in row and np.isfinite(row["qf_loss"])
    trainer.close()
    fixed = SACTrainer(new_run_config(algo="sac", env_id="Pendulum-v1", total_steps=600,
                                      overrides=[*SMALL, "autotune=false", "alpha=0.1"]))
    for _ in range(3):
        row = fixed.run_iteration()
    assert row["alpha"] == 0.1 and "alpha_loss" not in row
    fixed.close()


def test_random_actions_before_learning_starts_then_the_actor():
    cfg = new_run_config(algo="sac", env_id="Pendulum-v1", total_steps=600, overrides=SMALL)
    trainer = SACTrainer(cfg)
    row = trainer.run_iteration()  # 100 steps, all before learning_starts=200
    assert trainer.updates == 0 and "qf_loss" not in row
    actions = trainer.buffer.actions[:100, 0]
    assert actions.min() < -1.5 and actions.max() > 1.5  # uniform over [-2, 2]
    trainer.run_iteration(), trainer.run_iteration()
    assert trainer.updates == 100  # one Q-step per vector step after learning_starts
    trainer.close()


def test_resume_in_process_is_bit_identical():
    cfg = new_run_config(algo="sac", env_id="Pendulum-v1", total_steps=600, overrides=SMALL)
    a = SACTrainer(cfg)
    for _ in range(3):
        a.run_iteration()
    state = copy.deepcopy(a.state_dict())  # as written to disk: nothing shared with the running trainer
    rows_a = [a.run_iteration() for _ in range(2)]
    b = SACTrainer(cfg)
    b.load_state_dict(state)
    rows_b = [b.run_iteration() for _ in range(2)]
    for ra, rb in zip(rows_a, rows_b):
        assert ra["qf_loss"] == rb["qf_loss"] and ra["alpha"] == rb["alpha"]
    for pa, pb in zip(a.actor.parameters(), b.actor.parameters()):
        assert torch.equal(pa, pb)
    a.close(), b.close()


@pytest.mark.parametrize("argv, message", [
    (["--algo", "sac", "--env", "CartPole-v1"], "needs continuous (Box) actions"),
    (["--algo", "sac", "--env", "Pendulum-v1", "--total-steps", "4000"], "never learn"),
    (["--algo", "sac", "--env", "Pendulum-v1", "--set", "q_lr=0"], "q_lr=0"),
    (["--algo", "ppo", "--env", "Pendulum-v1", "--set", "sac.tau=0.01"], "apply to --algo sac"),
    (["--algo", "sac+gear", "--env", "Pendulum-v1"], "no trajectory advantage to share"),
    (["--algo", "sac+rnd", "--env", "Pendulum-v1"], "a Q-learner does not have"),
])
def test_bad_sac_input_is_one_line(cli, tmp_path, argv, message):
    code, out, err = cli("train", *argv, "--out", tmp_path / "run", "--no-progress")
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def _rows(path) -> int:
    try:
        return len((path / "metrics.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_sac_sigkill_and_resume_gives_identical_weights(cli, tmp_path):
    argv = ["--algo", "sac", "--env", "Pendulum-v1", "--total-steps", "3000", "--set", "hidden_sizes=64,64",
            "learning_starts=500", "log_every=100", "checkpoint_every=700", "buffer_size=5000"]
    reference = tmp_path / "reference"
    assert cli("train", *argv, "--out", reference, "--no-progress")[0] == 0
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl", "train", *argv, "--out", str(killed), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = _rows(reference)
    deadline = time.time() + 300
    while _rows(killed) < total // 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; raise --total-steps"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    code, _, err = cli("train", "--resume", killed, "--no-progress")
    assert code == 0, err
    sha = [json.loads(cli("eval", run, "--episodes", 1, "--json")[1])["params_sha256"] for run in (reference, killed)]
    assert sha[0] == sha[1]
    ref = [json.loads(x) for x in (reference / "metrics.jsonl").read_text().splitlines()]
    res = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in res] == [r["global_step"] for r in ref]
    assert [r.get("qf_loss") for r in res] == [r.get("qf_loss") for r in ref]
    assert [r.get("alpha") for r in res] == [r.get("alpha") for r in ref]


@pytest.mark.slow
def test_sac_improves_pendulum():
    # uniformly random actions score about -1200 on Pendulum-v1; CleanRL's defaults otherwise
    cfg = new_run_config(algo="sac", env_id="Pendulum-v1", seed=1, total_steps=6000,
                         overrides=["learning_starts=1000"])
    trainer = SACTrainer(cfg)
    trainer.train(progress=False)
    trainer.close()
    assert np.mean(list(trainer.recent_returns)[-5:]) > -700
