"""Sampling completions from a causal LM with a KV cache: a lean loop for the CPU.

`transformers`' `generate` does the same job, and stays the decoder for small vocabularies (the
tiny model's pinned runs draw from it). For a real vocabulary (SmolLM2's 49,152 tokens) three
costs of `generate` dominate a GRPO step's sampling on this CPU, and this loop avoids each:

- the prompt's prefill: a group's completions share one prompt, so the prompt is run once per
  distinct prompt and its KV cache repeated for the group (1/8 of the prefill at 8 per group);
- drawing a token: `torch.multinomial` draws an exponential variate per vocabulary entry (about
  50 ms a step at 32 x 49k here); inverse-CDF sampling (one uniform per row, a cumulative sum and
  a binary search) draws from the same distribution in a few milliseconds;
- the cache: `generate`'s DynamicCache concatenates each layer's keys and values at every step
  (a copy of the whole cache per token: about 90 ms a step at 32 x 200 tokens here); this one
  writes into buffers allocated once for the whole completion;
- stopping: rows that ended are carried as padding, and the loop stops when every row has.

The distribution sampled is `generate`'s with do_sample, temperature, top_p and top_k=0 (and
`min_new_tokens`: eos suppressed before it); greedy picks the argmax as `generate` does
(tests/test_llm_decode.py checks both against `generate`). The random draws differ from
`generate`'s, so a seeded run's samples differ from what `generate` would have drawn.
"""

from __future__ import annotations

import inspect
from functools import partial

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

SMALL_VOCAB = 4096  # at or below: `generate` (and the update's unchunked log-probabilities)


def vocab_size(model) -> int:
    head = model.get_output_embeddings()
    return head.weight.shape[0] if head is not None else model.config.get_text_config().vocab_size


def use_lean_decoder(model, decoder: str = "auto") -> bool:
    """Whether `decoder` (auto | generate | reflectrl) resolves to this module's loop: auto picks it
    for vocabularies above SMALL_VOCAB (where it is measured faster; bench/llm_vs_trl.py)."""
    if decoder not in ("auto", "generate", "reflectrl"):
        raise ValueError(f"decoder={decoder!r}: use auto, generate or reflectrl")
    if decoder == "auto":
        return vocab_size(model) > SMALL_VOCAB
    return decoder == "reflectrl"


def _groups(ids: torch.Tensor, attention: torch.Tensor) -> list[int]:
    """The sizes of the runs of identical consecutive rows (a GRPO batch lays out each prompt's group
    together)."""
    sizes, start = [], 0
    for i in range(1, ids.shape[0] + 1):
        if i == ids.shape[0] or not (torch.equal(ids[i], ids[start]) and torch.equal(attention[i], attention[start])):
            sizes.append(i - start)
            start = i
    return sizes


def _positions(attention: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch, as `generate` computes them (padding at position 1)."""
    return (attention.long().cumsum(-1) - 1).masked_fill(attention == 0, 1)


def draw(logits: torch.Tensor, *, temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of (N, V) logits: the argmax, or a draw from softmax(logits / temperature)
    restricted to the top-p nucleus (transformers' TopPLogitsWarper: the smallest set of most likely
    tokens whose probability reaches top_p, at least one), by inverse CDF. Returns (N,) long."""
    if greedy:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_p < 1.0:
        ordered, order = logits.sort(-1)  # ascending, as TopPLogitsWarper
        cumulative = ordered.softmax(-1).cumsum(-1)
        remove = cumulative <= 1 - top_p
        remove[:, -1] = False
        logits = logits.masked_fill(remove.scatter(1, order, remove), float("-inf"))
    probs = torch.softmax(logits, -1)
    cdf = probs.cumsum(-1)
    u = torch.rand(logits.shape[0], 1, generator=generator, device=logits.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)


@torch.no_grad()
def sample(model, ids: torch.Tensor, attention: torch.Tensor, *, max_new_tokens: int, eos: int, pad: int,
           temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False, min_new_tokens: int = 0) -> torch.Tensor:
    """`generate`'s output for a left-padded batch: (N, prompt width + new tokens), every row's new
    tokens ending at its first eos and padded with `pad` after it, cut at the longest row."""
    device = model.device
    ids, attention = ids.to(device), attention.to(device).long()
    sizes = _groups(ids, attention)
    firsts = torch.tensor([sum(sizes[:k]) for k in range(len(sizes))], device=device)
    repeats = torch.tensor(sizes, device=device)
    # the shared prompts' prefill, once per distinct prompt, then the cache repeated for each group
    cache = DynamicCache()
    cache.layer_class_to_replicate = partial(BufferedLayer, ids.shape[1] + max_new_tokens)
    with_cache = {_cache_argument(model): cache}  # filled in place by every forward
    logits = model(input_ids=ids[firsts], attention_mask=attention[firsts], position_ids=_positions(attention[firsts]),
                   use_cache=True, logits_to_keep=1, **with_cache).logits[:, -1]
    if len(sizes) < ids.shape[0]:
        cache.batch_repeat_interleave(repeats)  # a tensor of per-row repeats: groups may differ in size
        logits = logits.repeat_interleave(repeats, 0)
    position = _positions(attention)[:, -1]
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    new = []
    for step in range(max_new_tokens):
        if step < min_new_tokens:
            logits[:, eos] = float("-inf")
        token = draw(logits, temperature=temperature, top_p=top_p, greedy=greedy)
        token = token.masked_fill(done, pad)
        new.append(token)
        done |= token == eos
        if bool(done.all()) or step + 1 == max_new_tokens:
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], 1)
        position = position + 1
        logits = model(input_ids=token[:, None], attention_mask=attention, position_ids=position[:, None],
                       use_cache=True, logits_to_keep=1, **with_cache).logits[:, -1]
    return torch.cat([ids, torch.stack(new, 1)], 1)



def _cache_argument(model) -> str:
    """The forward's name for the KV cache: `cache` (transformers >= 5.25), `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft model passes it on
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class BufferedLayer(DynamicLayer):
    """A DynamicCache layer whose keys and values live in buffers of `capacity` positions, allocated
    at the first update: each later update writes in place, and `keys`/`values` are views of the
    filled part (DynamicLayer concatenates, copying the whole layer every token)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            b, h, _, d = key_states.shape
            self._keys = key_states.new_empty(b, h, self.capacity, d)
            self._values = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
            self.length = 0
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"the KV buffer holds {self.capacity} positions; {end} were written")
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats) -> None:
        if self.is_initialized:
            self._keys = self._keys.repeat_interleave(repeats, dim=0)
            self._values = self._values.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self._keys[:, :, :self.length], self._values[:, :, :self.length]
