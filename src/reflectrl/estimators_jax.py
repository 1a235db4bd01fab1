"""GAE on the JAX side, with the torch side's episode handling (estimators.py compute_gae):
an episode end (termination or truncation) stops the recursion; the bootstrap `next_values[t]`
(V of the final observation on a truncated step, V of the next state otherwise) counts unless
the step terminated."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def gae(rewards, values, next_values, terminations, truncations, gamma: float, gae_lambda: float):
    """(advantages, returns), each (T, N)."""
    not_terminal = 1.0 - terminations
    not_done = not_terminal * (1.0 - truncations)
    deltas = rewards + gamma * next_values * not_terminal - values
    carry = gamma * gae_lambda * not_done

    def back(y, xc):
        x, c = xc
        y = x + c * y
        return y, y

    _, advantages = jax.lax.scan(back, jnp.zeros_like(deltas[0]), (deltas, carry), reverse=True)
    return advantages, advantages + values


def discounted(x, carry):
    """y[t] = x[t] + carry[t] * y[t+1], y[T] = 0 (estimators.discounted_backward)."""
    def back(y, xc):
        y = xc[0] + xc[1] * y
        return y, y

    _, y = jax.lax.scan(back, jnp.zeros_like(x[0]), (x, carry), reverse=True)
    return y
