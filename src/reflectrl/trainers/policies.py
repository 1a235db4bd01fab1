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


def sample(out: torch.Tensor, logstd: torch.Tensor | None, generator: torch.Generator | None):
    """(action, logprob) drawn from the actor's output: a diagonal Gaussian around it with the
    state-independent `logstd` (continuous), or a categorical over its logits (logstd None)."""
    if logstd is not None:
        logstd = logstd.expand_as(out)
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


def log_prob_entropy(out: torch.Tensor, action: torch.Tensor, logstd: torch.Tensor | None):
    """(logprob, entropy) of given actions under the distribution `sample` draws from."""
    if logstd is not None:
        logstd = logstd.expand_as(out)
        z = (action - out) * torch.exp(-logstd)
        logprob = (-0.5 * z.square() - logstd - _HALF_LOG_2PI).sum(-1)
        entropy = (0.5 + _HALF_LOG_2PI + logstd).sum(-1)
    else:
        logp_all = torch.log_softmax(out, dim=-1)
        logprob = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logprob, entropy


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
        return sample(_forward(self.actor, obs), self.actor_logstd if self.continuous else None, generator)

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor, with_features: bool = False):
        """(logprob, entropy, value) of given actions, with gradients; with_features adds
        the actor's last hidden layer as a fourth element."""
        hidden = _hidden(self.actor, obs)
        last = self.actor._modules_list[-1]
        out = F.linear(hidden, last.weight, last.bias)
        logprob, entropy = log_prob_entropy(out, action, self.actor_logstd if self.continuous else None)
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


# ----------------------------------------------------------------------------- recurrent policies

RECURRENT_LAYERS = {"gru": nn.GRU, "lstm": nn.LSTM}
PIXELS_MEMORY_WIDTH = 128  # the recurrent layer above the Nature CNN's 512 units (CleanRL's ppo_atari_lstm.py)


class RecurrentActorCritic(nn.Module):
    """`policy=gru` or `lstm`: an encoder, one recurrent layer (nn.GRU or nn.LSTM) above it, and a linear
    actor (gain 0.01) and a linear critic (gain 1) both reading its output, as CleanRL's ppo_atari_lstm.py
    (one recurrent layer shared by the actor and the critic; sb3-contrib's RecurrentPPO gives the critic a
    second one by default). The recurrent layer's weights are orthogonal with gain 1 and its biases 0,
    as CleanRL's.

    The encoder is the feed-forward policy's, shared by the actor and the critic: the tanh MLP of
    `hidden_sizes` on a flat observation (`encoder=mlp`); the small MiniGrid CNN with that tanh MLP above
    it, or the Nature CNN (its linear 512 units, a recurrent layer of 128 above them as CleanRL's) for
    pixels (`encoder=cnn`). The recurrent layer is as wide as the encoder's output (the last of
    `hidden_sizes`) but on pixels.

    Its memory, one tensor (rows, B, width): the hidden state h (GRU), or h and c stacked (LSTM). A step
    whose `starts` is true begins an episode: the memory it reads is zeroed first (CleanRL's done mask).
    The trainer carries the memory through its rollouts (`act_value`) and re-runs whole sequences from
    each rollout's first memory in the update (`evaluate_sequences`). `features` and `value` of bare
    observations (what signals may call on observations out of their episodes: Batch.features_fn,
    value_fn) read them from a zero memory, as at an episode's first step. `act` and
    `deterministic_action` act in one episode at a time for `reflectrl eval`: they carry the memory from
    call to call, and `observe(info, reset=True)` (an episode's start) clears it."""

    recurrent = True
    numpy_acting = False        # the recurrence runs in torch: act_value serves the rollout
    values_with_actions = True  # each step's value comes with its action, from the same memory
    shared_trunk = True         # reward streams' value heads may read the recurrent output (trainers/streams.py)

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, continuous: bool, layer: str = "gru",
                 encoder: str = "mlp", hidden_sizes=(64, 64)):
        super().__init__()
        self.continuous, self.action_dim = continuous, action_dim
        self.obs_shape = tuple(obs_shape)
        self.obs_dim = int(math.prod(obs_shape))
        self.trunk, pixels, width = None, False, self.obs_dim
        if encoder == "cnn":
            self.trunk, width, pixels, self.channels_last = nets.image_trunk(self.obs_shape)
            self.scale = 1.0 / 255.0 if pixels else 1.0
        body = () if pixels else tuple(hidden_sizes)  # the tanh MLP (none above the Nature CNN's 512 units)
        self.body = nets.mlp(width, body, None, activation=nn.Tanh, init=layer_init)
        width = body[-1] if body else width
        memory_width = PIXELS_MEMORY_WIDTH if pixels else width
        self.rnn = RECURRENT_LAYERS[layer](width, memory_width)
        for name, param in self.rnn.named_parameters():
            if "bias" in name:
                nn.init.constant_(param, 0.0)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(memory_width, action_dim), std=0.01)
        self.critic = layer_init(nn.Linear(memory_width, 1), std=1.0)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))
        self.memory_rows = 2 if layer == "lstm" else 1
        self.memory_width = memory_width
        self.feature_dim = memory_width  # features: the recurrent output, what both heads read
        # a reward stream's value head on it has the critic's shape: linear (trainers/streams.py)
        self.head_in_dim, self.head_hidden = memory_width, ()
        self._acting_memory: torch.Tensor | None = None  # `act`'s memory in the episode eval plays

    @property
    def obs_ndim(self) -> int:
        return len(self.obs_shape)

    def initial_memory(self, n: int) -> torch.Tensor:
        return torch.zeros(self.memory_rows, n, self.memory_width)

    # the recurrence

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """The encoder's output (B, width) for observations given flat (B, obs_dim) or shaped (B, *obs_shape)."""
        if self.trunk is not None:
            x = nets.run_trunk(self.trunk, obs, self.obs_shape, self.channels_last, self.scale)
        else:
            x = obs.reshape(-1, self.obs_dim)
        return self.body(x)

    def _recur(self, x: torch.Tensor, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The recurrent layer over x (L, B, width) from `memory`: (outputs (L, B, memory_width), memory)."""
        if self.memory_rows == 2:
            y, (h, c) = self.rnn(x, (memory[:1].contiguous(), memory[1:].contiguous()))
            return y, torch.cat([h, c])
        y, h = self.rnn(x, memory.contiguous())
        return y, h

    def unroll(self, obs: torch.Tensor, memory: torch.Tensor, starts: torch.Tensor):
        """Outputs (T, B, memory_width) and the memory after them of T steps of B sequences: obs (T, B, ...),
        `memory` the one before the first step, `starts` (T, B) bool where an episode begins (the memory is
        zeroed there). Runs the layer over the stretches in which no sequence restarts at once."""
        T, B = starts.shape
        x = self.encode(obs.reshape(T * B, *obs.shape[2:])).reshape(T, B, -1)
        keep = (~starts).to(x.dtype).unsqueeze(-1)  # (T, B, 1)
        cuts = [0, *(torch.nonzero(starts[1:].any(1)).flatten() + 1).tolist(), T]
        outputs = []
        for begin, end in zip(cuts[:-1], cuts[1:]):
            y, memory = self._recur(x[begin:end], memory * keep[begin])
            outputs.append(y)
        return torch.cat(outputs) if len(outputs) > 1 else outputs[0], memory

    def step(self, obs: torch.Tensor, memory: torch.Tensor, starts: torch.Tensor):
        """One step of B sequences: (outputs (B, memory_width), memory after it)."""
        y, memory = self.unroll(obs.unsqueeze(0), memory, starts.unsqueeze(0))
        return y[0], memory

    # the heads

    def _logstd(self) -> torch.Tensor | None:
        return self.actor_logstd if self.continuous else None

    def value_from_trunk(self, h: torch.Tensor) -> torch.Tensor:
        """The critic on recurrent outputs."""
        return F.linear(h, self.critic.weight, self.critic.bias).squeeze(-1)

    def act_value(self, obs: torch.Tensor, memory: torch.Tensor, starts: torch.Tensor,
                  generator: torch.Generator | None = None):
        """A rollout's step: (action, logprob, value, recurrent output, memory after it). Call under no_grad."""
        y, memory = self.step(obs, memory, starts)
        action, logprob = sample(self.actor(y), self._logstd(), generator)
        return action, logprob, self.value_from_trunk(y), y, memory

    def evaluate_sequences(self, obs: torch.Tensor, actions: torch.Tensor, memory: torch.Tensor,
                           starts: torch.Tensor):
        """(logprob, entropy, value, recurrent output) of T steps of B sequences, (T, B) each (the output
        (T, B, memory_width)), with gradients: the update's pass, from the memory before the first step."""
        y, _ = self.unroll(obs, memory, starts)
        logprob, entropy = log_prob_entropy(self.actor(y), actions, self._logstd())
        return logprob, entropy, self.value_from_trunk(y), y

    # bare observations (signals' features_fn and value_fn): from a zero memory

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.step(obs, self.initial_memory(obs.shape[0]), torch.ones(obs.shape[0], dtype=torch.bool))[0]

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.value_from_trunk(self.features(obs))

    # acting in one episode after another (reflectrl eval): the memory carried from call to call

    def observe(self, info: dict, reset: bool = False) -> None:
        if reset:
            self._acting_memory = None

    def wrap_env(self, env):
        return env  # observe reads nothing of the env's info

    def _acting_step(self, obs: torch.Tensor) -> torch.Tensor:
        n = obs.shape[0]
        memory = self._acting_memory
        if memory is None or memory.shape[1] != n:
            memory = self.initial_memory(n)
        y, self._acting_memory = self.step(obs, memory, torch.zeros(n, dtype=torch.bool))
        return y

    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        """Sample the next actions of the episode in play; (action, logprob). Call under no_grad."""
        return sample(self.actor(self._acting_step(obs)), self._logstd(), generator)

    @takes_numpy
    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.actor(self._acting_step(obs))
        return out if self.continuous else out.argmax(-1)


def params_sha256(module: nn.Module) -> str:
    """A hash of every parameter and buffer, in name order, so two runs compare exactly."""
    import hashlib

    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(np.ascontiguousarray(tensor.detach().cpu().numpy()).tobytes())
    return h.hexdigest()
