"""The RefGRPO calibration bonus: the formula on hand-made tensors, the reflection net's fit,
alpha=0 equals PPO bit for bit, knob validation, metrics and the calibration picture."""

import json

import pytest
import torch
from torch import nn

from reflectrl.signals import Batch, SignalContext
from reflectrl.signals.calibration.torch import CalibrationBonus, CalibrationConfig


def ctx(obs_dim=2, action_dim=2, discrete=True, iterations=10):
    return SignalContext(obs_dim=obs_dim, action_dim=action_dim, discrete=discrete, feature_dim=4,
                         learning_rate=1e-3, gamma=0.99, gae_lambda=0.95, seed=1, total_iterations=iterations)


class Fixed(nn.Module):
    """A stand-in reflection net that outputs given predictions."""

    def __init__(self, values):
        super().__init__()
        self.values = torch.tensor(values).unsqueeze(-1)

    def forward(self, x):
        return self.values[: x.shape[0]]


def make(values, **knobs):
    signal = CalibrationBonus(CalibrationConfig(**knobs))
    signal.bind(ctx())
    signal.net = Fixed(values)
    signal._fit = lambda x, target: None  # the formula alone
    return signal


def batch(adv, rewards):
    adv = torch.tensor(adv).reshape(-1, 1)
    return Batch(obs=torch.zeros(adv.shape[0], 1, 2), actions=torch.zeros(adv.shape[0], 1, dtype=torch.long),
                 rewards=torch.tensor(rewards).reshape(-1, 1), terminations=torch.zeros_like(adv, dtype=torch.bool),
                 truncations=torch.zeros_like(adv, dtype=torch.bool), values=torch.zeros_like(adv),
                 next_values=torch.zeros_like(adv), advantages=adv, iteration=1)


A = [1.0, 3.0, 5.0, 7.0]      # mean 4, std (unbiased) 2.5820
R = [1.0, -1.0, 1.0, -1.0]    # mean |r| = 1
F = [0.0, 1.0, -1.0, 0.5]


def expected(alpha, prediction, c=None, beta=1.0):
    a = torch.tensor(A)
    b = -alpha * (prediction - a) ** 2
    if c is not None:
        b = b.clamp(-c, c)
    return (beta * b).tolist()


def test_denormalised_target():
    out = make(F, alpha=0.1, clip="none").after_advantages(batch(A, R))
    a = torch.tensor(A)
    prediction = torch.tensor(F) * (a.std() + 1e-8) + a.mean()
    assert out.reward.reshape(-1).tolist() == pytest.approx(expected(0.1, prediction))
    assert out.recompute and out.advantage is None


def test_seed_target_compares_raw_prediction_with_raw_advantage():
    out = make(F, alpha=0.1, clip="none", bonus_target="seed").after_advantages(batch(A, R))
    assert out.reward.reshape(-1).tolist() == pytest.approx(expected(0.1, torch.tensor(F)))


def test_relative_and_absolute_clipping_and_beta():
    a = torch.tensor(A)
    prediction = torch.tensor(F) * (a.std() + 1e-8) + a.mean()
    out = make(F, alpha=1.0, clip="relative", clip_k=2.0, beta=0.5).after_advantages(batch(A, R))
    assert out.reward.reshape(-1).tolist() == pytest.approx(expected(1.0, prediction, c=2.0, beta=0.5))
    assert min(out.reward.reshape(-1).tolist()) == pytest.approx(-1.0)  # -beta * c
    out = make(F, alpha=1.0, clip="absolute", clip_value=0.7).after_advantages(batch(A, R))
    assert out.reward.reshape(-1).tolist() == pytest.approx(expected(1.0, prediction, c=0.7))


def test_adaptive_weight_grows_with_calibration_loss():
    a = torch.tensor(A)
    target = (a - a.mean()) / (a.std() + 1e-8)
    good, bad = target.tolist(), [0.0] * 4  # a calibrated and a know-nothing reflection
    outs = {}
    for name, values in (("good", good), ("bad", bad)):
        signal = make(values, alpha=0.2, clip="none", adaptive=True, adaptive_max=2.0, bonus_target="seed")
        outs[name] = signal.after_advantages(batch(A, R))
        loss = float(((torch.tensor(values) - target) ** 2).mean())
        assert signal.metrics()["calibration_alpha"] == pytest.approx(0.2 * min(loss, 2.0))
        assert outs[name].reward.reshape(-1).tolist() == pytest.approx(
            expected(0.2 * min(loss, 2.0), torch.tensor(values)))
    assert outs["good"].reward.abs().sum() < outs["bad"].reward.abs().sum()


def test_keep_advantages_adds_term_to_advantages():
    a = torch.tensor(A)
    prediction = torch.tensor(F) * (a.std() + 1e-8) + a.mean()
    out = make(F, alpha=0.1, clip="none", recompute_advantages=False).after_advantages(batch(A, R))
    assert out.reward is None
    # the advantage term is the bonus itself: -alpha (prediction - A)^2 per step, by hand
    assert out.advantage.shape == (4, 1)
    assert out.advantage.reshape(-1).tolist() == pytest.approx(expected(0.1, prediction))
    assert out.advantage.reshape(-1).tolist() == pytest.approx([-0.1 * (p - x) ** 2 for p, x in
                                                               zip(prediction.tolist(), A)])
    # and the same clipped, beta-weighted term the reward would get with recomputation
    keep = make(F, alpha=1.0, clip="absolute", clip_value=0.7, beta=0.5, recompute_advantages=False)
    recompute = make(F, alpha=1.0, clip="absolute", clip_value=0.7, beta=0.5)
    assert torch.equal(keep.after_advantages(batch(A, R)).advantage, recompute.after_advantages(batch(A, R)).reward)
    assert keep.after_advantages(batch(A, R)).advantage.reshape(-1).tolist() == pytest.approx(
        expected(1.0, prediction, c=0.7, beta=0.5))


class FirstObs(nn.Module):
    """A stand-in reflection net: f(s, a) = 0.5 * s[0] - 0.1 (the first input is the observation's first)."""

    def forward(self, x):
        return 0.5 * x[:, :1] - 0.1


def hand_gae(rewards, values, next_values, terms, truncs, gamma, lam):
    """GAE in plain Python floats, env by env, backwards."""
    T, N = len(rewards), len(rewards[0])
    adv = [[0.0] * N for _ in range(T)]
    for i in range(N):
        last = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terms[t][i] else gamma * next_values[t][i]
            delta = rewards[t][i] + bootstrap - values[t][i]
            last = delta + (0.0 if terms[t][i] or truncs[t][i] else gamma * lam * last)
            adv[t][i] = last
    return adv


def trainer_with_fixed_reflection(recompute):
    from reflectrl.config import RunConfig, apply_overrides
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import resolve_config

    cfg = RunConfig(algo="refgrpo", env_id="CartPole-v1", seed=2, total_steps=128)
    apply_overrides(cfg, ["num_envs=2", "num_steps=32", "num_minibatches=2", "calibration.alpha=0.3",
                          "calibration.clip=none", "calibration.beta=0.5",
                          f"calibration.recompute_advantages={str(recompute).lower()}"])
    trainer = PPOTrainer(resolve_config(cfg))
    trainer.signal.net = FirstObs()
    trainer.signal._fit = lambda x, target: None
    return trainer


@pytest.mark.parametrize("recompute", [False, True])
def test_advantage_term_in_the_trainer_by_hand(recompute):
    """recompute_advantages=false: advantages = GAE(r) + beta * bonus at each step, returns
    and learning rewards untouched; true (the control): advantages = GAE(r + beta * bonus)."""
    trainer = trainer_with_fixed_reflection(recompute)
    rollout, _ = trainer.collect()
    assert rollout.terminations.any()  # episode ends inside the rollout: GAE's cuts are exercised
    p = trainer.cfg.ppo
    cols = [x.tolist() for x in (rollout.rewards, rollout.values, rollout.next_values, rollout.terminations,
                                 rollout.truncations)]
    gae = hand_gae(*cols, p.gamma, p.gae_lambda)
    flat = [a for row in gae for a in row]
    mean = sum(flat) / len(flat)
    std = (sum((a - mean) ** 2 for a in flat) / (len(flat) - 1)) ** 0.5
    s0 = rollout.obs[..., 0].tolist()
    T, N = len(gae), len(gae[0])
    # beta * bonus = 0.5 * -alpha (f de-normalised - A)^2 with alpha = 0.3 and f = 0.5 s[0] - 0.1
    term = [[0.5 * -0.3 * ((0.5 * s0[t][i] - 0.1) * (std + 1e-8) + mean - gae[t][i]) ** 2 for i in range(N)]
            for t in range(T)]
    trainer.apply_signal(rollout)
    if recompute:
        shaped = [[cols[0][t][i] + term[t][i] for i in range(N)] for t in range(T)]
        expected = hand_gae(shaped, *cols[1:], p.gamma, p.gae_lambda)
        assert rollout.learn_rewards.tolist() == [pytest.approx(row, abs=1e-5) for row in shaped]
    else:
        expected = [[gae[t][i] + term[t][i] for i in range(N)] for t in range(T)]
        assert torch.equal(rollout.learn_rewards, rollout.rewards)  # no reward term
        # returns are still the plain GAE's: the critic's target does not see the bonus
        assert rollout.returns.tolist() == [pytest.approx([g + v for g, v in zip(ga, va)], abs=1e-4)
                                            for ga, va in zip(gae, cols[1])]
    assert rollout.advantages.tolist() == [pytest.approx(row, abs=1e-4) for row in expected]
    # the two readings give different advantages here, so the check tells them apart
    other = ([[gae[t][i] + term[t][i] for i in range(N)] for t in range(T)] if recompute else
             hand_gae([[cols[0][t][i] + term[t][i] for i in range(N)] for t in range(T)], *cols[1:],
                      p.gamma, p.gae_lambda))
    assert max(abs(a - b) for ra, rb in zip(expected, other) for a, b in zip(ra, rb)) > 0.05


def test_metrics_of_the_bonus():
    signal = make(F, alpha=0.1, clip="none")
    out = signal.after_advantages(batch(A, R))
    m = signal.metrics()
    bonus = out.reward.reshape(-1)
    assert m["bonus_mean"] == pytest.approx(bonus.mean().item())
    assert m["bonus_min"] == pytest.approx(bonus.min().item()) and m["bonus_max"] == pytest.approx(bonus.max().item())
    assert m["bonus_to_reward"] == pytest.approx(bonus.abs().mean().item() / 1.0)
    assert m["calibration_loss_prev_batch"] is None  # no previous batch yet
    signal.after_advantages(batch(A, R))
    assert signal.metrics()["calibration_loss_prev_batch"] is not None


def test_reflection_net_fits_a_known_advantage_function():
    """Fresh batches from a fixed advantage function: the held-out loss (before each fit)
    falls far below 1, the loss of a predictor that knows nothing."""
    gen = torch.Generator().manual_seed(0)
    signal = CalibrationBonus(CalibrationConfig(epochs=5, lr_multiplier=3.0))
    signal.bind(ctx(obs_dim=3, action_dim=2, iterations=40))
    heldout = []
    for it in range(40):
        obs = torch.rand(512, 1, 3, generator=gen) * 2 - 1
        actions = torch.randint(0, 2, (512, 1), generator=gen)
        adv = torch.sin(2 * obs[..., 0]) + actions.float() * obs[..., 1] - 0.5 * obs[..., 2] ** 2
        b = batch([0.0], [0.0])
        b.obs, b.actions, b.advantages, b.rewards = obs, actions, adv, torch.ones_like(adv)
        b.iteration = it + 1
        signal.after_advantages(b)
        heldout.append(signal.metrics()["calibration_loss_heldout"])
    assert heldout[0] > 0.9
    assert sum(heldout[-5:]) / 5 < 0.1


FAST = ["--env", "CartPole-v1", "--total-steps", "2048", "--no-progress"]


def sha(run):
    return json.loads((run / "run.json").read_text())["params_sha256"]


@pytest.mark.slow
def test_alpha_zero_equals_ppo_bit_for_bit(cli, tmp_path):
    assert cli("train", "--algo", "ppo", *FAST, "--out", tmp_path / "ppo")[0] == 0
    assert cli("train", "--algo", "refgrpo", *FAST, "--out", tmp_path / "zero", "--set", "calibration.alpha=0")[0] == 0
    assert cli("train", "--algo", "refgrpo", *FAST, "--out", tmp_path / "on")[0] == 0
    assert sha(tmp_path / "zero") == sha(tmp_path / "ppo")
    assert sha(tmp_path / "on") != sha(tmp_path / "ppo")  # and a real bonus does change the policy


def test_refgrpo_run_logs_metrics_and_draws_its_picture(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "refgrpo", *FAST, "--out", out,
                       "--set", "calibration.inputs=obs_action_features")
    assert code == 0, err
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for key in ("calibration_loss", "calibration_loss_heldout", "calibration_loss_prev_batch", "bonus_mean",
                "bonus_std", "bonus_min", "bonus_max", "bonus_to_reward", "entropy"):
        assert row[key] is not None, key
    assert row["episodic_return"] > 0  # the true return, never the bonus-shaped one
    config = json.loads((out / "config.json").read_text())
    assert config["sections"]["calibration"]["inputs"] == "obs_action_features"
    assert config["sections"]["calibration"]["bonus_target"] == "denormalized"  # defaults are recorded
    assert (out / "calibration.png").read_bytes()[:4] == b"\x89PNG"
    code, stdout, _ = cli("plot", "calibration", out, "--out", tmp_path / "pic.png")
    assert code == 0 and (tmp_path / "pic.png").is_file()


def test_shared_trunk_trains_the_actor(cli, tmp_path):
    assert cli("train", "--algo", "ppo", *FAST, "--out", tmp_path / "ppo")[0] == 0
    code, _, err = cli("train", "--algo", "refgrpo", *FAST, "--out", tmp_path / "trunk", "--set", "calibration.alpha=0",
                       "calibration.shared_trunk=true", "calibration.inputs=features_action")
    assert code == 0, err
    assert sha(tmp_path / "trunk") != sha(tmp_path / "ppo")  # the auxiliary loss reached the trunk


@pytest.mark.parametrize("knob, needle", [
    ("calibration.alpha=-0.1", "calibration.alpha=-0.1"),
    ("calibration.epochs=0", "calibration.epochs=0"),
    ("calibration.max_ratio=0", "calibration.max_ratio=0.0"),
    ("calibration.bonus_target=raw", "calibration.bonus_target='raw'"),
    ("calibration.inputs=pixels", "calibration.inputs='pixels'"),
    ("calibration.clip=soft", "calibration.clip='soft'"),
    ("calibration.lr_multiplier=0", "lr_multiplier=0"),
    ("calibration.beta=nan", "calibration.beta=nan"),
    ("calibration.shared_trunk=true", "shared_trunk=true needs"),
    ("calibration.alpah=1", "unknown --set key 'calibration.alpah'"),
])
def test_bad_knobs(cli, tmp_path, knob, needle):
    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "refgrpo", *FAST, "--out", out, "--set", knob)
    assert code == 2 and len(err.strip().splitlines()) == 1 and needle in err, err
    assert not out.exists()


def test_calibration_knobs_need_refgrpo(cli, tmp_path):
    code, _, err = cli("train", "--algo", "ppo", *FAST, "--out", tmp_path / "run", "--set", "calibration.alpha=0.1")
    assert code == 2 and "apply to --algo refgrpo" in err


def test_bonus_budget_scales_the_term_to_its_share_of_the_reward():
    a = torch.tensor(A)
    prediction = torch.tensor(F) * (a.std() + 1e-8) + a.mean()
    free = torch.tensor(expected(1.0, prediction))
    assert free.abs().mean().item() > 0.5  # mean |r| = 1: a budget of 0.5 binds
    signal = make(F, alpha=1.0, clip="none", max_ratio=0.5)
    out = signal.after_advantages(batch(A, R))
    term = out.reward.reshape(-1)
    assert term.abs().mean().item() == pytest.approx(0.5)  # exactly at the budget
    assert term.tolist() == pytest.approx((free * 0.5 / free.abs().mean()).tolist())  # shape kept, only scaled
    assert signal.metrics()["calibration_budget_scale"] == pytest.approx(0.5 / free.abs().mean().item())
    assert signal.metrics()["bonus_to_reward"] == pytest.approx(0.5)
    # a budget that does not bind changes nothing
    loose = make(F, alpha=1.0, clip="none", max_ratio=1e6)
    assert loose.after_advantages(batch(A, R)).reward.reshape(-1).tolist() == pytest.approx(free.tolist())
    assert loose.metrics()["calibration_budget_scale"] == 1.0
    # no reward in the batch: no budget, no bonus
    none = make(F, alpha=1.0, clip="none", max_ratio=0.5).after_advantages(batch(A, [0.0] * 4))
    assert none.reward.abs().max().item() == 0.0
