"""GRPO's loss variants, one table (as verl registers its advantage estimators): each
reduces a (N, L) per-token loss over the mask's tokens. `loss_type` picks one; a new variant
is one decorated function here.

    grpo     mean over each sequence's tokens, then over sequences (DeepSeekMath)
    dr_grpo  sum over tokens / (sequences x longest completion) (Dr. GRPO: no length bias)
    dapo     mean over all tokens of the batch (DAPO's token-level loss)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LOSS_AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def register_loss(name: str):
    def add(fn):
        LOSS_AGGREGATIONS[name] = fn
        return fn
    return add


@register_loss("grpo")
def _sequence_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(per_token.dtype)
    return ((per_token * m).sum(1) / m.sum(1).clamp(min=1)).mean()


@register_loss("dr_grpo")
def _constant_normaliser(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / (per_token.shape[0] * max(int(mask.sum(1).max()), 1))


@register_loss("dapo")
def _token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / m.sum().clamp(min=1)


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str) -> torch.Tensor:
    """Reduce a (N, L) per-token loss over the mask's tokens, as `loss_type` says."""
    return LOSS_AGGREGATIONS[loss_type](per_token, mask)
