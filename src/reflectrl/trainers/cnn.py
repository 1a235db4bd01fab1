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

# the image encoders are the shared layer's (nets.py), so that signals may build their own
from reflectrl.nets import (  # noqa: F401  (re-exported)
    NATURE_MIN_SIDE,
    SMALL_MIN_SIDE,
    ImageEncoder,
    cnn_fits,
    image_layout,
    image_trunk,
    nature_cnn,
    run_trunk,
    small_cnn,
)
from reflectrl.trainers.policies import ActorCritic, RecurrentActorCritic, takes_numpy


class CNNActorCritic(ActorCritic):
    """A CNN trunk under the MLP policy's actor and critic heads (see the module docstring)."""

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, continuous: bool, hidden_sizes=(64, 64)):
        trunk, trunk_dim, pixels, channels_last = image_trunk(obs_shape)
        if pixels:
            hidden_sizes = ()  # linear heads on the shared 512 units
        super().__init__(trunk_dim, action_dim, continuous, tuple(hidden_sizes))
        self.trunk = trunk
        self.obs_shape = tuple(obs_shape)
        self.channels_last, self.pixels = channels_last, pixels
        self.scale = 1.0 / 255.0 if pixels else 1.0

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """The trunk's output for observations given flat (B, obs_dim) or shaped (B, *obs_shape)."""
        return run_trunk(self.trunk, obs, self.obs_shape, self.channels_last, self.scale)

    def batch_layout(self, obs: torch.Tensor) -> torch.Tensor:
        """A batch of observations laid out as `encode` reads them without a copy: channels-first
        images (Atari's frame stacks) as one channels-last tensor, so that each minibatch
        gathered from it is channels-last already (one copy per update instead of one per
        minibatch); others as given. Pixels that are all whole numbers in 0..255 (Atari's frames,
        which the rollout keeps as floats) are laid out as uint8: each minibatch's gather moves a
        quarter of the bytes, and `encode`'s scaling turns them into the same floats, bit for bit
        (issue 61: ~1.08x per minibatch step). The values are unchanged."""
        if len(self.obs_shape) != 3 or self.channels_last:
            return obs
        images = obs.reshape(-1, *self.obs_shape)
        pixels = whole_pixels(images) if self.pixels else None
        return images.contiguous(memory_format=torch.channels_last) if pixels is None else pixels

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return super().value(self.encode(obs))

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return super().features(self.encode(obs))

    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        return super().act(self.encode(obs), generator)

    numpy_acting = False        # the trunk runs in torch: act() serves the rollout
    values_with_actions = True  # the trainer takes each step's value from act_value: one trunk pass
    shared_trunk = True         # value heads of reward streams may sit on the trunk (trainers/streams.py)

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

    @property
    def obs_ndim(self) -> int:
        return len(self.obs_shape)

    @takes_numpy
    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return super().deterministic_action(self.encode(obs))


def whole_pixels(images: torch.Tensor, rows: int = 32) -> torch.Tensor | None:
    """`images` (B, C, H, W) as one channels-last uint8 tensor when every value is a whole number in 0..255,
    else None. Checked and converted `rows` images at a time, which stay in the cache between the two."""
    pixels = torch.empty(images.shape, dtype=torch.uint8, memory_format=torch.channels_last)
    for start in range(0, images.shape[0], rows):
        chunk = images[start:start + rows]
        whole = chunk.to(torch.uint8)
        if not torch.equal(whole.to(chunk.dtype), chunk):  # fractions, or values out of 0..255
            return None
        pixels[start:start + rows] = whole
    return pixels


def make_policy(obs_shape: tuple[int, ...], action_dim: int, continuous: bool, encoder: str,
                hidden_sizes=(64, 64), policy: str = "mlp") -> ActorCritic | RecurrentActorCritic:
    """The actor-critic for a resolved `encoder` (mlp or cnn) and `policy` (mlp: feed-forward; gru or lstm:
    a recurrent layer above the encoder, trainers/policies.py RecurrentActorCritic)."""
    if policy != "mlp":
        return RecurrentActorCritic(obs_shape, action_dim, continuous, policy, encoder, hidden_sizes)
    if encoder == "cnn":
        return CNNActorCritic(obs_shape, action_dim, continuous, hidden_sizes)
    return ActorCritic(int(math.prod(obs_shape)), action_dim, continuous, hidden_sizes)
