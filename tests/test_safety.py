"""Constrained RL (issue 21 item 1, seed 002 section 6.3): the cost channel (velocity-cost, the
grid world's hazards), the trainer's cost metrics, PPO-Lagrangian (`ppo_lag`) and shaping's
safety term (`shaping.safety_beta`)."""

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from reflectrl.envs.cost import CostTracker, VelocityCost, velocity_threshold
from reflectrl.envs.gridworld import GridWorldEnv
from reflectrl.errors import UserError

GRID = ["--env", "reflectrl/GridWorld-v0", "--no-progress", "--set", "env.size=6", "env.layout=empty",
        "env.hazards=0.3", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=2"]


class _Moving(gym.Env):
    """Reports the velocities it is given, one pair per step."""

    observation_space = gym.spaces.Box(-1, 1, (1,))
    action_space = gym.spaces.Box(-1, 1, (1,))

    def __init__(self, env_id, velocities):
        self.spec = gym.envs.registration.EnvSpec(env_id)
        self.velocities = list(velocities)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action):
        vx, vy = self.velocities.pop(0)
        return np.zeros(1, dtype=np.float32), 1.0, False, False, {"x_velocity": vx, "y_velocity": vy}


def test_velocity_cost_follows_safety_gymnasium_definitions():
    assert velocity_threshold("HalfCheetah-v5") == 3.2096 and velocity_threshold("Hopper-v5") == 0.7402
    assert velocity_threshold("CartPole-v1") is None
    # forward speed for HalfCheetah; backwards running is free
    env = VelocityCost(_Moving("HalfCheetah-v5", [(3.0, 9.0), (3.3, 0.0), (-5.0, 0.0)]))
    env.reset()
    assert [env.step(np.zeros(1))[-1]["cost"] for _ in range(3)] == [0.0, 1.0, 0.0]
    # the planar speed for Ant: 2.0 forward and 2.0 sideways is 2.83 > 2.6222
    ant = VelocityCost(_Moving("Ant-v5", [(2.0, 2.0), (2.0, 0.0)]))
    assert [ant.step(np.zeros(1))[-1]["cost"] for _ in range(2)] == [1.0, 0.0]
    assert VelocityCost(_Moving("X-v0", [(1.5, 0)]), threshold=1.0).step(np.zeros(1))[1] == 1.0  # rewards untouched
    with pytest.raises(ValueError, match="velocity-cost:LIMIT"):
        VelocityCost(_Moving("CartPole-v1", []))


@pytest.mark.slow
def test_velocity_cost_on_mujoco_matches_the_speed_the_env_reports():
    from reflectrl.envs import make_env

    env = make_env("HalfCheetah-v5", wrapper="velocity-cost")
    env.reset(seed=0)
    env.action_space.seed(0)
    for _ in range(50):
        *_, info = env.step(env.action_space.sample())
        assert info["cost"] == float(info["x_velocity"] > 3.2096)
    env.close()


def test_hazard_cells_cost_one_and_are_placed_deterministically():
    env = GridWorldEnv(size=8, layout="rooms", hazards=0.2)
    again = GridWorldEnv(size=8, layout="rooms", hazards=0.2)
    assert np.array_equal(env.hazards, again.hazards)
    free = len(env.free_cells()) - 2
    assert env.hazards.sum() == round(0.2 * free) and not env.hazards[env.start] and not env.hazards[env.goal]
    assert not (env.hazards & env.walls).any()
    assert GridWorldEnv(size=8, layout="rooms", hazards=5).hazards.sum() == 5
    env.reset()
    cell = env.start
    for action in (1, 2, 1, 2, 1, 2):
        _, reward, _, _, info = env.step(action)
        cell = env.next_cell(cell, action)
        assert info["cost"] == float(env.hazards[cell]) and reward in (0.0, 1.0)
    # an ASCII map's H cells; no hazards: no cost channel at all
    ascii_env = GridWorldEnv(layout="SH./.../..G")
    ascii_env.reset()
    assert ascii_env.step(1)[-1]["cost"] == 1.0 and ascii_env.step(1)[-1]["cost"] == 0.0
    plain = GridWorldEnv(size=5, layout="empty")
    plain.reset()
    assert "cost" not in plain.step(1)[-1]
    for bad in (-1, 1.5, 100, "many"):
        with pytest.raises(ValueError, match="hazards="):
            GridWorldEnv(size=5, layout="empty", hazards=bad)


def test_cost_tracker_sums_episodes_across_rollouts_and_autoresets():
    tracker = CostTracker(2)
    tracker.start(2)
    tracker.record(0, {"cost": np.array([1.0, 0.0]), "_cost": np.array([True, True])}, np.array([False, False]))
    # env 1 ends on step 1: its last cost comes in final_info (same-step autoreset), its info is the reset's
    tracker.record(1, {"cost": np.array([1.0, 0.0]), "_cost": np.array([True, False]),
                       "final_info": {"cost": np.array([0.0, 1.0]), "_cost": np.array([False, True])}},
                   np.array([False, True]))
    assert tracker.finished == [1.0] and tracker.costs.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    tracker.start(1)
    tracker.record(0, {"cost": np.array([1.0, 0.0]), "_cost": np.array([True, True])}, np.array([True, False]))
    assert tracker.finished == [3.0]  # env 0's episode ran over both rollouts
    assert tracker.metrics(2.5) == {"step_cost": 0.5, "episode_cost": 3.0, "cost_limit_violations": 1,
                                    "cost_limit_violation_rate": 1.0}
    assert CostTracker(1).metrics(25.0) == {}  # no cost channel: no cost metrics


def _lagrangian(cost_limit, **knobs):
    from reflectrl.signals.base import SignalContext
    from reflectrl.signals.lagrangian.torch import Lagrangian, LagrangianConfig

    signal = Lagrangian(LagrangianConfig(**knobs))
    signal.bind(SignalContext(obs_dim=3, action_dim=2, discrete=True, feature_dim=4, learning_rate=3e-4, gamma=0.99,
                              gae_lambda=0.95, seed=1, total_iterations=10, cost_limit=cost_limit))
    return signal


def test_lagrange_multiplier_rises_above_the_limit_and_falls_to_zero_below():
    signal = _lagrangian(10.0, lambda_init=0.5, lambda_lr=0.1)
    values = []
    for _ in range(5):
        signal.update_multiplier(30.0)  # over the limit: lambda grows
        values.append(signal.penalty)
    assert all(b > a for a, b in zip([0.5] + values, values))
    for _ in range(40):
        signal.update_multiplier(0.0)  # under it: lambda shrinks, clipped at 0
    assert signal.penalty == 0.0
    capped = _lagrangian(0.0, lambda_init=0.0, lambda_lr=1.0, lambda_max=0.3)
    for _ in range(5):
        capped.update_multiplier(100.0)
    assert capped.penalty == pytest.approx(0.3)


def test_lagrangian_advantage_is_omnisafes_combination():
    from reflectrl.estimators import compute_gae
    from reflectrl.signals.base import Batch

    signal = _lagrangian(0.0, lambda_init=1.0, lambda_lr=0.0)  # lambda stays 1
    T, N = 6, 2
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(T, N, generator=g)
    batch = Batch(obs=torch.randn(T, N, 3, generator=g), actions=torch.zeros(T, N, dtype=torch.long),
                  rewards=torch.zeros(T, N), terminations=torch.zeros(T, N, dtype=torch.bool),
                  truncations=torch.zeros(T, N, dtype=torch.bool), values=torch.zeros(T, N),
                  next_values=torch.zeros(T, N), advantages=adv, next_obs=torch.randn(T, N, 3, generator=g),
                  costs=(torch.rand(T, N, generator=g) > 0.5).float(), episode_costs=[3.0],
                  gae=lambda r, v, nv, te, tr: compute_gae(r, v, nv, te, tr, 0.99, 0.95))
    x, next_x = batch.obs.reshape(-1, 3), batch.next_obs.reshape(-1, 3)
    adv_c, _ = signal.critic.estimate(batch.gae, batch.costs, x, next_x, batch.terminations, batch.truncations)
    out = signal.after_advantages(batch)
    expected = ((adv - adv.mean()) / (adv.std() + 1e-8) - (adv_c - adv_c.mean())) / 2.0
    assert torch.allclose(adv + out.advantage, expected, atol=1e-6)
    assert signal.metrics()["lagrange_multiplier"] == 1.0 and signal.metrics()["lagrangian_episode_cost"] == 3.0


def _sha(run) -> str:
    return json.loads((run / "run.json").read_text())["params_sha256"]


def test_ppo_lag_at_lambda_max_zero_is_ppo_bit_for_bit_and_logs_costs(cli, tmp_path):
    fast = ["--total-steps", 1024, *GRID]
    assert cli("train", "--algo", "ppo", *fast, "--out", tmp_path / "ppo")[0] == 0
    code, _, err = cli("train", "--algo", "ppo_lag", *fast, "lagrangian.lambda_max=0", "--out", tmp_path / "neutral")
    assert code == 0, err
    assert _sha(tmp_path / "ppo") == _sha(tmp_path / "neutral")
    # a limit of 0 on a grid with hazards: lambda grows and the update changes
    code, _, err = cli("train", "--algo", "ppo_lag", *fast, "cost_limit=0", "--out", tmp_path / "lag")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "lag" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "episode_cost" in r]
    assert rows and all(r["cost_limit_violations"] >= 0 and r["episode_cost"] >= 0 for r in rows)
    assert rows[-1]["lagrange_multiplier"] > 0.001 and _sha(tmp_path / "lag") != _sha(tmp_path / "ppo")
    # the plain trainer logs the env's costs too
    ppo_rows = [json.loads(line) for line in (tmp_path / "ppo" / "metrics.jsonl").read_text().splitlines()]
    assert any("episode_cost" in r for r in ppo_rows) and all("lagrange_multiplier" not in r for r in ppo_rows)


@pytest.mark.parametrize("algo, sets", [("ppo_lag", ["cost_limit=25"]), ("ppo+shaping", ["shaping.safety_beta=1"])])
def test_algos_that_need_costs_are_refused_on_an_env_without_a_cost_channel(cli, tmp_path, algo, sets):
    code, _, err = cli("train", "--algo", algo, "--env", "CartPole-v1", "--out", tmp_path / "r", "--set", *sets)
    assert code == 2 and "needs a cost channel (info['cost'])" in err and "--wrapper velocity-cost" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_cost_knob_errors():
    from reflectrl.trainers.resolve import new_run_config

    with pytest.raises(UserError, match="cost_limit=-1.0"):
        new_run_config(algo="ppo_lag", overrides=["env.hazards=3", "cost_limit=-1"])
    with pytest.raises(UserError, match="lagrangian.lambda_lr"):
        new_run_config(algo="ppo_lag", overrides=["env.hazards=3", "lagrangian.lambda_lr=-0.1"])
    with pytest.raises(UserError, match="mode=bootstrap distils none"):
        new_run_config(algo="sdrs", overrides=["env.hazards=3", "shaping.safety_beta=1", "shaping.mode=bootstrap"])
    with pytest.raises(UserError, match="needs costs, which trainer 'dqn' does not provide|cannot run on trainer"):
        new_run_config(algo="dqn+lagrangian", overrides=["env.hazards=3"])


def test_ppo_lag_resumes_bit_identically(tmp_path, monkeypatch):
    from reflectrl.runs import RunDir
    from reflectrl.runs.session import Terminated
    from reflectrl.trainers import base as loop_module
    from reflectrl.trainers.policies import params_sha256
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import new_run_config

    cfg = lambda: new_run_config(algo="ppo+lagrangian+shaping", total_steps=640, overrides=[  # noqa: E731
        "env.size=6", "env.hazards=0.3", "cost_limit=1", "shaping.safety_beta=1", "shaping.update_every=1",
        "num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=1"])
    full = PPOTrainer(cfg())
    full.train(progress=False)
    run = RunDir.create(tmp_path / "run", cfg().to_dict())
    first = PPOTrainer(cfg(), run)
    monkeypatch.setattr(loop_module, "stop_requested", lambda: first.iteration >= 4)
    with pytest.raises(Terminated):
        first.train(progress=False)
    monkeypatch.undo()
    second = PPOTrainer(cfg(), run)
    second.load_state_dict(run.load_checkpoint())
    second.train(progress=False)
    assert params_sha256(second.agent) == params_sha256(full.agent)
    assert second.signal.members[0].penalty == full.signal.members[0].penalty > 0


@pytest.mark.slow
def test_safety_shaper_learns_that_hazards_cost(tmp_path):
    """F_safety, distilled from the negated cost advantages, pays less for a step onto a hazard
    than for a step onto a free cell."""
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import new_run_config

    cfg = new_run_config(algo="ppo+shaping", total_steps=12288, overrides=[
        "env.size=6", "env.layout=empty", "env.hazards=0.3", "shaping.safety_beta=1", "shaping.update_every=1",
        "num_envs=4", "num_steps=128"])
    trainer = PPOTrainer(cfg)
    trainer.train(progress=False)
    env = trainer.envs.envs[0].unwrapped
    shaping = trainer.signal
    onto_hazard, onto_free = [], []
    for cell in env.free_cells():
        for action in range(4):
            nxt = env.next_cell(cell, action)
            if nxt == cell or nxt == env.goal:
                continue
            obs = torch.as_tensor(env.obs_for_cell(*cell))[None]
            next_obs = torch.as_tensor(env.obs_for_cell(*nxt))[None]
            with torch.no_grad():
                f = shaping.safety_target(obs, shaping.encode_actions(torch.tensor([action])), next_obs,
                                          torch.zeros(1)).item()
            (onto_hazard if env.hazards[nxt] else onto_free).append(f)
    assert np.mean(onto_hazard) < np.mean(onto_free)
