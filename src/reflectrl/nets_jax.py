"""The JAX side's networks (torch: nets.py); the signals' one fit helper is signals/__init__.py's fit_rows.

Parameters are plain pytrees: a list of {"w": (in, out), "b": (out,)} layers, so that a torch
layer's weight is `w.T` (the fixture tests copy torch heads in with `from_torch`). Inits follow
the torch side: CleanRL's orthogonal init (gain sqrt 2 in the trunk) for the policy, and for the
signals' heads PyTorch's default uniform init with a near-zero output layer (nets.relu_mlp).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax

Params = list  # [{"w": (in, out), "b": (out,)}, ...]


def orthogonal_many(keys, shapes, gain: float, iterations: int = 60) -> list:
    """Random matrices of `shapes` with orthonormal rows or columns, times `gain`: torch's
    orthogonal_ distribution (Haar), as the polar factors of Gaussian matrices found by Newton-Schulz
    iterations (matrix products only; all the matrices in one loop). jax.nn.initializers.orthogonal's
    QR is slow to compile and to run batched on CPU (the RND nets' init under vmap over seeds took
    minutes there), and its batched LAPACK kernel deadlocked two processes on this 2-core machine
    (jax 0.10: ParallelBatchMap waiting on a saturated pool)."""
    xs = []
    for key, (rows, cols) in zip(keys, shapes, strict=True):
        w = jax.random.normal(key, (max(rows, cols), min(rows, cols)))
        xs.append(w / jnp.linalg.norm(w))  # every singular value in (0, 1]: the iteration converges

    def step(xs, _):
        return [1.5 * x - 0.5 * x @ (x.T @ x) for x in xs], None

    xs, _ = jax.lax.scan(step, xs, None, length=iterations)
    return [gain * (x if rows >= cols else x.T) for x, (rows, cols) in zip(xs, shapes, strict=True)]


def orthogonal(key, shape, gain: float, iterations: int = 60):
    """One such matrix."""
    return orthogonal_many([key], [shape], gain, iterations)[0]



def orthogonal_mlp(key: jax.Array, sizes: Sequence[int], out_gain: float) -> Params:
    """CleanRL's layer_init: orthogonal weights (gain sqrt 2; `out_gain` on the last), zero biases."""
    shapes = list(zip(sizes[:-1], sizes[1:], strict=True))
    ws = orthogonal_many(list(jax.random.split(key, len(shapes))), shapes, 1.0)
    gains = [math.sqrt(2.0)] * (len(shapes) - 1) + [out_gain]
    return [{"w": g * w, "b": jnp.zeros((b,))} for g, w, (_, b) in zip(gains, ws, shapes, strict=True)]


def torch_default_mlp(key: jax.Array, sizes: Sequence[int], near_zero_output: bool = True) -> Params:
    """PyTorch's nn.Linear init (uniform +-1/sqrt(fan_in)); the output layer scaled by 0.01 when
    `near_zero_output` (nets.near_zero_init): a head that adds nothing until it has learned."""
    keys = jax.random.split(key, 2 * (len(sizes) - 1))
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        bound = 1.0 / math.sqrt(a)
        w = jax.random.uniform(keys[2 * i], (a, b), minval=-bound, maxval=bound)
        bias = jax.random.uniform(keys[2 * i + 1], (b,), minval=-bound, maxval=bound)
        if near_zero_output and i == len(sizes) - 2:
            w, bias = w * 0.01, bias * 0.0
        layers.append({"w": w, "b": bias})
    return layers


def gru_init(key: jax.Array, in_dim: int, hidden: int) -> dict:
    """A GRU cell's parameters: {"wi": (in, 3H), "wh": (H, 3H), "bi": (3H,), "bh": (3H,)}, the gates in the
    order reset, update, candidate (torch's nn.GRU: r, z, n). Orthogonal weights (gain 1) for each gate's
    block and zero biases, as CleanRL's ppo_atari_lstm inits its LSTM."""
    keys = list(jax.random.split(key, 6))
    blocks = orthogonal_many(keys, [(in_dim, hidden)] * 3 + [(hidden, hidden)] * 3, 1.0)
    return {"wi": jnp.concatenate(blocks[:3], axis=1), "wh": jnp.concatenate(blocks[3:], axis=1),
            "bi": jnp.zeros((3 * hidden,)), "bh": jnp.zeros((3 * hidden,))}


def gru(params: dict, h: jax.Array, x: jax.Array) -> jax.Array:
    """One GRU step, h' = (1 - z) n + z h (torch's nn.GRU and flax's GRUCell): r and z the reset and update
    gates, n = tanh(W_in x + b_in + r (W_hn h + b_hn)) the candidate. h: (..., H), x: (..., in)."""
    gi = x @ params["wi"] + params["bi"]
    gh = h @ params["wh"] + params["bh"]
    i_r, i_z, i_n = jnp.split(gi, 3, axis=-1)
    h_r, h_z, h_n = jnp.split(gh, 3, axis=-1)
    r = jax.nn.sigmoid(i_r + h_r)
    z = jax.nn.sigmoid(i_z + h_z)
    n = jnp.tanh(i_n + r * h_n)
    return (1.0 - z) * n + z * h


def mlp(params: Params, x: jax.Array, activation: Callable = jax.nn.relu) -> jax.Array:
    """The MLP's output; `activation` between layers, none after the last."""
    for layer in params[:-1]:
        x = activation(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def head(params: Params, x: jax.Array) -> jax.Array:
    """A scalar ReLU head's output, (..., ) (nets.relu_mlp squeezed)."""
    return mlp(params, x)[..., 0]


def from_torch(module) -> Params:
    """A torch nn.Sequential of Linear layers (and activations) as JAX parameters."""
    import torch

    return [{"w": jnp.asarray(m.weight.detach().numpy().T), "b": jnp.asarray(m.bias.detach().numpy())}
            for m in module.modules() if isinstance(m, torch.nn.Linear)]


def adam(lr: float) -> optax.GradientTransformation:
    """torch.optim.Adam's defaults (eps 1e-8 outside the square root, as torch)."""
    return optax.adam(lr, b1=0.9, b2=0.999, eps=1e-8)


def polyak(target, source, tau: float):
    """target <- tau * source + (1 - tau) * target (nets.update_target)."""
    return jax.tree_util.tree_map(lambda t, s: t + tau * (s - t), target, source)
