"""reflectrl.integrations.verl: the reflectrl estimators in verl's advantage-estimator registry."""

import importlib
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip(
    "verl.trainer.ppo.core_algos",
    reason="verl is not installed (pip install 'reflectrl[verl]'; it pins transformers<5.11, so it is "
           "installed with --no-deps next to the llm extra)")

rv = importlib.import_module("reflectrl.integrations.verl")

from reflectrl.errors import UserError  # noqa: E402
from reflectrl.signals.base import SignalContext  # noqa: E402
from reflectrl.signals.divergence.torch import DivergenceConfig, divergence_weights  # noqa: E402
from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting  # noqa: E402
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
    adv, ret = fn(token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"],
                  index=b["index"], config={"norm_adv_by_std_in_grpo": norm},
                  token_weights=torch.ones_like(b["response_mask"]))
    assert torch.equal(adv, want) and torch.equal(ret, want_ret)
    equal = np.flatnonzero(b["index"] == "u1")
    assert torch.all(adv[equal] == 0)


def test_gear_singleton_group_matches_verl():
    b = make_batch()
    b["index"] = b["index"].copy()
    b["index"][0] = "alone"
    want, _ = grpo_reference(b)
    adv, _ = rv.compute_gear_advantage(b["token_level_rewards"], b["response_mask"], b["index"],
                                       token_weights=torch.ones_like(b["response_mask"]))
    assert torch.equal(adv, want)


def one_line(err):
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


@pytest.mark.parametrize("name", ["reflectrl_gear", "reflectrl_divergence"])
def test_estimators_refuse_verls_fixed_arguments(name):
    """What verl's own compute_advantage passes a registered estimator: no batch fields. Plain GRPO
    would be trained silently; the estimator refuses in one line that names the patch."""
    b = make_batch()
    with pytest.raises(UserError) as err:
        core_algos.get_adv_estimator_fn(name)(token_level_rewards=b["token_level_rewards"],
                                              response_mask=b["response_mask"], index=b["index"], config={})
    assert "patch_verl()" in one_line(err) and name in one_line(err)


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
    assert not torch.equal(w, torch.ones_like(w))
    assert torch.equal(data.batch["advantages"], grpo * w)


# ---------------------------------------------------------------------------- verl's own trainer paths

@pytest.fixture
def unpatched():
    """verl as installed, restored after the test whatever it patched."""
    rv.unpatch_verl()
    yield
    rv.unpatch_verl()


def legacy_data(b, **extra):
    protocol = pytest.importorskip("verl.protocol")
    return protocol.DataProto.from_dict(
        tensors={"token_level_rewards": b["token_level_rewards"], "response_mask": b["response_mask"], **extra},
        non_tensors={"uid": b["index"]})


@pytest.mark.slow  # importing verl's trainers takes > 2 s
def test_legacy_trainer_refuses_unpatched_and_reweights_patched(unpatched):
    ray_trainer = pytest.importorskip("verl.trainer.ppo.ray_trainer")
    # RayPPOTrainer.fit looks compute_advantage up in its module when it runs, so the patch reaches it
    assert "compute_advantage" in ray_trainer.RayPPOTrainer.fit.__code__.co_names
    b, student, teacher = divergence_inputs(planted=(0, 3))
    weights = 0.5 + torch.rand(b["response_mask"].shape, generator=torch.Generator().manual_seed(5))
    fields = dict(token_weights=weights, old_log_probs=student, teacher_log_prob=teacher)
    for name in rv.ESTIMATORS:  # verl's own compute_advantage, not patched: one line naming the fix
        with pytest.raises(UserError) as err:
            ray_trainer.compute_advantage(legacy_data(b, **fields), name, config={})
        assert "patch_verl()" in one_line(err)
    grpo = ray_trainer.compute_advantage(legacy_data(b), core_algos.AdvantageEstimator.GRPO).batch["advantages"]
    assert torch.equal(grpo, grpo_reference(b)[0])

    rv.patch_verl()
    rv.patch_verl()  # idempotent
    assert ray_trainer.compute_advantage.__wrapped__.__module__ == "verl.trainer.ppo.ray_trainer"
    out = ray_trainer.compute_advantage(legacy_data(b, **fields), "reflectrl_gear", config={})
    assert torch.equal(out.batch["advantages"], grpo * weights)
    out = ray_trainer.compute_advantage(legacy_data(b, **fields), "reflectrl_divergence", config={})
    w, _ = rv.teacher_divergence_weights(student, teacher, b["response_mask"], rv.divergence_config())
    assert not torch.equal(w, torch.ones_like(w)) and torch.equal(out.batch["advantages"], grpo * w)
    out = ray_trainer.compute_advantage(legacy_data(b, **fields), core_algos.AdvantageEstimator.GRPO)
    assert torch.equal(out.batch["advantages"], grpo)  # every other estimator is verl's own
    for name, key in (("reflectrl_gear", "token_weights"), ("reflectrl_divergence", "teacher_log_prob")):
        missing = {k: v for k, v in fields.items() if k != key}
        with pytest.raises(UserError, match=f"no '{key}'") as err:
            ray_trainer.compute_advantage(legacy_data(b, **missing), name, config={})
        one_line(err)
    rv.unpatch_verl()
    assert not hasattr(ray_trainer.compute_advantage, "_reflectrl_patched")


class MemoryTQ:
    """TransferQueue's kv_batch_get / kv_batch_put as verl's v1 trainer uses them, in memory: per-token
    fields stored per key and read back as jagged nested tensors, a field some key lacks left out of
    the answer (as TransferQueue 0.1.11 does)."""

    def __init__(self):
        self.rows: dict = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for name in fields.keys():
            value = fields.get(name)
            rows = value.tolist() if not isinstance(value, torch.Tensor) else list(value.unbind(0))
            for key, row in zip(keys, rows, strict=True):
                self.rows.setdefault((partition_id, key), {})[name] = row
        return v1_meta(list(keys), partition_id)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        from tensordict import TensorDict
        from tensordict.tensorclass import NonTensorStack
        out = {}
        for name in select_fields:
            rows = [self.rows[(partition_id, k)].get(name) for k in keys]
            if any(r is None for r in rows):
                continue
            out[name] = (torch.nested.as_nested_tensor(rows, layout=torch.jagged) if isinstance(rows[0], torch.Tensor)
                         else NonTensorStack(*rows))
        return TensorDict(out, batch_size=len(keys))


def v1_meta(keys, partition_id="train"):
    from transfer_queue import KVBatchMeta
    return KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id=partition_id)


def v1_rollout(seed=0, prompts=3, n=4):
    """Agent-loop outputs as verl's v1 AgentLoopWorkerTQ stores them: keys {uid}_{session}_{index},
    per-token fields nested by response length, the final reward on every output of a session (its
    last token); session p0_1 has two outputs (a multi-turn session), p0_1_1 its final one."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p in range(prompts):
        for s in range(n):
            score = float(torch.randint(0, 2, (1,), generator=g)) + 0.1 * float(torch.randn(1, generator=g))
            for i in range(2 if (p, s) == (0, 1) else 1):
                length = int(torch.randint(3, 9, (1,), generator=g))
                rm = torch.zeros(length)
                rm[-1] = score
                rows.append(dict(key=f"p{p}_{s}_{i}", uid=f"p{p}", score=score, length=length, rm_scores=rm,
                                 response_mask=torch.ones(length, dtype=torch.int64),
                                 old_log_probs=-torch.rand(length, generator=g)))
    return rows


def v1_put(tq, rows, partition_id="train"):
    from tensordict import TensorDict
    from tensordict.tensorclass import NonTensorStack
    fields = {k: torch.nested.as_nested_tensor([r[k] for r in rows], layout=torch.jagged)
              for k in ("rm_scores", "response_mask", "old_log_probs")}
    fields["uid"] = NonTensorStack(*[r["uid"] for r in rows])
    tq.kv_batch_put(keys=[r["key"] for r in rows], partition_id=partition_id,
                    fields=TensorDict(fields, batch_size=len(rows)))


def v1_trainer(estimator, n=4):
    """What verl's PPOTrainer._compute_advantage reads of its trainer: the config."""
    from omegaconf import OmegaConf
    return SimpleNamespace(config=OmegaConf.create({
        "algorithm": {"adv_estimator": estimator, "gamma": 1.0, "lam": 1.0, "use_kl_in_reward": False,
                      "norm_adv_by_std_in_grpo": True},
        "actor_rollout_ref": {"rollout": {"n": n}}}))


def v1_advantages(trainer_base, tq, estimator, rows):
    """verl's own v1 advantage step on the stored rollout; the advantages it wrote back, padded."""
    meta = v1_meta([r["key"] for r in rows])
    trainer_base.PPOTrainer._compute_advantage(v1_trainer(estimator), meta, {})
    return tq.kv_batch_get(keys=meta.keys, partition_id="train",
                           select_fields=["advantages", "returns"]).to_padded_tensor()


@pytest.fixture
def v1(monkeypatch, unpatched):
    pytest.importorskip("transfer_queue", reason="verl's v1 trainer needs TransferQueue (scripts/install_verl.sh)")
    trainer_base = pytest.importorskip("verl.trainer.ppo.v1.trainer_base",
                                       reason="verl's v1 trainer does not import here (scripts/install_verl.sh)")
    tq = MemoryTQ()
    monkeypatch.setattr(trainer_base, "tq", tq)
    rows = v1_rollout()
    v1_put(tq, rows)
    return trainer_base, tq, rows


def padded(rows, key):
    return torch.nested.as_nested_tensor([r[key] for r in rows], layout=torch.jagged).to_padded_tensor(0.0)


@pytest.mark.slow
def test_v1_trainer_unpatched_refuses_in_one_line(v1):
    trainer_base, tq, rows = v1
    grpo = v1_advantages(trainer_base, tq, "grpo", rows)["advantages"]
    assert grpo.abs().sum() > 0
    tq.kv_batch_put(keys=[r["key"] for r in rows], partition_id="train",
                    fields=_nested_fields(rows, token_weights=torch.full((len(rows), 8), 2.0)))
    for name in rv.ESTIMATORS:  # the weights are in the queue, but verl's v1 does not fetch them
        with pytest.raises(UserError) as err:
            v1_advantages(trainer_base, tq, name, rows)
        assert "patch_verl()" in one_line(err)


def _nested_fields(rows, **fields):
    from tensordict import TensorDict
    return TensorDict({k: torch.nested.as_nested_tensor([v[i, :r["length"]] for i, r in enumerate(rows)],
                                                        layout=torch.jagged) for k, v in fields.items()},
                      batch_size=len(rows))


@pytest.mark.slow
def test_v1_trainer_patched_gear_is_verls_v1_grpo_times_the_weights(v1):
    trainer_base, tq, rows = v1
    # verl's v1 fetches a fixed field list and calls the multi-trajectory helper it imported by name
    code = trainer_base.PPOTrainer._compute_advantage.__code__
    assert "compute_advantage_for_multi_trajectories" in code.co_names and "token_weights" not in code.co_consts
    grpo = v1_advantages(trainer_base, tq, "grpo", rows)["advantages"]
    rv.patch_verl()
    rv.patch_verl()  # idempotent
    mask = padded(rows, "response_mask").bool()
    assert torch.equal(v1_advantages(trainer_base, tq, "grpo", rows)["advantages"], grpo)  # verl's own, unchanged
    with pytest.raises(UserError, match="no 'token_weights'") as err:  # patched, but the queue has no weights
        v1_advantages(trainer_base, tq, "reflectrl_gear", rows)
    one_line(err)

    weights = 0.5 + torch.rand(len(rows), mask.shape[1], generator=torch.Generator().manual_seed(9))
    rv.put_response_fields(v1_meta([r["key"] for r in rows]), token_weights=weights)
    got = v1_advantages(trainer_base, tq, "reflectrl_gear", rows)
    assert torch.equal(got["advantages"], grpo * weights * mask)
    assert torch.equal(got["returns"], got["advantages"])
    assert not torch.allclose(got["advantages"], grpo)

    # independently of verl: GRPO over each session's final output, broadcast over the session
    finals = {}
    for i, r in enumerate(rows):
        finals[r["key"].rsplit("_", 1)[0]] = i  # the last index of a session comes last
    final_rows = sorted(finals.values())
    scores = torch.tensor([rows[i]["score"] for i in final_rows])
    adv, _, _ = rv.grpo_outcome(scores, np.array([rows[i]["uid"] for i in final_rows], dtype=object))
    per_session = dict(zip([rows[i]["key"].rsplit("_", 1)[0] for i in final_rows], adv.tolist(), strict=True))
    want = torch.tensor([per_session[r["key"].rsplit("_", 1)[0]] for r in rows])[:, None] * mask * weights
    torch.testing.assert_close(got["advantages"], want, rtol=1e-5, atol=1e-6)
    two_turns = [i for i, r in enumerate(rows) if r["key"].startswith("p0_1_")]
    assert len(two_turns) == 2 and len({round(float(grpo[i, 0]), 6) for i in two_turns}) == 1


@pytest.mark.slow
def test_v1_trainer_patched_divergence_reads_teacher_log_prob(v1):
    trainer_base, tq, rows = v1
    grpo = v1_advantages(trainer_base, tq, "grpo", rows)["advantages"]
    rv.patch_verl()
    student = padded(rows, "old_log_probs")
    teacher = student - 0.02
    row = max(range(len(rows)), key=lambda i: rows[i]["length"])
    teacher[row, rows[row]["length"] - 2] -= 3.0  # a planted departure
    rv.put_response_fields(v1_meta([r["key"] for r in rows]), teacher_log_prob=teacher)
    got = v1_advantages(trainer_base, tq, "reflectrl_divergence", rows)["advantages"]
    mask = padded(rows, "response_mask").bool()
    w, departure = rv.teacher_divergence_weights(student, teacher, mask.float(), rv.divergence_config())
    assert departure[row] == rows[row]["length"] - 2 and w[row].max() > 1
    assert torch.equal(got, grpo * w)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_v1_trainer_in_a_ray_worker_with_transferqueue():
    """verl's v1 advantage step in a Ray actor (where verl's TaskRunnerV1 runs the trainer), patched by
    the worker_process_setup_hook the docs give, against a real TransferQueue."""
    ray = pytest.importorskip("ray")
    tq = pytest.importorskip("transfer_queue", reason="verl's v1 trainer needs TransferQueue (scripts/install_verl.sh)")
    pytest.importorskip("verl.trainer.ppo.v1.trainer_base",
                        reason="verl's v1 trainer does not import here (scripts/install_verl.sh)")
    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": "reflectrl.integrations.verl.patch_verl"})
    try:
        from omegaconf import OmegaConf
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        rows = v1_rollout(seed=1)
        v1_put(tq, rows)
        weights = 0.5 + torch.rand(len(rows), max(r["length"] for r in rows))
        cfg = OmegaConf.to_container(v1_trainer("grpo").config)

        @ray.remote(num_cpus=0)
        class Trainer:  # the trainer's process, as verl's TaskRunnerV1 actor
            def patched(self):
                from verl.trainer.ppo import ray_trainer
                from verl.trainer.ppo.v1 import trainer_base
                return (getattr(ray_trainer.compute_advantage, "_reflectrl_patched", False)
                        and getattr(trainer_base.PPOTrainer._compute_advantage, "_reflectrl_patched", False))

            def advantages(self, keys, estimator, weights=None):
                import transfer_queue
                from omegaconf import OmegaConf
                from transfer_queue import KVBatchMeta
                from verl.trainer.ppo.v1 import trainer_base

                import reflectrl.integrations.verl as rv
                transfer_queue.init()
                meta = KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train")
                if weights is not None:
                    rv.put_response_fields(meta, token_weights=weights)
                cfg["algorithm"]["adv_estimator"] = estimator
                trainer_base.PPOTrainer._compute_advantage(SimpleNamespace(config=OmegaConf.create(cfg)), meta, {})
                return transfer_queue.kv_batch_get(keys=keys, partition_id="train",
                                                   select_fields=["advantages"]).to_padded_tensor()["advantages"]

        trainer = Trainer.remote()
        keys = [r["key"] for r in rows]
        assert ray.get(trainer.patched.remote())
        grpo = ray.get(trainer.advantages.remote(keys, "grpo"))
        gear = ray.get(trainer.advantages.remote(keys, "reflectrl_gear", weights))
        mask = padded(rows, "response_mask")
        assert grpo.abs().sum() > 0 and torch.equal(gear, grpo * weights * mask)
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()
    print(f"ray + TransferQueue round trip: {time.monotonic() - started:.0f} s")
