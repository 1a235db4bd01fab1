"""Network building blocks shared by trainers and signals: the flat-parameter helper,
CleanRL's layer init, the one MLP builder (`mlp`; the signals' ReLU heads are `relu_mlp`),
the one target-network update (`update_target`: Polyak averaging or a hard copy), and the
image encoders (the Nature CNN and the small MiniGrid CNN; trainers/cnn.py puts
actor-critic heads on them)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from reflectrl.errors import UserError


def layer_init(layer: nn.Linear, std: float = math.sqrt(2.0), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


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


def mlp(in_dim: int, hidden_sizes: Sequence[int], out_dim: int | None, *,
        activation: Callable[[], nn.Module] = nn.ReLU,
        init: Callable[[nn.Linear], nn.Module] | None = None,
        out_init: Callable[[nn.Linear], nn.Module] | None = None) -> nn.Sequential:
    """The one MLP builder: Linear, activation() for each width of `hidden_sizes`, then a
    Linear to `out_dim` (None: no output layer, the trunk alone).

    `init(layer)` re-initialises each hidden Linear, `out_init(layer)` the output one (default:
    `init`); None keeps PyTorch's default initialisation. Each is applied as soon as its layer
    is built, before the next layer is, so the random draws come in the order of the layers
    (default init, then re-init, layer by layer) and the state_dict keys are `0.weight`,
    `0.bias`, `2.weight`, ... (activations at the odd indices)."""
    out_init = init if out_init is None else out_init
    layers: list[nn.Module] = []
    last = in_dim
    for width in hidden_sizes:
        layer = nn.Linear(last, width)
        layers += [layer if init is None else init(layer), activation()]
        last = width
    if out_dim is not None:
        layer = nn.Linear(last, out_dim)
        layers.append(layer if out_init is None else out_init(layer))
    return nn.Sequential(*layers)


def near_zero_init(layer: nn.Linear) -> nn.Linear:
    """Weights uniform in [-1e-3, 1e-3], bias 0: a head whose output starts near zero."""
    nn.init.uniform_(layer.weight, -1e-3, 1e-3)
    nn.init.zeros_(layer.bias)
    return layer


def relu_mlp(in_dim: int, hidden_sizes, near_zero_output: bool = True) -> nn.Sequential:
    """A ReLU MLP with one scalar output; a head that starts near zero adds nothing until it
    has learned something (the signals' reflection, shaping and value heads)."""
    return mlp(in_dim, hidden_sizes, 1, out_init=near_zero_init if near_zero_output else None)


def numpy_linear_views(layers) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W^T, b) of each nn.Linear as numpy views of its parameters (no copy: they follow in-place
    updates, not a new storage), for `x @ W^T + b` forward passes outside torch (the rollouts'
    numpy samplers: policies.NumpySampler, the DQN's numpy_greedy)."""
    return [(m.weight.detach().numpy().T, m.bias.detach().numpy()) for m in layers]


@torch.no_grad()
def update_target(target: nn.Module, source: nn.Module, tau: float = 1.0, *, arithmetic: str = "lerp",
                  copy_at_one: bool = True) -> None:
    """The one target-network update: target <- tau * source + (1 - tau) * target, parameter
    by parameter (and in place, so optimisers and views of the target stay valid).

    tau == 1 with `copy_at_one` is a hard copy: the target's parameters and buffers become
    the source's (what `target.load_state_dict(source.state_dict())` does). Otherwise
    `arithmetic` says how the parameters move, bit for bit as their callers always have:
    "lerp" is `t.lerp_(s, tau)` (DQN's, SAC's, GEAR's EMA); "mul_add" is
    `t.mul_(1 - tau).add_(s, alpha=tau)` (the shaper's target). The two round differently,
    and at tau == 1 either differs from a copy only in the sign of a zero or where a value is
    not finite: `copy_at_one=False` keeps a caller's own arithmetic there too."""
    if arithmetic not in ("lerp", "mul_add"):
        raise ValueError(f"update_target: arithmetic={arithmetic!r} is not 'lerp' or 'mul_add'")
    if tau == 1.0 and copy_at_one:
        for t, s in zip(target.parameters(), source.parameters(), strict=True):
            t.copy_(s)
        for t, s in zip(target.buffers(), source.buffers(), strict=True):
            t.copy_(s)
        return
    targets, sources = list(target.parameters()), list(source.parameters())
    if len(targets) != len(sources):
        raise ValueError(f"update_target: {len(targets)} target parameters for {len(sources)} source ones")
    if arithmetic == "lerp":  # one fused kernel over every parameter (elementwise as t.lerp_(s, tau))
        torch._foreach_lerp_(targets, sources, tau)
    else:
        for t, s in zip(targets, sources):
            t.mul_(1 - tau).add_(s, alpha=tau)


# ----------------------------------------------------------------------------- image encoders

NATURE_MIN_SIDE = 36  # the smallest side the Nature CNN's three convolutions accept
SMALL_MIN_SIDE = 7    # likewise for the small MiniGrid CNN


def image_layout(shape: tuple[int, ...]) -> tuple[tuple[int, int, int], bool]:
    """((channels, height, width), channels_last) of an image observation's shape."""
    if len(shape) == 2:
        return (1, *shape), False
    if len(shape) != 3:
        raise UserError(f"observation of shape {tuple(shape)} is not an image: a CNN needs rank 2 or 3; "
                        "use --set encoder=mlp")
    if shape[-1] <= 4 < shape[0]:
        return (shape[2], shape[0], shape[1]), True
    return tuple(shape), False


def cnn_fits(shape: tuple[int, ...]) -> bool:
    """Whether an image of this shape is large enough for one of the CNNs."""
    if len(shape) not in (2, 3):
        return False
    _, height, width = image_layout(shape)[0]
    return min(height, width) >= SMALL_MIN_SIDE


def nature_cnn(channels: int) -> nn.Sequential:
    return nn.Sequential(
        layer_init(nn.Conv2d(channels, 32, 8, stride=4)), nn.ReLU(),
        layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
        layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(),
        nn.Flatten(),
    )


def small_cnn(channels: int) -> nn.Sequential:
    return nn.Sequential(
        layer_init(nn.Conv2d(channels, 16, 2)), nn.ReLU(), nn.MaxPool2d(2),
        layer_init(nn.Conv2d(16, 32, 2)), nn.ReLU(),
        layer_init(nn.Conv2d(32, 64, 2)), nn.ReLU(),
        nn.Flatten(),
    )


def image_trunk(obs_shape: tuple[int, ...]) -> tuple[nn.Sequential, int, bool, bool]:
    """(trunk, its output width, pixels, channels_last) of the CNN for an image observation:
    the Nature CNN with its linear 512 layer for pixels, the small CNN for symbolic views."""
    (channels, height, width), channels_last = image_layout(tuple(obs_shape))
    pixels = min(height, width) >= NATURE_MIN_SIDE
    if not pixels and min(height, width) < SMALL_MIN_SIDE:
        raise UserError(f"image observation of shape {tuple(obs_shape)} is too small for a CNN "
                        f"(sides >= {SMALL_MIN_SIDE}); use --set encoder=mlp")
    trunk = nature_cnn(channels) if pixels else small_cnn(channels)
    with torch.no_grad():
        trunk_dim = trunk(torch.zeros(1, channels, height, width)).shape[1]
    if pixels:
        trunk.append(layer_init(nn.Linear(trunk_dim, 512)))
        trunk.append(nn.ReLU())
        trunk_dim = 512
    return trunk.to(memory_format=torch.channels_last), trunk_dim, pixels, channels_last  # ~1.5x faster on CPU


def run_trunk(trunk: nn.Module, obs: torch.Tensor, obs_shape: tuple[int, ...], channels_last: bool,
              scale: float) -> torch.Tensor:
    """The trunk's output for observations given flat (B, obs_dim) or shaped (B, *obs_shape)."""
    x = obs.reshape(-1, *obs_shape)
    if len(obs_shape) == 2:
        x = x.unsqueeze(1)
    if channels_last:
        x = x.permute(0, 3, 1, 2)  # already the channels-last layout the trunk runs in
    else:
        x = x.contiguous(memory_format=torch.channels_last)
    if scale != 1.0:
        x = x * scale
    return trunk(x)


class ImageEncoder(nn.Module):
    """A CNN trunk of its own for an image observation (the policy's kind: `image_trunk`),
    read as flat or shaped observations: e.g. SDRS's shaper with `shaping.encoder=cnn`."""

    def __init__(self, obs_shape: tuple[int, ...]):
        super().__init__()
        self.trunk, self.out_dim, pixels, self.channels_last = image_trunk(obs_shape)
        self.obs_shape = tuple(obs_shape)
        self.scale = 1.0 / 255.0 if pixels else 1.0

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return run_trunk(self.trunk, obs, self.obs_shape, self.channels_last, self.scale)
