"""IMPALA (distributed/): V-trace against hand-computed cases, the synchronous mode's
determinism (inline and on Ray), neutral signals = plain impala, resume, the two fault cases
(an actor killed, the learner killed), bad input, and learning CartPole-v1 with 2 actors."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from reflectrl.estimators import compute_gae, vtrace
from reflectrl.trainers.impala.trainer import IMPALATrainer
from reflectrl.trainers.policies import params_sha256
from reflectrl.trainers.resolve import new_run_config


def _random_batch(T=7, N=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(T, N, generator=g)
    values = torch.randn(T, N, generator=g)
    next_values = torch.randn(T, N, generator=g)
    next_values[:-1] = values[1:]
    terms = torch.zeros(T, N, dtype=torch.bool)
    truncs = torch.zeros(T, N, dtype=torch.bool)
    terms[2, 0] = True
    truncs[4, 1] = True  # next_values[4, 1] stays V(final observation)
    return rewards, values, next_values, terms, truncs


def test_vtrace_on_policy_is_gae_at_lambda_one():
    rewards, values, next_values, terms, truncs = _random_batch()
    logp = torch.randn(7, 3)
    adv, targets, stats = vtrace(logp, logp, rewards, values, next_values, terms, truncs, 0.9)
    gae_adv, gae_returns = compute_gae(rewards, values, next_values, terms, truncs, 0.9, 1.0)
    assert torch.allclose(targets, gae_returns, atol=1e-6)
    assert torch.allclose(adv, gae_adv, atol=1e-6)
    assert stats["vtrace_rho_clip_frac"] == 0.0 and stats["vtrace_rho_mean"] == pytest.approx(1.0)


def test_vtrace_on_policy_is_the_n_step_return_to_the_end_of_the_batch():
    # one env, no episode end: v_0 = r0 + g r1 + g^2 r2 + g^3 V(x_3)
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [0.2], [-0.1]])
    next_values = torch.tensor([[0.2], [-0.1], [4.0]])
    none = torch.zeros(3, 1, dtype=torch.bool)
    logp = torch.zeros(3, 1)
    _, targets, _ = vtrace(logp, logp, rewards, values, next_values, none, none, 0.5)
    assert targets[0, 0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 3 + 0.125 * 4.0)
    assert targets[2, 0].item() == pytest.approx(3 + 0.5 * 4.0)


def test_vtrace_off_policy_by_hand_with_clipping():
    # two steps of one env; pi/mu = 2 at step 0 (clipped to rho_bar = 1, to c_bar = 0.5), 0.5 at step 1
    gamma = 0.9
    mu = torch.log(torch.tensor([[0.25], [0.5]]))
    pi = torch.log(torch.tensor([[0.5], [0.25]]))
    rewards = torch.tensor([[1.0], [0.0]])
    values = torch.tensor([[0.0], [1.0]])
    next_values = torch.tensor([[1.0], [2.0]])
    none = torch.zeros(2, 1, dtype=torch.bool)
    adv, targets, stats = vtrace(mu, pi, rewards, values, next_values, none, none, gamma, rho_bar=1.0, c_bar=0.5)
    rho0, rho1, c0 = 1.0, 0.5, 0.5
    delta1 = rho1 * (0.0 + gamma * 2.0 - 1.0)            # 0.4
    delta0 = rho0 * (1.0 + gamma * 1.0 - 0.0)            # 1.9
    v1 = 1.0 + delta1                                     # 1.4
    v0 = 0.0 + delta0 + gamma * c0 * (v1 - 1.0)           # 1.9 + 0.18
    assert targets[:, 0].tolist() == pytest.approx([v0, v1])
    # A_t = rho_t (r_t + gamma v_{t+1} - V(x_t)), v_2 = the bootstrap V(x_2) = 2
    assert adv[:, 0].tolist() == pytest.approx([rho0 * (1.0 + gamma * v1 - 0.0), rho1 * (0.0 + gamma * 2.0 - 1.0)])
    assert stats["vtrace_rho_clip_frac"] == 0.5 and stats["vtrace_c_clip_frac"] == 0.5
    # without clipping the weight 2 counts in full
    adv2, targets2, _ = vtrace(mu, pi, rewards, values, next_values, none, none, gamma, rho_bar=10.0, c_bar=10.0)
    assert targets2[0, 0].item() == pytest.approx(2.0 * 1.9 + gamma * 2.0 * (v1 - 1.0))
    assert adv2[0, 0].item() == pytest.approx(2.0 * (1.0 + gamma * v1))


def test_vtrace_does_not_carry_the_correction_across_an_episode_end():
    gamma = 0.9
    rewards = torch.tensor([[1.0], [5.0]])
    values = torch.tensor([[0.0], [0.0]])
    next_values = torch.tensor([[3.0], [0.0]])  # step 0 truncated: V(final observation) = 3
    term = torch.zeros(2, 1, dtype=torch.bool)
    trunc = torch.tensor([[True], [False]])
    logp = torch.zeros(2, 1)
    adv, targets, _ = vtrace(logp, logp, rewards, values, next_values, term, trunc, gamma)
    assert targets[0, 0].item() == pytest.approx(1.0 + gamma * 3.0)  # the next episode's 5 does not leak in
    assert adv[0, 0].item() == pytest.approx(1.0 + gamma * 3.0)
    terminated, _, _ = vtrace(logp, logp, rewards, values, next_values, trunc, term, gamma)
    assert terminated[0, 0].item() == pytest.approx(1.0)  # a termination drops the bootstrap


# ---------------------------------------------------------------------------- the trainer

def _cfg(algo="impala", steps=1600, env="CartPole-v1", extra=()):
    return new_run_config(algo=algo, env_id=env, total_steps=steps,
                          overrides=["actors=inline", "num_actors=2", "envs_per_actor=2", "unroll_length=20",
                                     *extra])


def _train(cfg):
    trainer = IMPALATrainer(cfg)
    trainer.train(progress=False)
    trainer.close()
    return trainer


def test_inline_runs_are_deterministic_and_learn_something():
    a, b = _train(_cfg()), _train(_cfg())
    assert params_sha256(a.agent) == params_sha256(b.agent)
    assert a.global_step == 1600 and a.iteration == 20
    c = _train(new_run_config(algo="impala", env_id="CartPole-v1", seed=2, total_steps=1600,
                              overrides=["actors=inline", "num_actors=2", "envs_per_actor=2", "unroll_length=20"]))
    assert params_sha256(c.agent) != params_sha256(a.agent)


@pytest.mark.parametrize("algo", ["impala+shaping[mode=off]", "impala+count[beta=0]", "impala+gear[temperature=inf]",
                                  "impala+calibration[alpha=0]"])
def test_neutral_signals_are_plain_impala_bit_for_bit(algo):
    from reflectrl.experiments.spec import parse_entry

    entry = parse_entry(algo)
    plain = _train(_cfg(extra=["num_actors=1"], env="reflectrl/GridWorld-v0"))
    with_signal = _train(_cfg(entry.algo, extra=["num_actors=1", *entry.overrides], env="reflectrl/GridWorld-v0"))
    assert params_sha256(with_signal.agent) == params_sha256(plain.agent)


def test_a_signal_changes_the_run():
    plain = _train(_cfg(env="reflectrl/GridWorld-v0"))
    shaped = _train(_cfg("impala+count", env="reflectrl/GridWorld-v0"))
    assert params_sha256(shaped.agent) != params_sha256(plain.agent)


def test_signals_compose_on_impala_and_rnd_gets_its_value_head():
    trainer = IMPALATrainer(_cfg("impala+rnd+shaping", env="reflectrl/GridWorld-v0", steps=160))
    row = trainer.run_iteration()
    trainer.close()
    assert "rnd_value_loss" in row and "shaping_mean" in row and 0 < row["signal_time_fraction"] < 1


def test_count_follows_env_ids_not_columns():
    from reflectrl.signals.count.torch import CountBonus, CountConfig

    a, b = CountBonus(CountConfig()), CountBonus(CountConfig())
    keys = np.array([[0, 5], [1, 5]])
    nxt = np.array([[1, 5], [2, 5]])
    none = np.zeros((2, 2), dtype=bool)
    a.visits(keys, nxt, none, np.array([10, 11]))
    b.visits(keys, nxt, none, np.array([10, 11]))
    # the next batch has the two envs in swapped columns: counts follow the env, not the column
    got_a = a.visits(np.array([[5, 2]]), np.array([[5, 1]]), np.zeros((1, 2), bool), np.array([11, 10]))
    got_b = b.visits(np.array([[2, 5]]), np.array([[1, 5]]), np.zeros((1, 2), bool), np.array([10, 11]))
    assert got_a.tolist() == [[4, 2]] and got_b.tolist() == [[2, 4]]


def test_synchronous_resume_is_bit_identical(tmp_path):
    from reflectrl.runs import RunDir

    cfg = _cfg(steps=1600, extra=["checkpoint_every=800"])
    straight = _train(cfg)
    run = RunDir.create(tmp_path / "r", cfg.to_dict(), command=["test"])
    first = IMPALATrainer(_cfg(steps=1600, extra=["checkpoint_every=800"]), run)
    for _ in range(10):
        first.run_iteration()
    first.save_checkpoint()
    first.close()
    second = IMPALATrainer(_cfg(steps=1600, extra=["checkpoint_every=800"]), run)
    second.load_state_dict(run.load_checkpoint())
    while not second.finished():
        second.run_iteration()
    second.close()
    assert params_sha256(second.agent) == params_sha256(straight.agent)


def test_train_eval_and_metrics_through_the_cli(cli, tmp_path):
    out = tmp_path / "r"
    code, stdout, err = cli("train", "--algo", "impala", "--env", "CartPole-v1", "--total-steps", "800", "--out", out,
                            "--no-progress", "--set", "actors=inline", "unroll_length=25")
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["global_step"] == 800
    for key in ("actor_steps_per_second", "learner_updates_per_second", "policy_lag_mean", "policy_lag_max",
                "vtrace_rho_clip_frac", "vtrace_c_clip_frac", "actor_restarts", "wall_time"):
        assert key in rows[-1]
    code, stdout, err = cli("eval", out, "--episodes", "2", "--json")
    assert code == 0 and json.loads(stdout)["episodes"] == 2


@pytest.mark.parametrize("argv,message", [
    (["--set", "batch_trajectories=3"], "batch_trajectories=3 is not a multiple of envs_per_actor=4"),
    (["--set", "rho_bar=0"], "rho_bar=0.0: must be > 0"),
    (["--set", "actors=local"], "actors='local': use one of ray, inline"),
    (["--set", "actors=inline", "--ray-address", "auto"], "actors=inline steps the actors in this process"),
    (["--total-steps", "100"], "smaller than one learner batch"),
])
def test_bad_input_is_one_line(cli, tmp_path, argv, message):
    code, _, err = cli("train", "--algo", "impala", "--env", "CartPole-v1", "--out", tmp_path / "r", *argv)
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_ray_address_is_refused_for_trainers_that_run_in_process(cli, tmp_path):
    code, _, err = cli("train", "--algo", "ppo", "--env", "CartPole-v1", "--out", tmp_path / "r", "--ray-address",
                       "auto")
    assert code == 2 and "--ray-address places an --algo impala run's actors" in err


def test_impala_refuses_signals_that_need_what_it_lacks(cli, tmp_path):
    code, _, err = cli("train", "--algo", "impala+calibration", "--env", "CartPole-v1", "--out", tmp_path / "r",
                       "--set", "calibration.shared_trunk=true", "calibration.inputs=features_action")
    assert code == 2 and "[feature_grad], which trainer 'impala' does not provide" in err


# ---------------------------------------------------------------------------- on a local Ray instance

@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_synchronous_ray_actors_equal_inline_ones(local_ray):
    inline = _train(_cfg())
    on_ray = _train(_cfg(extra=["actors=ray", "synchronous=true"]))
    assert params_sha256(on_ray.agent) == params_sha256(inline.agent)


@pytest.mark.slow
def test_a_killed_actor_is_replaced_and_the_run_goes_on(local_ray):
    trainer = IMPALATrainer(_cfg(steps=4000, extra=["actors=ray"]))
    trainer.prepare()
    for _ in range(3):
        trainer.run_iteration()
    dead_pid = trainer.pool.pids()[0]
    os.kill(dead_pid, signal.SIGKILL)
    rows = [trainer.run_iteration() for _ in range(6)]
    pids = trainer.pool.pids()
    trainer.close()
    assert rows[-1]["actor_restarts"] == 1 and dead_pid not in pids
    assert trainer.global_step == 9 * 80  # every batch whole: 2 actors x 2 envs x 20 steps
    assert all(np.isfinite(r["policy_loss"]) for r in rows)


@pytest.mark.slow
def test_the_learner_killed_leaves_its_checkpoint_and_resume_finishes(tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "r"
    argv = [sys.executable, "-m", "reflectrl", "train", "--algo", "impala", "--env", "CartPole-v1",
            "--total-steps", "60000", "--out", str(out), "--no-progress", "--set", "checkpoint_every=2000",
            "unroll_length=25"]
    # its own session: the learner and the Ray instance it started die together, as on a lost machine
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        metrics = out / "metrics.jsonl"
        if metrics.exists() and len(metrics.read_text().splitlines()) > 30:
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (out / "checkpoint.pt").exists()
    done = subprocess.run([sys.executable, "-m", "reflectrl", "train", "--resume", str(out), "--no-progress"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "finished" and status["global_step"] == 60_000
    steps = [json.loads(line)["global_step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 60_000  # no step logged twice across the kill


@pytest.mark.slow
def test_learns_cartpole_with_two_actors_on_ray(local_ray):
    # synchronous, so the test is deterministic (the asynchronous path is the fault test's)
    cfg = new_run_config(algo="impala", env_id="CartPole-v1", total_steps=100_000, seed=1,
                         overrides=["num_actors=2", "synchronous=true"])
    trainer = _train(cfg)
    assert np.mean(trainer.recent_returns) > 150, list(trainer.recent_returns)


def test_rnd_forward_filter_follows_env_ids():
    from reflectrl.signals.rnd.torch import RewardForwardFilter

    by_column, by_env = RewardForwardFilter(0.5), RewardForwardFilter(0.5)
    r = np.array([[1.0, 2.0], [3.0, 4.0]])
    by_column.update(r)
    by_env.update(r, np.array([7, 8]))
    # the same envs, next batch, columns swapped: each env's R continues where it was
    got = by_env.update(np.array([[0.0, 0.0]]), np.array([8, 7]))
    want = by_column.update(np.array([[0.0, 0.0]]))[:, ::-1]
    assert got.tolist() == want.tolist() == [[0.5 * (0.5 * 2 + 4), 0.5 * (0.5 * 1 + 3)]]
