"""SDRS: potential shaping telescopes and keeps the optimal policy, target and curriculum
math, mode=off equals PPO bit for bit, the prior pre-fit, knobs, the reward map."""

import json
import math
import textwrap

import numpy as np
import pytest
import torch

from reflectrl.envs.gridworld import GridWorldEnv
from reflectrl.signals.shaping.torch import RewardShaper, curriculum, polyak


def random_potential_shaper(obs_dim, gamma, seed=0):
    torch.manual_seed(seed)
    shaper = RewardShaper(obs_dim, 4, (16,), "potential", eta=1.0, gamma=gamma, hard_clip=math.inf)
    with torch.no_grad():
        shaper.net[-1].weight.normal_(0, 1.0)  # a non-trivial potential
    return shaper


def test_potential_shaping_telescopes_along_any_trajectory():
    gamma = 0.9
    gen = torch.Generator().manual_seed(1)
    states = torch.rand(9, 5, generator=gen)  # s_0 .. s_8
    shaper = random_potential_shaper(5, gamma)
    acts = torch.zeros(8, 4)
    for terminal in (False, True):
        terms = torch.zeros(8, dtype=torch.bool)
        terms[-1] = terminal
        with torch.no_grad():
            f = shaper(states[:-1], acts, states[1:], terms)
            phi = shaper.potential(states)
        discounted = sum(gamma ** t * f[t].item() for t in range(8))
        end = 0.0 if terminal else gamma ** 8 * phi[-1].item()  # Phi(terminal) = 0
        assert discounted == pytest.approx(end - phi[0].item(), abs=1e-5)


def _greedy_policy(env, gamma, shaping=None):
    """Value iteration on the grid world's exact model; the greedy action per free cell."""
    cells = env.free_cells()
    index = {c: i for i, c in enumerate(cells)}
    v = np.zeros(len(cells))
    q = np.zeros((len(cells), 4))
    for _ in range(500):
        for i, c in enumerate(cells):
            for a in range(4):
                n = env.next_cell(c, a)
                done = n == env.goal
                r = (1.0 if done else 0.0) + (shaping(c, a, n, done) if shaping else 0.0)
                q[i, a] = r + (0.0 if done else gamma * v[index[n]])
        v = q.max(1)
        v[index[env.goal]] = 0.0
    # the set of optimal actions per cell (grid worlds have ties: right-then-down = down-then-right)
    return {c: tuple(np.flatnonzero(q[i] >= q[i].max() - 1e-6)) for i, c in enumerate(cells) if c != env.goal}, q


@pytest.mark.slow
def test_potential_shaping_keeps_the_optimal_policy_of_a_solved_mdp():
    env = GridWorldEnv(size=6, layout="rooms")
    gamma = 0.95
    shaper = random_potential_shaper(36, gamma, seed=3)

    def shaping(c, a, n, done):
        s = torch.as_tensor(env.obs_for_cell(*c)).unsqueeze(0)
        s2 = torch.as_tensor(env.obs_for_cell(*n)).unsqueeze(0)
        with torch.no_grad():
            return shaper(s, torch.zeros(1, 4), s2, torch.tensor([done])).item()

    plain, q_plain = _greedy_policy(env, gamma)
    shaped, q_shaped = _greedy_policy(env, gamma, shaping)
    # Q is shifted by -Phi(s) per state, so every cell keeps the same optimal actions
    assert shaped == plain
    assert not np.allclose(q_plain, q_shaped)  # the shaping did change the values
    # and a non-potential shaping of the same size can change it
    bribe = lambda c, a, n, done: 0.5 if a == 0 else 0.0  # noqa: E731  (pays for moving up)
    assert _greedy_policy(env, gamma, bribe)[0] != plain


def test_target_update_math():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = [p.clone() for p in a.parameters()]
    polyak(a, b, 0.1)
    for p, old, src in zip(a.parameters(), before, b.parameters()):
        assert torch.allclose(p, 0.9 * old + 0.1 * src)
    polyak(a, b, 1.0)
    assert all(torch.equal(p, s) for p, s in zip(a.parameters(), b.parameters()))


def test_curriculum_schedule():
    assert [curriculum(s, 100, 50) for s in (0, 99, 100, 125, 150, 1000)] == [0.0, 0.0, 0.0, 0.5, 1.0, 1.0]
    assert curriculum(0, 0, 0) == 1.0 and curriculum(10, 20, 0) == 0.0 and curriculum(20, 20, 0) == 1.0


FAST = ["--env", "reflectrl/GridWorld-v0", "--total-steps", "4096", "--no-progress", "--set", "env.size=6"]


def sha(run):
    return json.loads((run / "run.json").read_text())["params_sha256"]


@pytest.mark.slow
def test_mode_off_equals_ppo_and_modes_log_metrics(cli, tmp_path):
    assert cli("train", "--algo", "ppo", *FAST, "--out", tmp_path / "ppo")[0] == 0
    assert cli("train", "--algo", "sdrs", *FAST, "shaping.mode=off", "--out", tmp_path / "off")[0] == 0
    assert sha(tmp_path / "off") == sha(tmp_path / "ppo")
    for mode in ("direct", "potential"):
        out = tmp_path / mode
        code, _, err = cli("train", "--algo", "sdrs", *FAST, f"shaping.mode={mode}", "shaping.update_every=1",
                           "--out", out)
        assert code == 0, err
        assert sha(out) != sha(tmp_path / "ppo")
        row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
        for key in ("shaping_mean", "shaping_std", "shaping_min", "shaping_max", "reward_mean", "reward_std",
                    "reward_min", "reward_max", "label_loss", "label_r2", "shaping_to_reward"):
            assert key in row, key
        # labels are normalised to std `scale` (0.1), so R^2 = 1 - loss / 0.01
        assert row["label_r2"] == pytest.approx(1 - row["label_loss"] / 0.01, abs=1e-4)
        code, stdout, _ = cli("plot", "reward-map", out)
        assert code == 0
        assert (out / "reward_map" / "reward_map.gif").read_bytes()[:3] == b"GIF"
        assert len(list((out / "reward_map").glob("step_*.png"))) >= 2


def test_prior_prefit_reaches_the_heuristic(cli, tmp_path, monkeypatch):
    (tmp_path / "my_prior.py").write_text(textwrap.dedent("""
        import torch

        def closer(s, a, s2):
            # cell index decreases towards the goal in this one-hot world: reward moving down/right
            idx = lambda x: x.argmax(-1).float()
            return 0.01 * (idx(s2) - idx(s))
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "sdrs", *FAST, "shaping.prior=my_prior:closer", "shaping.prior_epochs=300",
                       "shaping.lr_multiplier=8", "shaping.warmup_steps=100000", "--out", out)
    assert code == 0, err
    first = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # the heuristic's values are up to +-0.06 (variance ~1e-3): the pre-fit must be far closer
    assert first["prior_loss"] < 2e-5
    assert first["shaping_weight"] == 0.0  # and the warm-up keeps it out of the reward


@pytest.mark.parametrize("knob, needle", [
    ("shaping.mode=dense", "shaping.mode='dense'"),
    ("shaping.eta=0", "shaping.eta=0.0"),
    ("shaping.tau=1.5", "shaping.tau=1.5"),
    ("shaping.update_every=0", "shaping.update_every=0"),
    ("shaping.warmup_steps=-1", "shaping.warmup_steps=-1"),
    ("shaping.prior=nomodule", "module:function"),
    ("shaping.prior=no_such_module_xyz:f", "cannot import"),
])
def test_bad_knobs(cli, tmp_path, knob, needle):
    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "sdrs", *FAST, knob, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not out.exists()


def test_reward_map_needs_an_sdrs_gridworld_run(cli, tmp_path):
    out = tmp_path / "ppo"
    assert cli("train", "--algo", "ppo", *FAST, "--out", out)[0] == 0
    code, _, err = cli("plot", "reward-map", out)
    assert code == 2 and "needs --algo sdrs" in err


def test_warning_when_shaping_dominates(cli, tmp_path):
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="may dominate"):
        code, _, err = cli("train", "--algo", "sdrs", *FAST, "shaping.update_every=1", "shaping.warn_ratio=1e-9",
                           "--out", out)
    assert code == 0, err
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r["shaping_warning"] == 1 for r in rows)


@pytest.mark.parametrize("mode", ["direct", "potential"])
def test_reward_map_on_minigrid_by_agent_position(cli, tmp_path, mode):
    pytest.importorskip("minigrid")
    from reflectrl.report.reward_map import reward_maps

    out = tmp_path / mode
    code, _, err = cli("train", "--algo", "sdrs", "--env", "MiniGrid-Empty-5x5-v0", "--total-steps", "1024",
                       "--no-progress", "--set", f"shaping.mode={mode}", "shaping.update_every=1",
                       "shaping.snapshots=2", "--out", out)
    assert code == 0, err
    _, snapshots, maps, layout = reward_maps(out)
    assert len(maps) == len(snapshots) >= 2
    panels = 1 if mode == "potential" else 3
    assert maps[0].shape == (panels, 5, 5)
    # the 3x3 interior is free (the goal aside): a finite value per cell; the outer walls have none
    free = ~layout.walls
    assert layout.walls[0].all() and layout.walls[:, 0].all()
    values = maps[-1][:, free]
    assert np.isfinite(values).sum() >= panels * 8
    assert np.isnan(maps[-1][:, layout.walls]).all()
    if mode == "potential":
        assert maps[-1][0][layout.goal] == 0.0
    code, _, _ = cli("plot", "reward-map", out)
    assert code == 0 and (out / "reward_map" / "reward_map.gif").read_bytes()[:3] == b"GIF"


# ----------------------------------------------------------------------------- its own CNN (shaping.encoder=cnn)

def _trainer(env, *extra, algo="ppo+shaping"):
    from test_exploration import _config

    from reflectrl.trainers.ppo.trainer import PPOTrainer


    return PPOTrainer(_config(algo, env=env, extra=("shaping.update_every=1", *extra)))


@pytest.mark.parametrize("mode", ["direct", "potential"])
def test_shaper_with_its_own_cnn_reads_the_image_and_trains_its_trunk(mode):
    from reflectrl.nets import ImageEncoder

    trainer = _trainer("MiniGrid-Empty-5x5-v0", "shaping.encoder=cnn", f"shaping.mode={mode}", "encoder=cnn")
    shaper, target = trainer.signal.shaper, trainer.signal.target
    assert isinstance(shaper.encoder, ImageEncoder) and shaper.encoder.obs_shape == (7, 7, 3)
    assert shaper.net[0].in_features == (64 if mode == "potential" else 2 * 64 + 7)  # MiniGrid: 7 actions, one-hot
    obs = torch.rand(5, 7 * 7 * 3) * 5
    with torch.no_grad():  # F reads encoder(s): the flat view and the shaped one give the same F
        flat = shaper(obs, torch.eye(7)[[0, 1, 2, 0, 1]], obs, torch.zeros(5))
        shaped = shaper(obs.reshape(5, 7, 7, 3), torch.eye(7)[[0, 1, 2, 0, 1]], obs.reshape(5, 7, 7, 3), torch.zeros(5))
    assert torch.allclose(flat, shaped)
    enc_before = [p.detach().clone() for p in shaper.encoder.parameters()]
    target_before = [p.detach().clone() for p in target.encoder.parameters()]
    rollout, _ = trainer.collect()
    batch = trainer.apply_signal(rollout)
    trainer.update(rollout)
    trainer.signal.after_update(batch)  # update_every=1: a distillation
    moved = [not torch.equal(a, b) for a, b in zip(enc_before, shaper.encoder.parameters())]
    assert all(moved)  # the distillation trains the shaper's own trunk
    tau = trainer.signal.cfg.tau
    assert all(not torch.equal(a, b) for a, b in zip(target_before, target.encoder.parameters()))  # Polyak
    for a, b in zip(target.encoder.parameters(), shaper.encoder.parameters()):
        assert (a - b).abs().max() > 0 and tau < 1


def test_shaper_with_its_own_cnn_does_not_touch_the_policys_encoder():
    trainer = _trainer("MiniGrid-Empty-5x5-v0", "shaping.encoder=cnn", "encoder=cnn")
    assert trainer.signal.shaper.encoder is not None
    assert not any(p is q for p in trainer.signal.shaper.parameters() for q in trainer.agent.parameters())
    # the shaper is given the observations, not the policy's features
    rollout, _ = trainer.collect()
    obs = rollout.obs.reshape(rollout.rewards.numel(), -1)
    given, _ = trainer.signal._encoded(obs, obs, trainer.agent.features)
    assert given is obs


def test_shaping_encoder_cnn_needs_an_image(cli, tmp_path):
    for env, knob, needle in (
            ("CartPole-v1", "shaping.encoder=cnn", "shaping.encoder=cnn: the policy's encoder is mlp"),
            ("MiniGrid-Empty-5x5-v0", "shaping.encoder=cnn", "--set encoder=cnn"),  # the MLP flattens the view
            ("CartPole-v1", "shaping.encoder=resnet", "shaping.encoder='resnet': use one of policy, cnn")):
        out = tmp_path / "run"
        code, _, err = cli("train", "--algo", "sdrs", "--env", env, "--total-steps", "1024", "--out", out,
                           "--set", knob)
        assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
        assert not out.exists()


def test_shaper_with_its_own_cnn_resumes_bit_identically(tmp_path, monkeypatch):
    from test_exploration import resume_matches

    from reflectrl.trainers.policies import params_sha256
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    extra = ("shaping.update_every=1", "shaping.encoder=cnn", "encoder=cnn")
    rows, resumed = resume_matches(tmp_path, monkeypatch, "ppo+shaping", env="MiniGrid-Empty-5x5-v0", extra=extra,
                                   stop_at=3)
    from test_exploration import _config

    full = PPOTrainer(_config("ppo+shaping", env="MiniGrid-Empty-5x5-v0", extra=extra))
    full.train(progress=False)
    assert params_sha256(full.signal.target) == params_sha256(resumed.signal.target)
    assert all("label_loss" in r for r in rows[1:])


def test_compare_refuses_shaping_encoder_cnn_on_an_mlp_policy_before_anything_starts(cli, tmp_path):
    out = tmp_path / "exp"
    code, _, err = cli("compare", "--env", "MiniGrid-Empty-5x5-v0", "--algos", "ppo,ppo+shaping[encoder=cnn]",
                       "--seeds", "1", "--total-steps", "1024", "--out", out, "--no-progress")
    assert code == 2 and "shaping.encoder=cnn: the policy's encoder is mlp" in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_predictions_in_chunks_equal_one_pass():
    from reflectrl.signals.fit import predict_in_chunks

    torch.manual_seed(0)
    shaper = RewardShaper(5, 3, (16,), "direct", eta=1.0, gamma=0.9, hard_clip=math.inf)
    rows = (torch.rand(10, 5), torch.eye(3)[torch.randint(0, 3, (10,))], torch.rand(10, 5), torch.zeros(10))
    with torch.no_grad():
        whole = shaper(*rows)
        calls = []
        chunked = predict_in_chunks(lambda p: calls.append(len(p[0])) or shaper(*p), rows, chunk=4)
    assert calls == [4, 4, 2]
    torch.testing.assert_close(chunked, whole)
    single = predict_in_chunks(lambda x: x.sum(-1), torch.ones(3, 2), chunk=4)
    assert single.tolist() == [2.0, 2.0, 2.0]


# ------------------------------------------------------ loop-proof modes: bootstrap and advice

def test_bootstrap_shaping_is_the_critics_own_potential_difference():
    trainer = _trainer("reflectrl/GridWorld-v0", "shaping.mode=bootstrap", "shaping.value_scale=0.3")
    rollout, _ = trainer.collect()
    batch = trainer.apply_signal(rollout)
    shaping = rollout.learn_rewards - rollout.rewards
    gamma = trainer.signal.ctx.gamma
    alive = 1.0 - batch.terminations.float()
    expected = 0.3 * (gamma * batch.next_values * alive - batch.values)
    assert torch.allclose(shaping, expected, atol=1e-6)
    assert shaping.abs().max() > 0  # the critic's values are not all zero
    trainer.update(rollout)
    trainer.signal.after_update(batch)  # nothing is distilled
    assert trainer.signal.buffer == []


def test_advice_potential_learns_the_value_of_minus_f_so_its_differences_give_f_back():
    """A state that loops onto itself and a stand-in F = 0.1 everywhere: the value of -F is
    -0.1 / (1 - gamma) = -1 at gamma 0.9, and gamma Phi - Phi = 0.1 = F."""
    from reflectrl.signals.base import Batch

    trainer = _trainer("reflectrl/GridWorld-v0", "shaping.mode=advice", "gamma=0.9", "shaping.lr_multiplier=40",
                       "shaping.epochs=20", "shaping.buffer_rollouts=1")
    signal = trainer.signal
    signal.target = lambda obs, actions, next_obs, terms: torch.full((obs.shape[0],), 0.1)
    T, N = 32, 2
    obs = torch.zeros(T * N, trainer.obs_dim)
    obs[:, 0] = 1.0
    item_batch = Batch(obs=obs.reshape(T, N, -1), actions=torch.zeros(T, N, dtype=torch.long),
                       rewards=torch.zeros(T, N), terminations=torch.zeros(T, N, dtype=torch.bool),
                       truncations=torch.zeros(T, N, dtype=torch.bool), values=torch.zeros(T, N),
                       next_values=torch.zeros(T, N), next_obs=obs.reshape(T, N, -1))
    signal.buffer = [{**signal._transitions(item_batch), "rewards": item_batch.rewards, "shape": (T, N),
                      "truncations": item_batch.truncations, "raw_terminations": item_batch.terminations}]
    for _ in range(60):
        signal._fit_advice(trainer._gae_with, None)
    f = signal._advice_shaping(obs, obs, torch.zeros(T * N))
    assert f.mean().item() == pytest.approx(0.1, rel=0.1)
    # ending the episode there cuts the potential of s': the term is -Phi(s) = +1
    ended = signal._advice_shaping(obs[:1], obs[:1], torch.ones(1))
    assert ended.item() == pytest.approx(1.0, rel=0.1)


@pytest.mark.slow
def test_bootstrap_and_advice_train_log_and_resume_bit_identically(tmp_path, monkeypatch):
    from test_exploration import resume_matches

    for mode in ("bootstrap", "advice"):
        rows, _ = resume_matches(tmp_path / mode, monkeypatch, "ppo+shaping",
                                 extra=(f"shaping.mode={mode}", "shaping.update_every=1"))
        assert "shaping_mean" in rows[-1]
        assert ("advice_loss" in rows[-1]) == (mode == "advice")


@pytest.mark.parametrize("knob, needle", [
    (("shaping.mode=bootstrap", "shaping.value_scale=0"), "shaping.value_scale=0.0"),
    (("shaping.mode=advice", "shaping.encoder=cnn"), "mode=advice reads the policy's features"),
    (("shaping.mode=bootstrap", "shaping.prior=math:sqrt"), "mode=bootstrap distils no shaper"),
])
def test_bad_loop_proof_knobs(cli, tmp_path, knob, needle):
    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "sdrs", *FAST, *knob, "--out", out)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not out.exists()
