"""Actor-critic MLPs with CleanRL's initialisation, and fast action distributions.

Separate actor and critic trunks (tanh, orthogonal init with gain sqrt(2), output gains
0.01 for the actor and 1 for the critic), as in CleanRL. Continuous actions are a diagonal
Gaussian with a state-independent log-std. Log-probabilities and entropies are written out
rather than built through `torch.distributions`, whose per-call validation and object
construction cost more than the tiny networks themselves.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from reflectrl import nets
from reflectrl.nets import flatten_parameters, layer_init  # noqa: F401  (re-exported)

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def mlp(in_dim: int, hidden_sizes: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    """CleanRL's actor or critic: the shared builder's tanh MLP, orthogonally initialised
    (gain sqrt 2, `out_std` for the output layer)."""
    net = nets.mlp(in_dim, hidden_sizes, out_dim, activation=nn.Tanh, init=layer_init,
                   out_init=functools.partial(layer_init, std=out_std))
    # the Linear layers, in order, for _forward (kept off the module's registry)
    object.__setattr__(net, "_modules_list", [m for m in net if isinstance(m, nn.Linear)])
    return net


def _hidden(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    """The last hidden layer of a Linear/Tanh stack, without nn.Module call overhead
    (which dominates at batch size 4)."""
    for layer in net._modules_list[:-1]:
        x = torch.tanh(F.linear(x, layer.weight, layer.bias))
    return x


def _forward(net: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    last = net._modules_list[-1]
    return F.linear(_hidden(net, x), last.weight, last.bias)


def takes_numpy(method):
    """A policy's `deterministic_action` called from Python with what an env returns: a numpy array or
    a list, one observation or a batch of them. A tensor goes through unchanged (eval and the trainers
    pass batches); anything else is read as float32 (as eval reads observations), run without
    gradients, and the action comes back in numpy: one observation's alone (an int for a discrete
    action space), a batch's as an array. The policy's `obs_ndim` (the rank of one observation) tells
    one from a batch."""

    @functools.wraps(method)
    def wrapper(self, obs, *args, **kwargs):
        if isinstance(obs, torch.Tensor):
            return method(self, obs, *args, **kwargs)
        x = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        one = x.ndim == self.obs_ndim
        with torch.no_grad():
            action = method(self, x.unsqueeze(0) if one else x, *args, **kwargs).numpy()
        if not one:
            return action
        return action[0].item() if action[0].ndim == 0 else action[0]

    return wrapper


class ActorCritic(nn.Module):
    """Policy and value networks for a flat observation vector."""

    obs_ndim = 1  # the rank of one observation (takes_numpy)

    def __init__(self, obs_dim: int, action_dim: int, continuous: bool, hidden_sizes=(64, 64)):
        super().__init__()
        self.continuous = continuous
        self.action_dim = action_dim
        self.feature_dim = hidden_sizes[-1] if hidden_sizes else obs_dim  # width of features()
        # what the critic reads and its widths: a value head of the same shape on the same
        # input (trainers/streams.py's heads on a shared CNN trunk) is mlp(head_in_dim, head_hidden, 1)
        self.head_in_dim, self.head_hidden = obs_dim, tuple(hidden_sizes)
        self.critic = mlp(obs_dim, tuple(hidden_sizes), 1, out_std=1.0)
        self.actor = mlp(obs_dim, tuple(hidden_sizes), action_dim, out_std=0.01)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return _forward(self.critic, obs).squeeze(-1)

    def batch_layout(self, obs: torch.Tensor) -> torch.Tensor:
        """The update's batch of observations as this policy reads it fastest (flat here)."""
        return obs

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's last hidden layer, for signals that read the policy's features."""
        return _hidden(self.actor, obs)

    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        """Sample actions; returns (action, logprob). Call under no_grad."""
        out = _forward(self.actor, obs)
        if self.continuous:
            logstd = self.actor_logstd.expand_as(out)
            std = logstd.exp()
            noise = torch.randn(out.shape, generator=generator, dtype=out.dtype)
            action = out + std * noise
            logprob = (-0.5 * noise.square() - logstd - _HALF_LOG_2PI).sum(-1)
        else:
            logp_all = torch.log_softmax(out, dim=-1)
            # Inverse-CDF sampling: one uniform per row, cheaper than torch.multinomial.
            u = torch.rand((out.shape[0], 1), generator=generator, dtype=out.dtype)
            cdf = logp_all.exp().cumsum(-1)
            action = (cdf < u).sum(-1).clamp_(max=out.shape[-1] - 1)
            logprob = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return action, logprob

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor, with_features: bool = False):
        """(logprob, entropy, value) of given actions, with gradients; with_features adds
        the actor's last hidden layer as a fourth element."""
        hidden = _hidden(self.actor, obs)
        last = self.actor._modules_list[-1]
        out = F.linear(hidden, last.weight, last.bias)
        if self.continuous:
            logstd = self.actor_logstd.expand_as(out)
            z = (action - out) * torch.exp(-logstd)
            logprob = (-0.5 * z.square() - logstd - _HALF_LOG_2PI).sum(-1)
            entropy = (0.5 + _HALF_LOG_2PI + logstd).sum(-1)
        else:
            logp_all = torch.log_softmax(out, dim=-1)
            logprob = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        value = _forward(self.critic, obs).squeeze(-1)  # not self.value: a CNN subclass encodes obs there
        if with_features:
            return logprob, entropy, value, hidden
        return logprob, entropy, value

    @takes_numpy
    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        out = _forward(self.actor, obs)
        return out if self.continuous else out.argmax(-1)

    numpy_acting = True  # the MLP actor reads flat observations: numpy_sampler() serves a rollout

    def numpy_sampler(self) -> NumpySampler:
        """`act` for a rollout, in numpy on views of the parameters (see NumpySampler). Take
        one per rollout: the views follow in-place updates, not a new parameter storage."""
        layers = nets.numpy_linear_views(self.actor._modules_list)
        logstd = self.actor_logstd.detach().numpy()[0].copy() if self.continuous else None
        return NumpySampler(layers, logstd)


class NumpySampler:
    """The MLP actor's forward pass and act()'s sampling, in numpy, for the rollout's per-step
    path: at a batch of a few envs each torch op's dispatch (~10-20 us here) costs more than its
    arithmetic, and act() is a dozen of them, where this is a few numpy calls (2-5x faster;
    bench/limits.py). The draws are act()'s own (`torch.rand` / `torch.randn` on the same
    generator), so the random stream is unchanged; the numbers equal act()'s to float32
    rounding (numpy's and torch's matrix products and tanh may round the last bit differently,
    so a run's weights are not bit-identical to the torch path's: tests/test_policies.py)."""

    def __init__(self, layers: list[tuple[np.ndarray, np.ndarray]], logstd: np.ndarray | None):
        self.hidden, self.last = layers[:-1], layers[-1]
        self.continuous = logstd is not None
        if self.continuous:
            self.logstd, self.std = logstd, np.exp(logstd)

    def __call__(self, obs: np.ndarray, generator: torch.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """(actions, logprobs) for a (B, obs_dim) float32 batch, as act() gives them."""
        x = obs
        for w, b in self.hidden:
            x = np.tanh(x @ w + b)
        out = x @ self.last[0] + self.last[1]
        if self.continuous:
            noise = torch.randn(out.shape, generator=generator, dtype=torch.float32).numpy()
            action = out + self.std * noise
            logprob = (-0.5 * noise * noise - self.logstd - np.float32(_HALF_LOG_2PI)).sum(-1)
            return action, logprob
        z = out - out.max(-1, keepdims=True)
        logp_all = z - np.log(np.exp(z).sum(-1, keepdims=True))
        u = torch.rand((out.shape[0], 1), generator=generator, dtype=torch.float32).numpy()
        action = (np.exp(logp_all).cumsum(-1) < u).sum(-1)
        np.minimum(action, out.shape[-1] - 1, out=action)
        return action, np.take_along_axis(logp_all, action[:, None], -1)[:, 0]


def params_sha256(module: nn.Module) -> str:
    """A hash of every parameter and buffer, in name order, so two runs compare exactly."""
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(tensor.detach().cpu().numpy()).tobytes())
    return h.hexdigest()
