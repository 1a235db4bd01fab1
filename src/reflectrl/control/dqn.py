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

Everything random draws from the trainer's own `torch.Generator` (the epsilon coin, random
actions, minibatches), and a checkpoint holds it with the networks, the optimiser, the
replay buffer and an exact snapshot of the envs, so resuming is bit-identical on CPU
(`save_replay=false` leaves the buffer out: see its knob).
"""

from __future__ import annotations

import copy
import math
import random
import time
import warnings
from collections import deque

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from reflectrl.config import RunConfig
from reflectrl.control.checkpoint import (
    exploration_state,
    global_rngs,
    restore_envs,
    restore_exploration,
    restore_global_rngs,
)
from reflectrl.control.policies import params_sha256
from reflectrl.control.replay import ReplayBuffer
from reflectrl.envs import make_vector_env, snapshot
from reflectrl.envs.statekey import is_montezuma
from reflectrl.errors import NonFiniteError, UserError
from reflectrl.exploration import ExplorationTracker, RolloutKeys
from reflectrl.nets import image_trunk, run_trunk
from reflectrl.runs import MetricsLogger, RunDir
from reflectrl.runs.loop import crossed, train_loop

CHECKPOINT_FORMAT = 1
EVAL_EPSILON = 0.05  # CleanRL's dqn_eval: the "stochastic" evaluation policy is epsilon-greedy at 0.05


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
            layers, last = [], int(np.prod(obs_shape))
            for w in hidden_sizes:
                layers += [nn.Linear(last, w), nn.ReLU()]
                last = w
            self.trunk = nn.Sequential(*layers)
            self.head = nn.Linear(last, num_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.encoder == "cnn":
            return self.head(run_trunk(self.trunk, obs, self.obs_shape, self.channels_last, self.scale))
        return self.head(self.trunk(obs.reshape(len(obs), -1)))

    def act(self, obs: torch.Tensor, generator: torch.Generator, epsilon: float = EVAL_EPSILON):
        """Epsilon-greedy actions of a batch; (actions, None) as the policies' act gives (action, logprob)."""
        coin = torch.rand(len(obs), generator=generator)
        explore = torch.randint(0, self.num_actions, (len(obs),), generator=generator)
        greedy = self(obs).argmax(dim=1)
        return torch.where(coin < epsilon, explore, greedy), None

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        return self(obs).argmax(dim=1)


def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """CleanRL's epsilon: linear from start_e to end_e over `duration` steps, then end_e."""
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


def td_targets(rewards: torch.Tensor, terminations: torch.Tensor, next_q_target: torch.Tensor, gamma: float,
               next_q_online: torch.Tensor | None = None) -> torch.Tensor:
    """r + gamma * (1 - terminated) * Q_target(s', a'), with a' = argmax_a Q_target(s', a)
    (DQN), or a' = argmax_a Q_online(s', a) when the online network's values are given (Double DQN)."""
    if next_q_online is None:
        best = next_q_target.max(dim=1).values
    else:
        best = next_q_target.gather(1, next_q_online.argmax(dim=1, keepdim=True)).squeeze(1)
    return rewards + gamma * best * (1.0 - terminations)


class DQNTrainer:
    # what the shared loop (runs/loop.py) needs
    unit = "env steps"
    discrete_entropy = False  # no policy entropy to watch

    def __init__(self, cfg: RunConfig, run: RunDir | None = None, signal=None):
        if signal is not None:
            raise UserError("--algo dqn runs no signals yet; use --algo dqn alone")
        torch.set_num_threads(cfg.torch_threads)
        self.cfg, self.run = cfg, run
        d = cfg.dqn
        self.envs = make_vector_env(cfg)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        if not hasattr(act_space, "n"):
            raise UserError(f"--algo dqn needs discrete actions; '{cfg.env_id}' has {act_space}")
        self.obs_shape = tuple(obs_space.shape)
        self.num_envs = d.num_envs

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.agent = QNetwork(self.obs_shape, int(act_space.n), d.encoder, d.hidden_sizes)
        self.target = copy.deepcopy(self.agent)
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=d.learning_rate)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        obs_dtype = obs_space.dtype if np.issubdtype(obs_space.dtype, np.integer) else np.float32
        self.buffer = ReplayBuffer(d.buffer_size, self.obs_shape, obs_dtype)
        self.steps_per_iteration = d.log_every // d.num_envs * d.num_envs
        self.num_iterations = math.ceil(cfg.total_steps / self.steps_per_iteration)
        self.exploration_steps = d.exploration_fraction * cfg.total_steps

        self.global_step = 0
        self.iteration = 0
        self.updates = 0
        self.learn_from = d.learning_starts  # learning starts once global_step passes this
        self.recent_returns: deque[float] = deque(maxlen=20)
        obs, info = self.envs.reset(seed=cfg.seed)
        self.next_obs = np.asarray(obs)
        self.keys = RolloutKeys(obs, info)
        self.exploration = ExplorationTracker(rooms=is_montezuma(cfg.env_id))
        self.logger: MetricsLogger | None = None

    # ------------------------------------------------------------------ learning

    def epsilon(self) -> float:
        d = self.cfg.dqn
        return linear_schedule(d.start_e, d.end_e, self.exploration_steps, self.global_step)

    def train_step(self) -> dict[str, torch.Tensor]:
        """One gradient step on a sampled batch; its statistics (tensors)."""
        d = self.cfg.dqn
        batch = self.buffer.sample(d.batch_size, self.generator)
        with torch.no_grad():
            next_q = self.target(batch["next_obs"])
            online = self.agent(batch["next_obs"]) if d.double_dqn else None
            target = td_targets(batch["rewards"], batch["terminations"], next_q, d.gamma, online)
        q = self.agent(batch["obs"]).gather(1, batch["actions"].long().unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(q, target) if d.loss == "mse" else F.smooth_l1_loss(q, target)
        if not torch.isfinite(loss):
            raise NonFiniteError("loss", self.global_step)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += 1
        td = (target - q).detach()
        return {"td_loss": loss.detach(), "q_values": q.detach().mean(), "td_error_mean": td.mean(),
                "td_error_abs": td.abs().mean()}

    def update_target(self) -> None:
        tau = self.cfg.dqn.tau
        with torch.no_grad():
            for t, p in zip(self.target.parameters(), self.agent.parameters(), strict=True):
                t.copy_(p) if tau == 1.0 else t.lerp_(p, tau)

    # ------------------------------------------------------------------ loop

    def run_iteration(self) -> dict:
        """`log_every` env steps of acting, storing and learning; their metrics row."""
        d = self.cfg.dqn
        n = self.num_envs
        self.iteration += 1
        start = time.perf_counter()
        step_before = self.global_step
        T = self.steps_per_iteration // n
        self.keys.start(T)
        rewards_seen = np.zeros((T, n), dtype=np.float32)
        episodes: list[tuple[float, int]] = []
        stats: list[dict] = []
        for t in range(T):
            epsilon = self.epsilon()
            obs = self.next_obs
            with torch.no_grad():
                actions, _ = self.agent.act(torch.as_tensor(obs, dtype=torch.float32), self.generator, epsilon)
            actions = actions.numpy()
            next_obs, rewards, terms, truncs, info = self.envs.step(actions)
            if not (np.isfinite(next_obs).all() and np.isfinite(rewards).all()):
                raise NonFiniteError("observation" if not np.isfinite(next_obs).all() else "reward", self.global_step)
            real_next = np.array(next_obs, copy=True)
            if "final_obs" in info:
                for i in np.flatnonzero(info["_final_obs"]):
                    real_next[i] = info["final_obs"][i]
                final = info["final_info"]
                if "episode" in final:
                    for i in np.flatnonzero(final["_episode"]):
                        episodes.append((float(final["episode"]["r"][i]), int(final["episode"]["l"][i])))
            self.buffer.add(obs, real_next, actions, rewards, terms)
            self.keys.record(t, next_obs, info)
            rewards_seen[t] = rewards
            self.next_obs = np.asarray(next_obs)
            before, self.global_step = self.global_step, self.global_step + n
            if self.global_step > self.learn_from:
                if crossed(before, self.global_step, d.train_frequency):
                    stats.append(self.train_step())
                if crossed(before, self.global_step, d.target_network_frequency):
                    self.update_target()
        exploration = self.exploration.update(self.keys.state_keys, rewards_seen, step_before)
        returns = [r for r, _ in episodes]
        self.recent_returns.extend(returns)
        learned = {k: float(torch.stack([s[k] for s in stats]).mean()) for k in stats[0]} if stats else {}
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "episodic_return": float(np.mean(returns)) if returns else None,
            "episodic_length": float(np.mean([n for _, n in episodes])) if episodes else None,
            "episodes": len(episodes),
            "learning_rate": self.optimizer.param_groups[0]["lr"],
            "epsilon": epsilon,
            **learned,
            "gradient_steps": self.updates,
            "buffer_fill": len(self.buffer) / self.buffer.capacity,
            **exploration,
            "steps_per_second": (self.global_step - step_before) / (time.perf_counter() - start),
        }

    def total_units(self) -> int:
        return self.num_iterations * self.steps_per_iteration

    def units_done(self) -> int:
        return self.global_step

    def finished(self) -> bool:
        return self.iteration >= self.num_iterations

    def checkpoint_due(self, before: int) -> bool:
        return crossed(before, self.global_step, self.cfg.checkpoint_every)

    def postfix(self, row: dict) -> str:
        text = f"eps={row['epsilon']:.2f}"
        return f"return={np.mean(self.recent_returns):.3g} {text}" if self.recent_returns else text

    def train(self, progress: bool = True) -> None:
        train_loop(self, progress)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.cfg.to_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "updates": self.updates,
            "learn_from": self.learn_from,
            "agent": self.agent.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            **global_rngs(),
            "envs": snapshot.dumps(self.envs),
            "next_obs": self.next_obs.copy(),
            "replay": self.buffer.state_dict() if self.cfg.dqn.save_replay else None,
            "recent_returns": list(self.recent_returns),
            "obs_normalizer": None,
            "params_sha256": params_sha256(self.agent),
            "exploration": exploration_state(self),
        }

    def load_state_dict(self, state: dict) -> None:
        self.global_step, self.iteration = state["global_step"], state["iteration"]
        self.updates, self.learn_from = state["updates"], state["learn_from"]
        self.agent.load_state_dict(state["agent"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        restore_global_rngs(state)
        self.recent_returns = deque(state["recent_returns"], maxlen=20)
        restore_exploration(self, state["exploration"])
        if state["replay"] is not None:
            self.buffer.load_state_dict(state["replay"])
        elif self.global_step > 0:
            # without the buffer: refill it, and learn again from learning_starts new steps on
            self.learn_from = self.global_step + self.cfg.dqn.learning_starts
            warnings.warn("this checkpoint holds no replay buffer (save_replay=false): the buffer refills from "
                          f"empty and learning resumes after {self.cfg.dqn.learning_starts:,} more steps, so the "
                          "run is not bit-identical to an uninterrupted one", stacklevel=2)
        self.next_obs = state["next_obs"].copy()
        for i, obs in restore_envs(self, state["envs"]):
            self.next_obs[i] = obs

    def save_checkpoint(self) -> None:
        assert self.run is not None
        self.run.save_checkpoint(self.state_dict())

    def close(self) -> None:
        self.envs.close()
