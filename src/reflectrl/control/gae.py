"""Generalised advantage estimation that tells termination from truncation.

CleanRL treats a time-limit truncation like a termination: the value of the state the
episode was cut at is dropped, which biases every advantage near a time limit. Here the
caller passes, for each step, the value of the *next* state of the same episode
(`next_values`): for a truncated step that is V(final observation), so the TD error still
bootstraps; only a true termination zeroes it. Either kind of episode end stops the
lambda-trace, since the next row belongs to a new episode.
"""

from __future__ import annotations

import numpy as np
import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, shape (T, N) each.

    rewards, values, terminations, truncations: (T, N), step t of env n.
    next_values: (T, N), V of the state after step t in the same episode; ignored where
    the step terminated.
    """
    not_terminal = 1.0 - terminations.float()
    not_done = not_terminal * (1.0 - truncations.float())
    deltas = (rewards + gamma * next_values * not_terminal - values).numpy()
    # The backward recursion runs in numpy: per-row torch ops cost ~10x more at these sizes.
    carry = (gamma * gae_lambda * not_done).numpy()
    advantages = np.empty_like(deltas)
    last = np.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        advantages[t] = last
    advantages = torch.from_numpy(advantages)
    return advantages, advantages + values
