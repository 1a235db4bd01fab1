"""MAPPO on PettingZoo parallel envs (Yu et al. 2022, "The Surprising Effectiveness of PPO in
Cooperative Multi-Agent Games"), and per-agent shapers distilled from the team (seed 002 section 4.3).

Independent PPO per agent, in CleanRL's ppo.py details (GAE, advantage normalisation per
minibatch, the clipped objective, optional value clipping, entropy bonus, the global grad-norm
clip, lr annealing, orthogonal init): each agent i acts on its own observation o_i and learns
from its own reward r_i. Options (trainers/mappo/config.py):
* `share_parameters` (default true): one actor and one critic for all agents, each reading the
  agent's one-hot id after its observation; false: an actor and a critic per agent.
* `critic=central` (default, MAPPO): V_i reads the concatenation of every agent's observation
  (centralised training, decentralised execution: the actors read only their own);
  `critic=local`: V_i(o_i) (IPPO).
A minibatch is a set of joint steps with every agent's step in them. Progress counts joint
env steps (one step of every agent).

Signals (`mappo+SIGNAL`) see one Batch per rollout with a column per (env copy, agent),
(T, num_envs * agents), env-major: each agent's own rewards, values and advantages. A column's
observation is the joint observation (every agent's, concatenated) followed by the agent's
one-hot id: what a shaper reads is F^i(s, a_i, s') = F(s + id_i, a_i, s' + id_i), one network
conditioned on the agent (as the shared policy is). This trainer provides "team": the team
reward (the sum of every agent's reward, in every agent's column) and the team value
sum_j V_j(s) (`Batch.team_rewards`, `Batch.team_value_fn`): with shaping.labels=team (the
default under mappo) each F^i is distilled from the TEAM advantage, GAE on the summed rewards
under the summed critics, so no agent is paid for what helps it at the team's cost; with
labels=own, from agent i's own advantage (the selfish labels the seed warns of).
DECISION: F^i reads the joint observation (training-time only, like the central critic):
the team advantage it learns is a function of the joint state, not of o_i alone.

Everything random in training draws from the trainer's own `torch.Generator` (action
sampling, minibatch order), so a checkpoint holding it, the networks, the optimiser and a
snapshot of the envs (trainers/mappo/envs.py) resumes to bit-identical weights.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from reflectrl.config import RunConfig
from reflectrl.errors import NonFiniteError
from reflectrl.estimators import compute_gae
from reflectrl.nets import flatten_parameters
from reflectrl.runs import MetricsLogger, RunDir
from reflectrl.runs.progress import RECENT_EPISODES
from reflectrl.signals import Batch, Signal, SignalContext, make_signal
from reflectrl.trainers.base import EnvStepTrainer, Stopwatch, apply_signals, global_rngs, restore_global_rngs
from reflectrl.trainers.mappo import envs as envs_snapshot
from reflectrl.trainers.mappo.envs import ParallelVecEnv
from reflectrl.trainers.onpolicy.update import ClipKnobs, clipped_update
from reflectrl.trainers.policies import _forward, mlp, params_sha256

CHECKPOINT_FORMAT = 1


class MultiAgentActorCritic(nn.Module):
    """Actors on each agent's observation (+ one-hot id when shared) and critics on it or on the
    joint observation; CleanRL's MLPs (trainers/policies.py: tanh, orthogonal init, output gains
    0.01 for an actor, 1 for a critic). Every tensor keeps an agent axis before the features:
    (..., n, D) in, (..., n) out."""

    def __init__(self, n_agents: int, obs_dim: int, n_actions: int, hidden_sizes, share: bool, central: bool):
        super().__init__()
        self.n, self.obs_dim, self.n_actions, self.share, self.central = n_agents, obs_dim, n_actions, share, central
        ids = n_agents if share else 0
        self.policy_in = obs_dim + ids
        self.critic_in = (n_agents * obs_dim if central else obs_dim) + ids
        k = 1 if share else n_agents
        self.critics = nn.ModuleList(mlp(self.critic_in, tuple(hidden_sizes), 1, 1.0) for _ in range(k))
        self.actors = nn.ModuleList(mlp(self.policy_in, tuple(hidden_sizes), n_actions, 0.01) for _ in range(k))

    def _with_ids(self, x: torch.Tensor) -> torch.Tensor:
        if not self.share:
            return x
        ids = torch.eye(self.n, dtype=x.dtype).expand(*x.shape[:-1], self.n)
        return torch.cat([x, ids], -1)

    def _apply(self, nets: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        if self.share:
            return _forward(nets[0], x)
        return torch.stack([_forward(net, x[..., i, :]) for i, net in enumerate(nets)], -2)

    def policy_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., n, D) observations -> what each agent's actor reads."""
        return self._with_ids(obs)

    def critic_inputs(self, obs: torch.Tensor) -> torch.Tensor:
        """(..., n, D) observations -> what each agent's critic reads (the joint observation if central)."""
        if self.central:
            joint = obs.reshape(*obs.shape[:-2], 1, self.n * self.obs_dim)
            return self._with_ids(joint.expand(*obs.shape[:-2], self.n, self.n * self.obs_dim))
        return self._with_ids(obs)

    def value(self, critic_in: torch.Tensor) -> torch.Tensor:
        return self._apply(self.critics, critic_in).squeeze(-1)

    def values_of(self, obs: torch.Tensor) -> torch.Tensor:
        """Every agent's V_i of (..., n, D) observations: (..., n)."""
        return self.value(self.critic_inputs(obs))

    def act(self, policy_in: torch.Tensor, generator: torch.Generator | None = None):
        """Sample each agent's action: (action, logprob), each (..., n). Call under no_grad."""
        logp_all = torch.log_softmax(self._apply(self.actors, policy_in), -1)
        # inverse-CDF sampling, one uniform per agent (as trainers/policies.py's ActorCritic)
        u = torch.rand((*logp_all.shape[:-1], 1), generator=generator, dtype=logp_all.dtype)
        action = (logp_all.exp().cumsum(-1) < u).sum(-1).clamp_(max=self.n_actions - 1)
        return action, logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def evaluate(self, policy_in: torch.Tensor, critic_in: torch.Tensor, action: torch.Tensor):
        """(logprob, entropy, value) of given actions, with gradients, each (..., n)."""
        logp_all = torch.log_softmax(self._apply(self.actors, policy_in), -1)
        logprob = logp_all.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logprob, entropy, self.value(critic_in)


@dataclass
class Rollout:
    obs: torch.Tensor              # (T, E, n, D) each agent's observation
    actions: torch.Tensor          # (T, E, n)
    logprobs: torch.Tensor
    rewards: torch.Tensor
    terminations: torch.Tensor
    truncations: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    next_obs: torch.Tensor         # (T, E, n, D) the observations after each step (the last one where it ended)
    learn_rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    weights: torch.Tensor | None = None


class MAPPOTrainer(EnvStepTrainer):
    def __init__(self, cfg: RunConfig, run: RunDir | None = None, signal: Signal | None = None):
        torch.set_num_threads(cfg.torch_threads)
        self.cfg = cfg
        self.run = run
        m = cfg.mappo
        self.envs = ParallelVecEnv(cfg.env_id, cfg.env, m.num_envs)
        layout = self.envs.layout
        self.agents = layout.agents
        self.n_agents, self.obs_dim, self.n_actions = layout.n_agents, layout.obs_dim, layout.n_actions

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.policy = MultiAgentActorCritic(self.n_agents, self.obs_dim, self.n_actions, m.hidden_sizes,
                                            m.share_parameters, m.critic == "central")
        self.flat_params = flatten_parameters(self.policy)
        self.optimizer = torch.optim.Adam([self.flat_params], lr=m.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.num_iterations = math.ceil(cfg.total_steps / m.batch_size)

        self.signal = signal if signal is not None else make_signal(cfg)
        if self.signal is not None:
            joint = self.n_agents * self.obs_dim + self.n_agents  # a column's observation: joint + agent id
            self.signal.bind(SignalContext(
                obs_dim=joint, action_dim=self.n_actions, discrete=True, feature_dim=m.hidden_sizes[-1],
                learning_rate=m.learning_rate, gamma=m.gamma, gae_lambda=m.gae_lambda, seed=cfg.seed,
                total_iterations=self.num_iterations, obs_shape=(joint,), cost_limit=cfg.cost_limit))
        self.global_step = 0
        self.iteration = 0
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.next_obs = torch.from_numpy(self.envs.reset(seed=cfg.seed))
        self.logger: MetricsLogger | None = None
        self._own_estimate = Stopwatch()

    # ------------------------------------------------------------------ collect

    @torch.no_grad()
    def collect(self) -> tuple[Rollout, list]:
        m = self.cfg.mappo
        T, E, n = m.num_steps, m.num_envs, self.n_agents
        obs = torch.zeros((T, E, n, self.obs_dim))
        next_obs = torch.zeros((T, E, n, self.obs_dim))
        actions = torch.zeros((T, E, n), dtype=torch.long)
        logprobs = torch.zeros((T, E, n))
        rewards = np.zeros((T, E, n), dtype=np.float32)
        terminations = np.zeros((T, E, n), dtype=bool)
        truncations = np.zeros((T, E, n), dtype=bool)
        episodes = []
        for t in range(T):
            obs[t] = self.next_obs
            actions[t], logprobs[t] = self.policy.act(self.policy.policy_inputs(obs[t]), self.generator)
            step_obs, rewards[t], terminations[t], truncations[t], finals, ended = self.envs.step(actions[t].numpy())
            self.global_step += E
            if not (np.isfinite(step_obs).all() and np.isfinite(rewards[t]).all()):
                raise NonFiniteError("observation" if not np.isfinite(step_obs).all() else "reward", self.global_step)
            self.next_obs = torch.from_numpy(step_obs)
            next_obs[t] = self.next_obs
            for e, final in finals.items():
                next_obs[t, e] = torch.from_numpy(final)
            episodes += ended
        # values do not steer the rollout: one batched pass over s_t and s' of every step
        values = self.policy.values_of(obs)
        next_values = self.policy.values_of(next_obs)
        rewards, terminations, truncations = map(torch.from_numpy, (rewards, terminations, truncations))
        return Rollout(obs, actions, logprobs, rewards, terminations, truncations, values, next_values,
                       next_obs), episodes

    # ------------------------------------------------------------------ estimate

    def _columns(self, x: torch.Tensor) -> torch.Tensor:
        """(T, E, n, ...) -> (T, E * n, ...): a column per (env copy, agent), env-major."""
        return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])

    def _gae_with(self, rewards, values, next_values, terminations, truncations):
        m = self.cfg.mappo
        return compute_gae(rewards, values, next_values, terminations, truncations, m.gamma, m.gae_lambda)

    def estimate(self, rollout: Rollout) -> None:
        rewards = rollout.rewards if rollout.learn_rewards is None else rollout.learn_rewards
        c = self._columns
        adv, ret = self._gae_with(c(rewards), c(rollout.values), c(rollout.next_values), c(rollout.terminations),
                                  c(rollout.truncations))
        rollout.advantages, rollout.returns = adv.reshape(rollout.values.shape), ret.reshape(rollout.values.shape)

    # ------------------------------------------------------------------ signal

    def signal_obs(self, obs: torch.Tensor) -> torch.Tensor:
        """(T, E, n, D) -> (T, E * n, n * D + n): each column's joint observation and agent id."""
        T, E, n, D = obs.shape
        joint = obs.reshape(T, E, 1, n * D).expand(T, E, n, n * D)
        ids = torch.eye(n).expand(T, E, n, n)
        return self._columns(torch.cat([joint, ids], -1))

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Signal observations (..., n * D + n) -> (every agent's values V_j(s), (..., n); the agent index)."""
        n, D = self.n_agents, self.obs_dim
        obs = x[..., :n * D].reshape(*x.shape[:-1], n, D)
        return self.policy.values_of(obs), x[..., n * D:].argmax(-1)

    def own_value(self, x: torch.Tensor) -> torch.Tensor:
        """V_i(s) of signal observations: the column's own agent's critic."""
        values, agent = self._split(x)
        return values.gather(-1, agent.unsqueeze(-1)).squeeze(-1)

    def team_value(self, x: torch.Tensor) -> torch.Tensor:
        """The team's value sum_j V_j(s) of signal observations (the critics estimate each agent's
        return, so their sum estimates the summed rewards' return)."""
        return self._split(x)[0].sum(-1)

    def _team_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """(T, E, n) -> (T, E * n): the sum over the agents, in each agent's column."""
        return self._columns(rewards.sum(-1, keepdim=True).expand_as(rewards).contiguous())

    def apply_signal(self, rollout: Rollout) -> Batch:
        """The signal's hooks around advantage estimation (signals/base.py), on the agent columns."""
        signal, c = self.signal, self._columns
        shape = rollout.values.shape
        batch = Batch(obs=self.signal_obs(rollout.obs), actions=c(rollout.actions), rewards=c(rollout.rewards),
                      terminations=c(rollout.terminations), truncations=c(rollout.truncations),
                      values=c(rollout.values), next_values=c(rollout.next_values),
                      next_obs=self.signal_obs(rollout.next_obs), iteration=self.iteration,
                      global_step=self.global_step, value_fn=self.own_value, gae=self._gae_with,
                      team_value_fn=self.team_value)
        batch.estimate = lambda r: self._gae_with(r, batch.values, batch.next_values, batch.terminations,
                                                  batch.truncations)

        def team(batch):  # the team's rewards, the signals' terms included, in each agent's column
            batch.team_rewards = self._team_rewards(batch.rewards.reshape(shape))

        result = apply_signals(signal, batch, batch.estimate, on_rewards=team)
        self._own_estimate.seconds += result.own_estimate.seconds  # the estimate made with or without a signal
        rollout.learn_rewards = result.rewards.reshape(shape)
        rollout.advantages, rollout.returns = result.advantages.reshape(shape), result.returns.reshape(shape)
        if result.weights is not None:
            rollout.weights = result.weights.reshape(shape)
        return batch

    # ------------------------------------------------------------------ update

    def update(self, rollout: Rollout) -> dict:
        m = self.cfg.mappo
        n = self.n_agents
        B = m.batch_size  # joint steps; each row holds every agent's step
        b_policy_in = self.policy.policy_inputs(rollout.obs.reshape(B, n, self.obs_dim))
        b_critic_in = self.policy.critic_inputs(rollout.obs.reshape(B, n, self.obs_dim))
        b_actions = rollout.actions.reshape(B, n)
        b = {"logprobs": rollout.logprobs.reshape(B, n), "advantages": rollout.advantages.reshape(B, n),
             "returns": rollout.returns.reshape(B, n), "values": rollout.values.reshape(B, n),
             "weights": None if rollout.weights is None else rollout.weights.reshape(B, n)}
        evaluate = lambda idx: self.policy.evaluate(b_policy_in[idx], b_critic_in[idx], b_actions[idx])  # noqa: E731
        return clipped_update(self.flat_params, self.optimizer, evaluate, b, ClipKnobs.of(m), self.generator,
                              self.global_step)

    # ------------------------------------------------------------------ loop

    def run_iteration(self) -> dict:
        m = self.cfg.mappo
        self.iteration += 1
        if m.anneal_lr:
            frac = 1.0 - (self.iteration - 1.0) / self.num_iterations
            self.optimizer.param_groups[0]["lr"] = frac * m.learning_rate
        start = time.perf_counter()
        rollout, episodes = self.collect()
        if self.signal is None:
            self.estimate(rollout)
            stats = self.update(rollout)
        else:
            watch, self._own_estimate = Stopwatch(), Stopwatch()
            with watch:
                batch = self.apply_signal(rollout)
            stats = self.update(rollout)
            with watch:
                self.signal.after_update(batch)
            stats.update(self.signal.metrics())
            stats["signal_time_fraction"] = (watch.seconds - self._own_estimate.seconds) / (time.perf_counter() - start)
        elapsed = time.perf_counter() - start
        team = [r for r, _, _ in episodes]
        self.recent_returns.extend(team)
        per_agent = {}
        if episodes:
            mean = np.mean([a for _, a, _ in episodes], axis=0)
            per_agent = {f"agent_return/{agent}": float(mean[i]) for i, agent in enumerate(self.agents)}
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "episodic_return": float(np.mean(team)) if team else None,  # the team's: the agents' returns summed
            "episodic_length": float(np.mean([n for _, _, n in episodes])) if episodes else None,
            "episodes": len(episodes),
            **per_agent,
            "learning_rate": self.optimizer.param_groups[0]["lr"],
            **stats,
            "steps_per_second": m.batch_size / elapsed,
        }

    # what the shared loop (trainers/base.py) needs beyond EnvStepTrainer's

    @property
    def policy_module(self) -> torch.nn.Module:
        return self.policy

    def total_units(self) -> int:
        return self.num_iterations * self.cfg.mappo.batch_size

    # ------------------------------------------------------------------ checkpoints

    def _check_finite(self, tensor: torch.Tensor, quantity: str) -> None:
        if not torch.isfinite(tensor).all():
            raise NonFiniteError(quantity, self.global_step)

    def state_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.cfg.to_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "agent": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            **global_rngs(),
            "envs": envs_snapshot.dumps(self.envs),
            "next_obs": self.next_obs.clone(),
            "recent_returns": list(self.recent_returns),
            "params_sha256": params_sha256(self.policy),
            "signal": None if self.signal is None else self.signal.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.global_step = state["global_step"]
        self.iteration = state["iteration"]
        self.policy.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        restore_global_rngs(state)
        self.recent_returns = deque(state["recent_returns"], maxlen=RECENT_EPISODES)
        if self.signal is not None:
            self.signal.load_state_dict(state["signal"])
        self.envs.close()
        self.envs = envs_snapshot.loads(state["envs"])
        self.next_obs = state["next_obs"].clone()

    def save_checkpoint(self) -> None:
        assert self.run is not None
        self.run.save_checkpoint(self.state_dict())

    def close(self) -> None:
        self.envs.close()
