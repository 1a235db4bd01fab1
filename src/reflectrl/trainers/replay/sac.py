"""SAC for Gymnasium vector envs with continuous actions, as CleanRL's sac_continuous_action.py.

Twin soft Q-networks Q1, Q2 (MLP 256, 256, ReLU, on [s, a]) with Polyak-averaged targets
(`tau` every `target_network_frequency` env steps); a tanh-squashed Gaussian actor (its log
std squashed into [-5, 2] as CleanRL's), rescaled to the action bounds; automatic entropy
tuning of alpha towards `target_entropy` (-action_dim) with log alpha starting at 0;
`learning_starts` env steps of uniformly random actions before learning; one Q-step per
vector step, and every `policy_frequency` env steps `policy_frequency` actor (and alpha)
steps on the Q-step's batch (TD3's delayed update, as CleanRL). Soft TD target:
r + gamma (1 - terminated) (min_i Q_i_target(s', a') - alpha log pi(a' | s')), a' ~ pi(. | s').

Signals on replay data (trainers/replay/base.py): V(s) = min_i Q_i(s, a~) - alpha log pi(a~ | s)
with one action a~ sampled from the actor (E_pi[Q - alpha log pi], seed 000's advantage for
SAC: Q(s, a) - V(s), Q = min_i Q_i), the bootstrap value of s' is the soft target value above,
and shaping's labels are the soft TD errors under the networks after each step. The draws
for the signal come from the trainer's second generator.

Everything random draws from the trainer's own `torch.Generator`, and a checkpoint holds it
with the networks, optimisers, temperature, replay buffer and an exact env snapshot, so
resuming is bit-identical on CPU.
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
from reflectrl.nets import mlp, update_target
from reflectrl.runs import RunDir
from reflectrl.trainers.base import crossed
from reflectrl.trainers.policies import takes_numpy
from reflectrl.trainers.replay.base import AdamStep, ReplayTrainer, adam

LOG_STD_MAX = 2.0
LOG_STD_MIN = -5.0
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def run_mlp(layers: list[nn.Linear], x: torch.Tensor, relu_last: bool = False) -> torch.Tensor:
    """An nets.mlp's Linear layers (ReLU between them; after the last too with `relu_last`), with the
    functional ops called directly: the same maths as calling the nn.Sequential, without nn.Module's
    call machinery (a dozen module calls per network pass, per gradient step and per env step)."""
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        x = F.linear(x, layer.weight, layer.bias)
        if i < last or relu_last:
            x = F.relu(x)
    return x


class SoftQNetwork(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes=(256, 256)):
        super().__init__()
        self.net = mlp(obs_dim + action_dim, hidden_sizes, 1)  # ReLU, PyTorch's default init (CleanRL's)
        self._layers = list(self.net[::2])

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return run_mlp(self._layers, torch.cat([obs.reshape(len(obs), -1), actions], 1)).squeeze(-1)


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy scaled to the action bounds (CleanRL's)."""

    def __init__(self, obs_dim: int, low: np.ndarray, high: np.ndarray, hidden_sizes=(256, 256)):
        super().__init__()
        action_dim = len(low)
        self.trunk = mlp(obs_dim, hidden_sizes, None)
        last = hidden_sizes[-1] if hidden_sizes else obs_dim
        self.fc_mean = nn.Linear(last, action_dim)
        self.fc_logstd = nn.Linear(last, action_dim)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))
        self._layers = list(self.trunk[::2])

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = run_mlp(self._layers, obs.reshape(len(obs), -1), relu_last=True)
        mean = F.linear(x, self.fc_mean.weight, self.fc_mean.bias)
        log_std = torch.tanh(F.linear(x, self.fc_logstd.weight, self.fc_logstd.bias))
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
        return mean, log_std

    def sample(self, obs: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log pi(action | s)) with the reparameterisation trick (gradients flow)."""
        mean, log_std = self(obs)
        noise = torch.randn(mean.shape, generator=generator, dtype=mean.dtype)
        x = mean + log_std.exp() * noise
        y = torch.tanh(x)
        log_prob = -0.5 * noise.square() - log_std - _HALF_LOG_2PI
        log_prob = log_prob - torch.log(self.action_scale * (1 - y.square()) + 1e-6)
        return y * self.action_scale + self.action_bias, log_prob.sum(-1)

    # what `reflectrl eval` calls (as the other policies' act / deterministic_action)
    def act(self, obs: torch.Tensor, generator: torch.Generator | None = None):
        return self.sample(obs, generator)

    obs_ndim = 1  # the rank of one observation (takes_numpy)

    @takes_numpy
    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        mean, _ = self(obs)
        return torch.tanh(mean) * self.action_scale + self.action_bias


def temperature_loss(log_alpha: torch.Tensor, log_pi: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """CleanRL's (and SAC v2's) temperature loss: -alpha (log pi + target_entropy), pi's
    samples held fixed. Its gradient in log alpha raises alpha when the policy's entropy
    (-log pi) is below the target, and lowers it when above."""
    return (-log_alpha.exp() * (log_pi.detach() + target_entropy)).mean()


class SACTrainer(ReplayTrainer):
    name = "sac"

    def __init__(self, cfg: RunConfig, run: RunDir | None = None, signal=None):
        super().__init__(cfg, run, signal)
        act_space = self.envs.single_action_space
        if not hasattr(act_space, "low"):
            raise UserError(f"--algo sac needs continuous (Box) actions; '{cfg.env_id}' has {act_space}")
        d = self.knobs
        self.low, self.high = act_space.low.astype(np.float32), act_space.high.astype(np.float32)
        if not (np.isfinite(self.low).all() and np.isfinite(self.high).all()):
            raise UserError(f"--algo sac squashes actions into the env's bounds, and '{cfg.env_id}' has unbounded "
                            "ones; wrap it with gymnasium.wrappers.RescaleAction or use --algo ppo")
        obs_dim, action_dim = int(np.prod(self.obs_shape)), len(self.low)
        self.actor = Actor(obs_dim, self.low, self.high, d.hidden_sizes)
        self.qf1 = SoftQNetwork(obs_dim, action_dim, d.hidden_sizes)
        self.qf2 = SoftQNetwork(obs_dim, action_dim, d.hidden_sizes)
        self.qf1_target, self.qf2_target = copy.deepcopy(self.qf1), copy.deepcopy(self.qf2)
        self._critic_params = [*self.qf1.parameters(), *self.qf2.parameters()]
        # both critics' (and both targets') parameters in one list each: one fused target update
        self._critics, self._critic_targets = nn.ModuleList([self.qf1, self.qf2]), \
            nn.ModuleList([self.qf1_target, self.qf2_target])
        self.q_optimizer = adam(self._critic_params, d.q_lr)
        self.actor_optimizer = adam(self.actor.parameters(), d.policy_lr)
        self.target_entropy = -float(action_dim) if d.target_entropy is None else float(d.target_entropy)
        if d.autotune:
            self.log_alpha = torch.zeros(1, requires_grad=True)
            self.alpha_optimizer = adam([self.log_alpha], d.q_lr)
            self.alpha = float(self.log_alpha.detach().exp())
        else:
            self.log_alpha, self.alpha_optimizer, self.alpha = None, None, d.alpha
        self._last_actor: dict = {}
        self._q_adam, self._actor_adam = AdamStep(self.q_optimizer), AdamStep(self.actor_optimizer)
        self._alpha_adam = None if self.alpha_optimizer is None else AdamStep(self.alpha_optimizer)
        self.bind_signal(action_dim, False, 0, d.policy_lr)

    @property
    def policy_module(self) -> nn.Module:
        return self.actor

    # ------------------------------------------------------------------ acting

    def select_actions(self, obs: np.ndarray) -> np.ndarray:
        n = len(obs)
        if self.global_step < self.knobs.learning_starts:  # CleanRL: uniform random actions at first
            u = torch.rand((n, len(self.low)), generator=self.generator).numpy()
            return (self.low + (self.high - self.low) * u).astype(np.float32)
        with torch.no_grad():
            actions, _ = self.actor.sample(torch.as_tensor(obs, dtype=torch.float32), self.generator)
        return actions.numpy()

    # ------------------------------------------------------------------ learning

    def soft_values(self, obs: torch.Tensor, generator: torch.Generator, target: bool) -> torch.Tensor:
        """min_i Q_i(s, a~) - alpha log pi(a~ | s), a~ ~ pi(. | s): the soft value (no gradients)."""
        with torch.no_grad():
            actions, log_pi = self.actor.sample(obs, generator)
            q1, q2 = (self.qf1_target, self.qf2_target) if target else (self.qf1, self.qf2)
            return torch.min(q1(obs, actions), q2(obs, actions)) - self.alpha * log_pi

    def td_errors(self, obs, actions, rewards, next_obs, terminations) -> torch.Tensor:
        """The soft TD error r + gamma (1 - terminated) V_target(s') - min_i Q_i(s, a)."""
        with torch.no_grad():
            next_v = self.soft_values(next_obs, self.signal_generator, target=True)
            q = torch.min(self.qf1(obs, actions), self.qf2(obs, actions))
            return rewards + self.knobs.gamma * (1.0 - terminations) * next_v - q

    def learn(self, before: int, stats: list[dict]) -> None:
        d = self.knobs
        row, obs = self.q_step()
        if crossed(before, self.global_step, d.policy_frequency):
            # TD3's delayed update, as CleanRL: policy_frequency actor steps at once, on the Q-step's batch
            for _ in range(d.policy_frequency):
                self._last_actor = self.actor_step(obs)
        if crossed(before, self.global_step, d.target_network_frequency):
            self.update_targets()
        stats.append({**row, **self._last_actor})

    def q_step(self) -> tuple[dict, torch.Tensor]:
        """One Q-step on a sampled batch; its statistics, and the batch's observations."""
        d = self.knobs
        # without a signal nothing holds the batch past this learn(): sampled into the same arrays each time
        batch = self.buffer.sample(d.batch_size, self.generator, reuse=self.signal is None)
        obs, actions, next_obs = batch["obs"], batch["actions"], batch["next_obs"]
        with torch.no_grad():
            next_actions, next_log_pi = self.actor.sample(next_obs, self.generator)
            next_min = torch.min(self.qf1_target(next_obs, next_actions), self.qf2_target(next_obs, next_actions))
            next_v = next_min - self.alpha * next_log_pi
        q1, q2 = self.qf1(obs, actions), self.qf2(obs, actions)
        rewards, weights, signal_batch = batch["rewards"], None, None
        if self.signal is not None:  # its terms join the sampled rewards at learning time
            q_sa = torch.min(q1, q2).detach()
            values = self.soft_values(obs, self.signal_generator, target=False)
            signal_batch = self.signal_batch(batch, q_sa, values, next_v)
            extra, weights = self.signal_rewards(signal_batch)
            if extra is not None:
                rewards = rewards + extra
        with torch.no_grad():
            target = rewards + (1.0 - batch["terminations"]) * d.gamma * next_v
        if weights is None:
            qf1_loss, qf2_loss = F.mse_loss(q1, target), F.mse_loss(q2, target)
        else:
            qf1_loss, qf2_loss = (weights * (q1 - target).square()).mean(), (weights * (q2 - target).square()).mean()
        loss = qf1_loss + qf2_loss
        if not math.isfinite(loss.item()):
            raise NonFiniteError("loss", self.global_step)
        self._q_adam.zero_grad()
        loss.backward()
        self._q_adam.step()
        self.updates += 1
        if signal_batch is not None:
            self.signal_after_update(signal_batch)
        td = (target - q1).detach()
        return {"qf_loss": loss.detach() / 2.0, "qf1_values": q1.detach().mean(), "qf2_values": q2.detach().mean(),
                "td_error_mean": td.mean(), "td_error_abs": td.abs().mean()}, obs

    def actor_step(self, obs: torch.Tensor) -> dict:
        d = self.knobs
        pi, log_pi = self.actor.sample(obs, self.generator)
        critics = self._critic_params
        for p in critics:  # the actor's gradient flows through the critics, not into their weights
            p.requires_grad_(False)
        try:
            min_q = torch.min(self.qf1(obs, pi), self.qf2(obs, pi))
        finally:
            for p in critics:
                p.requires_grad_(True)
        actor_loss = (self.alpha * log_pi - min_q).mean()
        if not math.isfinite(actor_loss.item()):
            raise NonFiniteError("actor loss", self.global_step)
        self._actor_adam.zero_grad()
        actor_loss.backward()
        self._actor_adam.step()
        out = {"actor_loss": actor_loss.detach(), "entropy": -log_pi.detach().mean()}
        if d.autotune:
            # DECISION: the temperature's loss reads the actor step's own samples (detached), as
            # SB3 does; CleanRL draws fresh ones (one more actor pass for the same estimate)
            alpha_loss = temperature_loss(self.log_alpha, log_pi, self.target_entropy)
            self._alpha_adam.zero_grad()
            alpha_loss.backward()
            self._alpha_adam.step()
            self.alpha = float(self.log_alpha.detach().exp())
            out["alpha_loss"] = alpha_loss.detach()
        return out

    def update_targets(self) -> None:
        # lerp at every tau, 1 included (SAC's arithmetic before the shared helper); both critics in one
        # fused kernel (elementwise the same as one call per critic)
        update_target(self._critic_targets, self._critics, self.knobs.tau, copy_at_one=False)

    # ------------------------------------------------------------------ row, checkpoints

    def row_extras(self) -> dict:
        return {"learning_rate": self.actor_optimizer.param_groups[0]["lr"], "alpha": self.alpha}

    def postfix(self, row: dict) -> str:
        return f"{super().postfix(row)} alpha={self.alpha:.3g}".strip()

    def network_state(self) -> dict:
        return {
            "agent": self.actor.state_dict(),
            "qf1": self.qf1.state_dict(), "qf2": self.qf2.state_dict(),
            "qf1_target": self.qf1_target.state_dict(), "qf2_target": self.qf2_target.state_dict(),
            "q_optimizer": self.q_optimizer.state_dict(), "actor_optimizer": self.actor_optimizer.state_dict(),
            "log_alpha": None if self.log_alpha is None else self.log_alpha.detach().clone(),
            "alpha_optimizer": None if self.alpha_optimizer is None else self.alpha_optimizer.state_dict(),
            "alpha": self.alpha, "last_actor": {k: float(v) for k, v in self._last_actor.items()},
        }

    def load_network_state(self, state: dict) -> None:
        self.actor.load_state_dict(state["agent"])
        for name in ("qf1", "qf2", "qf1_target", "qf2_target"):
            getattr(self, name).load_state_dict(state[name])
        self.q_optimizer.load_state_dict(state["q_optimizer"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        if self.log_alpha is not None:
            with torch.no_grad():
                self.log_alpha.copy_(state["log_alpha"])
            self.alpha_optimizer.load_state_dict(state["alpha_optimizer"])
        self.alpha = state["alpha"]
        self._last_actor = {k: torch.tensor(v) for k, v in state["last_actor"].items()}
