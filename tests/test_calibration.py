"""The RefGRPO calibration bonus: the formula on hand-made tensors, the reflection net's fit,
alpha=0 equals PPO bit for bit, knob validation, metrics and the calibration picture."""

import json

import pytest
import torch
from torch import nn

from reflectrl.signals import Batch, SignalContext
from reflectrl.signals.calibration import CalibrationBonus, CalibrationConfig


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
        assert outs[name].reward.reshape(-1).tolist() == pytest.approx(expected(0.2 * min(loss, 2.0), torch.tensor(values)))
    assert outs["good"].reward.abs().sum() < outs["bad"].reward.abs().sum()


def test_keep_advantages_adds_term_to_advantages():
    out = make(F, alpha=0.1, clip="none", recompute_advantages=False).after_advantages(batch(A, R))
    assert out.reward is None and out.advantage is not None


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
    signal = CalibrationBonus(CalibrationConfig(reflection_epochs=5, lr_multiplier=3.0))
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


def test_alpha_zero_equals_ppo_bit_for_bit(cli, tmp_path):
    assert cli("train", "--algo", "ppo", *FAST, "--out", tmp_path / "ppo")[0] == 0
    assert cli("train", "--algo", "refgrpo", *FAST, "--out", tmp_path / "zero", "--set", "calibration.alpha=0")[0] == 0
    assert cli("train", "--algo", "refgrpo", *FAST, "--out", tmp_path / "on")[0] == 0
    assert sha(tmp_path / "zero") == sha(tmp_path / "ppo")
    assert sha(tmp_path / "on") != sha(tmp_path / "ppo")  # and a real bonus does change the policy


def test_refgrpo_run_logs_metrics_and_draws_its_picture(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "refgrpo", *FAST, "--out", out, "--set", "calibration.inputs=obs_action_features")
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
    ("calibration.reflection_epochs=0", "calibration.reflection_epochs=0"),
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
