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
        if p.dim() == 4 and not p.is_contiguous() and p.is_contiguous(memory_format=torch.channels_last):
            # a channels-last conv weight stays channels-last (the CNN's faster layout on CPU)
            out, inp, h, w = p.shape
            flat.data[offset:offset + n] = p.data.permute(0, 2, 3, 1).reshape(-1)
            view = lambda t, out=out, inp=inp, h=h, w=w: t.view(out, h, w, inp).permute(0, 3, 1, 2)  # noqa: E731
        else:
            flat.data[offset:offset + n] = p.data.reshape(-1)
            view = lambda t, p=p: t.view_as(p)  # noqa: E731
        p.data = view(flat.data[offset:offset + n])
        p.grad = view(flat.grad[offset:offset + n])
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
