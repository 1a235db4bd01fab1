"""The toy signal's JAX form (signals/jax_base.py's protocol): the same constant reward term."""

from __future__ import annotations

import jax.numpy as jnp

from reflectrl.signals.jax_base import Signal


class ToyBonus(Signal):
    name = "toy"

    def shape_rewards(self, state, batch, key):
        if self.cfg.size == 0:
            return state, None, {"toy_size": jnp.float32(0.0)}
        return state, jnp.full_like(batch.rewards, self.cfg.size), {"toy_size": jnp.float32(self.cfg.size)}
