"""Teacher-divergence advantage reweighting: the GEAR paper's segments (arXiv 2605.11853).

The teacher is the policy itself, conditioned on the ground truth: the same model reads the
prompt, then the task's reference (a worked solution, or the answer), then the student's
completion, without gradients. Where the student's next-token distribution agrees with the
teacher's, the student is on a path the ground truth supports; where the divergence spikes,
the student has departed from it, and everything after that point is a consequence of the
departure. So:

1. per-token divergence d_t between student and teacher on each completion token:
   `measure="kl"`: KL(student || teacher) over the vocabulary (the default);
   `"logp_gap"`: log p_student(token) - log p_teacher(token), clipped at 0 (the sampled
   token is less likely under the teacher: needs only the two gathered log-probabilities,
   which is what verl's batch carries);
2. the departure: the first completion token whose divergence spikes above the
   completion's running statistics, d_t > mean(d_<t) + `threshold` * std(d_<t), after at least
   `min_history` tokens of history, with d_t >= `floor` (nats; a spike out of a flat,
   near-zero history is noise below it); with `entropy_min` > 0 the student must also be
   uncertain there (entropy of its distribution >= entropy_min nats: a fork, not a slip);
3. weights, relative to the completion's mean divergence dbar:
   inside the aligned span before the departure, token resolution: w_t = (d_t / dbar)^strength;
   from the departure on, one segment with one weight, w = (d_b / dbar)^strength, the
   divergence at the departure point b; clipped to [w_min, w_max] and optionally
   renormalised to mean 1 per completion (as GEAR's), multiplied into the GRPO advantage.

`strength=0` gives w = 1 exactly (GRPO bit for bit); so does a teacher identical to the
student (d = 0 everywhere: dbar = 0 gives w = 1). A completion is one trajectory: in a
multi-turn episode the segment runs across the tool outputs to the last agent token.

DECISIONs where the paper leaves the choice open (docs/llm.md says why):
- one departure per completion (the first spike); the paper's "the rest of the
  continuation is one adaptive segment" makes later spikes part of it;
- the running statistics are over the completion's own earlier tokens (not the batch's), so
  a long, uniformly uncertain completion is not all departure;
- the same weights for positive and negative advantages: a correct completion's departure
  carries more credit, a wrong one's more blame;
- the teacher is the current policy by default (`teacher_refresh=0`); `teacher_refresh=K`
  uses a copy frozen every K steps, which keeps the teacher from drifting with the student.

The trainer provides the distributions (it asks its `Batch.teacher_fn`); this module does
the rest and never sees the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec, register_signal
from reflectrl.signals.base import Batch, Signal, SignalOutput, checked_once

MEASURES = ("kl", "logp_gap")
REFERENCES = ("solution", "answer")


@checked_once
@dataclass
class DivergenceConfig:
    measure: str = "kl"
    """kl: KL(student || teacher) per token; logp_gap: log p_student - log p_teacher of the sampled token"""
    reference: str = "solution"
    """what the teacher reads: the task's worked solution, or only its answer"""
    teacher_refresh: int = 0
    """0: the current policy is the teacher; K: a copy frozen every K steps"""
    threshold: float = 2.0
    """a departure: d_t > running mean + threshold x running std of the completion's earlier tokens"""
    min_history: int = 2
    """earlier completion tokens needed before a spike can be called"""
    floor: float = 0.1
    """and d_t at least this (nats)"""
    entropy_min: float = 0.0
    """and the student's entropy at least this (nats); 0: divergence alone marks departures"""
    strength: float = 1.0
    """w = (d / mean d)^strength; 0: every w = 1 (GRPO bit for bit)"""
    w_min: float = 0.5
    """lower clip of the weights"""
    w_max: float = 2.0
    """upper clip of the weights"""
    renormalize: bool = False
    """rescale the weights to mean 1 per completion"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"divergence.{msg}")

        for name, allowed in (("measure", MEASURES), ("reference", REFERENCES)):
            if getattr(self, name) not in allowed:
                bad(f"{name}='{getattr(self, name)}': use one of {', '.join(allowed)}")
        for name in ("teacher_refresh", "min_history"):
            if getattr(self, name) < 0:
                bad(f"{name}={getattr(self, name)}: must be >= 0")
        for name in ("threshold", "floor", "entropy_min", "strength"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                bad(f"{name}={value}: must be a finite number >= 0")
        if not (0 < self.w_min <= 1 <= self.w_max) or not math.isfinite(self.w_max):
            bad(f"w_min={self.w_min}, w_max={self.w_max}: need 0 < w_min <= 1 <= w_max < inf")


# ------------------------------------------------------------------------ per-token math (batch-major)

def token_divergence(student_logp: torch.Tensor, teacher_logp: torch.Tensor, tokens: torch.Tensor,
                     measure: str = "kl", chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(divergence, student entropy), each (N, L), from log-softmax distributions (N, L, V)
    of the student and the teacher over the same positions and the tokens sampled there
    (N, L). Computed `chunk` sequences at a time, in float32, so a large vocabulary costs
    one chunk's memory."""
    div, ent = [], []
    for s in range(0, student_logp.shape[0], chunk):
        ls, lt = student_logp[s:s + chunk].float(), teacher_logp[s:s + chunk].float()
        p = ls.exp()
        ent.append(-(p * ls).sum(-1))
        if measure == "kl":
            div.append((p * (ls - lt)).sum(-1).clamp(min=0.0))
        else:
            tok = tokens[s:s + chunk, :, None]
            div.append((ls.gather(-1, tok) - lt.gather(-1, tok)).squeeze(-1).clamp(min=0.0))
    return torch.cat(div), torch.cat(ent)


def find_departures(div: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig,
                    entropy: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) the position of each completion's first departure, -1 where it has none.

    Running statistics at a token are over the real (masked-in) tokens before it."""
    m = mask.to(div.dtype)
    d = div * m
    count = torch.cumsum(m, 1) - m                     # real tokens strictly before t
    total = torch.cumsum(d, 1) - d
    total_sq = torch.cumsum(d * d, 1) - d * d
    mean = total / count.clamp(min=1)
    var = (total_sq / count.clamp(min=1) - mean * mean).clamp(min=0.0)
    spike = mask & (count >= max(cfg.min_history, 1)) & (div > mean + cfg.threshold * var.sqrt()) & (div >= cfg.floor)
    if cfg.entropy_min > 0:
        if entropy is None:
            raise ValueError("entropy_min > 0 needs the student's entropy")
        spike = spike & (entropy >= cfg.entropy_min)
    first = spike.long().argmax(1)
    return torch.where(spike.any(1), first, torch.full_like(first, -1))


def divergence_weights(div: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig,
                       entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (N, L), departure (N,)) for divergences `div` (N, L) on completions `mask`
    (bool, N, L); weights are 1 outside the mask."""
    departure = find_departures(div, mask, cfg, entropy)
    if cfg.strength == 0:
        return torch.ones_like(div), departure
    m = mask.to(div.dtype)
    dbar = (div * m).sum(1) / m.sum(1).clamp(min=1)     # (N,)
    flat = dbar <= 1e-12                                  # teacher = student: nothing to reweight
    rel = div / dbar.clamp(min=1e-12)[:, None]
    n, length = div.shape
    positions = torch.arange(length)[None, :].expand(n, length)
    at_departure = rel.gather(1, departure.clamp(min=0)[:, None])  # (N, 1)
    in_segment = (departure[:, None] >= 0) & (positions >= departure[:, None])
    rel = torch.where(in_segment, at_departure.expand(n, length), rel)
    w = rel.pow(cfg.strength).clamp(cfg.w_min, cfg.w_max)
    if cfg.renormalize:
        mean_w = (w * m).sum(1) / m.sum(1).clamp(min=1)
        w = w / mean_w.clamp(min=1e-12)[:, None]
    w = torch.where(mask & ~flat[:, None], w, torch.ones_like(w))
    return w, departure


def segment_stats(departure: torch.Tensor, mask: torch.Tensor) -> dict:
    """Segments per completion (the departure share: one segment at most), their mean length in
    tokens and the share of completion tokens inside them."""
    lengths = mask.sum(1)
    positions = torch.arange(mask.shape[1])[None, :]
    in_segment = mask & (departure[:, None] >= 0) & (positions >= departure[:, None])
    seg_len = in_segment.sum(1)
    has = departure >= 0
    return {"segments_per_completion": has.float().mean().item(),
            "segment_length": seg_len[has].float().mean().item() if has.any() else 0.0,
            "departure_token_share": seg_len.sum().item() / max(lengths.sum().item(), 1)}


# ------------------------------------------------------------------------ the signal

class DivergenceReweighting(Signal):
    name = "divergence"

    def __init__(self, cfg: DivergenceConfig):
        self.built_from(cfg, SPEC)
        self.cfg = cfg
        self._last: dict = {}

    def after_advantages(self, batch: Batch) -> SignalOutput | None:
        cfg = self.cfg
        if batch.teacher_fn is None:
            raise RuntimeError("the divergence signal needs Batch.teacher_fn (a trainer providing 'teacher')")
        student, teacher = batch.teacher_fn(cfg.teacher_refresh, cfg.reference)  # (T, N, V) log-softmax each
        mask = batch.mask.T if batch.mask is not None else torch.ones(batch.actions.T.shape, dtype=torch.bool)
        div, entropy = token_divergence(student.transpose(0, 1), teacher.transpose(0, 1),
                                        batch.actions.T.long().to(student.device), cfg.measure)
        div, entropy = div.cpu(), entropy.cpu()  # the distributions may live on an accelerator
        w, departure = divergence_weights(div, mask, cfg, entropy)
        real_w, real_d = w[mask], div[mask]
        b = departure.clamp(min=0)[:, None]
        at_departure = div.gather(1, b).squeeze(1)[departure >= 0]
        self._last = {"divergence_mean": real_d.mean().item() if real_d.numel() else 0.0,
                      "divergence_max": real_d.max().item() if real_d.numel() else 0.0,
                      "divergence_at_departure": at_departure.mean().item() if at_departure.numel() else 0.0,
                      "student_entropy": entropy[mask].mean().item() if real_d.numel() else 0.0,
                      **segment_stats(departure, mask),
                      "weights_mean": real_w.mean().item() if real_w.numel() else 1.0,
                      "weights_std": real_w.std().item() if real_w.numel() > 1 else 0.0,
                      "weights_min": real_w.min().item() if real_w.numel() else 1.0,
                      "weights_max": real_w.max().item() if real_w.numel() else 1.0,
                      "weights_clipped_frac": ((real_w <= cfg.w_min) | (real_w >= cfg.w_max)).float().mean().item()
                      if real_w.numel() and cfg.strength > 0 else 0.0}
        return SignalOutput(weights=w.T.contiguous())

    def metrics(self) -> dict:
        return dict(self._last)


SPEC = register_signal(SignalSpec(
    name="divergence", config=DivergenceConfig, factory=DivergenceReweighting, step_kinds=("token",),
    summary="the GEAR paper's segments: a ground-truth-conditioned teacher's divergence from the student marks "
            "the departure, from which one weight covers the rest of the completion",
    wants=frozenset({"teacher"}), neutral="strength=0",
    refusals={"env_step": "the divergence signal compares the policy's next-token distributions with its own, "
              "conditioned on the task's reference: it needs a language model and a reference (llm train)",
              "transition": "the divergence signal works on a language model's tokens (llm train)"},
))
