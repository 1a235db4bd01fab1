"""DQN for Gymnasium vector envs with discrete actions, as CleanRL's dqn.py and dqn_atari.py.

A replay buffer, a target network (Polyak `tau` every `target_network_frequency` steps;
tau=1 is CleanRL's hard copy), a linear epsilon schedule over `exploration_fraction` of
training, `learning_starts`, a gradient step every `train_frequency` steps on `batch_size`
transitions, MSE loss (CleanRL) or Huber, and an optional Double-DQN target. The Q-network
is CleanRL's MLP (120, 84, ReLU) for vector observations and the Nature CNN for pixels
(the project's `nets.image_trunk`, orthogonally initialised as the PPO policy's, where
CleanRL keeps PyTorch's default init). A truncated step bootstraps from the episode's
last observation (CleanRL's `real_next_obs`); only terminations cut the target.

Steps are counted in env steps: with num_envs > 1 one vector step is num_envs of them, and
`learning_starts`, `train_frequency` and `target_network_frequency` are in env steps too
(CleanRL's dqn.py counts vector steps with its default num_envs=1: the same).

Signals on replay data (trainers/replay/base.py): V(s) = max_a Q(s, a), the bootstrap value of
s' is the target network's (Double DQN's where on), the advantage a signal sees is
Q(s, a) - max_a Q(s, a), and the TD errors shaping distils are the seed's section 4.3
labels, r + gamma max_a' Q_target(s', a') - Q(s, a), under the networks after each step.

Everything random draws from the trainer's own `torch.Generator` (the epsilon coin, random
actions, minibatches), and a checkpoint holds it with the networks, the optimiser, the
replay buffer and an exact snapshot of the envs, so resuming is bit-identical on CPU
(`save_replay=false` leaves the buffer out: see its knob).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from reflectrl.config import RunConfig
from reflectrl.errors import NonFiniteError, UserError
from reflectrl.nets import image_trunk, mlp, numpy_linear_views, run_trunk, update_target
from reflectrl.runs import RunDir
from reflectrl.trainers.base import crossed
from reflectrl.trainers.policies import takes_numpy
from reflectrl.trainers.replay.base import AdamStep, ReplayTrainer, adam

EVAL_EPSILON = 0.05  # CleanRL's dqn_eval: the "stochastic" evaluation policy is epsilon-greedy at 0.05


class ActingDraws:
    """The epsilon coin and the random action of each of `n` envs, drawn (as act() draws them)
    into tensors kept from step to step, read through numpy views of them."""

    def __init__(self, n: int):
        self.n = n
        self.coin, self.explore = torch.empty(n), torch.empty(n, dtype=torch.int64)
        self.coin_np, self.explore_np = self.coin.numpy(), self.explore.numpy()

    def draw(self, generator: torch.Generator, num_actions: int) -> tuple[np.ndarray, np.ndarray]:
        torch.rand(self.n, generator=generator, out=self.coin)
        torch.randint(0, num_actions, (self.n,), generator=generator, out=self.explore)
        return self.coin_np, self.explore_np


class QNetwork(nn.Module):
    """Q(s, .) for every discrete action: CleanRL's MLP, or the Nature CNN for images."""

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, encoder: str, hidden_sizes=(120, 84)):
        super().__init__()
        self.obs_shape, self.num_actions, self.encoder = tuple(obs_shape), num_actions, encoder
        if encoder == "cnn":
            self.trunk, width, pixels, self.channels_last = image_trunk(self.obs_shape)
            self.scale = 1.0 / 255.0 if pixels else 1.0
            self.head = nn.Linear(width, num_actions)
        else:
            in_dim = int(np.prod(obs_shape))
            self.trunk = mlp(in_dim, hidden_sizes, None)  # ReLU, PyTorch's default init (CleanRL's)
            self.head = nn.Linear(hidden_sizes[-1] if hidden_sizes else in_dim, num_actions)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The trunk's output: what the head reads (and a signal's heads may)."""
        if self.encoder == "cnn":
            return run_trunk(self.trunk, obs, self.obs_shape, self.channels_last, self.scale)
        x = obs.reshape(len(obs), -1)
        for i in range(0, len(self.trunk), 2):  # Linear, ReLU pairs, called directly: a module call
            layer = self.trunk[i]                # per layer costs more than a small layer's maths
            x = F.relu(F.linear(x, layer.weight, layer.bias))
        return x

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # the head's maths called directly: nn.Module's call machinery costs more than it at batch 1
        return F.linear(self.features(obs), self.head.weight, self.head.bias)

    def act(self, obs: torch.Tensor, generator: torch.Generator, epsilon: float = EVAL_EPSILON):
        """Epsilon-greedy actions of a batch; (actions, None) as the policies' act gives (action, logprob)."""
        coin = torch.rand(len(obs), generator=generator)
        explore = torch.randint(0, self.num_actions, (len(obs),), generator=generator)
        random_ = coin < epsilon
        if bool(random_.all()):  # every env explores: no forward pass needed (the same draws either way)
            return explore, None
        greedy = self.forward(obs).argmax(dim=1)  # not self(obs): no hooks to run, per env step
        return torch.where(random_, explore, greedy), None

    def act_numpy(self, obs: np.ndarray, generator: torch.Generator, epsilon: float, greedy,
                  draws: ActingDraws | None = None) -> np.ndarray:
        """act() on a numpy batch with numpy_greedy()'s `greedy`: the same draws and choice;
        `draws` holds tensors to draw into (no allocation per step)."""
        if draws is None or draws.n != len(obs):
            coin = torch.rand(len(obs), generator=generator).numpy()
            explore = torch.randint(0, self.num_actions, (len(obs),), generator=generator).numpy()
        else:
            coin, explore = draws.draw(generator, self.num_actions)
        if len(obs) == 1:  # one env (the default): a scalar test, no mask
            return explore.copy() if coin[0] < epsilon else greedy(np.asarray(obs, dtype=np.float32))
        random_ = coin < epsilon
        if random_.all():  # every env explores: no forward pass needed (the same draws either way)
            return explore.copy()
        return np.where(random_, explore, greedy(np.asarray(obs, dtype=np.float32)))

    @property
    def obs_ndim(self) -> int:
        return len(self.obs_shape)

    @takes_numpy
    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs).argmax(dim=1)

    def numpy_greedy(self):
        """argmax_a Q(s, a) of a numpy batch, in numpy on views of the MLP's parameters (a few
        us where the torch forward is ~50 at batch 1; the views follow in-place updates). The
        argmax equals the torch forward's unless two actions' values are within float32
        rounding of each other. None for the CNN."""
        if self.encoder == "cnn":
            return None
        layers = numpy_linear_views((*self.trunk[::2], self.head))
        hidden, (w_out, b_out) = layers[:-1], layers[-1]

        def greedy(obs: np.ndarray) -> np.ndarray:
            x = obs.reshape(len(obs), -1)
            for w, b in hidden:
                x = np.maximum(x @ w + b, 0.0)
            return (x @ w_out + b_out).argmax(1)

        return greedy


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """CleanRL's epsilon: linear from start_e to end_e over `duration` steps, then end_e."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def bootstrap_values(next_q_target: torch.Tensor, next_q_online: torch.Tensor | None = None) -> torch.Tensor:
    """Q_target(s', a') with a' = argmax_a Q_target(s', a) (DQN), or a' = argmax_a Q_online(s', a)
    when the online network's values are given (Double DQN)."""
    if next_q_online is None:
        return next_q_target.max(dim=1).values
    return next_q_target.gather(1, next_q_online.argmax(dim=1, keepdim=True)).squeeze(1)


def td_targets(rewards: torch.Tensor, terminations: torch.Tensor, next_q_target: torch.Tensor, gamma: float,
               next_q_online: torch.Tensor | None = None) -> torch.Tensor:
    """r + gamma * (1 - terminated) * Q_target(s', a') (a' as bootstrap_values picks it)."""
    return rewards + gamma * bootstrap_values(next_q_target, next_q_online) * (1.0 - terminations)


class DQNTrainer(ReplayTrainer):
    name = "dqn"
    has_features = True

    def __init__(self, cfg: RunConfig, run: RunDir | None = None, signal=None):
        super().__init__(cfg, run, signal)
        act_space = self.envs.single_action_space
        if not hasattr(act_space, "n"):
            raise UserError(f"--algo dqn needs discrete actions; '{cfg.env_id}' has {act_space}")
        d = self.knobs
        self.agent = QNetwork(self.obs_shape, int(act_space.n), d.encoder, d.hidden_sizes)
        self.target = copy.deepcopy(self.agent)
        self.optimizer = adam(self.agent.parameters(), d.learning_rate)
        self._adam = AdamStep(self.optimizer)
        self.exploration_steps = d.exploration_fraction * cfg.total_steps
        self._epsilon = d.start_e
        self._greedy, self._greedy_ptr = None, None  # select_actions' numpy greedy policy (_numpy_greedy)
        self._head_weight = self.agent.head.weight  # whose storage _numpy_greedy watches
        self._draws = ActingDraws(self.num_envs)
        self.bind_signal(int(act_space.n), True, self.agent.feature_dim, d.learning_rate,
                         image_obs=d.encoder == "cnn")

    @property
    def policy_module(self) -> nn.Module:
        return self.agent

    # ------------------------------------------------------------------ acting

    def epsilon(self) -> float:
        d = self.knobs
        return linear_schedule(d.start_e, d.end_e, self.exploration_steps, self.global_step)

    def select_actions(self, obs: np.ndarray) -> np.ndarray:
        self._epsilon = self.epsilon()
        greedy = self._numpy_greedy()
        if greedy is None:
            with torch.no_grad():
                actions, _ = self.agent.act(torch.as_tensor(obs, dtype=torch.float32), self.generator, self._epsilon)
            return actions.numpy()
        return self.agent.act_numpy(obs, self.generator, self._epsilon, greedy, self._draws)

    def _numpy_greedy(self):
        """The MLP's numpy greedy policy, rebuilt if the parameters moved to new storage."""
        ptr = self._head_weight.data_ptr()
        if self._greedy_ptr != ptr:
            self._greedy, self._greedy_ptr = self.agent.numpy_greedy(), ptr
        return self._greedy

    # ------------------------------------------------------------------ learning

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.agent.features(obs)

    def td_errors(self, obs, actions, rewards, next_obs, terminations) -> torch.Tensor:
        """r + gamma (1 - terminated) Q_target(s', a') - Q(s, a) under the current networks."""
        with torch.no_grad():
            online = self.agent(next_obs) if self.knobs.double_dqn else None
            target = td_targets(rewards, terminations, self.target(next_obs), self.knobs.gamma, online)
            q = self.agent(obs).gather(1, actions.reshape(-1, 1).long()).squeeze(1)
            return target - q

    def learn(self, before: int, stats: list[dict]) -> None:
        d = self.knobs
        if crossed(before, self.global_step, d.train_frequency):
            stats.append(self.train_step())
        if crossed(before, self.global_step, d.target_network_frequency):
            self.update_target()

    def train_step(self) -> dict[str, torch.Tensor]:
        """One gradient step on a sampled batch; its statistics (tensors)."""
        d = self.knobs
        # without a signal nothing holds the batch past this step: sampled into the same arrays each time
        batch = self.buffer.sample(d.batch_size, self.generator, reuse=self.signal is None)
        q_all = self.agent(batch["obs"])
        q = q_all.gather(1, batch["actions"].long().unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_q = self.target(batch["next_obs"])
            online = self.agent(batch["next_obs"]) if d.double_dqn else None
        rewards, weights, signal_batch = batch["rewards"], None, None
        if self.signal is not None:  # its terms join the sampled rewards at learning time
            signal_batch = self.signal_batch(batch, q.detach(), q_all.detach().max(dim=1).values,
                                             bootstrap_values(next_q, online))
            extra, weights = self.signal_rewards(signal_batch)
            if extra is not None:
                rewards = rewards + extra
        with torch.no_grad():
            target = td_targets(rewards, batch["terminations"], next_q, d.gamma, online)
        if weights is None:
            loss = F.mse_loss(q, target) if d.loss == "mse" else F.smooth_l1_loss(q, target)
        else:  # a signal's per-transition weights on the TD loss
            per = F.mse_loss(q, target, reduction="none") if d.loss == "mse" else \
                F.smooth_l1_loss(q, target, reduction="none")
            loss = (weights * per).mean()
        if not math.isfinite(loss.item()):
            raise NonFiniteError("loss", self.global_step)
        self._adam.zero_grad()
        loss.backward()
        self._adam.step()
        self.updates += 1
        if signal_batch is not None:
            self.signal_after_update(signal_batch)
        td = (target - q).detach()
        return {"td_loss": loss.detach(), "q_values": q.detach().mean(), "td_error_mean": td.mean(),
                "td_error_abs": td.abs().mean()}

    def update_target(self) -> None:
        update_target(self.target, self.agent, self.knobs.tau)  # tau=1: CleanRL's hard copy

    # ------------------------------------------------------------------ row, checkpoints

    def row_extras(self) -> dict:
        return {"learning_rate": self.optimizer.param_groups[0]["lr"], "epsilon": self._epsilon}

    def postfix(self, row: dict) -> str:
        text = f"eps={row['epsilon']:.2f}"
        return f"{super().postfix(row)} {text}".strip()

    def network_state(self) -> dict:
        return {"agent": self.agent.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict()}

    def load_network_state(self, state: dict) -> None:
        self.agent.load_state_dict(state["agent"])
        self._head_weight, self._greedy_ptr = self.agent.head.weight, None
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
