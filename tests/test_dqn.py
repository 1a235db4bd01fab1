"""DQN (control/dqn.py): TD and Double-DQN targets by hand, the epsilon schedule, the replay
buffer's round trip, resume with and without the buffer, bad input, and learning CartPole."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from reflectrl.trainers.replay.buffer import ReplayBuffer
from reflectrl.trainers.replay.dqn import DQNTrainer, linear_schedule, td_targets
from reflectrl.trainers.resolve import new_run_config


def test_td_targets_by_hand():
    rewards = torch.tensor([1.0, 0.0, -1.0])
    terminations = torch.tensor([0.0, 1.0, 0.0])
    next_q = torch.tensor([[2.0, 5.0], [7.0, 3.0], [-4.0, -2.0]])
    # r + 0.9 * max_a Q'(s', a) * (1 - done): 1 + 0.9 * 5, 0 (terminated), -1 + 0.9 * -2
    assert torch.allclose(td_targets(rewards, terminations, next_q, 0.9), torch.tensor([5.5, 0.0, -2.8]))


def test_double_dqn_target_takes_the_online_argmax():
    rewards = torch.tensor([1.0, 0.0])
    terminations = torch.tensor([0.0, 0.0])
    next_q_target = torch.tensor([[2.0, 5.0], [7.0, 3.0]])
    next_q_online = torch.tensor([[9.0, 1.0], [0.0, 4.0]])  # picks action 0, then action 1
    # the target network values the online network's choice: 1 + 0.5 * 2, 0 + 0.5 * 3
    got = td_targets(rewards, terminations, next_q_target, 0.5, next_q_online)
    assert torch.allclose(got, torch.tensor([2.0, 1.5]))
    # plain DQN would take the target network's own max: 1 + 0.5 * 5, 0 + 0.5 * 7
    assert torch.allclose(td_targets(rewards, terminations, next_q_target, 0.5), torch.tensor([3.5, 3.5]))


def test_linear_epsilon_schedule():
    assert linear_schedule(1.0, 0.05, 1000, 0) == 1.0
    assert linear_schedule(1.0, 0.05, 1000, 500) == pytest.approx(0.525)
    assert linear_schedule(1.0, 0.05, 1000, 1000) == pytest.approx(0.05)
    assert linear_schedule(1.0, 0.05, 1000, 5000) == 0.05


def _filled(capacity, n, seed=0):
    rng = np.random.default_rng(seed)
    buf = ReplayBuffer(capacity, (3,), np.float32)
    for _ in range(n):
        obs = rng.normal(size=(2, 3)).astype(np.float32)
        buf.add(obs, obs + 1, rng.integers(0, 4, 2), rng.normal(size=2), rng.integers(0, 2, 2))
    return buf


@pytest.mark.parametrize("steps", [3, 9])  # 6 transitions (not full), 18 (wrapped round a capacity of 10)
def test_replay_buffer_round_trip(steps):
    buf = _filled(10, steps)
    assert len(buf) == min(2 * steps, 10)
    copy = ReplayBuffer(10, (3,), np.float32)
    copy.load_state_dict(buf.state_dict())
    assert (copy.pos, copy.size) == (buf.pos, buf.size)
    a, b = (x.sample(32, torch.Generator().manual_seed(5)) for x in (buf, copy))
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # the next additions land in the same slots
    for x in (buf, copy):
        x.add(np.zeros((2, 3)), np.zeros((2, 3)), [1, 1], [0.0, 0.0], [0, 0])
    assert np.array_equal(buf.obs, copy.obs) and buf.pos == copy.pos


def test_replay_buffer_keeps_uint8_frames():
    buf = ReplayBuffer(4, (2, 2), np.uint8)
    buf.add(np.full((1, 2, 2), 255, np.uint8), np.zeros((1, 2, 2), np.uint8), [0], [1.0], [0])
    assert buf.obs.dtype == np.uint8
    batch = buf.sample(2, torch.Generator().manual_seed(0))
    assert batch["obs"].dtype == torch.float32 and float(batch["obs"].max()) == 255.0


def test_replay_buffer_too_big_for_memory_is_refused():
    from reflectrl.errors import UserError

    with pytest.raises(UserError, match="lower buffer_size"):
        ReplayBuffer(10**9, (84, 84, 4), np.uint8)


def test_truncated_steps_store_the_episode_s_last_observation():
    # CartPole cut at 5 steps: every 5th transition is a truncation whose s' is the last
    # observation of its episode, while the env has already moved to a new episode
    cfg = new_run_config(algo="dqn", env_id="CartPole-v1", total_steps=2000,
                         overrides=["env.max_episode_steps=5", "learning_starts=1000", "log_every=100",
                                    "start_e=1", "end_e=1"])
    trainer = DQNTrainer(cfg)
    trainer.run_iteration()
    buf = trainer.buffer
    assert buf.terminations[:100].sum() < 100
    cut = [i for i in range(4, 99, 5) if buf.terminations[i] == 0]  # truncated, not terminated
    assert cut
    for i in cut:
        # s' of the cut step continues its own episode, not the next one's first observation
        assert not np.array_equal(buf.next_obs[i], buf.obs[i + 1])
    for i in (0, 1, 2):
        assert np.array_equal(buf.next_obs[i], buf.obs[i + 1])
    trainer.close()


def test_resume_without_the_replay_buffer_refills_first():
    overrides = ["learning_starts=200", "log_every=100", "save_replay=false", "buffer_size=1000", "batch_size=16"]
    cfg = new_run_config(algo="dqn", env_id="CartPole-v1", total_steps=2000, overrides=overrides)
    trainer = DQNTrainer(cfg)
    for _ in range(3):
        trainer.run_iteration()
    assert trainer.updates > 0
    state = trainer.state_dict()
    assert state["replay"] is None
    resumed = DQNTrainer(cfg)
    with pytest.warns(UserWarning, match="no replay buffer"):
        resumed.load_state_dict(state)
    updates = resumed.updates
    resumed.run_iteration()
    assert resumed.updates == updates  # still refilling: 100 new steps < learning_starts
    assert len(resumed.buffer) == 100
    trainer.close()
    resumed.close()


@pytest.mark.parametrize("argv, message", [
    (["--algo", "dqn", "--env", "Pendulum-v1"], "needs discrete actions"),
    (["--algo", "dqn+gear", "--env", "CartPole-v1"], "no trajectory advantage to share"),
    (["--algo", "dqn+count", "--env", "CartPole-v1"], "sampled out of their episodes"),
    (["--algo", "dqn+calibration", "--env", "CartPole-v1", "--set", "calibration.recompute_advantages=false"],
     "has no advantage"),
    (["--algo", "sac+calibration", "--env", "Pendulum-v1", "--set", "calibration.inputs=features_action"],
     "which trainer 'sac' does not provide"),
    (["--algo", "ppo", "--env", "CartPole-v1", "--set", "dqn.buffer_size=10"], "apply to --algo dqn"),
    (["--algo", "dqn", "--env", "CartPole-v1", "--total-steps", "5000"], "never learn"),
    (["--algo", "dqn", "--env", "CartPole-v1", "--set", "loss=l1"], "loss='l1'"),
    (["--algo", "dqn", "--env", "CartPole-v1", "--set", "num_steps=64"], "unknown --set key 'num_steps'"),
])
def test_bad_dqn_input_is_one_line(cli, tmp_path, argv, message):
    code, out, err = cli("train", *argv, "--out", tmp_path / "run", "--no-progress")
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def _rows(path):
    try:
        return (path / "metrics.jsonl").read_text().count("\n")
    except FileNotFoundError:
        return 0


@pytest.mark.slow
def test_dqn_sigkill_and_resume_gives_identical_weights(cli, tmp_path):
    argv = ["--algo", "dqn", "--env", "CartPole-v1", "--total-steps", "20000", "--set", "learning_starts=2000",
            "log_every=500", "checkpoint_every=1700", "buffer_size=5000", "train_frequency=4",
            "target_network_frequency=300"]
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
    assert [r.get("td_loss") for r in res] == [r.get("td_loss") for r in ref]
    assert [r["episodic_return"] for r in res] == [r["episodic_return"] for r in ref]


@pytest.mark.slow
def test_dqn_learns_cartpole(tmp_path):
    cfg = new_run_config(algo="dqn", env_id="CartPole-v1", seed=1, total_steps=30_000,
                         overrides=["learning_starts=5000"])
    trainer = DQNTrainer(cfg)
    trainer.train(progress=False)
    trainer.close()
    # CleanRL's defaults otherwise (500k steps there); CartPole counts as solved at 195
    assert np.mean(trainer.recent_returns) >= 195


@pytest.mark.slow
def test_dqn_runs_on_atari_pixels(cli, tmp_path):
    pytest.importorskip("ale_py")
    out = tmp_path / "breakout"
    code, _, err = cli("train", "--algo", "dqn", "--env", "ALE/Breakout-v5", "--total-steps", 1200, "--set",
                       "buffer_size=1000", "learning_starts=600", "log_every=200", "--out", out, "--no-progress")
    assert code == 0, err
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dqn"]["encoder"] == "cnn" and cfg["dqn"]["learning_rate"] == 1e-4  # dqn_atari.py's
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["gradient_steps"] == (1200 - 600) // 4
    assert np.isfinite(rows[-1]["td_loss"])


def test_adam_step_and_reused_sampling_are_bit_identical():
    """AdamStep (the replay trainers' fused-Adam step without Adam.step's wrapper) gives Adam.step's
    weights bit for bit, also after the optimiser's state is reloaded; sample(reuse=True) gives
    sample()'s batch."""
    import copy

    from reflectrl.trainers.replay.base import AdamStep, adam

    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [adam(net.parameters(), 1e-2) for net in nets]
    fast = AdamStep(opts[1])
    x = torch.randn(16, 4)
    for step in range(6):
        for i, (net, opt) in enumerate(zip(nets, opts)):
            (fast.zero_grad if i else opt.zero_grad)()
            net(x).square().mean().backward()
            (fast.step if i else opt.step)()
        if step == 3:  # a reloaded state (a copy: load_state_dict keeps the tensors it is given): AdamStep must
            opts[1].load_state_dict(copy.deepcopy(opts[0].state_dict()))  # not keep stepping the old ones
    for a, b in zip(nets[0].parameters(), nets[1].parameters()):
        assert torch.equal(a, b)

    buf = ReplayBuffer(20, (3,), np.float32)
    for i in range(12):
        buf.add(np.full((1, 3), i, np.float32), np.full((1, 3), i + 1, np.float32), np.array([i % 2]),
                np.array([float(i)], np.float32), np.array([0.0], np.float32))
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for _ in range(3):
        plain, reused = buf.sample(5, g1), buf.sample(5, g2, reuse=True)
        assert all(torch.equal(plain[k], reused[k]) and plain[k].dtype == reused[k].dtype for k in plain)
