"""MAPPO on PettingZoo parallel envs and per-agent shapers distilled from the team (seed 002 section 4.3)."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

from reflectrl.errors import UserError  # noqa: E402

SPREAD = "pettingzoo:mpe2.simple_spread_v3"
AGENTS = ["agent_0", "agent_1", "agent_2"]
# 2 copies x 32 steps a rollout, episodes of 10 steps
SMALL = ["env.max_cycles=10", "num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=2"]


def _config(algo="mappo", total_steps=256, extra=()):
    from reflectrl.trainers.resolve import new_run_config

    return new_run_config(algo=algo, env_id=SPREAD, total_steps=total_steps, overrides=[*SMALL, *extra])


def _trainer(algo="mappo", total_steps=256, extra=()):
    from reflectrl.trainers.mappo.trainer import MAPPOTrainer

    return MAPPOTrainer(_config(algo, total_steps, extra))


# ---------------------------------------------------------------------------- the env adapter

def test_adapter_on_simple_spread_gives_an_agent_axis():
    from reflectrl.trainers.mappo.envs import ParallelVecEnv

    envs = ParallelVecEnv(SPREAD, {"max_cycles": 5, "N": 3}, num_envs=2)
    assert envs.agents == AGENTS
    assert (envs.layout.obs_dim, envs.layout.n_actions) == (18, 5)
    obs = envs.reset(seed=3)
    assert obs.shape == (2, 3, 18) and obs.dtype == np.float32
    assert not np.array_equal(obs[0], obs[1])  # each copy has its own seed
    for t in range(5):
        obs, rewards, terms, truncs, finals, episodes = envs.step(np.zeros((2, 3), dtype=np.int64))
        assert obs.shape == (2, 3, 18) and rewards.shape == terms.shape == truncs.shape == (2, 3)
        if t < 4:
            assert not truncs.any() and not finals and not episodes
    # max_cycles: every agent is cut at once, the copies are reset, each episode reported once
    assert truncs.all() and not terms.any()
    assert sorted(finals) == [0, 1] and finals[0].shape == (3, 18)
    assert [length for _, _, length in episodes] == [5, 5]
    team, per_agent, _ = episodes[0]
    assert per_agent.shape == (3,) and team == pytest.approx(per_agent.sum())


def test_adapter_is_seeded():
    from reflectrl.trainers.mappo.envs import ParallelVecEnv

    a, b = (ParallelVecEnv(SPREAD, {"max_cycles": 5}, num_envs=1) for _ in range(2))
    assert np.array_equal(a.reset(seed=7), b.reset(seed=7))


# ---------------------------------------------------------------------------- training through the CLI

def test_mappo_run_via_the_cli_logs_per_agent_returns(cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli("train", "--algo", "mappo", "--env", SPREAD, "--total-steps", 256, "--no-progress",
                            "--set", *SMALL, "--out", out)
    assert code == 0, err
    assert "finished mappo" in stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [64, 128, 192, 256]
    last = rows[-1]
    for key in ("episodic_return", "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac",
                "explained_variance", *(f"agent_return/{a}" for a in AGENTS)):
        assert last[key] is not None, key
    # the team's return is the agents' summed
    assert last["episodic_return"] == pytest.approx(sum(last[f"agent_return/{a}"] for a in AGENTS))
    saved = json.loads((out / "config.json").read_text())
    assert saved["mappo"]["num_envs"] == 2 and saved["env"]["max_cycles"] == 10
    assert json.loads((out / "run.json").read_text())["status"] == "finished"
    code, _, err = cli("eval", out)
    _assert_one_line(code, err, "multi-agent (mappo) run")


@pytest.mark.parametrize("share, critic", [(True, "central"), (False, "central"), (True, "local"), (False, "local")])
def test_every_layout_trains(share, critic):
    trainer = _trainer(extra=[f"share_parameters={str(share).lower()}", f"critic={critic}"])
    before = trainer.flat_params.detach().clone()
    trainer.train(progress=False)
    assert not torch.equal(before, trainer.flat_params.detach())
    policy = trainer.policy
    assert len(policy.actors) == (1 if share else 3)
    assert policy.policy_in == 18 + (3 if share else 0)
    assert policy.critic_in == (54 if critic == "central" else 18) + (3 if share else 0)


def test_central_critic_reads_every_agent():
    """V_i under critic=central changes when another agent's observation does; under local it does not."""
    for critic, moves in (("central", True), ("local", False)):
        trainer = _trainer(extra=[f"critic={critic}"])
        obs = torch.randn(1, 3, 18)
        other = obs.clone()
        other[0, 2] += 1.0
        with torch.no_grad():
            changed = not torch.equal(trainer.policy.values_of(obs)[0, 0], trainer.policy.values_of(other)[0, 0])
        assert changed == moves, critic


def test_runs_are_deterministic():
    a, b = _trainer(), _trainer()
    a.train(progress=False)
    b.train(progress=False)
    assert torch.equal(a.flat_params, b.flat_params)


@pytest.mark.parametrize("algo, extra", [
    ("mappo", []),
    ("mappo+shaping", ["shaping.labels=team", "shaping.update_every=1", "shaping.buffer_rollouts=2"]),
])
def test_resume_is_bit_identical(tmp_path, monkeypatch, algo, extra):
    from reflectrl.runs import RunDir
    from reflectrl.runs.session import Terminated
    from reflectrl.trainers import base as loop_module
    from reflectrl.trainers.mappo.trainer import MAPPOTrainer
    from reflectrl.trainers.policies import params_sha256

    full = MAPPOTrainer(_config(algo, 384, extra))
    full.train(progress=False)
    run = RunDir.create(tmp_path / "run", _config(algo, 384, extra).to_dict())
    first = MAPPOTrainer(_config(algo, 384, extra), run)
    # stop as SIGTERM does: at the end of iteration 3 (mid-episode: 96 steps of 10-step episodes)
    monkeypatch.setattr(loop_module, "stop_requested", lambda: first.iteration >= 3)
    with pytest.raises(Terminated):
        first.train(progress=False)
    monkeypatch.undo()
    assert run.load_checkpoint()["iteration"] == 3
    second = MAPPOTrainer(_config(algo, 384, extra), run)
    second.load_state_dict(run.load_checkpoint())
    second.train(progress=False)
    assert params_sha256(second.policy) == params_sha256(full.policy)
    if algo != "mappo":
        assert torch.equal(torch.cat([p.flatten() for p in second.signal.target.parameters()]),
                           torch.cat([p.flatten() for p in full.signal.target.parameters()]))


def test_resume_through_the_cli(cli, tmp_path, sigterm_after_rows):
    # 4 iterations of 64 env steps; SIGTERM after the first stops the run there, --resume trains the other 3
    argv = ["train", "--algo", "mappo+shaping", "--env", SPREAD, "--total-steps", 256, "--no-progress", "--set", *SMALL]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    code, _, err = cli(*argv, "--out", reference)
    assert code == 0, err
    sigterm_after_rows(1)
    code, _, err = cli(*argv, "--out", resumed)
    assert code == 143 and "--resume" in err, err
    status = json.loads((resumed / "run.json").read_text())
    assert status["status"] == "interrupted" and status["global_step"] == 64
    code, _, err = cli("train", "--resume", resumed, "--no-progress")
    assert code == 0, err
    ref, res = (json.loads((run / "run.json").read_text()) for run in (reference, resumed))
    assert res["status"] == ref["status"] == "finished" and res["global_step"] == ref["global_step"] == 256
    assert res["params_sha256"] == ref["params_sha256"]
    ref, res = ([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
                for run in (reference, resumed))
    assert [r["global_step"] for r in res] == [r["global_step"] for r in ref] == [64, 128, 192, 256]
    for key in ("policy_loss", "value_loss", "shaping_mean", "episodic_return", "agent_return/agent_0"):
        assert [r[key] for r in res] == [r[key] for r in ref], key


# ---------------------------------------------------------------------------- refusals

def _assert_one_line(code, err, *needles):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reflectrl: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("argv, needles", [
    (["--algo", "mappo", "--env", "pettingzoo:no_such_module_xyz"], ["cannot import module 'no_such_module_xyz'"]),
    (["--algo", "mappo", "--env", "pettingzoo:json"], ["has no parallel_env()"]),
    (["--algo", "mappo", "--env", "pettingzoo:"], ["name a module"]),
    (["--algo", "mappo", "--env", SPREAD, "--set", "env.continuous_actions=true"],
     ["continuous (Box) actions", "Discrete actions only"]),
    (["--algo", "mappo", "--env", SPREAD, "--set", "env.no_such_kwarg=1"], ["does not take the --set env.*"]),
    (["--algo", "ppo", "--env", SPREAD], ["multi-agent (PettingZoo) env", "--algo mappo"]),
    (["--algo", "dqn", "--env", SPREAD], ["--algo mappo"]),
    (["--algo", "mappo", "--env", "CartPole-v1"], ["PettingZoo parallel envs", "--algo ppo"]),
    (["--algo", "mappo", "--env", SPREAD, "--set", "critic=global"], ["mappo.critic='global'", "central, local"]),
    (["--algo", "mappo", "--env", SPREAD, "--set", "num_minibatches=3"], ["num_minibatches=3"]),
    (["--algo", "mappo", "--env", SPREAD, "--wrapper", "sparse"], ["--wrapper sparse"]),
    (["--algo", "mappo+shaping", "--env", SPREAD, "--set", "shaping.labels=mine"], ["shaping.labels='mine'"]),
    (["--algo", "ppo+shaping", "--env", "CartPole-v1", "--set", "shaping.labels=team"],
     ["[team]", "trainer 'ppo' does not provide"]),
    (["--algo", "mappo+shaping", "--env", SPREAD, "--set", "shaping.imagined_fraction=0.5"], ["[policy]"]),
    (["--algo", "mappo+rnd", "--env", SPREAD], ["rnd"]),
])
def test_bad_input_gets_one_line(cli, tmp_path, argv, needles):
    out = tmp_path / "run"
    code, _, err = cli("train", *argv, "--total-steps", 4096, "--no-progress", "--out", out)
    _assert_one_line(code, err, *needles)
    assert not out.exists()


def test_mappo_knobs_are_refused_on_other_trainers():
    from reflectrl.trainers.resolve import new_run_config

    with pytest.raises(UserError, match="apply to --algo mappo"):
        new_run_config(algo="ppo", env_id="CartPole-v1", overrides=["mappo.critic=local"])


# ---------------------------------------------------------------------------- team vs own labels

def _shaper(labels):
    from reflectrl.signals.base import SignalContext
    from reflectrl.signals.shaping.torch import SelfDistilledShaping, ShapingConfig

    sh = SelfDistilledShaping(ShapingConfig(labels=labels, update_every=1, epochs=1))
    sh.bind(SignalContext(obs_dim=4, action_dim=2, discrete=True, feature_dim=4, learning_rate=1e-3, gamma=0.9,
                          gae_lambda=0.95, seed=0, total_iterations=10))
    return sh


def _hand_batch(team: bool):
    """One env, two agents (columns 0 and 1), 6 steps: agent 0 is paid 1 at step 2, agent 1 nothing."""
    from reflectrl.estimators import compute_gae
    from reflectrl.signals.base import Batch

    T, N = 6, 2
    rewards = torch.zeros(T, N)
    rewards[2, 0] = 1.0
    obs = torch.randn(T, N, 4, generator=torch.Generator().manual_seed(0))
    zeros = torch.zeros(T, N, dtype=torch.bool)
    gae = lambda r, v, nv, te, tr: compute_gae(r, v, nv, te, tr, 0.9, 0.95)  # noqa: E731
    return Batch(obs=obs, actions=torch.zeros(T, N, dtype=torch.long), rewards=rewards, terminations=zeros,
                 truncations=zeros, values=torch.zeros(T, N), next_values=torch.zeros(T, N), next_obs=obs,
                 value_fn=lambda x: torch.zeros(x.shape[:-1]), gae=gae,
                 team_rewards=rewards.sum(-1, keepdim=True).expand(T, N).contiguous() if team else None,
                 team_value_fn=(lambda x: torch.zeros(x.shape[:-1])) if team else None)


@pytest.mark.parametrize("labels, team_batch, same", [
    ("own", True, False),    # own labels: each agent's from its own rewards, even where a team is given
    ("team", True, True),    # team labels: every agent of the env gets the team's advantage
    ("auto", True, True),    # auto: team where the trainer gives one ...
    ("auto", False, False),  # ... own where it does not (PPO)
])
def test_labels_come_from_own_or_team_rewards(labels, team_batch, same):
    sh = _shaper(labels)
    batch = _hand_batch(team_batch)
    sh.after_update(batch)
    stored = sh.buffer[-1]["rewards"]
    assert torch.equal(stored, batch.team_rewards if same else batch.rewards)
    _, _, _, _, y = sh.distillation_set(batch.value_fn, batch.gae)
    y = y.reshape(6, 2)
    assert torch.equal(y[:, 0], y[:, 1]) == same
    if not same:  # agent 1 was paid nothing: its labels carry nothing of agent 0's reward
        assert y[:, 1].unique().numel() == 1 and y[:, 0].unique().numel() > 1


def test_mappo_gives_the_signal_the_team():
    trainer = _trainer("mappo+shaping")
    rollout, _ = trainer.collect()
    batch = trainer.apply_signal(rollout)
    T, E, n = rollout.rewards.shape
    assert batch.rewards.shape == (T, E * n) and batch.obs.shape == (T, E * n, 3 * 18 + 3)
    team = rollout.learn_rewards.sum(-1)  # (T, E)
    for e in range(E):
        for i in range(n):
            assert torch.equal(batch.team_rewards[:, e * n + i], team[:, e])
            assert torch.equal(batch.rewards[:, e * n + i], rollout.learn_rewards[:, e, i])
    with torch.no_grad():
        own = trainer.own_value(batch.obs)  # the column's agent's V_i
        assert torch.allclose(own, batch.values, atol=1e-6)
        team_value = trainer.team_value(batch.obs)
        assert torch.allclose(team_value, batch.values.reshape(T, E, n).sum(-1, keepdim=True).expand(T, E, n)
                              .reshape(T, E * n), atol=1e-5)


def test_team_advantage_is_the_agents_summed():
    """GAE is linear: under common episode ends the team advantage of an env is its agents' advantages summed."""
    trainer = _trainer("mappo+shaping")
    rollout, _ = trainer.collect()
    batch = trainer.apply_signal(rollout)
    team_adv, _ = batch.gae(batch.team_rewards, trainer.team_value(batch.obs), trainer.team_value(batch.next_obs),
                            batch.terminations, batch.truncations)
    T, E, n = rollout.rewards.shape
    summed = rollout.advantages.sum(-1, keepdim=True).expand(T, E, n).reshape(T, E * n)
    assert torch.allclose(team_adv, summed, atol=1e-4)


def test_neutral_shaping_is_mappo_bit_for_bit():
    plain = _trainer("mappo")
    off = _trainer("mappo+shaping", extra=["shaping.mode=off"])
    plain.train(progress=False)
    off.train(progress=False)
    assert torch.equal(plain.flat_params, off.flat_params)


@pytest.mark.slow
def test_mappo_learns_simple_spread():
    """A short budget improves the team's return over the first rollouts' (random play)."""
    trainer = _trainer(total_steps=40_000, extra=["num_envs=8", "num_steps=64", "num_minibatches=4",
                                                  "update_epochs=4", "env.max_cycles=25"])
    rows = []
    while not trainer.finished():
        rows.append(trainer.run_iteration())
    first = np.mean([r["episodic_return"] for r in rows[:3]])
    last = np.mean([r["episodic_return"] for r in rows[-5:]])
    assert last > first + 5, (first, last)
