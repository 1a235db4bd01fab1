"""A GRPO batch with each group's shared prompt computed once: the group packed into one row.

A GRPO batch holds `group_size` episodes of each prompt, all starting with the same prompt tokens.
The update's forward (and the reference's) runs the decoder over every row, so each prompt is
computed `group_size` times; at SmolLM2's chat prompts (~70 tokens) and 128-token completions
that is about a third of the update's work. Packed, a group is one row: its prompt once, then
each episode's tokens after the prompt, one segment after another. A 4D attention mask lets a
segment see the prompt and its own earlier tokens only, and each token keeps its original
position id, so every hidden state equals the unpacked one (up to float rounding; the logits of
step t are read from the token at position t as before). Works with activation checkpointing
and LoRA (it is only a change of inputs), for decoders that take a 4D mask and position ids
(transformers' Llama, Qwen, Mistral, ...).

The mask hides the other segments, but attention still computes every query-key pair of a packed
row: a group of long completions packs best a few episodes to a row. `best_rows` picks that number
from a cost model (a layer's weights per token, its attention per pair); at 4 x 8 episodes of
~70 + 128 tokens on SmolLM2 it picks 4 (measured on this CPU, forward + backward with activation
checkpointing: 8 to a row 110 s, 4 to a row 102 s, 2 to a row 106 s, unpacked 115-124 s).

`plan(model, ids, attention, prompt_lengths)` decides and packs; `pack(ids, attention,
prompt_lengths, max_rows=...)` returns the packed inputs and the index that maps the packed hidden
states back to the (N, L) layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Packed:
    ids: torch.Tensor        # (G, W) token ids, one row per group
    mask: torch.Tensor       # (G, 1, W, W) bool: True where a query may attend to a key
    positions: torch.Tensor  # (G, W) position ids
    group: torch.Tensor      # (N, L) the packed row of each original (row, position)
    index: torch.Tensor      # (N, L) its place in that row

    def to(self, device) -> Packed:
        return Packed(*(t.to(device) for t in (self.ids, self.mask, self.positions, self.group, self.index)))

    def attention_mask(self, model) -> torch.Tensor:
        """The mask in the form the model's attention takes: bool for sdpa, additive for eager."""
        if model.config._attn_implementation == "sdpa":
            return self.mask
        dtype = next(model.parameters()).dtype
        return torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill(
            ~self.mask, torch.finfo(dtype).min)

    def unpack(self, hidden: torch.Tensor) -> torch.Tensor:
        """(G, W, H) packed hidden states -> (N, L, H) in the original layout (differentiable)."""
        return hidden[self.group, self.index]


def supported(model) -> bool:
    """Whether the model's attention takes a custom 4D mask (sdpa and eager do; flash-attention does not)."""
    return getattr(model.config, "_attn_implementation", None) in ("sdpa", "eager")


def groups(ids: torch.Tensor, prompt_lengths: torch.Tensor, max_rows: int = 0) -> list[tuple[int, int, int]]:
    """(first row, rows, prompt length) of each run of consecutive rows with the same prompt, at most
    `max_rows` rows a run where given."""
    out, n = [], ids.shape[0]
    first = 0
    for i in range(1, n + 1):
        p = int(prompt_lengths[first])
        if (i == n or int(prompt_lengths[i]) != p or not torch.equal(ids[i, :p], ids[first, :p])
                or 0 < max_rows <= i - first):
            out.append((first, i - first, p))
            first = i
    return out


def plan(model, ids: torch.Tensor, attention: torch.Tensor, prompt_lengths: torch.Tensor) -> Packed | None:
    """The batch packed as the cost model prefers, on the batch's device, or None where packing saves
    nothing (no prompt shared by two rows, one row to a packed row) or the attention takes no 4D mask."""
    if not supported(model):
        return None
    device = ids.device
    ids, attention, prompt_lengths = ids.cpu(), attention.cpu(), prompt_lengths.cpu()
    spans = groups(ids, prompt_lengths)
    if len(spans) == ids.shape[0]:
        return None
    rows = best_rows(attention, spans, *costs(model))
    return pack(ids, attention, prompt_lengths, max_rows=rows).to(device) if rows > 1 else None


def costs(model) -> tuple[float, float]:
    """(multiply-adds per token in a decoder layer's weights, per query-key pair in its attention): the
    packed row's cost model. The mask hides other segments but the attention still computes every
    pair of a row, so long rows pay quadratically for what packing saves linearly."""
    config = model.config.get_text_config()
    layer = model.get_decoder().layers[0]
    per_token = sum(p.numel() for n, p in layer.named_parameters() if p.dim() == 2 and "lora_" not in n)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return float(per_token), float(2 * config.num_attention_heads * head_dim)


def best_rows(attention: torch.Tensor, spans: list[tuple[int, int, int]], per_token: float,
              per_pair: float) -> int:
    """The most rows of a group to pack into one row (1: no packing) that minimises the cost model."""
    lengths = attention.long().sum(1).tolist()
    largest = max(count for _, count, _ in spans)

    def cost(k: int) -> float:
        total = 0.0
        for first, count, p in spans:
            tails = [lengths[r] - p for r in range(first, first + count)]
            for s in range(0, count, k):
                width = p + sum(tails[s:s + k])
                total += width * per_token + width * width * per_pair
        return total

    return min(range(1, largest + 1), key=cost)


def pack(ids: torch.Tensor, attention: torch.Tensor, prompt_lengths: torch.Tensor, pad: int = 0,
         max_rows: int = 0) -> Packed:
    """Pack right-padded rows (`attention` 1 on each row's first tokens) whose first
    `prompt_lengths[r]` tokens are a prompt shared with the neighbouring rows of its group, at most
    `max_rows` rows to a packed row (0: a whole group)."""
    n, width = ids.shape
    lengths = attention.long().sum(1).tolist()
    spans = groups(ids, prompt_lengths, max_rows)
    rows_ids, rows_seg, rows_pos = [], [], []
    group = torch.zeros(n, width, dtype=torch.long)
    index = torch.zeros(n, width, dtype=torch.long)
    for g, (first, count, p) in enumerate(spans):
        toks, seg, pos = [ids[first, :p]], [torch.zeros(p, dtype=torch.long)], [torch.arange(p)]
        at = p
        for k, r in enumerate(range(first, first + count)):
            tail = lengths[r] - p
            toks.append(ids[r, p:lengths[r]])
            seg.append(torch.full((tail,), k + 1, dtype=torch.long))
            pos.append(torch.arange(p, lengths[r]))
            group[r] = g
            index[r, :p] = torch.arange(p)
            index[r, p:lengths[r]] = torch.arange(at, at + tail)
            index[r, lengths[r]:] = at + tail - 1 if tail > 0 else p - 1  # padding: read any real token
            at += tail
        rows_ids.append(torch.cat(toks))
        rows_seg.append(torch.cat(seg))
        rows_pos.append(torch.cat(pos))
    w = max(len(r) for r in rows_ids)
    g_ids = torch.full((len(spans), w), pad, dtype=ids.dtype)
    seg = torch.full((len(spans), w), -1, dtype=torch.long)  # -1: padding
    positions = torch.zeros((len(spans), w), dtype=torch.long)
    for g, (t, s, q) in enumerate(zip(rows_ids, rows_seg, rows_pos)):
        g_ids[g, :len(t)], seg[g, :len(s)], positions[g, :len(q)] = t, s, q
    causal = torch.ones(w, w, dtype=torch.bool).tril()
    sq, sk = seg[:, :, None], seg[:, None, :]
    mask = causal & (sk >= 0) & ((sk == 0) | (sk == sq))
    mask |= torch.eye(w, dtype=torch.bool)  # a padding query sees itself: no row of the softmax is empty
    return Packed(g_ids, mask[:, None], positions, group, index)
