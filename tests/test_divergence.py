"""The divergence signal (the GEAR paper's teacher segments), GEAR's rank_groups / history /
target_ema, and the LLM trainer's device and precision choices."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch

from reflectrl.errors import UserError
from reflectrl.signals.base import Batch, SignalContext
from reflectrl.signals.divergence.torch import (
    NEVER,
    DivergenceConfig,
    DivergenceReweighting,
    divergence_weights,
    find_departures,
    find_segments,
    segment_stats,
    segment_weights,
    soft_clip,
    token_divergence,
)

sys.path.insert(0, str(Path(__file__).parent))


# ---------------------------------------------------------------------------- per-token math

def _planted(n_tokens=12, at=7, base=0.05, spike=3.0):
    div = torch.full((1, n_tokens), base)
    div[0, ::2] += 0.01  # a little noise, so the running std is not zero
    div[0, at] = spike
    return div


ONE = dict(max_segments=1, boundary="spike", weights="step")  # issue 19's form: one departure to the end


def test_a_planted_departure_yields_one_segment_at_the_right_token():
    div = _planted()
    mask = torch.ones_like(div, dtype=torch.bool)
    mask[0, :2] = False  # the prompt: not part of the completion
    cfg = DivergenceConfig(**ONE)
    w, dep = divergence_weights(div, mask, cfg)
    assert dep.tolist() == [7]
    # one weight from the departure on, the divergence at the departure relative to the mean
    dbar = div[mask].mean()
    expected_seg = min(cfg.w_max, max(cfg.w_min, (3.0 / dbar).item()))
    assert torch.allclose(w[0, 7:], torch.full((5,), expected_seg))
    # token resolution before it: (d_t / dbar) clipped
    aligned = (div[0, 2:7] / dbar).clamp(cfg.w_min, cfg.w_max)
    assert torch.allclose(w[0, 2:7], aligned)
    assert torch.equal(w[0, :2], torch.ones(2))  # outside the completion: 1
    stats = segment_stats(dep, mask)
    assert stats["segments_per_completion"] == 1.0 and stats["segment_length_mean"] == 5
    assert stats["departure_token_share"] == pytest.approx(5 / 10)
    assert segment_stats(segment_weights(div, mask, cfg)[1], mask) == stats  # the map and the departure agree


def test_only_the_first_spike_starts_the_segment_and_history_is_required():
    div = _planted(at=5)
    div[0, 9] = 5.0  # a later spike is inside the segment already
    mask = torch.ones_like(div, dtype=torch.bool)
    assert find_departures(div, mask, DivergenceConfig()).tolist() == [5]
    assert find_segments(div, mask, DivergenceConfig(**ONE)).tolist() == [[0] * 5 + [1] * 7]
    early = torch.full((1, 6), 0.05)
    early[0, 1] = 3.0  # one token of history: not enough with min_history=2
    early[0, 0] = 0.06
    assert find_departures(early, torch.ones_like(early, dtype=torch.bool), DivergenceConfig()).tolist() == [-1]
    assert find_departures(early, torch.ones_like(early, dtype=torch.bool),
                           DivergenceConfig(min_history=1)).tolist() == [1]


def _issue19_weights(div, mask, cfg, entropy=None):
    """issue 19's divergence_weights, verbatim: the first spike, one segment to the end weighted by the
    divergence there, hard-clipped (what max_segments=1, boundary=spike, weights=step must reproduce)."""
    departure = find_departures(div, mask, cfg, entropy)
    if cfg.strength == 0:
        return torch.ones_like(div), departure
    m = mask.to(div.dtype)
    dbar = (div * m).sum(1) / m.sum(1).clamp(min=1)
    flat = dbar <= 1e-12
    rel = div / dbar.clamp(min=1e-12)[:, None]
    n, length = div.shape
    positions = torch.arange(length)[None, :].expand(n, length)
    at_departure = rel.gather(1, departure.clamp(min=0)[:, None])
    in_segment = (departure[:, None] >= 0) & (positions >= departure[:, None])
    rel = torch.where(in_segment, at_departure.expand(n, length), rel)
    w = rel.pow(cfg.strength).clamp(cfg.w_min, cfg.w_max)
    if cfg.renormalize:
        mean_w = (w * m).sum(1) / m.sum(1).clamp(min=1)
        w = w / mean_w.clamp(min=1e-12)[:, None]
    w = torch.where(mask & ~flat[:, None], w, torch.ones_like(w))
    return w, departure


def _fixtures(seed):
    g = torch.Generator().manual_seed(seed)
    div = torch.rand(16, 30, generator=g) ** 3 * 2  # heavy-tailed: spikes here and there
    div[torch.rand(16, 30, generator=g) < 0.1] = 0.0
    mask = torch.rand(16, 30, generator=g) > 0.15  # holes: tool outputs inside a completion
    mask[:, :3] = False
    mask[0] = False  # an empty completion
    entropy = torch.rand(16, 30, generator=g) * 2
    return div, mask, entropy


@pytest.mark.parametrize("knobs", [{}, dict(strength=0.5), dict(renormalize=True), dict(entropy_min=0.8),
                                   dict(threshold=0.5, min_history=1, floor=0.0, w_min=0.3, w_max=4.0)])
def test_issue19_form_is_one_setting_away_bit_for_bit(knobs):
    for seed in range(3):
        div, mask, entropy = _fixtures(seed)
        cfg = DivergenceConfig(**ONE, **knobs)
        w, dep = divergence_weights(div, mask, cfg, entropy)
        w19, dep19 = _issue19_weights(div, mask, cfg, entropy)
        assert torch.equal(dep, dep19) and torch.equal(w, w19)
        assert (dep >= 0).sum() > 3  # the fixtures have departures
    # and the default (several smooth segments) is not that form
    assert not torch.equal(divergence_weights(div, mask, DivergenceConfig(), entropy)[0], w19)


def test_several_spikes_open_several_segments_up_to_max_segments():
    div = torch.full((1, 16), 0.05)
    div[0, ::2] += 0.01
    div[0, 4], div[0, 9], div[0, 13] = 3.0, 6.0, 12.0  # three spikes, each above the history before it
    mask = torch.ones_like(div, dtype=torch.bool)
    seg = find_segments(div, mask, DivergenceConfig(max_segments=4))
    assert seg.tolist() == [[0] * 4 + [1] * 5 + [2] * 4 + [3] * 3]
    capped = find_segments(div, mask, DivergenceConfig(max_segments=2))
    assert capped.tolist() == [[0] * 4 + [1] * 5 + [2] * 7]  # the last segment runs to the end
    stats = segment_stats(seg, mask)
    assert stats == {"segments_per_completion": 3.0, "segments_max": 3, "segment_length_mean": 4.0,
                     "departure_token_share": 0.75}
    # a segment spans a hole in the mask (a tool output) and resumes after it
    mask[0, 6:8] = False
    seg = find_segments(div, mask, DivergenceConfig(max_segments=4))
    assert seg[0, 6:8].tolist() == [0, 0] and seg[0, 8].item() == 1
    assert segment_stats(seg, mask)["segments_per_completion"] == 3.0


def test_boundaries_by_spike_entropy_or_both():
    div = torch.full((1, 16), 0.05)
    div[0, ::2] += 0.01
    div[0, 4], div[0, 7], div[0, 12] = 3.0, 6.0, 12.0
    entropy = torch.full((1, 16), 0.6)
    entropy[0, 1::2] += 0.02
    entropy[0, 10] = 2.5  # an entropy spike (>= entropy_floor 0.5)
    mask = torch.ones_like(div, dtype=torch.bool)
    spike = find_segments(div, mask, DivergenceConfig(boundary="spike"), entropy)
    assert spike.tolist() == [[0] * 4 + [1] * 3 + [2] * 5 + [3] * 4]
    # entropy: a spike opens a segment when none is open; the entropy spike closes it (its token is aligned)
    ent = find_segments(div, mask, DivergenceConfig(boundary="entropy"), entropy)
    assert ent.tolist() == [[0] * 4 + [1] * 6 + [0] * 2 + [2] * 4]
    both = find_segments(div, mask, DivergenceConfig(boundary="both"), entropy)
    assert both.tolist() == [[0] * 4 + [1] * 3 + [2] * 3 + [0] * 2 + [3] * 4]
    # the entropy floor: the same spike below it is not a boundary
    assert torch.equal(find_segments(div, mask, DivergenceConfig(boundary="both", entropy_floor=3.0), entropy), spike)
    with pytest.raises(ValueError, match="entropy"):
        find_segments(div, mask, DivergenceConfig(boundary="entropy"))


def test_smooth_weights_are_continuous_inside_the_bounds():
    rel = torch.tensor([0.0, 0.05, 0.3, 0.9, 1.0, 1.1, 3.0, 8.0, 1e6])
    cfg = DivergenceConfig(w_min=0.5, w_max=2.0)
    w = soft_clip(rel, cfg)
    assert w[0] == 0.5 and w[4] == 1.0
    assert torch.all(w[1:-1] > 0.5) and torch.all(w[:-1] < 2.0) and torch.all(w[1:] > w[:-1])  # increasing
    assert w[-1] == pytest.approx(2.0, abs=1e-6) and w[-1] <= 2.0
    # near rel = 1 it is rel^strength
    assert soft_clip(torch.tensor([1.01]), cfg).item() == pytest.approx(1.01, rel=1e-4)
    assert torch.equal(soft_clip(rel[1:], DivergenceConfig(strength=0.0)), torch.ones(8))
    assert soft_clip(torch.tensor([0.0]), DivergenceConfig(strength=0.0)).item() == 1.0  # 0 * ln 0: no weight
    assert torch.equal(soft_clip(rel, DivergenceConfig(w_min=1.0, w_max=1.0)), torch.ones(9))
    # on fixtures: inside [w_min, w_max], one weight per segment, its mean divergence relative to the completion's
    for seed in range(3):
        div, mask, entropy = _fixtures(seed)
        for boundary in ("spike", "both"):
            cfg = DivergenceConfig(boundary=boundary, w_min=0.6, w_max=1.8)
            w, seg = segment_weights(div, mask, cfg, entropy)
            real = w[mask]
            assert torch.all((real >= 0.6) & (real <= 1.8)) and len(set(real.tolist())) > 20
            i, k = 5, int(seg[5].max())
            assert k >= 1
            rows = mask[i] & (seg[i] == k)
            dbar = div[i][mask[i]].mean()
            expected = soft_clip((div[i][rows].mean() / dbar)[None], cfg)
            assert torch.allclose(w[i][rows], expected.expand(int(rows.sum())), atol=1e-6)
    # the step form with several segments: each weighs its first token's divergence
    div = torch.full((1, 16), 0.05)
    div[0, ::2] += 0.01
    div[0, 4], div[0, 9] = 0.3, 0.9
    cfg = DivergenceConfig(weights="step", w_max=100.0, floor=0.0)
    w, seg = segment_weights(div, torch.ones_like(div, dtype=torch.bool), cfg)
    assert seg[0, 4].item() == 1 and seg[0, 9].item() == 2
    dbar = div.mean()
    assert torch.allclose(w[0, 4:9], (0.3 / dbar).expand(5)) and torch.allclose(w[0, 9:], (0.9 / dbar).expand(7))


def test_the_floor_and_the_entropy_gate():
    div = torch.tensor([[0.001, 0.0011, 0.001, 0.05, 0.001]])  # a spike, but below the 0.1-nat floor
    mask = torch.ones_like(div, dtype=torch.bool)
    assert find_departures(div, mask, DivergenceConfig()).tolist() == [-1]
    assert find_departures(div, mask, DivergenceConfig(floor=0.01)).tolist() == [3]
    div = _planted(at=6)
    entropy = torch.full_like(div, 0.2)
    gated = DivergenceConfig(entropy_min=0.5)
    assert find_departures(div, mask.new_ones(div.shape), gated, entropy).tolist() == [-1]  # a confident slip
    entropy[0, 6] = 1.0
    assert find_departures(div, mask.new_ones(div.shape), gated, entropy).tolist() == [6]


def test_weights_are_neutral_when_the_teacher_is_the_student_and_at_strength_zero():
    torch.manual_seed(0)
    logits = torch.randn(3, 9, 17)
    student = torch.log_softmax(logits, -1)
    tokens = torch.randint(0, 17, (3, 9))
    mask = torch.rand(3, 9) > 0.2
    for measure in ("kl", "logp_gap"):
        div, ent = token_divergence(student, student.clone(), tokens, measure)
        assert torch.equal(div, torch.zeros_like(div))
        w, dep = divergence_weights(div, mask, DivergenceConfig(measure=measure))
        assert torch.equal(w, torch.ones_like(w)) and (dep == -1).all()
    teacher = torch.log_softmax(torch.randn(3, 9, 17), -1)
    div, _ = token_divergence(student, teacher, tokens)
    w, _ = divergence_weights(div, mask, DivergenceConfig(strength=0))
    assert torch.equal(w, torch.ones_like(w))


def test_token_divergence_against_hand_computed_values():
    s = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    t = torch.log(torch.tensor([[[0.25, 0.5, 0.25]]]))
    div, ent = token_divergence(s, t, torch.tensor([[0]]), "kl")
    kl = 0.5 * math.log(2) + 0.25 * math.log(0.5)
    assert div.item() == pytest.approx(kl)
    assert ent.item() == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    gap, _ = token_divergence(s, t, torch.tensor([[0]]), "logp_gap")
    assert gap.item() == pytest.approx(math.log(2))  # log 0.5 - log 0.25
    gap, _ = token_divergence(s, t, torch.tensor([[1]]), "logp_gap")
    assert gap.item() == 0.0  # the teacher likes the token more: no departure there (clipped at 0)
    # chunking does not change anything
    big_s = torch.log_softmax(torch.randn(40, 5, 11), -1)
    big_t = torch.log_softmax(torch.randn(40, 5, 11), -1)
    toks = torch.randint(0, 11, (40, 5))
    a, _ = token_divergence(big_s, big_t, toks, chunk=7)
    b, _ = token_divergence(big_s, big_t, toks, chunk=64)
    assert torch.allclose(a, b)


def test_bad_knobs_say_what_is_wrong():
    for knobs, text in ((dict(measure="js"), "measure"), (dict(threshold=-1), "threshold"),
                        (dict(w_min=2.0), "w_min"), (dict(teacher_refresh=-1), "teacher_refresh"),
                        (dict(max_segments=0), "max_segments"), (dict(boundary="tokens"), "boundary"),
                        (dict(weights="linear"), "weights"), (dict(entropy_floor=-0.1), "entropy_floor"),
                        (dict(teacher_schedule="ema"), "teacher_schedule"),
                        (dict(teacher_schedule="initial", teacher_refresh=3), "teacher_refresh")):
        with pytest.raises(UserError, match=text):
            DivergenceConfig(**knobs).validate()


def test_the_signal_on_a_batch_through_teacher_fn():
    torch.manual_seed(1)
    steps, n, v = 6, 2, 7
    student = torch.log_softmax(torch.randn(steps, n, v), -1)
    teacher = student.clone()
    teacher[4, 0] = torch.log_softmax(torch.randn(v) * 5, -1)  # sequence 0 departs at step 4
    calls = []

    def teacher_fn(refresh, reference):
        calls.append((refresh, reference))
        return student, teacher

    mask = torch.ones(steps, n, dtype=torch.bool)
    batch = Batch(obs=torch.zeros(steps, n, 1), actions=torch.zeros(steps, n, dtype=torch.long),
                  rewards=torch.zeros(steps, n), terminations=torch.zeros(steps, n, dtype=torch.bool),
                  truncations=torch.zeros(steps, n, dtype=torch.bool), values=torch.zeros(steps, n),
                  next_values=torch.zeros(steps, n), mask=mask, teacher_fn=teacher_fn)
    sig = DivergenceReweighting(DivergenceConfig(min_history=2, floor=0.01, teacher_refresh=3, reference="answer"))
    sig.bind(SignalContext(obs_dim=1, action_dim=0, discrete=False, feature_dim=1, learning_rate=1e-3, gamma=1.0,
                           gae_lambda=1.0, seed=0, total_iterations=1))
    out = sig.after_advantages(batch)
    assert calls == [(3, "answer")]
    assert out.weights.shape == (steps, n)
    assert torch.equal(out.weights[:, 1], torch.ones(steps))  # sequence 1: the teacher agrees everywhere
    assert len(set(out.weights[4:, 0].tolist())) == 1 and out.weights[4, 0] > 1  # one segment weight
    metrics = sig.metrics()
    assert metrics["segments_per_completion"] == 0.5 and metrics["segment_length_mean"] == 2.0
    assert metrics["departure_token_share"] == pytest.approx(2 / 12)
    # seq 0's four aligned tokens have d = 0 (w_min), its segment's two one weight, seq 1's six are 1
    assert metrics["weights_min"] == 0.5 and metrics["weights_max"] == out.weights[4, 0].item()
    assert metrics["weights_p10"] == 0.5 and metrics["weights_p50"] == 1.0 and 1 < metrics["weights_p90"]
    assert metrics["segment_weight_mean"] == pytest.approx(out.weights[4, 0].item())
    assert metrics["segment_weight_std"] == 0.0 and 0 < metrics["weights_std"]
    # teacher_schedule=initial asks the trainer for a copy that is never refreshed
    calls.clear()
    initial = DivergenceReweighting(DivergenceConfig(teacher_schedule="initial"))
    initial.after_advantages(batch)
    assert calls == [(NEVER, "solution")]


def test_divergence_is_refused_off_language_models():
    from reflectrl.registry import parse_algo

    with pytest.raises(UserError, match="language model"):
        parse_algo("ppo+divergence", "control")
    assert parse_algo("grpo+gear+divergence", "llm").signals == ("gear", "divergence")


# ---------------------------------------------------------------------------- the teacher pass

def test_teacher_inputs_put_the_reference_between_prompt_and_completion(tiny_model_dir):
    from reflectrl.llm.model import load_model
    from reflectrl.llm.tasks import make_task
    from reflectrl.llm.tasks.base import reference_hint
    from reflectrl.trainers.grpo.trainer import rollout, teacher_inputs, teacher_logprobs, token_logprobs

    model, tok = load_model(str(tiny_model_dir))
    task = make_task("tools")
    import random

    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(3)]
    torch.manual_seed(0)
    episodes = rollout(model, tok, task, problems, max_new_tokens=6)
    ids, attention, prompt_len, hint_len = teacher_inputs(tok, task, episodes)
    for i, problem in enumerate(problems):
        hint = tok.encode(reference_hint(task, problem), add_special_tokens=False)
        p, h = int(prompt_len[i]), int(hint_len[i])
        assert h == len(hint) and ids[i, p:p + h].tolist() == hint
        n = int(episodes.attention[i].sum())
        assert ids[i, p + h:p + h + n - p].tolist() == episodes.ids[i, p:n].tolist()
    steps = episodes.ids.shape[1] - 1
    lt = teacher_logprobs(model, tok, task, episodes, steps=steps)
    with torch.no_grad():
        direct = torch.log_softmax(model(input_ids=ids, attention_mask=attention).logits.float(), -1)
    i, p, h = 0, int(prompt_len[0]), int(hint_len[0])
    assert torch.allclose(lt[i, p - 1], direct[i, p - 1 + h], atol=1e-5)  # the step that samples token p
    # a teacher reading no reference would equal the student: compare with the student's own pass
    _, _, student = token_logprobs(model, episodes.ids, episodes.attention, with_logits=True)
    assert student.shape == lt.shape
    assert torch.allclose(lt[i, :p - 1], student[i, :p - 1], atol=1e-5)  # prompt steps: the same context


def test_reference_hint_uses_the_demonstration_or_the_answer():
    import random

    from reflectrl.llm.tasks import make_task
    from reflectrl.llm.tasks.base import reference_hint

    task = make_task("tools[reflect=both]")
    problem = task.sample(random.Random(2))
    solution = task.reference(problem)
    assert solution.splitlines()[-1] == f"answer {problem.answer}"  # no reflection in the ground truth
    assert task.reference(problem, "answer") == str(problem.answer)
    assert reference_hint(task, problem).startswith("Reference:\n")


def test_sft_reference_share_puts_the_hint_in_context_only(tiny_model_dir):
    import random

    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import demonstration_tokens
    from reflectrl.llm.tasks import make_task
    from reflectrl.llm.tasks.base import reference_hint

    _, tok = load_model(str(tiny_model_dir))
    task = make_task("tools")
    problem = task.sample(random.Random(0))
    plain_ids, plain_agent = demonstration_tokens(tok, task, problem)
    ids, agent = demonstration_tokens(tok, task, problem, reference_hint(task, problem))
    hint = tok.encode(reference_hint(task, problem), add_special_tokens=False)
    assert len(ids) == len(plain_ids) + len(hint)
    assert [t for t, a in zip(ids, agent) if a] == [t for t, a in zip(plain_ids, plain_agent) if a]


# ---------------------------------------------------------------------------- the trainer

@pytest.mark.slow
def test_divergence_at_strength_zero_is_grpo(sft_arith_model_dir):
    from test_llm import _trained

    start, plain, _ = _trained(sft_arith_model_dir)
    _, zero, row = _trained(sft_arith_model_dir, algo="grpo+divergence", **{"divergence.strength": 0})
    _, weighted, wrow = _trained(sft_arith_model_dir, algo="grpo+divergence", **{"divergence.floor": 0.0})
    assert not torch.equal(start, plain)
    assert "divergence_mean" in row and row["weights_mean"] == 1.0 and 0 < row["teacher_time_fraction"] < 1
    assert torch.equal(plain, zero)
    assert wrow["weights_std"] > 0 and not torch.equal(plain, weighted)


def test_divergence_trains_with_a_frozen_teacher_and_resumes(tiny_model_dir, monkeypatch):
    from test_llm import _params, _rewarding, _trainer

    def build():
        return _rewarding(_trainer(tiny_model_dir, algo="grpo+divergence", task="tools",
                                   **{"divergence.teacher_refresh": 2, "num_iterations": 2}), monkeypatch)

    trainer = build()
    rows = [trainer.train_step() for _ in range(3)]
    assert all(math.isfinite(r["loss"]) for r in rows) and "segment_length_mean" in rows[-1]
    state = copy.deepcopy(trainer.state_dict())  # a snapshot: the trainer goes on
    assert state["teacher"] is not None and state["teacher_step"] == 2
    trainer.train_step()  # the uninterrupted run's step 4, which reads the teacher of step 2
    again = build()
    again.load_state_dict(state)
    loaded = _params(again)
    for model, saved in ((again.model, state["model"]), (again.frozen_teacher, state["teacher"])):
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, saved[name]), name
    assert math.isfinite(again.train_step()["loss"])
    assert not torch.equal(loaded, _params(again))  # training went on after loading ...
    assert torch.equal(_params(again), _params(trainer))  # ... to where the uninterrupted run is
    for a, b in zip(again.frozen_teacher.parameters(), trainer.frozen_teacher.parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_grpo_trains_with_several_segments_and_an_initial_teacher(tiny_model_dir, monkeypatch):
    from test_llm import _params, _rewarding, _trainer

    # the random tiny model's teacher barely differs from its student (d ~ 1e-4 nats): a low threshold, no floor
    knobs = {"divergence.max_segments": 4, "divergence.boundary": "both", "divergence.threshold": 0.0,
             "divergence.min_history": 1, "divergence.floor": 0.0, "divergence.entropy_floor": 0.0,
             "divergence.teacher_schedule": "initial", "max_new_tokens": 12}
    trainer = _rewarding(_trainer(tiny_model_dir, algo="grpo+divergence", task="tools", **knobs), monkeypatch)
    start = _params(trainer)
    rows = [trainer.train_step() for _ in range(2)]
    assert all(math.isfinite(r["loss"]) for r in rows) and not torch.equal(start, _params(trainer))
    row = rows[-1]
    for key in ("segments_per_completion", "segment_length_mean", "weights_p10", "weights_p90", "segment_weight_std"):
        assert key in row, key
    assert row["segments_max"] >= 2 and row["segments_per_completion"] > 0  # several segments in a completion
    assert 0.5 <= row["weights_min"] <= row["weights_p10"] <= row["weights_p90"] <= row["weights_max"] <= 2.0
    teacher = torch.cat([q.reshape(-1) for q in trainer.frozen_teacher.parameters()])
    assert torch.equal(teacher, start)  # the initial policy, not refreshed


# ---------------------------------------------------------------------------- GEAR's seed items

def _gear(**knobs):
    from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting

    sig = GEARReweighting(GEARConfig(**knobs))
    sig.bind(SignalContext(obs_dim=3, action_dim=0, discrete=False, feature_dim=3, learning_rate=1e-3, gamma=1.0,
                           gae_lambda=1.0, seed=0, total_iterations=10))
    return sig


def _group_batch(seed=0, steps=5, n=8, group_size=4):
    g = torch.Generator().manual_seed(seed)
    rewards_seq = (torch.rand(n, generator=g) > 0.5).float()
    rewards_seq[4:] = 1.0  # the second group: every completion solved, advantage 0
    grouped = rewards_seq.view(-1, group_size)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).reshape(-1)
    rewards = torch.zeros(steps, n)
    rewards[-1] = rewards_seq
    term = torch.zeros(steps, n, dtype=torch.bool)
    term[-1] = True
    feats = torch.randn(steps, n, 3, generator=g)
    return Batch(obs=feats, actions=torch.zeros(steps, n), rewards=rewards, terminations=term,
                 truncations=torch.zeros_like(term), values=torch.zeros(steps, n), next_values=torch.zeros(steps, n),
                 advantages=adv[None, :].expand(steps, n).clone(), features=feats,
                 mask=torch.ones(steps, n, dtype=torch.bool),
                 groups=(torch.arange(n) // group_size)[None, :].expand(steps, n).contiguous())


def test_rank_groups_replaces_each_advantage_by_the_standardised_mean_reweighted_one():
    sig = _gear(rank_groups=True)
    batch = _group_batch()
    w = torch.rand(batch.values.shape, generator=torch.Generator().manual_seed(3)) + 0.5
    term = sig._ranked(batch, w, batch.mask)
    final = w * batch.advantages + term  # what the trainer applies: weights, then the advantage term
    s = (w * batch.advantages).mean(0)
    expected = torch.zeros(8)
    for lo in (0, 4):
        grp = s[lo:lo + 4]
        expected[lo:lo + 4] = (grp - grp.mean()) / (grp.std() + 1e-4)
    assert torch.allclose(final, w * expected[None, :], atol=1e-5)
    assert torch.equal(final[:, 4:], torch.zeros(5, 4))  # the all-solved group keeps advantage 0


def test_rank_groups_is_refused_where_there_are_no_groups():
    from reflectrl.registry import signal_spec
    from reflectrl.signals.gear import GEARConfig

    with pytest.raises(UserError, match="rank_groups"):
        signal_spec("gear").check(GEARConfig(rank_groups=True), "ppo", "ppo+gear")
    signal_spec("gear").check(GEARConfig(rank_groups=True), "grpo", "grpo+gear")


def test_history_refits_past_winners_and_logs_the_heldout_loss():
    sig = _gear(history=2, epochs=1)
    sizes = []
    for seed in range(4):
        sig.after_update(_group_batch(seed))
        sizes.append(len(sig.past))
    assert sizes == [1, 2, 2, 2]  # the last two distillations are kept
    assert "value_head_heldout_loss" in sig.metrics()
    state = sig.state_dict()
    fresh = _gear(history=2, epochs=1)
    fresh.load_state_dict(state)
    assert len(fresh.past) == 2 and torch.equal(fresh.past[0][0], sig.past[0][0])


def test_target_ema_moves_the_frozen_head_part_of_the_way():
    sig = _gear(target_ema=0.25, epochs=1)
    sig.after_update(_group_batch(0))  # the first distillation copies
    assert all(torch.equal(a, b) for a, b in zip(sig.frozen.parameters(), sig.head.parameters()))
    before = [p.detach().clone() for p in sig.frozen.parameters()]
    sig.after_update(_group_batch(1))
    for old, new, head in zip(before, sig.frozen.parameters(), sig.head.parameters()):
        assert torch.allclose(new, old + 0.25 * (head - old), atol=1e-6)
    with pytest.raises(UserError, match="target_ema"):
        _gear(target_ema=0.0)


# ---------------------------------------------------------------------------- device and precision

def test_device_and_precision_choices():
    from reflectrl.trainers.grpo.trainer import resolve_device

    assert resolve_device("cpu", "auto") == (torch.device("cpu"), False)
    assert resolve_device("cpu", "fp32") == (torch.device("cpu"), False)
    if not torch.cuda.is_available():
        assert resolve_device("auto", "auto") == (torch.device("cpu"), False)
        with pytest.raises(UserError, match="CUDA is not available"):
            resolve_device("cuda", "auto")
    assert resolve_device("cpu", "bf16") == (torch.device("cpu"), True)  # autocast there too, fp32 weights


def test_bad_device_is_one_line(tiny_model_dir, tmp_path, capsys):
    from reflectrl.cli import main

    code = main(["llm", "train", "--model", str(tiny_model_dir), "--out", str(tmp_path / "r"), "--device", "tpu"])
    assert code != 0 and "--device tpu" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_gradient_checkpointing_trains(tiny_model_dir, monkeypatch):
    from test_llm import _params, _rewarding, _trainer

    def one_step(checkpointing: str):
        trainer = _rewarding(_trainer(tiny_model_dir, algo="grpo+divergence", task="tools", device="cpu",
                                      precision="fp32", gradient_checkpointing=checkpointing), monkeypatch)
        model = trainer.model
        # each call of a module inside the first decoder layer (checkpointing wraps the layer's forward, so
        # these run again when the backward pass recomputes it), and whether it built a graph
        layer, calls = next(module for name, module in model.named_modules() if name.endswith("layers.0")), []
        for sub in layer.modules():
            if sub is not layer:
                sub.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
        start = _params(trainer)
        row = trainer.train_step()
        # transformers 5 renamed it activation checkpointing (the old name warns)
        flag = getattr(model, "is_activation_checkpointing", None)
        flag = model.is_gradient_checkpointing if flag is None else flag
        return flag, calls, start, row, _params(trainer)

    plain = one_step("false")
    flag, calls, start, row, trained = one_step("true")
    assert flag and not plain[0]
    # active in the forward pass: the backward pass ran the layer's modules again, to recompute the
    # activations the forward did not keep
    assert plain[1].count(True) > 0 and calls.count(True) > plain[1].count(True)
    # and the step it trains is the plain one
    assert math.isfinite(row["loss"]) and row["loss"] == pytest.approx(plain[3]["loss"], abs=1e-6)
    assert torch.equal(start, plain[2]) and not torch.equal(start, trained)
    assert torch.allclose(trained, plain[4], rtol=0, atol=1e-6)
