"""llm/packing.py: a group's shared prompt computed once in the update's forward passes. The
packed forward gives the unpacked log-probabilities and gradients (sdpa and eager attention, with
and without activation checkpointing, whole groups or a few rows to a packed row), and a GRPO
step with it trains the same weights."""

import pytest
import torch

pytest.importorskip("transformers")

from reflectrl.llm import decode, packing  # noqa: E402
from reflectrl.trainers.grpo.trainer import token_logprobs  # noqa: E402


def _episodes(vocab: int, seed: int = 0):
    """Two groups (3 and 2 rows) with prompts of 5 and 7 tokens, then tails of different lengths,
    right-padded; the rows' first agent tokens."""
    g = torch.Generator().manual_seed(seed)
    rows, firsts = [], []
    for count, p in ((3, 5), (2, 7)):
        prompt = torch.randint(0, vocab, (p,), generator=g)
        for k in range(count):
            tail = torch.randint(0, vocab, (3 + 2 * k,), generator=g)
            rows.append(torch.cat([prompt, tail]))
            firsts.append(p)
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], attention[i, :len(r)] = r, 1
    return ids, attention, torch.tensor(firsts)


def test_groups_and_the_layout():
    ids, attention, firsts = _episodes(50)
    assert packing.groups(ids, firsts) == [(0, 3, 5), (3, 2, 7)]
    assert packing.groups(ids, firsts, max_rows=2) == [(0, 2, 5), (2, 1, 5), (3, 2, 7)]
    p = packing.pack(ids, attention, firsts)
    assert p.ids.shape == (2, 5 + 3 + 5 + 7)  # the first group: its prompt once, then tails of 3, 5, 7
    for r in range(ids.shape[0]):  # every real token of every row sits at its place in its packed row
        n = int(attention[r].sum())
        assert torch.equal(p.ids[p.group[r, :n], p.index[r, :n]], ids[r, :n])
        assert torch.equal(p.positions[p.group[r, :n], p.index[r, :n]], torch.arange(n))
    # the second tail of group 0 sees the prompt and itself, never the first tail
    mask = p.mask[0, 0]
    assert mask[5 + 3, :5].all() and not mask[5 + 3, 5:8].any() and mask[5 + 3, 8]


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=5000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("max_rows", [0, 2])
def test_packed_logprobs_and_gradients_equal_the_unpacked(llama, monkeypatch, attn, checkpointing, max_rows):
    model = llama
    model.config._attn_implementation = attn
    on, off = (("activation_checkpointing_enable", "activation_checkpointing_disable")
               if hasattr(model, "activation_checkpointing_enable")  # transformers 5's name
               else ("gradient_checkpointing_enable", "gradient_checkpointing_disable"))
    if checkpointing:
        getattr(model, on)(**{on.replace("enable", "kwargs"): {"use_reentrant": False}})
    else:
        getattr(model, off)()
    model.train()
    monkeypatch.setattr(packing, "best_rows", lambda *a, **k: max_rows or 99)
    ids, attention, firsts = _episodes(model.config.vocab_size)
    start = int(firsts.min()) - 1
    agent = torch.arange(ids.shape[1] - 1)[None, :] + 1 >= firsts[:, None]
    agent &= attention[:, 1:].bool()

    def run(**kw):
        model.zero_grad(set_to_none=True)
        logp, hidden = token_logprobs(model, ids, attention, temperature=0.8, chunk=3, start=start, **kw)
        (logp * agent).sum().backward()
        return logp.detach(), hidden.detach(), [p.grad.clone() for p in model.parameters()]

    plain, plain_hidden, plain_grads = run()
    packed, packed_hidden, packed_grads = run(prompt_lengths=firsts)
    assert torch.allclose(packed[agent], plain[agent], rtol=0, atol=1e-5)
    real = attention.bool()
    assert torch.allclose(packed_hidden[real], plain_hidden[real], rtol=0, atol=1e-5)
    for a, b in zip(packed_grads, plain_grads):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    getattr(model, off)()
    model.config._attn_implementation = "sdpa"


def test_the_cost_model_packs_short_tails_whole_and_long_ones_in_parts(llama):
    per_token, per_pair = 3.5e6, 1152.0  # SmolLM2-135M's layer
    attention = torch.ones(32, 199, dtype=torch.long)
    spans = [(8 * g, 8, 71) for g in range(4)]
    assert packing.best_rows(attention, spans, per_token, per_pair) == 4
    attention[:, 71 + 32:] = 0
    assert packing.best_rows(attention, spans, per_token, per_pair) == 8
    assert packing.best_rows(attention, [(g, 1, 71) for g in range(32)], per_token, per_pair) == 1
    assert packing.costs(llama) == (32 * 32 * 2 + 32 * 16 * 2 + 32 * 64 * 3, 2 * 4 * 8)


def test_a_step_with_shared_prompts_trains_the_same_weights(tiny_model_dir, monkeypatch):
    from test_llm import _params, _rewarding, _trainer

    monkeypatch.setattr(decode, "SMALL_VOCAB", 0)  # the tiny model's log-probabilities chunked, hence packed
    out, original = [], packing.pack
    for share in (False, True):
        trainer = _rewarding(_trainer(tiny_model_dir, max_new_tokens=8, logprob_chunk=2, decoder="generate",
                                      share_prompts=share), monkeypatch)
        packed_calls = []
        monkeypatch.setattr(packing, "pack", lambda *a, **k: packed_calls.append(1) or original(*a, **k))
        monkeypatch.setattr(packing, "best_rows", lambda *a, **k: 4)
        row = trainer.train_step()
        out.append((_params(trainer), row, len(packed_calls)))
    (plain, plain_row, plain_calls), (shared, shared_row, shared_calls) = out
    assert plain_calls == 0 and shared_calls >= 1
    assert shared_row["loss"] == pytest.approx(plain_row["loss"], abs=1e-5)
    assert torch.allclose(shared, plain, rtol=0, atol=1e-5)
