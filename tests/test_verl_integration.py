"""reflectrl.integrations.verl: the reflectrl estimators in verl's advantage-estimator registry."""

import importlib

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos",
    reason="verl is not installed (pip install 'reflectrl[verl]'; it pins transformers<5.11, so it is "
           "installed with --no-deps next to the llm extra)")

rv = importlib.import_module("reflectrl.integrations.verl")

from reflectrl.signals.base import SignalContext  # noqa: E402
from reflectrl.signals.divergence import DivergenceConfig, divergence_weights  # noqa: E402
from reflectrl.signals.gear import GEARConfig, GEARReweighting  # noqa: E402
from reflectrl.trainers.grpo.trainer import group_advantages, token_batch  # noqa: E402

GROUP = 4


def make_batch(seed=0, groups=5, length=7, shuffle=True, hidden=0):
    """A verl-like batch: outcome rewards on each response's last token, a right-padded response
    mask, uids in an interleaved (non-contiguous) order; group 'u1' has all rewards equal."""
    g = torch.Generator().manual_seed(seed)
    n = groups * GROUP
    uids = np.array([f"u{i // GROUP}" for i in range(n)], dtype=object)
    lengths = torch.randint(2, length + 1, (n,), generator=g)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    scores = torch.randint(0, 2, (n,), generator=g).float() + 0.1 * torch.randn(n, generator=g)
    scores[GROUP:2 * GROUP] = 1.0  # all equal
    order = torch.randperm(n, generator=g) if shuffle else torch.arange(n)
    uids, mask, scores, lengths = uids[order.numpy()], mask[order], scores[order], lengths[order]
    rewards = torch.zeros(n, length)
    rewards[torch.arange(n), lengths - 1] = scores
    out = dict(token_level_rewards=rewards, response_mask=mask, index=uids, scores=scores)
    if hidden:
        out["hidden"] = torch.randn(n, length, hidden, generator=g)
        out["responses"] = torch.randint(0, 50, (n, length), generator=g)
    return out


def grpo_reference(b, **kw):
    return core_algos.compute_grpo_outcome_advantage(b["token_level_rewards"], b["response_mask"], b["index"], **kw)


def test_names_resolve_through_verls_registry():
    assert rv.ESTIMATORS == ("reflectrl_gear", "reflectrl_divergence")
    assert core_algos.get_adv_estimator_fn("reflectrl_gear") is rv.compute_gear_advantage
    assert core_algos.get_adv_estimator_fn("reflectrl_divergence") is rv.compute_divergence_advantage


def test_importing_again_registers_idempotently():
    again = importlib.reload(rv)
    assert core_algos.get_adv_estimator_fn("reflectrl_gear") is again.compute_gear_advantage
    # someone else's function under the name still makes verl raise
    with pytest.raises(ValueError):
        core_algos.register_adv_est("reflectrl_gear")(lambda **kw: None)


@pytest.mark.parametrize("norm", [True, False])
def test_gear_without_weights_is_verls_grpo_bit_for_bit(norm):
    b = make_batch()
    want, want_ret = grpo_reference(b, norm_adv_by_std_in_grpo=norm)
    fn = core_algos.get_adv_estimator_fn("reflectrl_gear")
    for weights in (None, torch.ones_like(b["response_mask"])):
        adv, ret = fn(token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"],
                      index=b["index"], config={"norm_adv_by_std_in_grpo": norm}, token_weights=weights)
        assert torch.equal(adv, want) and torch.equal(ret, want_ret)
    equal = np.flatnonzero(b["index"] == "u1")
    assert torch.all(adv[equal] == 0)


def test_gear_singleton_group_matches_verl():
    b = make_batch()
    b["index"] = b["index"].copy()
    b["index"][0] = "alone"
    want, _ = grpo_reference(b)
    adv, _ = rv.compute_gear_advantage(b["token_level_rewards"], b["response_mask"], b["index"])
    assert torch.equal(adv, want)


@pytest.mark.parametrize("scale", ["group", "none"])
def test_gear_with_weights_is_reflectrls_grpo_times_weights(scale):
    b = make_batch(shuffle=False)  # contiguous by group, as reflectrl's trainer lays them out
    weights = 0.5 + torch.rand(b["response_mask"].shape, generator=torch.Generator().manual_seed(3))
    adv, _ = rv.compute_gear_advantage(b["token_level_rewards"], b["response_mask"], b["index"],
                                       norm_adv_by_std_in_grpo=scale == "group", token_weights=weights)
    advantages, _, _ = group_advantages(b["scores"], GROUP, scale, eps=rv.EPSILON)
    token_adv = advantages[:, None] * b["response_mask"]  # GRPOTrainer._signal_output
    torch.testing.assert_close(adv, token_adv * weights, rtol=1e-6, atol=1e-7)


def test_gear_helper_weights_match_reflectrls_trainer_path():
    hidden_size, lr = 6, 1e-3
    cfg = GEARConfig(top_frac=0.5, temperature=1.0, epochs=2, minibatch_size=16)
    helper = rv.GEARTokenWeights(GEARConfig(**vars(cfg)), hidden_size=hidden_size, learning_rate=lr, seed=7)
    signal = GEARReweighting(GEARConfig(**vars(cfg)))
    signal.bind(SignalContext(obs_dim=hidden_size, action_dim=0, discrete=False, feature_dim=hidden_size,
                              learning_rate=lr, gamma=0.99, gae_lambda=1.0, seed=7, total_iterations=1))

    def trainer_path(b):  # what reflectrl's GRPOTrainer does with the same tensors
        n = b["scores"].shape[0]
        advantages, baseline, _ = group_advantages(b["scores"], GROUP, eps=rv.EPSILON)
        agent = torch.cat([torch.zeros(n, 1, dtype=torch.bool), b["response_mask"].bool()], 1)
        features = torch.cat([b["hidden"], torch.zeros(n, 1, hidden_size)], 1)
        ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), b["responses"]], 1)
        return token_batch(agent, b["scores"], baseline, advantages, features, ids, GROUP)

    for step in range(3):
        b = make_batch(seed=10 + step, shuffle=False, hidden=hidden_size)
        got = helper.weights(b["hidden"], b["response_mask"], b["token_level_rewards"], b["index"], b["responses"])
        batch = trainer_path(b)
        out = signal.after_advantages(batch)
        want = torch.ones_like(got) if out is None else out.weights.T
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        if step > 0:  # distilled: the weights are not all 1
            assert not torch.allclose(got, torch.ones_like(got))
        helper.update()
        signal.after_update(batch)


def test_gear_helper_token_batch_groups_by_uid():
    b = make_batch(hidden=3)
    helper = rv.GEARTokenWeights(hidden_size=3, learning_rate=1e-3)
    batch = helper.token_batch(b["hidden"], b["response_mask"], b["token_level_rewards"], b["index"])
    groups = batch.groups[0]
    for g in groups.unique():
        assert len(set(b["index"][groups.numpy() == int(g)])) == 1
    assert torch.equal(batch.features.transpose(0, 1), b["hidden"])
    assert torch.equal(batch.mask.T, b["response_mask"].bool())


def test_response_hidden_states_slice():
    class Model(torch.nn.Module):
        def forward(self, input_ids, attention_mask, output_hidden_states, use_cache):
            h = input_ids[..., None].float().expand(*input_ids.shape, 2)
            return type("Out", (), {"hidden_states": (h * 0, h)})()

    ids = torch.arange(10).reshape(2, 5)
    h = rv.response_hidden_states(Model(), ids, torch.ones_like(ids), response_length=3)
    assert torch.equal(h[..., 0], ids[:, 1:4].float())  # the state before each of the last 3 tokens


def divergence_inputs(seed=0, planted=None):
    b = make_batch(seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    student = -torch.rand(b["response_mask"].shape, generator=g)
    teacher = student - 0.02 * torch.rand(student.shape, generator=g)
    if planted is not None:
        row, t = planted
        teacher[row, t] = student[row, t] - 3.0  # the teacher finds the sampled token far less likely
    return b, student, teacher


def test_divergence_zero_gap_is_grpo():
    b = make_batch()
    student = -torch.rand(b["response_mask"].shape)
    adv, _ = core_algos.get_adv_estimator_fn("reflectrl_divergence")(
        token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"], index=b["index"],
        config=None, old_log_probs=student, teacher_log_prob=student.clone())
    assert torch.equal(adv, grpo_reference(b)[0])


def test_divergence_planted_departure_reweights_from_there_on():
    cfg = DivergenceConfig(measure="logp_gap", threshold=2.0, min_history=2, floor=0.1, w_max=3.0)
    b0 = make_batch()
    row = int(torch.argmax(b0["response_mask"].sum(1)))  # a long response
    t = int(b0["response_mask"][row].sum()) - 2
    b, student, teacher = divergence_inputs(planted=(row, t))
    adv, _ = rv.compute_divergence_advantage(b["token_level_rewards"], b["response_mask"], b["index"],
                                             old_log_probs=student, teacher_log_prob=teacher, divergence_config=cfg)
    div = (student - teacher).clamp(min=0)
    weights, departure = divergence_weights(div, b["response_mask"].bool(), cfg)
    assert departure[row] == t
    assert torch.all(weights[row, t:int(b["response_mask"][row].sum())] == weights[row, t])
    assert weights[row, t] > 1  # the departure carries more credit
    torch.testing.assert_close(adv, grpo_reference(b)[0] * weights, rtol=0, atol=0)
    got_w, got_dep = rv.teacher_divergence_weights(student, teacher, b["response_mask"], cfg)
    assert torch.equal(got_w, weights) and torch.equal(got_dep, departure)


def test_divergence_refuses_kl_and_reads_the_algorithm_config():
    with pytest.raises(ValueError, match="gathered per-token log-probs"):
        rv.divergence_config(DivergenceConfig(measure="kl"))
    with pytest.raises(ValueError, match="gathered per-token log-probs"):
        rv.divergence_config(config={"reflectrl_divergence": {"measure": "kl"}})
    cfg = rv.divergence_config(config={"reflectrl_divergence": {"threshold": 3.0}})
    assert cfg.measure == "logp_gap" and cfg.threshold == 3.0
    with pytest.raises(ValueError, match="unknown setting"):
        rv.divergence_config({"treshold": 3.0})


def test_compute_advantage_reads_the_extra_batch_keys():
    protocol = pytest.importorskip("verl.protocol")
    b, student, teacher = divergence_inputs(planted=(0, 3))
    weights = 0.5 + torch.rand(b["response_mask"].shape)
    data = protocol.DataProto.from_dict(
        tensors={"token_level_rewards": b["token_level_rewards"], "response_mask": b["response_mask"],
                 "token_weights": weights, "old_log_probs": student, "teacher_log_prob": teacher},
        non_tensors={"uid": b["index"]})
    grpo = grpo_reference(b)[0]
    rv.compute_advantage(data, "reflectrl_gear", config={"norm_adv_by_std_in_grpo": True})
    assert torch.equal(data.batch["advantages"], grpo * weights)
    rv.compute_advantage(data, "reflectrl_divergence")
    w, _ = rv.teacher_divergence_weights(student, teacher, b["response_mask"], rv.divergence_config())
    assert torch.equal(data.batch["advantages"], grpo * w)


def test_patched_verl_compute_advantage_routes_the_reflectrl_estimators():
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    protocol = pytest.importorskip("verl.protocol")
    original = ray_trainer.compute_advantage
    try:
        rv.patch_verl_compute_advantage()
        rv.patch_verl_compute_advantage()  # idempotent
        assert ray_trainer.compute_advantage.__wrapped__ is original
        b = make_batch()
        weights = 0.5 + torch.rand(b["response_mask"].shape)

        def data():
            return protocol.DataProto.from_dict(
                tensors={"token_level_rewards": b["token_level_rewards"], "response_mask": b["response_mask"],
                         "token_weights": weights}, non_tensors={"uid": b["index"]})

        grpo = grpo_reference(b)[0]
        out = ray_trainer.compute_advantage(data(), "reflectrl_gear", config={"norm_adv_by_std_in_grpo": True})
        assert torch.equal(out.batch["advantages"], grpo * weights)
        out = ray_trainer.compute_advantage(data(), core_algos.AdvantageEstimator.GRPO)  # verl's own
        assert torch.equal(out.batch["advantages"], grpo)
    finally:
        ray_trainer.compute_advantage = original
