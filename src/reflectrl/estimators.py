"""Backward discounted recursions over time-major (T, N) batches: GAE and returns-to-go.

Both are one recursion, y[t] = x[t] + carry[t] * y[t+1] with y[T] = 0 (`discounted_backward`);
they differ only in what they feed it. Each tells termination from truncation the same way:

- an episode end (termination or truncation) stops the recursion: row t+1 of that env
  belongs to a new episode, so carry[t] = 0 there;
- where the sum stops without a termination (a time limit, or the end of the batch), it
  continues with the value of the next state, `next_values[t]` (for a truncated step, V of
  the final observation); a true termination drops it.

CleanRL treats a truncation like a termination (drops V of the state the episode was cut
at), which biases every estimate near a time limit; here only a termination does.
"""

from __future__ import annotations

import numpy as np
import torch

_SCALAR_LOOP_MAX_ENVS = 5  # per-env scalar loop up to this many envs, row-wise array loop above


def discounted_backward(x: torch.Tensor, carry: torch.Tensor) -> torch.Tensor:
    """y[t] = x[t] + carry[t] * y[t+1] for t = T-1 .. 0, with y[T] = 0; x, carry (T, N).

    One rounding per multiply and per add in x's dtype, as a plain loop does."""
    xs = x.detach().numpy()
    return torch.from_numpy(_backward(xs, carry.detach().numpy().astype(xs.dtype, copy=False)))


def _backward(xs: np.ndarray, cs: np.ndarray) -> np.ndarray:
    # numpy, not torch: at these sizes a torch op's overhead is several times a numpy one's
    out = np.empty(xs.shape, xs.dtype)
    if xs.shape[1] <= _SCALAR_LOOP_MAX_ENVS:
        # few envs: each env's column on numpy scalars, cheaper than two array ops a step
        for n in range(xs.shape[1]):
            y, column = xs.dtype.type(0.0), []
            for x_t, c_t in zip(xs[::-1, n], cs[::-1, n]):
                y = x_t + c_t * y
                column.append(y)
            out[::-1, n] = column
        return out
    last = np.zeros_like(out[0])
    for x_t, c_t, y_t in zip(xs[::-1], cs[::-1], out[::-1]):  # row views, in-place ufuncs
        np.multiply(c_t, last, out=y_t)
        np.add(x_t, y_t, out=y_t)
        last = y_t
    return out


def _continuation_masks(terminations: torch.Tensor, truncations: torch.Tensor, dtype) -> tuple:
    """(1 - terminated, 1 - episode ended) as arrays of `dtype`: where a bootstrap value counts,
    and where the recursion carries on into the next row."""
    not_terminal = 1.0 - terminations.detach().numpy().astype(dtype)
    return not_terminal, not_terminal * (1.0 - truncations.detach().numpy().astype(dtype))


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation: advantages and returns (= advantages + values), (T, N).

    rewards, values, terminations, truncations: (T, N), step t of env n.
    next_values: (T, N), V of the state after step t in the same episode (for a truncated
    step, V of the final observation); ignored where the step terminated.
    """
    r, v, nv = (t.detach().numpy() for t in (rewards, values, next_values))
    not_terminal, not_done = _continuation_masks(terminations, truncations, np.float32)
    deltas = r + gamma * nv * not_terminal - v  # the same float32 operations, in the same order, as in torch
    advantages = _backward(deltas, (gamma * gae_lambda * not_done).astype(deltas.dtype, copy=False))
    return torch.from_numpy(advantages), torch.from_numpy(advantages + v)


def episode_continues(terminations: torch.Tensor, truncations: torch.Tensor) -> torch.Tensor:
    """(T, N) bool: step t+1 of the env continues step t's episode (never at the last row)."""
    cont = ~(terminations.bool() | truncations.bool())
    cont[-1] = False
    return cont


def discounted_returns(rewards: torch.Tensor, gamma: float, continues: torch.Tensor,
                       bootstrap: torch.Tensor | None = None) -> torch.Tensor:
    """Discounted reward-to-go within each episode, (T, N):
    G[t] = r[t] + gamma * (G[t+1] if continues[t] else bootstrap[t]).

    `continues[t]`: step t+1 continues step t's trajectory (`episode_continues`); where it
    does not, the sum stops at t and `bootstrap[t]` (the value of the next state, 0 where
    the step terminated; None: 0 everywhere) stands in for what came after.
    """
    same = continues.float()
    x = rewards if bootstrap is None else rewards + gamma * ((1.0 - same) * bootstrap)
    return discounted_backward(x, gamma * same)


def discounted_returns_from_ends(rewards: torch.Tensor, next_values: torch.Tensor, terminations: torch.Tensor,
                                 truncations: torch.Tensor, gamma: float) -> torch.Tensor:
    """Returns-to-go with GAE's episode handling: cut at every episode end, continued with
    V(next state) where the cut is a truncation or the end of the batch, not where the
    episode terminated."""
    bootstrap = next_values * (1.0 - terminations.float())
    return discounted_returns(rewards, gamma, episode_continues(terminations, truncations), bootstrap)


def vtrace(
    behaviour_logprobs: torch.Tensor,
    target_logprobs: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float | None = None,
    vtrace_lambda: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """V-trace (Espeholt et al. 2018, eqs. 1-2, remark 1): off-policy value targets v_s and
    policy-gradient advantages for (T, N) trajectories collected by a behaviour policy mu and
    learnt by a target policy pi. Returns (advantages, targets, clipping statistics).

        rho_t = min(rho_bar, pi/mu),  c_t = lambda * min(c_bar, pi/mu)
        delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
        v_t - V(x_t) = delta_t + gamma c_t (v_{t+1} - V(x_{t+1}))        (0 past the batch)
        A_t = min(pg_rho_bar, pi/mu) (r_t + gamma_t v_{t+1} - V(x_t))

    Episode ends are handled as compute_gae does: gamma_t = 0 after a termination, V(x_{t+1})
    is `next_values[t]` (V of the final observation at a truncation), and the correction never
    flows across an episode end, so there v_{t+1} is the bootstrap V(x_{t+1}) itself. On-policy
    (pi = mu) with rho_bar, c_bar >= 1 and lambda = 1 the targets are compute_gae's returns at
    gae_lambda = 1 (n-step returns to the end of the batch) and the advantages its advantages.
    """
    log_rhos = (target_logprobs - behaviour_logprobs).detach().numpy().astype(np.float64)
    rhos = np.exp(log_rhos)
    dtype = rewards.detach().numpy().dtype
    clipped = np.minimum(rho_bar, rhos).astype(dtype)
    pg_clipped = np.minimum(rho_bar if pg_rho_bar is None else pg_rho_bar, rhos).astype(dtype)
    cs = (vtrace_lambda * np.minimum(c_bar, rhos)).astype(dtype)
    r, v, nv = (t.detach().numpy() for t in (rewards, values, next_values))
    not_terminal, not_done = _continuation_masks(terminations, truncations, dtype)
    deltas = clipped * (r + gamma * nv * not_terminal - v)
    vs_minus_v = _backward(deltas.astype(dtype, copy=False), (gamma * cs * not_done).astype(dtype, copy=False))
    targets = vs_minus_v + v
    following = np.zeros_like(vs_minus_v)  # v_{t+1} - V(x_{t+1}) where step t+1 continues the episode
    following[:-1] = vs_minus_v[1:]
    next_targets = nv + not_done * following
    advantages = pg_clipped * (r + gamma * next_targets * not_terminal - v)
    stats = {"vtrace_rho_clip_frac": float((rhos > rho_bar).mean()),
             "vtrace_c_clip_frac": float((rhos > c_bar).mean()),
             "vtrace_rho_mean": float(rhos.mean()), "vtrace_rho_max": float(rhos.max())}
    return torch.from_numpy(advantages.astype(dtype)), torch.from_numpy(targets.astype(dtype)), stats
