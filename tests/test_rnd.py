"""Random Network Distillation and the trainer's reward streams (issue 15 item 5): the running
statistics and the forward filter by hand, novelty, the second value head's advantages,
neutral = PPO bit for bit, composition with shaping, resume, pixels."""

import numpy as np
import pytest
import torch
from test_exploration import _config, resume_matches

from reflectrl.errors import UserError
from reflectrl.signals import Batch, RewardStream, Signal, SignalContext, SignalOutput
from reflectrl.signals.rnd.torch import RND, RewardForwardFilter, RndConfig, RunningMeanStd


@pytest.fixture(autouse=True)
def _one_thread():
    # as a run does (torch_threads=1): on a loaded 2-core machine, torch's default threads make
    # these small nets' ops 30x slower
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ctx(obs_dim=4, **kw):
    return SignalContext(obs_dim=obs_dim, action_dim=2, discrete=True, feature_dim=4, learning_rate=1e-3,
                         gamma=0.99, gae_lambda=0.95, seed=1, total_iterations=10, **kw)


def _bound(obs_dim=4, **knobs):
    signal = RND(RndConfig(**knobs))
    signal.bind(_ctx(obs_dim))
    return signal


def test_running_mean_std_by_hand():
    rms = RunningMeanStd(2)
    a = np.array([[1.0, 10.0], [3.0, 14.0]])
    rms.update(a)
    # prior: mean 0, var 1, count 1e-4; batch: mean (2, 12), var (1, 4), count 2
    total = 2 + 1e-4
    assert rms.count == pytest.approx(total)
    assert np.allclose(rms.mean, np.array([2.0, 12.0]) * 2 / total)
    m2 = 1e-4 + np.array([1.0, 4.0]) * 2 + np.array([4.0, 144.0]) * 1e-4 * 2 / total
    assert np.allclose(rms.var, m2 / total)
    b = np.array([[5.0, 0.0], [7.0, 2.0], [9.0, 4.0]])
    rms.update(b)
    both = np.concatenate([a, b])
    assert np.allclose(rms.mean, both.mean(0), rtol=1e-4) and np.allclose(rms.var, both.var(0), rtol=1e-3)


def test_forward_filter_runs_over_time_per_env_and_across_rollouts():
    f = RewardForwardFilter(0.5)
    out = f.update(np.array([[1.0, 0.0], [2.0, 1.0], [0.0, 4.0]]))
    assert out.tolist() == [[1.0, 0.0], [2.5, 1.0], [1.25, 4.5]]
    assert f.update(np.array([[1.0, 1.0]])).tolist() == [[1.625, 3.25]]


def test_intrinsic_reward_is_divided_by_the_running_std_of_filtered_returns():
    signal = _bound(int_gamma=0.5)
    raw = np.array([[1.0, 0.0], [2.0, 1.0], [0.0, 4.0]])
    reward = signal.normalise_rewards(raw)
    filtered = np.array([[1.0, 0.0], [2.5, 1.0], [1.25, 4.5]])
    n, total = 6, 6 + 1e-4
    var = (1e-4 + filtered.var() * n + filtered.mean() ** 2 * 1e-4 * n / total) / total
    assert np.allclose(reward, raw / np.sqrt(var))


def test_observations_are_normalised_and_clipped():
    signal = _bound(obs_dim=2)
    signal.obs_rms.mean, signal.obs_rms.var = np.array([1.0, -2.0]), np.array([4.0, 0.01])
    z = signal.normalise(np.array([[3.0, -2.0], [1.0, 0.0]]))
    assert np.allclose(z.numpy(), [[1.0, 0.0], [0.0, 5.0]], atol=1e-5)  # 2 / 0.1 = 20 is clipped to 5


def test_prediction_error_falls_on_trained_states_and_stays_on_novel_ones():
    signal = _bound(obs_dim=16, update_proportion=1.0)
    eye = torch.eye(16)
    seen, novel = eye[:8].repeat(16, 1), eye[8:]
    before = signal.prediction_error(seen[:8]).mean().item()
    for it in range(1, 11):
        signal.train_predictor(seen, it)
    after_seen = signal.prediction_error(seen[:8]).mean().item()
    after_novel = signal.prediction_error(novel).mean().item()
    assert after_seen < 0.2 * before and after_novel > 3 * after_seen


def test_bad_knobs():
    with pytest.raises(UserError, match="rnd.update_proportion=0"):
        RndConfig(update_proportion=0).validate()
    with pytest.raises(UserError, match="rnd.int_gamma=1.5"):
        RndConfig(int_gamma=1.5).validate()


def test_neutral_rnd_is_ppo_bit_for_bit_and_default_is_not():
    from reflectrl.trainers.policies import params_sha256
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    sha = {}
    for name, algo, extra in (("ppo", "ppo", ()), ("neutral", "ppo+rnd", ("rnd.int_coef=0",)),
                              ("rnd", "ppo+rnd", ())):
        trainer = PPOTrainer(_config(algo, extra=extra))
        trainer.train(progress=False)
        sha[name] = params_sha256(trainer.agent)
        if name == "neutral":
            assert trainer.streams is None and trainer.signal.extrinsic_coef == 1.0
            assert trainer.signal.metrics()["rnd_predictor_loss"] > 0  # the nets still train, and log
        if name == "rnd":
            assert len(trainer.optimizer.param_groups) == 2 and trainer.signal.extrinsic_coef == 2.0
    assert sha["neutral"] == sha["ppo"] != sha["rnd"]


class _Stream(Signal):
    """A signal with a constant reward on its own stream."""

    def __init__(self, episodic, coef=0.5, ext=3.0):
        self.episodic, self.coef, self.extrinsic_coef = episodic, coef, ext

    def reward_streams(self):
        return [RewardStream("s", gamma=0.9, episodic=self.episodic, coef=self.coef)]

    def after_advantages(self, batch):
        return SignalOutput(streams={"s": torch.ones_like(batch.rewards)})


@pytest.mark.parametrize("episodic", [True, False])
def test_a_stream_gets_its_own_value_head_and_gae(episodic):
    from reflectrl.estimators import compute_gae
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    trainer = PPOTrainer(_config("ppo", env="CartPole-v1"), signal=_Stream(episodic))
    rollout, _ = trainer.collect()
    assert rollout.terminations.any()  # CartPole's episodes end within the rollout
    trainer.apply_signal(rollout)
    ext, _ = trainer._gae(rollout, rollout.rewards)
    T, N = rollout.rewards.shape
    with torch.no_grad():
        values = trainer.streams.value("s", rollout.obs.reshape(T * N, -1)).reshape(T, N)
        last = trainer.streams.value("s", rollout.last_obs)
    next_values = torch.cat([values[1:], last[None]])
    terms = rollout.terminations if episodic else torch.zeros_like(rollout.terminations)
    truncs = rollout.truncations if episodic else torch.zeros_like(rollout.truncations)
    adv, ret = compute_gae(torch.ones(T, N), values, next_values, terms, truncs, 0.9, 0.95)
    assert torch.allclose(rollout.advantages, 3.0 * ext + 0.5 * adv, atol=1e-5)
    assert torch.allclose(trainer.streams.returns["s"], ret.reshape(-1), atol=1e-6)
    # the head learns in the update: its loss is logged and its weights move
    before = trainer.streams.flat.detach().clone()
    stats = trainer.update(rollout)
    assert "s_value_loss" in stats and not torch.equal(before, trainer.streams.flat)


def test_rnd_with_shaping_runs_and_resumes_bit_identically(tmp_path, monkeypatch):
    rows, trainer = resume_matches(tmp_path, monkeypatch, "ppo+rnd+shaping", extra=("shaping.update_every=1",))
    assert {"rnd_intrinsic_mean", "rnd_value_loss", "shaping_mean"} <= set(rows[-1])
    assert trainer.streams is not None


def test_rnd_alone_resumes_bit_identically(tmp_path, monkeypatch):
    rows, _ = resume_matches(tmp_path, monkeypatch, "ppo+rnd", env="MiniGrid-Empty-5x5-v0", stop_at=3)
    assert all(r["rnd_intrinsic_mean"] > 0 for r in rows)


def test_pixels_use_the_conv_nets_on_the_last_frame():
    signal = RND(RndConfig())
    signal.bind(_ctx(obs_dim=4 * 84 * 84, obs_shape=(4, 84, 84), image_obs=True))
    assert isinstance(signal.target[1], torch.nn.Conv2d) and signal.obs_rms.mean.shape == (84 * 84,)
    T, N = 2, 2
    obs = torch.rand(T, N, 4, 84, 84) * 255
    zeros = torch.zeros(T, N)
    batch = Batch(obs=obs, actions=zeros.long(), rewards=zeros, terminations=zeros.bool(), truncations=zeros.bool(),
                  values=zeros, next_values=zeros, next_obs=obs, iteration=1)
    out = signal.after_advantages(batch)
    assert out.streams["rnd"].shape == (T, N) and (out.streams["rnd"] >= 0).all()
    # the last frame alone: changing earlier frames changes nothing
    other = obs.clone()
    other[:, :, :3] = 0
    assert np.array_equal(signal.inputs(other), signal.inputs(obs))
    signal.after_update(batch)
    assert signal.metrics()["rnd_predictor_loss"] > 0


# ----------------------------------------------------------------------------- stream heads on a CNN trunk

_SMALL_CNN = ("encoder=cnn",)


def test_stream_heads_sit_on_the_cnn_trunk_by_default_and_separate_is_the_old_layout():
    from torch import nn

    from reflectrl.trainers.ppo.trainer import PPOTrainer


    shared = PPOTrainer(_config("ppo+rnd", env="MiniGrid-Empty-5x5-v0", extra=_SMALL_CNN))
    assert shared.cfg.ppo.stream_heads == "shared" and shared.streams.shared
    head = shared.streams.heads["rnd"]
    # the extrinsic critic's shape, reading the trunk: the hidden_sizes MLP above the small CNN
    linears = [m for m in head if isinstance(m, nn.Linear)]
    assert [m.in_features for m in linears] == [shared.agent.head_in_dim, 64, 64]
    separate = PPOTrainer(_config("ppo+rnd", env="MiniGrid-Empty-5x5-v0", extra=(*_SMALL_CNN, "stream_heads=separate")))
    assert not separate.streams.shared
    assert type(separate.streams.heads["rnd"]).__name__ == "CNNActorCritic"  # a trunk of its own
    mlp_run = PPOTrainer(_config("ppo+rnd", env="MiniGrid-Empty-5x5-v0"))
    assert mlp_run.cfg.ppo.stream_heads == "separate" and not mlp_run.streams.shared


def test_shared_stream_heads_need_a_cnn_policy():
    with pytest.raises(UserError, match="stream_heads=shared needs a CNN policy"):
        _config("ppo+rnd", env="MiniGrid-Empty-5x5-v0", extra=("stream_heads=shared",))
    with pytest.raises(UserError, match="stream_heads='both'"):
        _config("ppo+rnd", env="MiniGrid-Empty-5x5-v0", extra=("stream_heads=both",))


def test_shared_heads_read_the_trunk_kept_from_collection_and_train_the_trunk():
    from reflectrl.estimators import compute_gae
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    trainer = PPOTrainer(_config("ppo", env="MiniGrid-Empty-5x5-v0", extra=_SMALL_CNN), signal=_Stream(False))
    assert trainer.streams.shared
    rollout, _ = trainer.collect()
    T, N = rollout.rewards.shape
    with torch.no_grad():  # the trunk outputs kept while collecting are the trunk's outputs on those states
        fresh = trainer.agent.encode(torch.cat([rollout.obs.reshape(T * N, -1), rollout.last_obs.reshape(N, -1)]))
    assert torch.allclose(rollout.trunk[:T * N + N], fresh, atol=1e-6)
    trainer.apply_signal(rollout)
    ext, _ = trainer._gae(rollout, rollout.rewards)
    with torch.no_grad():
        v = trainer.streams.value("s", fresh)
    values, last = v[:T * N].reshape(T, N), v[T * N:]
    zeros = torch.zeros_like(rollout.terminations)
    adv, ret = compute_gae(torch.ones(T, N), values, torch.cat([values[1:], last[None]]), zeros, zeros, 0.9, 0.95)
    assert torch.allclose(rollout.advantages, 3.0 * ext + 0.5 * adv, atol=1e-5)
    # the stream's value loss alone reaches the policy's trunk (CleanRL's critic_int shares it)
    trainer.flat_params.grad = torch.zeros_like(trainer.flat_params)
    trainer.streams.value_loss(trainer.agent.encode(rollout.obs.reshape(T * N, -1)[:16]), torch.arange(16)).backward()
    trunk_grads = [p.grad for p in trainer.agent.trunk.parameters()]
    assert all(g is not None for g in trunk_grads) and any(g.abs().sum() > 0 for g in trunk_grads)
    actor_grad = [p.grad for p in trainer.agent.actor.parameters()]
    assert all(g is None or g.abs().sum() == 0 for g in actor_grad)


def test_rnd_on_a_cnn_trunk_resumes_bit_identically(tmp_path, monkeypatch):
    from reflectrl.trainers.policies import params_sha256
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    rows, resumed = resume_matches(tmp_path, monkeypatch, "ppo+rnd", env="MiniGrid-Empty-5x5-v0", extra=_SMALL_CNN,
                                   stop_at=3)
    assert resumed.streams.shared and all(r["rnd_value_loss"] > 0 for r in rows)

    full = PPOTrainer(_config("ppo+rnd", env="MiniGrid-Empty-5x5-v0", extra=_SMALL_CNN))
    full.train(progress=False)
    assert params_sha256(full.streams.heads) == params_sha256(resumed.streams.heads)


def test_a_config_written_before_stream_heads_resumes_with_separate_heads():
    from reflectrl.config import RunConfig

    d = _config("ppo+rnd", env="MiniGrid-Empty-5x5-v0", extra=_SMALL_CNN).to_dict()
    assert d["ppo"].pop("stream_heads") == "shared"
    assert RunConfig.from_dict(d).ppo.stream_heads == "separate"


def test_shared_heads_in_an_edited_config_of_an_mlp_run_are_refused():
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    cfg = _config("ppo+rnd", env="MiniGrid-Empty-5x5-v0")
    cfg.ppo.stream_heads = "shared"  # as an edited config.json would have it (resume does not re-validate)
    with pytest.raises(UserError, match="stream_heads=shared needs a CNN policy"):
        PPOTrainer(cfg)
