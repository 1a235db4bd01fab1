"""Teacher-divergence advantage reweighting: the GEAR paper's segments (arXiv 2605.11853).

The teacher is the policy itself, conditioned on the ground truth: the same model reads the
prompt, then the task's reference (a worked solution, or the answer), then the student's
completion, without gradients. Where the student's next-token distribution agrees with the
teacher's, the student is on a path the ground truth supports; where the divergence spikes,
the student has departed from it, and what follows is a consequence of the departure, up to
the next point where the student decides again. So:

1. per-token divergence d_t between student and teacher on each completion token:
   `measure="kl"`: KL(student || teacher) over the vocabulary (the default);
   `"logp_gap"`: log p_student(token) - log p_teacher(token), clipped at 0 (the sampled
   token is less likely under the teacher: needs only the two gathered log-probabilities,
   which is what verl's batch carries);
2. spikes: a spike of a per-token series x over a completion is a token t with
   x_t > mean(x_<t) + `threshold` * std(x_<t), the statistics over the completion's real
   tokens before t, of which there are at least `min_history`;
   a departure is a spike of d with d_t >= `floor` (nats; a spike out of a flat, near-zero
   history is noise below it), and, with `entropy_min` > 0, student entropy H_t >= entropy_min
   there (a fork, not a slip); an entropy boundary is a spike of the student's entropy H with
   H_t >= `entropy_floor` (the student is suddenly uncertain: it decides again there);
3. segments, token by token along the completion: an entropy boundary (`boundary=entropy` or
   `both`) ends the open segment, its own token back at token resolution; then a departure
   opens the next segment if fewer than `max_segments` have opened and either no segment is
   open or departures end segments (`boundary=spike` or `both`: the new one ends the old).
   A segment runs to its boundary or to the completion's end; tokens outside the mask (tool
   outputs of a multi-turn episode) are not weighted and do not end it;
4. weights, with rel_t = d_t / dbar, dbar the completion's mean divergence:
   aligned tokens (in no segment) w_t = g(rel_t); segment k one weight for all its tokens,
   `weights="smooth"`: w_k = g(mean of rel over its tokens), g(r) = exp(L tanh(s ln r / L)),
   s = `strength`, L = ln `w_max` where s ln r >= 0 and -ln `w_min` where it is < 0: smooth
   and increasing, g(1) = 1 with r^s's slope there, g(0) = w_min, g -> w_max (a soft clip
   in log space: the weights are continuous inside [w_min, w_max]);
   `weights="step"`: w_k = clip((rel at the segment's first token)^s, w_min, w_max), aligned
   tokens clip(rel_t^s) (issue 19's form: with one segment per completion the weights
   were mostly the two clip values);
   then optionally renormalised to mean 1 per completion (as GEAR's) and multiplied into
   the GRPO advantage.

`strength=0` gives w = 1 exactly (GRPO bit for bit); so does a teacher identical to the
student (d = 0 everywhere: dbar = 0 gives w = 1). `max_segments=1 boundary=spike
weights=step` is issue 19's signal bit for bit (one departure, a segment to the end weighted
by the divergence at the departure; tests/test_divergence.py keeps that function and checks).
A completion is one trajectory: in a multi-turn episode a segment runs across the tool
outputs.

DECISIONs where the paper leaves the choice open (docs/llm.md says why):
- several segments per completion (default `max_segments=4`), each anchored at a departure;
  issue 19's single departure made the first spike, usually within the first tokens, the
  start of one segment covering most of the completion (94% of tokens on tools8);
- boundaries default to `spike` (the next departure), because an entropy boundary needs the
  student's entropy, which verl's batch does not carry; `entropy` and `both` are the paper's
  "entropy for boundaries", for trainers that provide it (ours and TRL's do);
- the segment weight is its mean divergence relative to the completion's (`smooth`), not the
  divergence at its first token: a spike is by definition extreme, so issue 19's weights sat
  at the clip bounds; soft clipping keeps their order where hard clipping ties them;
- the running statistics are over the completion's own earlier tokens (not the batch's), so
  a long, uniformly uncertain completion is not all departure; departures and entropy
  boundaries share `threshold` and `min_history` (one rule for a spike);
- the same weights for positive and negative advantages: a correct completion's departure
  carries more credit, a wrong one's more blame;
- the teacher is the current policy by default (`teacher_refresh=0`); `teacher_refresh=K`
  uses a copy frozen every K steps, which keeps the teacher from drifting with the student;
  `teacher_schedule=initial` a copy of the first step's policy (the warm start, which learned
  to read references) that is never refreshed.

The trainer provides the distributions (it asks its `Batch.teacher_fn`, with
`DivergenceConfig.refresh_interval()`); this module does the rest and never sees the model.
"""

from __future__ import annotations

import math

import torch

from reflectrl.signals.base import Batch, Signal, SignalOutput
from reflectrl.signals.divergence import NEVER, SPEC, DivergenceConfig  # noqa: F401 (NEVER: still importable here)

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


def spikes(x: torch.Tensor, mask: torch.Tensor, threshold: float, min_history: int, floor: float) -> torch.Tensor:
    """(N, L) bool: x_t > mean(x_<t) + threshold * std(x_<t) and x_t >= floor, on real tokens with
    at least max(min_history, 1) real tokens before them (the statistics are over those)."""
    m = mask.to(x.dtype)
    d = x * m
    count = torch.cumsum(m, 1) - m                     # real tokens strictly before t
    total = torch.cumsum(d, 1) - d
    total_sq = torch.cumsum(d * d, 1) - d * d
    mean = total / count.clamp(min=1)
    var = (total_sq / count.clamp(min=1) - mean * mean).clamp(min=0.0)
    return mask & (count >= max(min_history, 1)) & (x > mean + threshold * var.sqrt()) & (x >= floor)


def departure_spikes(div: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig,
                     entropy: torch.Tensor | None = None) -> torch.Tensor:
    """(N, L) bool: the divergence spikes that can open a segment (with entropy_min > 0, only where
    the student's entropy is at least that)."""
    spike = spikes(div, mask, cfg.threshold, cfg.min_history, cfg.floor)
    if cfg.entropy_min > 0:
        if entropy is None:
            raise ValueError("divergence.entropy_min > 0 needs the student's entropy")
        spike = spike & (entropy >= cfg.entropy_min)
    return spike


def find_departures(div: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig,
                    entropy: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) the position of each completion's first departure (its first segment's start), -1
    where it has none."""
    spike = departure_spikes(div, mask, cfg, entropy)
    first = spike.long().argmax(1)
    return torch.where(spike.any(1), first, torch.full_like(first, -1))


def find_segments(div: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig,
                  entropy: torch.Tensor | None = None) -> torch.Tensor:
    """(N, L) int64: k >= 1 on the tokens of a completion's k-th segment, 0 on aligned tokens and
    outside the mask. Token by token: an entropy boundary (boundary=entropy|both) ends the open
    segment (the boundary token is aligned); then a departure spike opens the next segment if
    fewer than max_segments are open so far and either none is open or spikes end segments
    (boundary=spike|both). Tokens outside the mask (tool outputs) keep the state."""
    spike = departure_spikes(div, mask, cfg, entropy)
    spike_ends = cfg.boundary in ("spike", "both")
    ends = None
    if cfg.boundary in ("entropy", "both"):
        if entropy is None:
            raise ValueError(f"divergence.boundary={cfg.boundary} needs the student's entropy")
        ends = spikes(entropy, mask, cfg.threshold, cfg.min_history, cfg.entropy_floor)
    n, length = div.shape
    current = torch.zeros(n, dtype=torch.long)
    opened = torch.zeros(n, dtype=torch.long)
    segments = torch.zeros(n, length, dtype=torch.long)
    for t in range(length):
        if ends is not None:
            current = torch.where(ends[:, t], torch.zeros_like(current), current)
        can_open = spike[:, t] & (opened < cfg.max_segments)
        if not spike_ends:
            can_open = can_open & (current == 0)
        opened = opened + can_open.long()
        current = torch.where(can_open, opened, current)
        segments[:, t] = torch.where(mask[:, t], current, torch.zeros_like(current))
    return segments


def segment_starts(segments: torch.Tensor) -> torch.Tensor:
    """(N, L) bool: each segment's first token (segments are numbered in order along a completion,
    and one may span tokens outside the mask, where the map is 0)."""
    before = torch.nn.functional.pad(torch.cummax(segments, 1).values, (1, 0))[:, :-1]
    return (segments > 0) & (segments > before)


def soft_clip(rel: torch.Tensor, cfg: DivergenceConfig) -> torch.Tensor:
    """w = exp(L tanh(u / L)), u = strength * ln(rel), L = ln(w_max) where u >= 0 and -ln(w_min)
    where u < 0 (w = 1 where that L is 0): smooth and increasing in rel, w = 1 at rel = 1, slope
    rel^strength's there, w_min at rel = 0 and w_max as rel grows (tanh(u/L) ~ u/L near 0)."""
    if cfg.strength == 0:
        return torch.ones_like(rel)
    u = cfg.strength * torch.log(rel)
    up, down = math.log(cfg.w_max), -math.log(cfg.w_min)
    w_up = torch.exp(up * torch.tanh(u / up)) if up > 0 else torch.ones_like(rel)
    w_down = torch.exp(down * torch.tanh(u / down)) if down > 0 else torch.ones_like(rel)
    return torch.where(u >= 0, w_up, w_down)


def segment_weights(div: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig,
                    entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (N, L), segments (N, L) as find_segments) for divergences `div` (N, L) on
    completions `mask` (bool, N, L); weights are 1 outside the mask. With rel = d / dbar (dbar: the
    completion's mean divergence): aligned tokens get g(rel_t), the k-th segment one weight, g of
    its mean rel (weights=smooth, g = soft_clip) or g of rel at its first token (weights=step,
    g = rel^strength clipped to [w_min, w_max])."""
    segments = find_segments(div, mask, cfg, entropy)
    if cfg.strength == 0:
        return torch.ones_like(div), segments
    m = mask.to(div.dtype)
    dbar = (div * m).sum(1) / m.sum(1).clamp(min=1)     # (N,)
    flat = dbar <= 1e-12                                  # teacher = student: nothing to reweight
    rel = div / dbar.clamp(min=1e-12)[:, None]
    k_max = int(segments.max()) if segments.numel() else 0
    if k_max:
        # per (completion, segment): sum of rel, token count, and rel at the segment's first token
        index = segments.clamp(max=k_max)
        sums = torch.zeros(div.shape[0], k_max + 1, dtype=div.dtype).scatter_add_(1, index, rel * m)
        counts = torch.zeros_like(sums).scatter_add_(1, index, m)
        starts = torch.zeros_like(sums)
        first = segment_starts(segments)
        starts.scatter_(1, torch.where(first, index, torch.zeros_like(index)), torch.where(first, rel, 0.0))
        per_segment = sums / counts.clamp(min=1) if cfg.weights == "smooth" else starts
        rel = torch.where(segments > 0, per_segment.gather(1, index), rel)
    if cfg.weights == "smooth":
        w = soft_clip(rel, cfg)
    else:
        w = rel.pow(cfg.strength).clamp(cfg.w_min, cfg.w_max)
    if cfg.renormalize:
        mean_w = (w * m).sum(1) / m.sum(1).clamp(min=1)
        w = w / mean_w.clamp(min=1e-12)[:, None]
    w = torch.where(mask & ~flat[:, None], w, torch.ones_like(w))
    return w, segments


def divergence_weights(div: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig,
                       entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (N, L), departure (N,)): segment_weights' weights and each completion's first
    segment start (-1 where it has none)."""
    w, segments = segment_weights(div, mask, cfg, entropy)
    has = (segments > 0).any(1)
    first = (segments > 0).long().argmax(1)
    return w, torch.where(has, first, torch.full_like(first, -1))


def segment_stats(segments: torch.Tensor, mask: torch.Tensor) -> dict:
    """Segments per completion (mean count and the largest), their mean length in tokens (completion
    tokens) and the share of completion tokens inside them. `segments`: find_segments' map (N, L), or (N,) first
    departures (one segment each, from there to the end)."""
    if segments.dim() == 1:  # departures: one segment from there to the end
        positions = torch.arange(mask.shape[1])[None, :]
        segments = (mask & (segments[:, None] >= 0) & (positions >= segments[:, None])).long()
    count = segments.max(1).values.clamp(min=0)          # segments are numbered 1..count
    in_segment = mask & (segments > 0)
    total = int(count.sum())
    return {"segments_per_completion": count.float().mean().item() if count.numel() else 0.0,
            "segments_max": int(count.max()) if count.numel() else 0,
            "segment_length_mean": in_segment.sum().item() / total if total else 0.0,
            "departure_token_share": in_segment.sum().item() / max(mask.sum().item(), 1)}


def weight_stats(w: torch.Tensor, segments: torch.Tensor, mask: torch.Tensor, cfg: DivergenceConfig) -> dict:
    """The weights' distribution over completion tokens (mean, std, min, max, 10/50/90% quantiles,
    the share at a bound) and over segments (one weight each: mean, std)."""
    real = w[mask].float()
    if not real.numel():
        return {"weights_mean": 1.0, "weights_std": 0.0, "weights_min": 1.0, "weights_max": 1.0, "weights_p10": 1.0,
                "weights_p50": 1.0, "weights_p90": 1.0, "weights_clipped_frac": 0.0, "segment_weight_mean": 1.0,
                "segment_weight_std": 0.0}
    q = torch.quantile(real, torch.tensor([0.1, 0.5, 0.9]))
    seg_w = w[segment_starts(segments)].float()
    return {"weights_mean": real.mean().item(), "weights_std": real.std().item() if real.numel() > 1 else 0.0,
            "weights_min": real.min().item(), "weights_max": real.max().item(),
            "weights_p10": q[0].item(), "weights_p50": q[1].item(), "weights_p90": q[2].item(),
            "weights_clipped_frac": ((real <= cfg.w_min) | (real >= cfg.w_max)).float().mean().item()
            if cfg.strength > 0 else 0.0,
            "segment_weight_mean": seg_w.mean().item() if seg_w.numel() else 1.0,
            "segment_weight_std": seg_w.std().item() if seg_w.numel() > 1 else 0.0}


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
        student, teacher = batch.teacher_fn(cfg.refresh_interval(), cfg.reference)  # (T, N, V) log-softmax each
        mask = batch.mask.T if batch.mask is not None else torch.ones(batch.actions.T.shape, dtype=torch.bool)
        div, entropy = token_divergence(student.transpose(0, 1), teacher.transpose(0, 1),
                                        batch.actions.T.long().to(student.device), cfg.measure)
        div, entropy = div.cpu(), entropy.cpu()  # the distributions may live on an accelerator
        w, segments = segment_weights(div, mask, cfg, entropy)
        real_d = div[mask]
        at_start = div[segment_starts(segments)]
        self._last = {"divergence_mean": real_d.mean().item() if real_d.numel() else 0.0,
                      "divergence_max": real_d.max().item() if real_d.numel() else 0.0,
                      "divergence_at_departure": at_start.mean().item() if at_start.numel() else 0.0,
                      "student_entropy": entropy[mask].mean().item() if real_d.numel() else 0.0,
                      **segment_stats(segments, mask), **weight_stats(w, segments, mask, cfg)}
        return SignalOutput(weights=w.T.contiguous())

    def metrics(self) -> dict:
        return dict(self._last)
