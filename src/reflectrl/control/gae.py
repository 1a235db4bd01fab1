"""Generalised advantage estimation that tells termination from truncation.

CleanRL treats a time-limit truncation like a termination: the value of the state the
episode was cut at is dropped, which biases every advantage near a time limit. Here the
caller passes, for each step, the value of the *next* state of the same episode
(`next_values`): for a truncated step that is V(final observation), so the TD error still
bootstraps; only a true termination zeroes it. Either kind of episode end stops the
lambda-trace, since the next row belongs to a new episode.
"""

from __future__ import annotations

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
    deltas = rewards + gamma * next_values * not_terminal - values
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])
    decay = gamma * gae_lambda
    for t in reversed(range(rewards.shape[0])):
        last = deltas[t] + decay * not_done[t] * last
        advantages[t] = last
    return advantages, advantages + values
