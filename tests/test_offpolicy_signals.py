"""Signals on replay data (control/offpolicy.py): neutral signals leave DQN and SAC bit for
bit, reward terms join the sampled rewards in the TD target at learning time, weights
multiply the TD loss, shaping distils the trainer's TD errors, and resume is exact."""

import copy

import pytest
import torch

from reflectrl.signals import Signal, SignalOutput
from reflectrl.trainers.policies import params_sha256
from reflectrl.trainers.replay.dqn import DQNTrainer
from reflectrl.trainers.replay.sac import SACTrainer
from reflectrl.trainers.resolve import new_run_config

DQN = ["learning_starts=200", "log_every=100", "train_frequency=2", "batch_size=32", "buffer_size=2000",
       "target_network_frequency=100"]
SAC = ["hidden_sizes=32,32", "learning_starts=200", "log_every=100", "batch_size=32", "buffer_size=2000"]
NEUTRAL = ["shaping.mode=off", "calibration.alpha=0", "calibration.minibatch_size=32",
           "shaping.minibatch_size=32"]


def _trained(trainer_cls, algo, env, overrides, iterations=5, signal=None):
    cfg = new_run_config(algo=algo, env_id=env, total_steps=1000, overrides=overrides)
    trainer = trainer_cls(cfg, signal=signal) if signal is not None else trainer_cls(cfg)
    rows = [trainer.run_iteration() for _ in range(iterations)]
    trainer.close()
    return trainer, rows


@pytest.mark.slow
@pytest.mark.parametrize("trainer_cls, trainer, env, base", [
    (DQNTrainer, "dqn", "CartPole-v1", DQN), (SACTrainer, "sac", "Pendulum-v1", SAC)])
def test_neutral_signals_equal_the_plain_trainer_bit_for_bit(trainer_cls, trainer, env, base):
    plain, plain_rows = _trained(trainer_cls, trainer, env, base)
    neutral, rows = _trained(trainer_cls, f"{trainer}+shaping+calibration", env, [*base, *NEUTRAL])
    assert params_sha256(neutral.policy_module) == params_sha256(plain.policy_module)
    key = "td_loss" if trainer == "dqn" else "qf_loss"
    assert [r.get(key) for r in rows] == [r.get(key) for r in plain_rows]
    # the signals did run: the reflection net was fit on every gradient step's minibatch
    assert rows[-1]["calibration_loss"] is not None and rows[-1]["bonus_mean"] == 0.0
    # and a signal that is not neutral changes the run (the check above can fail)
    shaped, _ = _trained(trainer_cls, f"{trainer}+shaping", env, [*base, "shaping.minibatch_size=32",
                                                                  "shaping.update_every=1", "shaping.eta=1"])
    assert params_sha256(shaped.policy_module) != params_sha256(plain.policy_module)


class ConstantTerm(Signal):
    """A reward term of `c` on every sampled transition, or per-transition weights."""

    name = "constant"

    def __init__(self, c=0.0, weight=None):
        self.c, self.weight, self.seen = c, weight, []

    def shape_rewards(self, batch):
        self.seen.append(batch)
        return torch.full_like(batch.rewards, self.c)

    def after_advantages(self, batch):
        return None if self.weight is None else SignalOutput(weights=torch.full_like(batch.rewards, self.weight))


def test_a_reward_term_joins_the_td_target_at_learning_time():
    cfg = new_run_config(algo="dqn", env_id="CartPole-v1", total_steps=1000, overrides=DQN)
    term = ConstantTerm(c=0.25)
    plain, shifted = DQNTrainer(cfg), DQNTrainer(cfg, signal=term)
    for trainer in (plain, shifted):
        for _ in range(2):
            trainer.run_iteration()  # 200 steps: the buffer is filled, no gradient step yet
    assert not term.seen  # acting never calls the signal
    a, b = plain.train_step(), shifted.train_step()  # the same minibatch from the same networks
    assert term.seen[0].rewards.shape == (1, 32)  # the sampled minibatch, as (1, B)
    assert b["td_error_mean"].item() == pytest.approx(a["td_error_mean"].item() + 0.25, abs=1e-5)
    assert b["q_values"] == a["q_values"]
    # the buffer keeps the env's rewards: the term is never stored
    assert (shifted.buffer.rewards[:len(shifted.buffer)] == 1.0).all()
    plain.close(), shifted.close()


def test_zero_weights_make_a_gradient_step_change_nothing():
    cfg = new_run_config(algo="dqn", env_id="CartPole-v1", total_steps=1000, overrides=DQN)
    trainer = DQNTrainer(cfg, signal=ConstantTerm(weight=0.0))
    for _ in range(2):
        trainer.run_iteration()  # 200 steps: the buffer is filled, no step yet
    before = copy.deepcopy(trainer.agent.state_dict())
    trainer.train_step()
    assert all(torch.equal(before[k], v) for k, v in trainer.agent.state_dict().items())
    trainer.close()


def test_dqn_shaping_distils_the_trainers_td_errors(monkeypatch):
    cfg = new_run_config(algo="dqn+shaping", env_id="CartPole-v1", total_steps=1000,
                         overrides=[*DQN, "shaping.minibatch_size=32", "shaping.update_every=1"])
    trainer = DQNTrainer(cfg)
    for _ in range(3):
        trainer.run_iteration()
    shaping = trainer.signal
    assert len(shaping.buffer) == shaping.cfg.buffer_rollouts  # the last minibatches
    seen = []

    def labels(obs, actions, rewards, next_obs, terms):
        seen.append(actions)
        return obs[:, 0] * 3.0 + 1.0  # anything the trainer calls its TD errors

    obs, actions, _, _, target = shaping.distillation_set(None, None, labels)
    x = obs[:, 0] * 3.0 + 1.0
    expected = shaping.cfg.scale * (x - x.mean()) / (x.std() + 1e-8)
    assert torch.allclose(target, expected)
    assert seen[0].dtype == torch.int64 and seen[0].ndim == 1  # the raw actions, not their one-hots
    # and the trainer's own TD errors are r + gamma max Q_target(s') (1 - term) - Q(s, a)
    item = shaping.buffer[-1]
    td = trainer.td_errors(item["obs"], item["raw_actions"], item["rewards"].reshape(-1), item["next_obs"],
                           item["raw_terminations"].reshape(-1).float())
    with torch.no_grad():
        q = trainer.agent(item["obs"]).gather(1, item["raw_actions"].reshape(-1, 1)).squeeze(1)
        boot = trainer.target(item["next_obs"]).max(1).values * (1 - item["raw_terminations"].reshape(-1).float())
    assert torch.allclose(td, item["rewards"].reshape(-1) + 0.99 * boot - q)
    trainer.close()


@pytest.mark.slow
@pytest.mark.parametrize("trainer_cls, algo, env, base", [
    (DQNTrainer, "dqn+shaping+calibration", "CartPole-v1", DQN),
    (SACTrainer, "sac+shaping+calibration", "Pendulum-v1", SAC)])
def test_resume_with_signals_is_bit_identical(trainer_cls, algo, env, base):
    overrides = [*base, "shaping.minibatch_size=32", "calibration.minibatch_size=32", "shaping.update_every=2"]
    cfg = new_run_config(algo=algo, env_id=env, total_steps=1000, overrides=overrides)
    a = trainer_cls(cfg)
    for _ in range(3):
        a.run_iteration()
    state = copy.deepcopy(a.state_dict())
    rows_a = [a.run_iteration() for _ in range(2)]
    b = trainer_cls(cfg)
    b.load_state_dict(state)
    rows_b = [b.run_iteration() for _ in range(2)]
    for key in ("td_error_mean", "bonus_mean", "shaping_mean", "label_loss"):
        assert [r.get(key) for r in rows_a] == [r.get(key) for r in rows_b], key
    assert params_sha256(a.policy_module) == params_sha256(b.policy_module)
    a.close(), b.close()


def test_sac_signal_sees_q_minus_soft_value():
    class Spy(Signal):
        name = "spy"
        trainer = None
        checked = 0

        def after_advantages(self, batch):
            t = self.trainer
            obs, actions = batch.obs[0], batch.actions[0]
            with torch.no_grad():
                q = torch.min(t.qf1(obs, actions), t.qf2(obs, actions))
            # Q(s, a) - V(s), V(s) = min Q(s, a~) - alpha log pi(a~ | s) of a sampled a~
            assert torch.allclose(batch.advantages[0] + batch.values[0], q, atol=1e-5)
            assert not torch.allclose(batch.values[0], q)
            assert torch.allclose(batch.returns, batch.rewards + 0.99 * batch.next_values * (1 - batch.terminations))
            self.checked += 1

    spy = Spy()
    cfg = new_run_config(algo="sac", env_id="Pendulum-v1", total_steps=1000, overrides=SAC)
    spy.trainer = trainer = SACTrainer(cfg, signal=spy)
    for _ in range(3):
        trainer.run_iteration()
    assert spy.checked == 100
    trainer.close()
