"""HPPO: a sub-goal policy over regions of a grid and a goal-conditioned low level, with a signal at each
level (seed 002 section 6.1)."""

import json

import numpy as np
import pytest
import torch

from reflectrl.errors import UserError

GRID = "reflectrl/GridWorld-v0"
# a 9x9 four-rooms grid, 2 envs x 32 steps a rollout, a high-level update every 4 decisions of each env
ROOMS9 = ["env.size=9", "env.layout=rooms"]
KNOBS = ["num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=2",
         "high_num_steps=4", "high_num_minibatches=2", "high_update_epochs=2", "horizon=6"]
SMALL = [*ROOMS9, *KNOBS]
SHAPING = ["shaping.update_every=1", "shaping.buffer_rollouts=2"]


def _config(algo="hppo", total_steps=512, extra=(), env_id=GRID):
    from reflectrl.trainers.resolve import new_run_config

    knobs = SMALL if env_id == GRID else KNOBS
    return new_run_config(algo=algo, env_id=env_id, total_steps=total_steps, overrides=[*knobs, *extra])


def _trainer(algo="hppo", total_steps=512, extra=(), env_id=GRID):
    from reflectrl.trainers.hppo.trainer import HPPOTrainer

    return HPPOTrainer(_config(algo, total_steps, extra, env_id))


def _params(trainer) -> torch.Tensor:
    return torch.cat([trainer.low.flat.detach(), trainer.high.flat.detach()])


# ---------------------------------------------------------------------------- the goal space

def _space(kind="relative", region=3, reach=1, free=None):
    from reflectrl.trainers.hppo.goals import GoalSpace

    free = np.ones((9, 9), dtype=bool) if free is None else free
    return GoalSpace(free, region, kind, reach, position_features=False)


def test_regions_tile_the_grid():
    space = _space()
    assert (space.grid_rows, space.grid_cols, space.n_regions) == (3, 3, 9)
    cells = np.array([[0, 0], [2, 2], [0, 3], [4, 4], [8, 8], [8, 0]])
    assert space.region_of(cells).tolist() == [0, 0, 1, 4, 8, 6]
    # a side that the region does not divide: the last regions are smaller
    from reflectrl.trainers.hppo.goals import GoalSpace

    odd = GoalSpace(np.ones((10, 10), dtype=bool), 4, "absolute", 1, False)
    assert odd.n_regions == 9 and odd.region_of(np.array([[9, 9]])).tolist() == [8]


def test_relative_choices_are_the_neighbouring_regions():
    space = _space("relative", reach=1)
    assert space.n_choices == 9
    centre, corner = np.array([[4, 4]]), np.array([[0, 0]])
    mask = space.masks(centre)[0]
    assert mask.sum() == 8 and not mask[4]  # every neighbour, never the agent's own region
    assert sorted(space.goal_of(np.flatnonzero(mask.numpy()), centre.repeat(8, 0)).tolist()) == [0, 1, 2, 3, 5, 6, 7, 8]
    mask = space.masks(corner)[0]
    assert mask.sum() == 3  # off-grid offsets are closed
    assert sorted(space.goal_of(np.flatnonzero(mask.numpy()), corner.repeat(3, 0)).tolist()) == [1, 3, 4]


def test_absolute_choices_are_every_other_free_region():
    free = np.ones((9, 9), dtype=bool)
    free[6:, 6:] = False  # region 8 has no free cell
    space = _space("absolute", free=free)
    assert space.n_choices == 9
    mask = space.masks(np.array([[0, 0]]))[0]
    assert mask.tolist() == [False, True, True, True, True, True, True, True, False]


def test_a_region_with_nowhere_to_go_is_refused():
    free = np.zeros((9, 9), dtype=bool)
    free[0:3, 0:3] = free[6:, 6:] = True  # two free regions, two regions apart
    with pytest.raises(UserError, match="goal_reach=1"):
        _space("relative", reach=1, free=free)
    assert _space("relative", reach=2, free=free).n_choices == 25


def test_goal_features_and_reaching():
    space = _space()
    cells = np.array([[0, 0], [4, 4]])
    goals = np.array([4, 4])
    f = space.features(goals, cells)
    assert f.shape == (2, 9 + 2)
    assert torch.equal(f[:, 4], torch.ones(2)) and f[:, :9].sum() == 2
    # the displacement to the centre of region 4 (cells 3..5: centre (4, 4)) over the side 9
    assert torch.allclose(f[0, 9:], torch.tensor([4 / 9, 4 / 9])) and torch.allclose(f[1, 9:], torch.zeros(2))
    assert space.reached(goals, cells).tolist() == [False, True]


def test_the_agent_cell_is_in_every_info():
    import gymnasium as gym

    from reflectrl.envs import make_env
    from reflectrl.trainers.hppo.goals import AgentCell

    env = AgentCell(make_env(GRID, env_kwargs={"size": 5, "layout": "empty"}))
    _, info = env.reset(seed=0)
    assert info["agent_cell"].tolist() == [0, 0]
    _, _, _, _, info = env.step(1)  # right
    assert info["agent_cell"].tolist() == [0, 1] == list(info["cell"])
    pytest.importorskip("minigrid")
    mg = AgentCell(make_env("MiniGrid-Empty-5x5-v0"))
    _, info = mg.reset(seed=0)
    x, y = mg.unwrapped.agent_pos
    assert info["agent_cell"].tolist() == [y, x]
    assert isinstance(mg.unwrapped, gym.Env)


# ---------------------------------------------------------------------------- what one rollout holds

def test_low_level_rewards_ends_and_horizon():
    """The low level is paid goal_reward exactly where it reaches its sub-goal, which ends its episode; a
    pursuit never runs past the horizon."""
    trainer = _trainer(extra=["goal_reward=2.0"])
    for _ in range(3):
        ro, _, pursuits = trainer.collect()
        r, term, trunc = ro["rewards"], ro["terminations"], ro["truncations"]
        assert set(r.unique().tolist()) <= {0.0, 2.0}
        assert bool(term[r > 0].all())  # paid => its episode ended
        assert not bool((term & trunc).any())
        assert all(1 <= steps <= 6 for _, steps in pursuits)
        assert sum(ok for ok, _ in pursuits) == int((r > 0).sum())
        for column in range((term | trunc).shape[1]):  # between two ends: at most `horizon` steps
            ends = np.flatnonzero((term | trunc)[:, column].numpy())
            assert np.all(np.diff(ends) <= 6)


def test_the_high_level_is_paid_the_env_reward_of_its_pursuits():
    """Over a rollout, the env reward equals what the finished decisions were paid plus what the pursuits
    in flight have gathered (nothing is lost or counted twice between the levels)."""
    trainer = _trainer(extra=["env.size=5", "env.layout=empty", "goal_region=1", "goal_reach=2"])
    total, paid = 0.0, 0.0
    for _ in range(6):
        before = float(trainer.option_reward.sum())
        ro, episodes, _ = trainer.collect()
        total += float(ro["env_rewards"].sum())
        paid += sum(step["reward"] for q in trainer.pending for step in q)
        trainer.pending = [[] for _ in trainer.pending]
        paid += float(trainer.option_reward.sum()) - before
    assert total > 0  # the 5x5 grid's goal was reached
    assert paid == pytest.approx(total)


def test_sub_goals_are_only_open_ones():
    trainer = _trainer()
    for _ in range(3):
        trainer.collect()
    steps = [step for q in trainer.pending for step in q]
    assert steps
    for step in steps:
        assert bool(step["mask"][step["choice"]])


def test_masked_choices_are_never_sampled():
    from reflectrl.trainers.hppo.trainer import SubgoalPolicy

    torch.manual_seed(0)
    policy = SubgoalPolicy(4, 6, (8,))
    mask = torch.tensor([[True, False, False, False, False, True]] * 500)
    with torch.no_grad():
        choice, logprob = policy.act(torch.randn(500, 4), mask, torch.Generator().manual_seed(1))
    assert set(choice.tolist()) == {0, 5}
    lp, entropy, _ = policy.evaluate(torch.randn(3, 4), mask[:3], torch.zeros(3, dtype=torch.long))
    assert torch.isfinite(lp).all() and torch.isfinite(entropy).all()
    assert bool((entropy <= np.log(2) + 1e-5).all())  # two open choices at most


# ---------------------------------------------------------------------------- training

def test_hppo_run_via_the_cli_logs_both_levels(cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli("train", "--algo", "hppo+shaping", "--env", GRID, "--total-steps", 512, "--no-progress",
                            "--set", *SMALL, *SHAPING, "--out", out)
    assert code == 0, err
    assert "finished hppo+shaping" in stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [64 * i for i in range(1, 9)]
    last = rows[-1]
    for key in ("policy_loss", "value_loss", "entropy", "approx_kl", "explained_variance", "high_policy_loss",
                "high_value_loss", "high_entropy", "high_approx_kl", "subgoals", "subgoal_success", "subgoal_steps",
                "unique_states_total", "low/shaping_mean", "low/label_r2", "high/shaping_mean", "high/label_r2",
                "signal_time_fraction"):
        assert last.get(key) is not None, key
    assert last["high_updates"] >= 2
    saved = json.loads((out / "config.json").read_text())
    assert saved["hppo"]["horizon"] == 6 and saved["env"]["size"] == 9
    # eval acts with both levels, keeping each episode's sub-goal
    code, stdout, err = cli("eval", out, "--episodes", 3, "--json")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["episodes"] == 3
    assert result["params_sha256"] == torch.load(out / "checkpoint.pt", weights_only=False)["params_sha256"]


def test_eval_agent_keeps_and_renews_its_sub_goal():
    from reflectrl.trainers.hppo.trainer import HierarchicalAgent

    trainer = _trainer()
    agent = HierarchicalAgent(trainer.low.policy, trainer.high.policy, trainer.goals, horizon=3)
    x = torch.zeros(1, trainer.obs_dim)
    x[0, 0] = 1.0  # the one-hot cell (0, 0)
    agent.observe({"agent_cell": np.array([0, 0])}, reset=True)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        agent.act(x, generator)
        first = agent.goal.copy()
        assert first[0] in (1, 3, 4) and not agent.need_goal  # a neighbour of region 0
        agent.observe({"agent_cell": np.array([0, 1])})
        assert not agent.need_goal and agent.steps == 1
        agent.observe({"agent_cell": np.array([0, 1])})
        agent.observe({"agent_cell": np.array([0, 1])})
        assert agent.need_goal  # the horizon ran out
        agent.deterministic_action(x)
        agent.observe({"agent_cell": np.array([4, 4])})  # an arrival elsewhere than the goal
        cells = trainer.goals.region_of(np.array([[4, 4]]))
        assert agent.need_goal == bool(agent.goal[0] == cells[0])



def test_eval_agent_takes_a_numpy_observation():
    """From Python, with what the env returns: one observation (numpy or a list) gives an int, the action
    the tensor path gives; the tensor path is unchanged."""
    from reflectrl.trainers.hppo.trainer import HierarchicalAgent

    trainer = _trainer()
    actions = []
    for obs in (torch.zeros(1, trainer.obs_dim), np.zeros(trainer.obs_dim, np.float32), [0.0] * trainer.obs_dim):
        agent = HierarchicalAgent(trainer.low.policy, trainer.high.policy, trainer.goals, horizon=3)
        agent.observe({"agent_cell": np.array([0, 0])}, reset=True)
        with torch.no_grad():
            actions.append(agent.deterministic_action(obs))
    assert isinstance(actions[0], torch.Tensor) and type(actions[1]) is int
    assert actions[1] == actions[2] == int(actions[0][0])

def test_both_levels_learn():
    trainer = _trainer()
    low, high = trainer.low.flat.detach().clone(), trainer.high.flat.detach().clone()
    trainer.train(progress=False)
    assert trainer.high_updates >= 2
    assert not torch.equal(low, trainer.low.flat.detach()) and not torch.equal(high, trainer.high.flat.detach())


def test_runs_are_deterministic():
    a, b = _trainer("hppo+shaping", extra=SHAPING), _trainer("hppo+shaping", extra=SHAPING)
    a.train(progress=False)
    b.train(progress=False)
    assert torch.equal(_params(a), _params(b))


@pytest.mark.parametrize("levels, low, high", [("both", True, True), ("high", False, True), ("low", True, False)])
def test_shaped_levels(levels, low, high):
    trainer = _trainer("hppo+shaping", extra=[*SHAPING, f"shaped_levels={levels}"])
    assert (trainer.low.signal is not None, trainer.high.signal is not None) == (low, high)
    if low and high:
        assert trainer.low.signal is not trainer.high.signal
        assert trainer.low.signal.ctx.gamma == pytest.approx(0.99)
        assert trainer.high.signal.ctx.gamma == pytest.approx(0.99 ** 6)  # per decision: gamma ** horizon
        assert trainer.high.signal.ctx.action_dim == trainer.goals.n_choices
    trainer.train(progress=False)
    for level, shaped in ((trainer.low, low), (trainer.high, high)):
        assert (level.signal is not None and level.signal.updates >= 1) == shaped


def test_neutral_shaping_is_hppo_bit_for_bit():
    plain = _trainer("hppo")
    off = _trainer("hppo+shaping", extra=["shaping.mode=off"])
    plain.train(progress=False)
    off.train(progress=False)
    assert torch.equal(_params(plain), _params(off))


def test_shaping_changes_both_levels_rewards():
    """F_low and F_high each reach their level: with a large eta, the rewards each level learns from differ
    from its own."""
    trainer = _trainer("hppo+shaping", extra=[*SHAPING, "shaping.eta=1.0"])
    trainer.train(progress=False)
    low, high = trainer.low.signal, trainer.high.signal
    assert low.updates >= 2 and high.updates >= 2
    assert abs(low.metrics()["shaping_mean"]) > 0 and abs(high.metrics()["shaping_mean"]) > 0
    # the distilled shapers are fit on their own level's transitions: (s|g, a, s'|g) and (s, choice, s')
    assert low.buffer[-1]["obs"].shape[-1] == trainer.low_in and low.buffer[-1]["actions"].shape[-1] == 4
    assert high.buffer[-1]["obs"].shape[-1] == trainer.high_in
    assert high.buffer[-1]["actions"].shape[-1] == trainer.goals.n_choices


@pytest.mark.parametrize("algo", ["hppo+count", "hppo+gear", "hppo+calibration", "hppo+shaping+count"])
def test_other_signals_compose(algo):
    trainer = _trainer(algo, total_steps=256, extra=SHAPING if "shaping" in algo else ())
    trainer.train(progress=False)
    assert trainer.high_updates >= 1


@pytest.mark.parametrize("algo, extra", [("hppo", []), ("hppo+shaping", SHAPING)])
def test_resume_is_bit_identical(tmp_path, monkeypatch, algo, extra):
    from reflectrl.runs import RunDir
    from reflectrl.runs.session import Terminated
    from reflectrl.trainers import base as loop_module
    from reflectrl.trainers.hppo.trainer import HPPOTrainer
    from reflectrl.trainers.policies import params_sha256

    full = HPPOTrainer(_config(algo, 640, extra))
    full.train(progress=False)
    run = RunDir.create(tmp_path / "run", _config(algo, 640, extra).to_dict())
    first = HPPOTrainer(_config(algo, 640, extra), run)
    # stop as SIGTERM does: after iteration 5, with pursuits in flight and decisions waiting
    monkeypatch.setattr(loop_module, "stop_requested", lambda: first.iteration >= 5)
    with pytest.raises(Terminated):
        first.train(progress=False)
    monkeypatch.undo()
    state = run.load_checkpoint()
    assert state["iteration"] == 5 and any(state["pending"]) and state["high_updates"] >= 1
    second = HPPOTrainer(_config(algo, 640, extra), run)
    second.load_state_dict(run.load_checkpoint())
    second.train(progress=False)
    assert params_sha256(second.policy_module) == params_sha256(full.policy_module)
    if algo != "hppo":
        for a, b in ((second.low.signal, full.low.signal), (second.high.signal, full.high.signal)):
            assert torch.equal(torch.cat([p.flatten() for p in a.target.parameters()]),
                               torch.cat([p.flatten() for p in b.target.parameters()]))


def test_resume_through_the_cli(cli, tmp_path, sigterm_after_rows):
    # 4 iterations of 64 env steps; SIGTERM after the first stops the run there, --resume trains the other 3
    argv = ["train", "--algo", "hppo+shaping", "--env", GRID, "--total-steps", 256, "--no-progress",
            "--set", *SMALL, *SHAPING]
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
    for key in ("policy_loss", "value_loss", "high_policy_loss", "low/label_loss", "high/label_loss"):
        assert [r[key] for r in res] == [r[key] for r in ref], key


def test_minigrid_runs_with_the_agent_position():
    pytest.importorskip("minigrid")
    trainer = _trainer("hppo+shaping", total_steps=256, extra=[*SHAPING, "goal_region=2"],
                       env_id="MiniGrid-FourRooms-v0")
    g = trainer.goals
    assert g.position_features and (g.rows, g.cols) == (19, 19) and g.n_regions == 100
    assert trainer.high_in == 147 + 2 and trainer.low_in == 147 + 2 + 102
    assert g.valid[0] and not g.valid[99]  # the last region (row and column 18) holds only the outer wall
    trainer.train(progress=False)
    assert trainer.global_step == 256


# ---------------------------------------------------------------------------- refusals

def _assert_one_line(code, err, *needles):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reflectrl: error: "), err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("argv, needles", [
    (["--algo", "hppo", "--env", "CartPole-v1"], ["cells of a grid", "CartPole-v1"]),
    (["--algo", "hppo", "--env", "Pendulum-v1"], ["discrete actions"]),
    (["--algo", "hppo", "--env", GRID, "--set", "goals=nearby"], ["hppo.goals='nearby'", "relative, absolute"]),
    (["--algo", "hppo", "--env", GRID, "--set", "goal_region=20"], ["goal_region=20", "larger than the grid"]),
    (["--algo", "hppo", "--env", GRID, "--set", "shaped_levels=top"], ["shaped_levels='top'"]),
    (["--algo", "hppo", "--env", GRID, "--set", "high_num_minibatches=3"], ["high_num_minibatches=3"]),
    (["--algo", "hppo", "--env", GRID, "--set", "horizon=0"], ["horizon=0"]),
    (["--algo", "hppo+rnd", "--env", GRID], ["[value_stream]", "hppo does not have"]),
])
def test_bad_input_gets_one_line(cli, tmp_path, argv, needles):
    out = tmp_path / "run"
    code, _, err = cli("train", *argv, "--total-steps", 4096, "--no-progress", "--out", out)
    _assert_one_line(code, err, *needles)
    assert not out.exists()


def test_hppo_knobs_are_refused_on_other_trainers():
    from reflectrl.trainers.resolve import new_run_config

    with pytest.raises(UserError, match="apply to --algo hppo"):
        new_run_config(algo="ppo", env_id=GRID, overrides=["hppo.horizon=4"])


def test_knobs_lists_the_section(cli):
    code, stdout, err = cli("knobs", "hppo")
    assert code == 0, err
    for knob in ("horizon", "goal_region", "goals", "goal_reach", "high_gamma", "shaped_levels"):
        assert knob in stdout


# ---------------------------------------------------------------------------- learning

@pytest.mark.slow
def test_hppo_solves_the_small_rooms_grid():
    """On the 9x9 four-rooms grid, a short budget brings the episodes' return up from random play's."""
    trainer = _trainer(total_steps=30_000, extra=["num_envs=4", "num_steps=128", "num_minibatches=4",
                                                  "update_epochs=4", "high_num_steps=16", "high_num_minibatches=4",
                                                  "high_update_epochs=4", "horizon=8", "env.max_episode_steps=100"])
    rows = []
    while not trainer.finished():
        rows.append(trainer.run_iteration())
    returns = [r["episodic_return"] for r in rows if r["episodic_return"] is not None]
    assert np.mean(returns[-5:]) > np.mean(returns[:5]) + 0.3, (returns[:5], returns[-5:])
    assert rows[-1]["subgoal_success"] > rows[0]["subgoal_success"]
