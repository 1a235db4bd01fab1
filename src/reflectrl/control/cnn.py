"""CNN actor-critics for image observations, and `make_policy`, which picks MLP or CNN.

Two encoders, chosen by the image's size when `encoder=cnn`:

* pixels (both sides >= 36): the Nature CNN of CleanRL's ppo_atari.py (Mnih et al. 2015):
  conv 32 8x8 stride 4, conv 64 4x4 stride 2, conv 64 3x3 stride 1, linear 512, ReLU,
  orthogonal init (gain sqrt 2), input scaled by 1/255, one trunk shared by a linear actor
  (gain 0.01) and a linear critic (gain 1). Its 512 units are the policy's `features`.
* small symbolic views (MiniGrid's 7x7x3): the CNN of the rl-starter-files family (conv 16
  2x2, max-pool 2x2, conv 32 2x2, conv 64 2x2, ReLU), unscaled (the view holds object,
  colour and state indices), then the usual tanh actor and critic MLPs of `hidden_sizes`;
  the actor's last hidden layer is `features`, as for the MLP policy.

The trunk runs in PyTorch's channels-last memory format, about 1.5x faster than the default
for the Nature CNN's forward and backward on a CPU (`flatten_parameters` keeps the layout).

Layout: a rank-3 observation whose last axis has at most 4 entries and whose first has
more is channels-last (HWC: CarRacing, MiniGrid) and is permuted; any other rank-3 one is
channels-first (CHW: Atari's stack of 4 frames); a rank-2 one is one channel. The trainer
may pass observations flat or in their shape: `encode` reshapes either.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from reflectrl.control.policies import ActorCritic, layer_init
from reflectrl.errors import UserError

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


class CNNActorCritic(ActorCritic):
    """A CNN trunk under the MLP policy's actor and critic heads (see the module docstring)."""

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, continuous: bool, hidden_sizes=(64, 64)):
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
            trunk_dim, hidden_sizes = 512, ()  # linear heads on the shared 512 units
        super().__init__(trunk_dim, action_dim, continuous, tuple(hidden_sizes))
        self.trunk = trunk.to(memory_format=torch.channels_last)  # about 1.5x faster convolutions on CPU
        self.obs_shape = tuple(obs_shape)
        self.channels_last, self.pixels = channels_last, pixels
        self.scale = 1.0 / 255.0 if pixels else 1.0

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """The trunk's output for observations given flat (B, obs_dim) or shaped (B, *obs_shape)."""
        x = obs.reshape(-1, *self.obs_shape)
        if len(self.obs_shape) == 2:
            x = x.unsqueeze(1)
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)  # already the channels-last layout the trunk runs in
        else:
            x = x.contiguous(memory_format=torch.channels_last)
        if self.scale != 1.0:
            x = x * self.scale
        return self.trunk(x)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return super().value(self.encode(obs))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return super().features(self.encode(obs))

    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        return super().act(self.encode(obs), generator)

    values_with_actions = True  # the trainer takes each step's value from act_value: one trunk pass
    shared_trunk = True         # value heads of reward streams may sit on the trunk (control/streams.py)

    def act_value(self, obs: torch.Tensor, generator: torch.Generator | None = None, with_trunk: bool = False):
        """(action, logprob, value) from one pass of the trunk, plus the trunk's output with
        `with_trunk`. Call under no_grad."""
        h = self.encode(obs)
        action, logprob = super().act(h, generator)
        out = action, logprob, super().value(h)
        return (*out, h) if with_trunk else out

    def value_from_trunk(self, h: torch.Tensor) -> torch.Tensor:
        """The critic on the trunk's output (`encode`)."""
        return super().value(h)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor, with_features: bool = False,
                 with_trunk: bool = False):
        """As ActorCritic.evaluate; `with_trunk` appends the trunk's output (with its graph)."""
        h = self.encode(obs)
        out = super().evaluate(h, action, with_features)
        return (*out, h) if with_trunk else out

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return super().deterministic_action(self.encode(obs))


def make_policy(obs_shape: tuple[int, ...], action_dim: int, continuous: bool, encoder: str,
                hidden_sizes=(64, 64)) -> ActorCritic:
    """The actor-critic for a resolved `encoder` (mlp or cnn)."""
    if encoder == "cnn":
        return CNNActorCritic(obs_shape, action_dim, continuous, hidden_sizes)
    return ActorCritic(int(math.prod(obs_shape)), action_dim, continuous, hidden_sizes)
