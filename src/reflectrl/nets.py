"""Small network utilities shared by trainers and signals."""

from __future__ import annotations

import torch
from torch import nn


def flatten_parameters(module: nn.Module) -> nn.Parameter:
    """Re-home every parameter of `module` (and its gradient) into one flat tensor.

    The module's parameters become views of the returned flat parameter, their `.grad`
    views of its `.grad`, which autograd accumulates into in place. An optimiser and the
    gradient-norm clip then work on one tensor instead of a dozen: on small networks that
    is most of the update's cost. Zero gradients with `flat.grad.zero_()`, never by
    setting them to None.
    """
    params = list(module.parameters())
    total = sum(p.numel() for p in params)
    flat = nn.Parameter(torch.zeros(total, dtype=params[0].dtype))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        flat.data[offset:offset + n] = p.data.reshape(-1)
        p.data = flat.data[offset:offset + n].view_as(p)
        p.grad = flat.grad[offset:offset + n].view_as(p)
        offset += n
    return flat


def relu_mlp(in_dim: int, hidden_sizes, near_zero_output: bool = True) -> nn.Sequential:
    """A ReLU MLP with one scalar output; a head that starts near zero adds nothing until it
    has learned something (the signals' reflection, shaping and value heads)."""
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden_sizes:
        layers += [nn.Linear(last, width), nn.ReLU()]
        last = width
    out = nn.Linear(last, 1)
    if near_zero_output:
        nn.init.uniform_(out.weight, -1e-3, 1e-3)
        nn.init.zeros_(out.bias)
    return nn.Sequential(*layers, out)
