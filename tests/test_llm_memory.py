"""The LLM trainer's memory options: log-probabilities in chunks of positions (the full-vocabulary
logits never held at once), LoRA adapters (peft) with the base model as the KL reference, bf16
autocast on the CPU, and the per-step time and memory it logs."""

import math

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from test_llm import _params, _rewarding, _trainer  # noqa: E402

from reflectrl.errors import UserError  # noqa: E402
from reflectrl.llm import decode  # noqa: E402
from reflectrl.trainers.grpo.trainer import resolve_device, token_logprobs  # noqa: E402


def _batch(vocab: int, n: int = 3, width: int = 13, seed: int = 0):
    """Right-padded token rows of different lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, width), generator=g)
    attention = torch.ones(n, width, dtype=torch.long)
    for i, length in enumerate(range(width, width - n, -1)):
        attention[i, length:] = 0
    return ids, attention


@pytest.fixture
def chunked_everywhere(monkeypatch):
    """The trainer chunks the tiny model's log-probabilities too (it keeps the whole-batch path for
    vocabularies under SMALL_VOCAB)."""
    monkeypatch.setattr(decode, "SMALL_VOCAB", 0)


def test_chunked_logprobs_and_gradients_equal_the_full_ones(tiny_model_dir):
    from reflectrl.llm.model import load_model

    model, _ = load_model(str(tiny_model_dir))
    ids, attention = _batch(model.config.vocab_size)
    weights = torch.linspace(0.5, 2.0, ids.shape[1] - 1)
    start = 4

    def run(**kw):
        model.zero_grad(set_to_none=True)
        logp, hidden = token_logprobs(model, ids, attention, temperature=0.7, **kw)
        (logp[:, start:] * weights[start:] * attention[:, start + 1:]).sum().backward()
        return logp.detach(), hidden.detach(), [p.grad.clone() for p in model.parameters()]

    full, full_hidden, full_grads = run()
    for chunk in (1, 3, 64):  # one position at a time, a chunk that does not divide the steps, all in one
        logp, hidden, grads = run(chunk=chunk, start=start)
        assert logp.shape == full.shape and torch.equal(hidden, full_hidden)
        assert torch.allclose(logp[:, start:], full[:, start:], rtol=0, atol=1e-5)
        assert torch.equal(logp[:, :start], torch.zeros(ids.shape[0], start))  # the prompt's steps: never read
        for g, f in zip(grads, full_grads):
            assert torch.allclose(g, f, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # a reference or prepass pass: no checkpointing, the same numbers
        logp, _ = token_logprobs(model, ids, attention, temperature=0.7, chunk=3, start=start)
    assert torch.allclose(logp[:, start:], full[:, start:], rtol=0, atol=1e-5)


def test_a_frozen_heads_chunks_run_as_one_matmul_with_the_same_numbers(tiny_model_dir):
    """With the head's weight frozen (LoRA, or the base model's pass) a chunk of positions, a strided
    view, would reach the head as a batched matmul against the weight broadcast per row (about 1.6x
    slower on the CPU); the chunk is made contiguous, so it is one matmul, with the same numbers."""
    from torch.profiler import profile

    from reflectrl.llm.model import load_model

    model, _ = load_model(str(tiny_model_dir))
    ids, attention = _batch(model.config.vocab_size)
    start = 4

    def run():
        model.zero_grad(set_to_none=True)
        logp, hidden = token_logprobs(model, ids, attention, chunk=3, start=start)
        logp[:, start:].sum().backward()
        return logp.detach(), [p.grad.clone() for p in model.get_decoder().parameters() if p.grad is not None]

    trained, trained_grads = run()
    model.get_output_embeddings().weight.requires_grad_(False)  # tied: the input embedding is frozen too
    with profile() as prof:
        frozen, frozen_grads = run()
    assert not [e.key for e in prof.key_averages() if e.key == "aten::bmm"]
    assert torch.allclose(frozen[:, start:], trained[:, start:], rtol=0, atol=1e-6)
    assert frozen_grads and len(frozen_grads) == len(trained_grads) - 1  # all but the shared embedding
    for g, f in zip(frozen_grads, trained_grads[1:]):
        assert torch.allclose(g, f, rtol=1e-5, atol=1e-7)


def test_small_vocabularies_keep_the_whole_batch_path(tiny_model_dir, chunked_everywhere, monkeypatch):
    trainer = _trainer(tiny_model_dir)
    assert trainer.logprob_chunk == trainer.cfg.logprob_chunk > 0
    monkeypatch.setattr(decode, "SMALL_VOCAB", 4096)
    assert _trainer(tiny_model_dir).logprob_chunk == 0  # the tiny model's pinned runs keep their bits


def _one_step(model_dir, monkeypatch, steps=1, **knobs):
    trainer = _rewarding(_trainer(model_dir, max_new_tokens=8, **knobs), monkeypatch)
    start = _params(trainer)
    rows = [trainer.train_step() for _ in range(steps)]
    return trainer, start, rows


def test_a_chunked_step_trains_the_full_steps_weights(tiny_model_dir, monkeypatch):
    full, start, full_rows = _one_step(tiny_model_dir, monkeypatch, logprob_chunk=2, decoder="generate")
    monkeypatch.setattr(decode, "SMALL_VOCAB", 0)
    chunked, start_c, rows = _one_step(tiny_model_dir, monkeypatch, logprob_chunk=2, decoder="generate")
    assert full.logprob_chunk == 0 and chunked.logprob_chunk == 2
    assert torch.equal(start, start_c) and not torch.equal(start, _params(full))
    assert rows[0]["loss"] == pytest.approx(full_rows[0]["loss"], abs=1e-6)
    assert rows[0]["kl"] == full_rows[0]["kl"] == 0  # the reference's pass is chunked too
    assert torch.allclose(_params(full), _params(chunked), rtol=0, atol=1e-6)


def _lora_params(trainer):
    named = dict(trainer.model.named_parameters())
    adapters = {n: p.detach().clone() for n, p in named.items() if "lora_" in n}
    base = {n: p.detach().clone() for n, p in named.items() if "lora_" not in n}
    return adapters, base


def test_lora_trains_only_the_adapters_against_the_base_without_a_copy(tiny_model_dir, chunked_everywhere,
                                                                     monkeypatch):
    trainer = _rewarding(_trainer(tiny_model_dir, max_new_tokens=8, lora_rank=4, lora_targets="q_proj,v_proj"),
                         monkeypatch)
    adapters, base = _lora_params(trainer)
    assert adapters and all(p.requires_grad == ("lora_" in n) for n, p in trainer.model.named_parameters())
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(adapters)
    assert trainer.reference is None  # the reference is the base, adapters off: no second model
    rows = [trainer.train_step() for _ in range(3)]
    after, base_after = _lora_params(trainer)
    assert all(torch.equal(base[n], base_after[n]) for n in base)
    assert any(not torch.equal(adapters[n], after[n]) for n in adapters)
    # B starts at 0: the policy is the base at first, and moves off it once the adapters train
    assert rows[0]["kl"] == 0 and rows[-1]["kl"] > 0
    assert all(math.isfinite(r["loss"]) for r in rows)


def test_lora_with_gradient_checkpointing_trains_the_same_step(tiny_model_dir, chunked_everywhere, monkeypatch):
    plain, start, _ = _one_step(tiny_model_dir, monkeypatch, lora_rank=4)
    checkpointed, start_c, _ = _one_step(tiny_model_dir, monkeypatch, lora_rank=4, gradient_checkpointing="true")
    assert checkpointed.model.get_base_model().is_activation_checkpointing
    assert torch.equal(start, start_c) and not torch.equal(start, _params(plain))
    assert torch.allclose(_params(plain), _params(checkpointed), rtol=0, atol=1e-6)


def test_lora_samples_through_merged_weights_and_puts_the_originals_back(tiny_model_dir, chunked_everywhere,
                                                                         monkeypatch):
    from reflectrl.trainers.grpo.trainer import merged_for_sampling

    trainer, _, _ = _one_step(tiny_model_dir, monkeypatch, steps=2, lora_rank=4, learning_rate=0.05)
    model = trainer.model
    adapters, base = _lora_params(trainer)
    assert any(p.abs().max() > 0 for n, p in adapters.items() if "lora_B" in n)  # the adapters moved off 0
    objects = {n: p for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (3, 12), generator=g)
    attention = torch.ones_like(ids)
    with torch.no_grad():
        unmerged = model(input_ids=ids, attention_mask=attention).logits
        with model.disable_adapter():
            base_model = model(input_ids=ids, attention_mask=attention).logits
        with merged_for_sampling(model):
            merged = model(input_ids=ids, attention_mask=attention).logits
            swapped = [n for n, p in model.named_parameters() if "base_layer.weight" in n and p is not objects[n]]
        again = model(input_ids=ids, attention_mask=attention).logits
    assert not torch.allclose(base_model, unmerged, rtol=0, atol=1e-4)  # the adapters change the policy
    assert torch.allclose(merged, unmerged, rtol=0, atol=1e-5)  # and the merged weights are that policy
    assert torch.equal(again, unmerged)  # the adapters are on again, the weights as before
    assert swapped and len(swapped) == sum("base_layer.weight" in n for n in objects)  # every adapted layer merged
    after = dict(model.named_parameters())
    assert all(after[n] is objects[n] for n in objects)  # the same tensors, not copies
    adapters_after, base_after = _lora_params(trainer)
    assert all(torch.equal(base[n], base_after[n]) for n in base)
    assert all(torch.equal(adapters[n], adapters_after[n]) for n in adapters)
    # a step samples this way, and with lora_merged_sampling=false through the adapters: the same episodes here
    on, _, rows_on = _one_step(tiny_model_dir, monkeypatch, steps=2, lora_rank=4, learning_rate=0.05)
    off, _, rows_off = _one_step(tiny_model_dir, monkeypatch, steps=2, lora_rank=4, learning_rate=0.05,
                                 lora_merged_sampling="false")
    assert [r["completion_length"] for r in rows_on] == [r["completion_length"] for r in rows_off]
    assert torch.allclose(_params(on), _params(off), rtol=0, atol=1e-5)


def test_lora_resumes_exactly_and_saves_a_merged_model(tiny_model_dir, chunked_everywhere, monkeypatch, tmp_path):
    from reflectrl.llm.model import load_model
    from reflectrl.runs import RunDir

    knobs = dict(lora_rank=4, max_new_tokens=8, checkpoint_every=1)
    full = _rewarding(_trainer(tiny_model_dir, steps=3, **knobs), monkeypatch)
    start = _params(full)
    for _ in range(3):
        full.train_step()
    assert not torch.equal(start, _params(full))

    run = RunDir.create(tmp_path / "run", {})
    first = _rewarding(_trainer(tiny_model_dir, steps=3, run=run, **knobs), monkeypatch)
    first.train_step()
    first.train_step()
    first.save_checkpoint()
    del first
    second = _rewarding(_trainer(tiny_model_dir, steps=3, run=run, **knobs), monkeypatch)
    state = run.load_checkpoint()
    second.load_state_dict(state)
    second.train_step()
    assert torch.equal(_params(full), _params(second))

    # the policy with the adapters merged: an ordinary model directory, and the checkpoint's plain weights
    second.save_model(tmp_path / "merged")
    merged, _ = load_model(str(tmp_path / "merged"))
    assert type(merged).__name__ == "LlamaForCausalLM" and not any("lora" in n for n, _ in merged.named_parameters())
    ids, attention = _batch(merged.config.vocab_size)
    second.model.eval()
    with torch.no_grad():
        want = second.model(input_ids=ids, attention_mask=attention).logits
        assert torch.allclose(merged(input_ids=ids, attention_mask=attention).logits, want, rtol=0, atol=1e-5)
        plain, _ = load_model(str(tiny_model_dir))
        plain.load_state_dict(run.load_checkpoint()["model"])  # what `--model RUN` reads from an unfinished run
        assert not torch.equal(plain(input_ids=ids, attention_mask=attention).logits,
                               merged(input_ids=ids, attention_mask=attention).logits)  # a step earlier


def test_bf16_autocasts_on_the_cpu_and_auto_stays_fp32(tiny_model_dir, monkeypatch):
    assert resolve_device("cpu", "bf16") == (torch.device("cpu"), True)
    assert resolve_device("cpu", "auto") == (torch.device("cpu"), False)
    trainer, start, rows = _one_step(tiny_model_dir, monkeypatch, device="cpu", precision="bf16")
    assert trainer.bf16 and next(trainer.model.parameters()).dtype == torch.float32  # fp32 master weights
    assert math.isfinite(rows[0]["loss"]) and not torch.equal(start, _params(trainer))


def test_step_logs_its_time_and_peak_memory(tiny_model_dir, monkeypatch):
    _, _, rows = _one_step(tiny_model_dir, monkeypatch)
    row = rows[0]
    assert 0 < row["generation_seconds"] < row["step_seconds"] and 0 < row["update_seconds"] < row["step_seconds"]
    assert 0.05 < row["peak_memory_gb"] < 64


@pytest.mark.parametrize("knob, message", [
    ("logprob_chunk=-1", "logprob_chunk=-1: must be >= 0"),
    ("lora_rank=-2", "lora_rank=-2: must be >= 0"),
    ("lora_alpha=0", "lora_alpha=0.0: must be a finite number > 0"),
    ("lora_dropout=1", "lora_dropout=1.0: must be in [0, 1)"),
    ("lora_targets=,", "lora_targets=',': name the modules"),
])
def test_bad_memory_knobs_are_one_line(knob, message):
    from reflectrl.trainers.grpo.config import new_llm_config

    with pytest.raises(UserError) as err:
        new_llm_config(model="M", sets=[knob])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_lora_targets_the_model_lacks_are_one_line(tiny_model_dir):
    with pytest.raises(UserError) as err:
        _trainer(tiny_model_dir, lora_rank=4, lora_targets="q_proj,c_attn")
    assert "no module named c_attn" in str(err.value) and "q_proj" in str(err.value)
    assert "\n" not in str(err.value)



MALLOC_PROBE = """
import sys, torch
from reflectrl.llm import malloc
if sys.argv[1] == "on":
    assert malloc.map_large_blocks()
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
warm = torch.ones(30 << 18)  # a 30 MB block freed: glibc raises its mapping threshold past it
del warm
big, keep = [], []
for i in range(40):
    big.append(torch.ones(1 << 20))
    keep.append(torch.ones(10))  # small blocks between the big ones: the heap cannot shrink past them
base = rss()
del big
for i in range(40):
    x = torch.ones(3 << 18)
    del x
print((base - rss()) / 2**20)
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="reads /proc")
def test_released_memory_returns_to_the_system():
    """160 MB of 4 MB tensors freed after a larger block raised glibc's mapping threshold: with
    llm/malloc.py's setting the system gets it all back, without it only part."""
    import subprocess
    import sys

    from reflectrl.llm import malloc

    if not malloc.map_large_blocks():
        pytest.skip("not glibc: mallopt is not there")
    freed = {mode: float(subprocess.run([sys.executable, "-c", MALLOC_PROBE, mode], capture_output=True, text=True,
                                        check=True).stdout) for mode in ("on", "off")}
    assert freed["on"] > 150, freed
    assert freed["on"] > freed["off"] + 20, freed
