"""What the JAX forms of the signals (signals/NAME/jax.py; the protocol: jax_base.py) share:
actions as a head's input, an unbiased std, and `fit_rows`,
the masked minibatch fit with the torch HeadFitter's minibatch structure (signals/fit.py).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax


def encode_actions(actions: jax.Array, ctx) -> jax.Array:
    """(B, action_dim) float actions: one-hot if discrete (torch Signal.encode_actions)."""
    if ctx.discrete:
        return jax.nn.one_hot(actions.reshape(-1), ctx.action_dim, dtype=jnp.float32)
    return actions.reshape(-1, ctx.action_dim).astype(jnp.float32)


def std(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """The unbiased (n - 1) std, torch's Tensor.std(), over all of x or the rows where mask."""
    if mask is None:
        return jnp.std(x, ddof=1)
    m = mask.astype(x.dtype)
    n = m.sum()
    mean = (x * m).sum() / jnp.maximum(n, 1.0)
    return jnp.sqrt(((x - mean) ** 2 * m).sum() / jnp.maximum(n - 1.0, 1.0))


def var(x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """The unbiased variance (torch's Tensor.var())."""
    return std(x, mask) ** 2


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    m = mask.astype(x.dtype)
    return (x * m).sum() / jnp.maximum(m.sum(), 1.0)


def fit_rows(err_fn: Callable, params, opt_state, opt: optax.GradientTransformation, data: tuple,
             key: jax.Array, *, epochs: int, minibatch_size: int, mask: jax.Array | None = None,
             shuffle: str = "always", aux=None, after_step: Callable | None = None):
    """Minibatch MSE fit over the rows of `data` (a tuple of row-aligned arrays) where `mask`
    (None: every row), as HeadFitter.fit does it on the selected rows x[mask]: per epoch a
    random order of the valid rows (shuffle="when_split": in order when one minibatch holds them
    all), minibatches of `minibatch_size` with the last, short one kept, one Adam step each.
    The number of valid rows may be traced: the rows are ordered valid-first, minibatches past
    the valid rows take no step, and padding rows of a minibatch are masked out of its loss.

    `err_fn(params, *rows) -> (B,)` per-row squared errors; a minibatch's loss is their mean
    over its valid rows. `after_step(params, aux) -> aux` runs after every step (the shaper's
    Polyak target). Returns (params, opt_state, aux)."""
    n = data[0].shape[0]
    mask = jnp.ones((n,), bool) if mask is None else mask.reshape(-1)
    n_valid = mask.sum()
    mb = min(minibatch_size, n)
    num = -(-n // mb)
    pad = num * mb - n

    def loss(p, rows, m):
        err = err_fn(p, *rows)
        return (err * m).sum() / jnp.maximum(m.sum(), 1.0)

    def epoch(carry, k):
        if shuffle == "when_split" and mb >= n:
            # one minibatch holds every row: the valid rows in their order (torch draws nothing)
            order = jnp.argsort(jnp.where(mask, 0, 1), stable=True)
        else:
            u = jax.random.uniform(k, (n,))
            order = jnp.argsort(jnp.where(mask, u, u + 2.0))
        order = jnp.concatenate([order, jnp.zeros((pad,), order.dtype)])
        valid_pos = jnp.arange(num * mb) < n_valid

        def step(carry, j):
            params, opt_state, aux = carry
            idx = jax.lax.dynamic_slice(order, (j * mb,), (mb,))
            m = jax.lax.dynamic_slice(valid_pos, (j * mb,), (mb,)).astype(jnp.float32)
            rows = tuple(d[idx] for d in data)

            def do(carry):
                params, opt_state, aux = carry
                grads = jax.grad(loss)(params, rows, m)
                updates, opt_state = opt.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
                if after_step is not None:
                    aux = after_step(params, aux)
                return params, opt_state, aux

            return jax.lax.cond(j * mb < n_valid, do, lambda c: c, (params, opt_state, aux)), None

        carry, _ = jax.lax.scan(step, carry, jnp.arange(num))
        return carry, None

    (params, opt_state, aux), _ = jax.lax.scan(epoch, (params, opt_state, aux), jax.random.split(key, epochs))
    return params, opt_state, aux


def schedule_factor(cfg, batch, ctx):
    """The decay factor of a config's `schedule` after this batch's rollout (signals/schedule.py), as a
    traced float32 scalar, or None for `constant` (factor 1 exactly: the caller multiplies by nothing).
    progress = (env steps after the rollout) / schedule_steps (the JAX Batch's global_step is before
    it: + T x N), or (iterations done) / total_iterations (the batch's 0-based iteration + 1)."""
    if cfg.schedule == "constant":
        return None
    if cfg.schedule_steps > 0:
        steps = batch.global_step.astype(jnp.float32) + float(ctx.num_steps * ctx.num_envs)
        progress = steps / float(cfg.schedule_steps)
    else:
        progress = (jnp.asarray(batch.iteration).astype(jnp.float32) + 1.0) / float(max(1, ctx.total_iterations))
    if cfg.schedule == "linear":
        return jnp.maximum(0.0, 1.0 - progress).astype(jnp.float32)
    from reflectrl.signals.schedule import EXPONENTIAL_END

    return jnp.power(jnp.float32(EXPONENTIAL_END), progress).astype(jnp.float32)
