"""llm/decode.py, the lean sampling loop, against transformers' generate: the same greedy tokens
(shared prompts prefilled once, groups of unequal sizes, left padding, min_new_tokens, stopping at
eos), draws from the same distribution (temperature and top-p as TopPLogitsWarper), its buffered
KV cache, and the rollout and the trainer running on it."""

import pytest
import torch

pytest.importorskip("transformers")

from reflectrl.llm import decode  # noqa: E402
from reflectrl.trainers.grpo.trainer import _left_pad, rollout  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from reflectrl.llm.model import load_model

    model, tokenizer = load_model(str(tiny_model_dir))
    return model.eval(), tokenizer


def _prompts(tokenizer):
    """Three distinct prompts of different lengths in groups of 3, 1 and 2 (left-padded)."""
    texts = ["3+4=", "12+30=", "7+8="]
    rows = [tokenizer.encode(t) for t, k in zip(texts, (3, 1, 2)) for _ in range(k)]
    return _left_pad(rows, tokenizer.pad_token_id)


@pytest.mark.parametrize("min_new_tokens", [0, 5])
def test_greedy_tokens_equal_generate(tiny, min_new_tokens):
    model, tok = tiny
    ids, attention = _prompts(tok)
    assert decode._groups(ids, attention) == [3, 1, 2]
    kw = dict(max_new_tokens=12, pad_token_id=tok.pad_token_id, do_sample=False)
    free = model.generate(input_ids=ids, attention_mask=attention, eos_token_id=None, **kw)[:, ids.shape[1]:]
    eos = int(free[0, 2])  # a token the first row says third: it stops there, other rows elsewhere or never
    kw["eos_token_id"] = eos
    want = model.generate(input_ids=ids, attention_mask=attention, min_new_tokens=min_new_tokens, **kw)
    got = decode.sample(model, ids, attention, max_new_tokens=12, eos=eos, pad=tok.pad_token_id, greedy=True,
                        min_new_tokens=min_new_tokens)
    assert torch.equal(got, want)


def test_rows_stop_at_eos_and_are_padded(tiny):
    model, tok = tiny
    ids, attention = _prompts(tok)
    pad = tok.pad_token_id
    first = decode.sample(model, ids, attention, max_new_tokens=1, eos=0, pad=pad, greedy=True)[:, -1]
    eos = int(first[0])  # the first row's greedy first token: that row ends at once
    out = decode.sample(model, ids, attention, max_new_tokens=6, eos=eos, pad=pad, greedy=True)
    new = out[0, ids.shape[1]:]
    assert new[0] == eos and (new[1:] == pad).all()


def test_draws_follow_the_distribution():
    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0, 0.0]]).repeat(20000, 1)
    for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.8)):
        from transformers.generation.logits_process import TopPLogitsWarper

        warped = TopPLogitsWarper(top_p)(None, logits[:1] / temperature) if top_p < 1 else logits[:1] / temperature
        want = torch.softmax(warped, -1)[0]
        tokens = decode.draw(logits, temperature=temperature, top_p=top_p)
        freq = torch.bincount(tokens, minlength=6).float() / len(tokens)
        # 4 standard errors at 20,000 draws; tokens outside the nucleus are never drawn
        assert torch.all((freq - want).abs() <= 4 * (want * (1 - want) / len(tokens)).sqrt() + 1e-9), (freq, want)
        assert torch.all(freq[want == 0] == 0)
    assert torch.equal(decode.draw(logits[:3], greedy=True), torch.zeros(3, dtype=torch.long))


def test_zero_probability_tokens_are_never_drawn():
    torch.manual_seed(1)
    logits = torch.full((5000, 50), float("-inf"))
    logits[:, 17] = 0.0
    logits[:, 49] = 0.0
    tokens = decode.draw(logits)
    assert set(tokens.tolist()) == {17, 49}


def test_buffered_cache_refuses_overflow(tiny):
    model, tok = tiny
    layer = decode.BufferedLayer(capacity=4)
    k = torch.zeros(2, 1, 3, 8)
    layer.update(k, k)
    assert layer.get_seq_length() == 3
    with pytest.raises(RuntimeError, match="holds 4 positions"):
        layer.update(k, k)


def test_decoder_choice(tiny):
    model, _ = tiny
    assert not decode.use_lean_decoder(model)  # the tiny model's 384 tokens: generate
    assert decode.use_lean_decoder(model, "reflectrl") and not decode.use_lean_decoder(model, "generate")
    with pytest.raises(ValueError, match="decoder="):
        decode.use_lean_decoder(model, "fast")


def test_rollout_greedy_episodes_equal_generates(tiny):
    import random

    from reflectrl.llm.tasks import make_task

    model, tok = tiny
    task = make_task("arith")
    rng = random.Random(0)
    problems = [p for p in (task.sample(rng) for _ in range(3)) for _ in range(2)]
    a = rollout(model, tok, task, problems, max_new_tokens=6, greedy=True, decoder="generate")
    b = rollout(model, tok, task, problems, max_new_tokens=6, greedy=True, decoder="reflectrl")
    assert torch.equal(a.ids, b.ids) and a.turns == b.turns


def test_trainer_steps_with_the_lean_decoder(tiny_model_dir):
    from test_llm import _trainer

    from reflectrl.errors import UserError

    trainer = _trainer(tiny_model_dir, decoder="reflectrl")
    row = trainer.train_step()
    assert row["completion_length"] > 0 and row["generation_seconds"] > 0
    with pytest.raises(UserError, match="decoder=fast"):
        _trainer(tiny_model_dir, decoder="fast")


def test_sampled_evaluation_is_seeded_and_leaves_the_training_rng_alone(tiny_model_dir):
    from test_llm import _trainer

    from reflectrl.errors import UserError

    trainer = _trainer(tiny_model_dir, eval_every=1, eval_problems=4, eval_samples=3)
    state = torch.get_rng_state()
    first = trainer.evaluate()
    assert torch.equal(torch.get_rng_state(), state)
    assert 0.0 <= first["eval_sampled_accuracy"] <= 1.0 and "eval_accuracy" in first
    assert trainer.evaluate() == first  # the same draws at the same step
    assert "eval_sampled_accuracy" not in _trainer(tiny_model_dir, eval_every=1, eval_problems=4).evaluate()
    with pytest.raises(UserError, match="eval_samples=-1"):
        _trainer(tiny_model_dir, eval_samples=-1)
