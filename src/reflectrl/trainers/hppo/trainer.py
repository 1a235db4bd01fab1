"""HPPO: two-level hierarchical PPO with self-distilled shaping at both levels (seed 002 section 6.1).

A high-level policy pi_high(g | s) picks a sub-goal g, a region of the grid (trainers/hppo/goals.py),
and a goal-conditioned low-level policy pi_low(a | s, g) acts until it reaches g, `horizon` steps
pass, or the episode ends; then the high level picks again. Both levels are PPO learners in
CleanRL's details (GAE, clipped objective and value loss, entropy bonus, global grad-norm clip,
lr annealing, orthogonal init), each with its own networks and optimiser:

* the low level learns from r_low = goal_reward * 1[reached g] (+ low_env_reward * r_env), each
  pursuit of a sub-goal being its episode: reaching g terminates it, running out of the horizon
  truncates it (the TD target bootstraps from V_low(s', g) there, as at a time limit);
* the high level is an SMDP learner: one step per sub-goal, its reward the env's rewards summed
  over the pursuit, its next state where the pursuit ended. DECISION: its discount is per decision,
  `high_gamma` (default gamma ** horizon), not gamma ** (steps taken): a constant discount keeps
  the high level an ordinary MDP to every signal (their GAE and potential differences read one
  gamma, SignalContext.gamma), as FeUdal's and HIRO's managers discount on their own time scale.
  The high level updates once every env has made `high_num_steps` decisions since its last update
  (a decision still running at an update waits for the next).

Signals (`hppo+SIGNAL`, e.g. `hppo+shaping`): each shaped level (`shaped_levels`) runs its own
instance of the composed signal on its own batches, through the same hooks as under PPO
(signals/base.py); the signal does not know which level it serves. So under `hppo+shaping`:
* F_high(s, g, s') is distilled from the high level's advantages under its updated critic: the
  long-term value gain that the low level's pursuit of g brought about (the seed's soft label for
  "proposing good sub-goals");
* F_low(s|g, a, s'|g) is distilled from the low level's advantages on its sub-goal reward: which
  actions reach sub-goals efficiently.
Both with the shaping machinery as it is (modes, target nets, curriculum, `--set shaping.*`, one
section for both levels). Metrics of each level's signal are logged as `high/NAME` and `low/NAME`.

Logged besides PPO's metrics (which are the low level's): `high_policy_loss`, `high_value_loss`,
`high_entropy`, `high_approx_kl`, `high_clipfrac`, `high_explained_variance`, `high_updates`;
`subgoals` (pursuits ended this iteration), `subgoal_success` (the share that reached their goal),
`subgoal_steps` (their mean length); the exploration metrics of PPO runs (trainers/exploration_metrics.py).

Everything random in training draws from the trainer's own `torch.Generator` (both levels'
sampling, minibatch order), so a checkpoint with it, both levels, the pursuits in flight, the
decisions waiting for a high-level update and a snapshot of the envs resumes bit-identically.
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
from reflectrl.envs import make_vector_env, snapshot
from reflectrl.errors import NonFiniteError
from reflectrl.estimators import compute_gae
from reflectrl.nets import flatten_parameters
from reflectrl.runs import MetricsLogger, RunDir
from reflectrl.runs.progress import RECENT_EPISODES
from reflectrl.signals import Batch, Signal, SignalContext, make_signal
from reflectrl.trainers.base import (
    EnvStepTrainer,
    Stopwatch,
    apply_signals,
    exploration_state,
    global_rngs,
    restore_envs,
    restore_exploration,
    restore_global_rngs,
)
from reflectrl.trainers.exploration_metrics import ExplorationTracker, RolloutKeys
from reflectrl.trainers.hppo.goals import AgentCell, agent_cell, goal_space_for
from reflectrl.trainers.onpolicy.update import UPDATE_METRICS, ClipKnobs, clipped_update
from reflectrl.trainers.policies import ActorCritic, _forward, _hidden, mlp, params_sha256, takes_numpy

CHECKPOINT_FORMAT = 1
_MASKED = -1e8  # the logit of a sub-goal the agent cannot pick (exp() of it is 0 in float32)
_HIGH_SEED = 0x5EED_0F_41  # the high level's signal instance is seeded apart from the low level's


class SubgoalPolicy(nn.Module):
    """The high level's actor-critic over sub-goal choices, with the unavailable ones masked out
    (CleanRL's MLPs: tanh, orthogonal init, output gain 0.01 for the actor, 1 for the critic)."""

    def __init__(self, in_dim: int, n_choices: int, hidden_sizes):
        super().__init__()
        self.feature_dim = hidden_sizes[-1]
        self.critic = mlp(in_dim, tuple(hidden_sizes), 1, 1.0)
        self.actor = mlp(in_dim, tuple(hidden_sizes), n_choices, 0.01)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return _forward(self.critic, x).squeeze(-1)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return _hidden(self.actor, x)

    def _logp(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(_forward(self.actor, x).masked_fill(~mask, _MASKED), -1)

    def act(self, x: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None = None):
        """Sample a choice per row among the open ones: (choice, logprob). Call under no_grad."""
        logp_all = self._logp(x, mask)
        u = torch.rand((x.shape[0], 1), generator=generator, dtype=logp_all.dtype)
        choice = (logp_all.exp().cumsum(-1) < u).sum(-1).clamp_(max=logp_all.shape[-1] - 1)
        # a uniform draw past the last open choice's cumulative mass (rounding) falls back to it
        choice = torch.where(mask.gather(-1, choice.unsqueeze(-1)).squeeze(-1), choice,
                             (mask.cumsum(-1) == mask.sum(-1, keepdim=True)).int().argmax(-1))
        return choice, logp_all.gather(-1, choice.unsqueeze(-1)).squeeze(-1)

    def evaluate(self, x: torch.Tensor, mask: torch.Tensor, choice: torch.Tensor):
        logp_all = self._logp(x, mask)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp_all.gather(-1, choice.long().unsqueeze(-1)).squeeze(-1), entropy, self.value(x)


@dataclass
class Level:
    """One level's learner: its actor-critic, optimiser over its flat parameters, and signal."""

    policy: nn.Module
    flat: torch.Tensor
    optimizer: torch.optim.Optimizer
    signal: Signal | None
    gamma: float


class HPPOTrainer(EnvStepTrainer):
    def __init__(self, cfg: RunConfig, run: RunDir | None = None, signal: Signal | None = None):
        torch.set_num_threads(cfg.torch_threads)
        self.cfg = cfg
        self.run = run
        h = cfg.hppo
        self.envs = make_vector_env(cfg, wrap=AgentCell)
        self.goals = goal_space_for(self.envs.envs[0], h.goal_region, h.goals, h.goal_reach, cfg.env_id)
        self.obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        self.n_actions = int(self.envs.single_action_space.n)
        g = self.goals
        self.high_in = self.obs_dim + g.position_dim
        self.low_in = self.obs_dim + g.position_dim + g.feature_dim

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.num_iterations = math.ceil(cfg.total_steps / h.batch_size)
        shaped = {"both": ("low", "high"), "high": ("high",), "low": ("low",)}[h.shaped_levels]
        low_signal = (signal if signal is not None else make_signal(cfg)) if "low" in shaped else None
        high_signal = make_signal(cfg) if "high" in shaped else None
        self.low = self._level(ActorCritic(self.low_in, self.n_actions, False, h.hidden_sizes), self.low_in,
                               low_signal, h.gamma, self.n_actions, cfg.seed)
        self.high = self._level(SubgoalPolicy(self.high_in, g.n_choices, h.hidden_sizes), self.high_in,
                                high_signal, h.high_discount, g.n_choices, cfg.seed ^ _HIGH_SEED)
        self.generator = torch.Generator().manual_seed(cfg.seed)

        self.global_step = 0
        self.iteration = 0
        self.high_updates = 0
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        obs, info = self.envs.reset(seed=cfg.seed)
        self._check_finite(torch.as_tensor(obs), "observation")
        self.next_obs = np.asarray(obs, dtype=np.float32)
        self.cells = np.asarray(info["agent_cell"], dtype=np.int64).copy()
        self.keys = RolloutKeys(obs, info)
        self.exploration = ExplorationTracker()
        N = h.num_envs
        # the sub-goal each env pursues, and what its decision recorded (for the high level's step)
        self.goal = np.zeros(N, dtype=np.int64)
        self.option_steps = np.zeros(N, dtype=np.int64)
        self.option_reward = np.zeros(N, dtype=np.float64)
        self.decision = {"obs": torch.zeros((N, self.high_in)), "choice": torch.zeros(N, dtype=torch.long),
                         "logprob": torch.zeros(N), "mask": torch.zeros((N, g.n_choices), dtype=torch.bool),
                         "key": np.zeros(N, dtype=np.int64)}
        self.pending: list[list[dict]] = [[] for _ in range(N)]  # finished decisions waiting for a high update
        self._choose(np.arange(N))
        self.high_stats: dict = {}
        self.logger: MetricsLogger | None = None

    def _level(self, policy: nn.Module, in_dim: int, signal: Signal | None, gamma: float, action_dim: int,
               seed: int) -> Level:
        h = self.cfg.hppo
        flat = flatten_parameters(policy)
        if signal is not None:
            signal.bind(SignalContext(
                obs_dim=in_dim, action_dim=action_dim, discrete=True,
                feature_dim=h.hidden_sizes[-1], learning_rate=h.learning_rate, gamma=gamma, gae_lambda=h.gae_lambda,
                seed=seed, total_iterations=self.num_iterations, cost_limit=self.cfg.cost_limit))
        return Level(policy, flat, torch.optim.Adam([flat], lr=h.learning_rate, eps=1e-5), signal, gamma)

    # ------------------------------------------------------------------ the levels' inputs

    def _high_inputs(self, obs: np.ndarray, cells: np.ndarray) -> torch.Tensor:
        return torch.cat([torch.as_tensor(obs, dtype=torch.float32).reshape(len(cells), -1),
                          self.goals.positions(cells)], -1)

    def _low_inputs(self, obs: np.ndarray, cells: np.ndarray, goals: np.ndarray) -> torch.Tensor:
        return torch.cat([self._high_inputs(obs, cells), self.goals.features(goals, cells)], -1)

    @torch.no_grad()
    def _choose(self, envs: np.ndarray) -> None:
        """The high level picks new sub-goals for these envs, at their current states."""
        if len(envs) == 0:
            return
        x = self._high_inputs(self.next_obs[envs], self.cells[envs])
        mask = self.goals.masks(self.cells[envs])
        choice, logprob = self.high.policy.act(x, mask, self.generator)
        self.goal[envs] = self.goals.goal_of(choice.numpy(), self.cells[envs])
        self.option_steps[envs] = 0
        self.option_reward[envs] = 0.0
        d = self.decision
        d["obs"][envs], d["choice"][envs], d["logprob"][envs], d["mask"][envs] = x, choice, logprob, mask
        d["key"][envs] = self.keys.current[envs]

    # ------------------------------------------------------------------ collect

    @torch.no_grad()
    def collect(self) -> tuple[dict, list, list]:
        """num_steps low-level steps in every env; the high level's finished decisions join `pending`.
        Returns the low level's rollout, the finished episodes and the finished pursuits."""
        h = self.cfg.hppo
        T, N = h.num_steps, h.num_envs
        low_obs = torch.zeros((T, N, self.low_in))
        low_next_obs = torch.zeros((T, N, self.low_in))
        actions = torch.zeros((T, N), dtype=torch.long)
        logprobs = torch.zeros((T, N))
        env_rewards = np.zeros((T, N), dtype=np.float32)
        low_rewards = np.zeros((T, N), dtype=np.float32)
        low_terms = np.zeros((T, N), dtype=bool)
        low_truncs = np.zeros((T, N), dtype=bool)
        episodes, pursuits = [], []
        self.keys.start(T, self.envs)  # grid keys: read per step (hppo uses them in the loop)
        low_in = self._low_inputs(self.next_obs, self.cells, self.goal)
        sampler = self.low.policy.numpy_sampler()  # the low level's MLP samples in numpy (policies.NumpySampler)
        for t in range(T):
            low_obs[t] = low_in
            action, logprob = sampler(low_obs[t].numpy(), self.generator)
            actions[t], logprobs[t] = torch.from_numpy(action), torch.from_numpy(logprob)
            obs, reward, term, trunc, info = self.envs.step(action)
            self.global_step += N
            if not (np.isfinite(obs).all() and np.isfinite(reward).all()):
                raise NonFiniteError("observation" if not np.isfinite(obs).all() else "reward", self.global_step)
            self.keys.record(t, obs, info)
            obs = np.asarray(obs, dtype=np.float32)
            final_obs, final_cells = obs.copy(), np.asarray(info["agent_cell"], dtype=np.int64).copy()
            if "final_obs" in info:
                final = info["final_info"]
                for i in np.flatnonzero(info["_final_obs"]):
                    final_obs[i] = info["final_obs"][i]
                    final_cells[i] = final["agent_cell"][i]
                if "episode" in final:
                    for i in np.flatnonzero(final["_episode"]):
                        episodes.append((float(final["episode"]["r"][i]), int(final["episode"]["l"][i])))
            reached = self.goals.reached(self.goal, final_cells)
            self.option_steps += 1
            self.option_reward += reward
            env_rewards[t] = reward
            low_rewards[t] = h.goal_reward * reached + h.low_env_reward * reward
            low_terms[t] = reached | term
            ended = low_terms[t] | trunc | (self.option_steps >= h.horizon)
            low_truncs[t] = ended & ~low_terms[t]
            low_next_obs[t] = self._low_inputs(final_obs, final_cells, self.goal)
            finished = np.flatnonzero(ended)
            if len(finished):
                next_high = self._high_inputs(final_obs[finished], final_cells[finished])
                d = self.decision
                for j, i in enumerate(finished):
                    self.pending[i].append({
                        "obs": d["obs"][i].clone(), "choice": d["choice"][i].clone(),
                        "logprob": d["logprob"][i].clone(), "mask": d["mask"][i].clone(),
                        "reward": float(self.option_reward[i]), "next_obs": next_high[j],
                        "termination": bool(term[i]), "truncation": bool(trunc[i] and not term[i]),
                        "key": int(d["key"][i]), "next_key": int(self.keys.next_state_keys[t, i])})
                    pursuits.append((bool(reached[i]), int(self.option_steps[i])))
            self.next_obs = obs
            self.cells = np.asarray(info["agent_cell"], dtype=np.int64).copy()
            self._choose(finished)
            # where the pursuit goes on (the episode too), the next step's inputs are this step's s'
            low_in = low_next_obs[t].clone()
            if len(finished):
                low_in[finished] = self._low_inputs(obs[finished], self.cells[finished], self.goal[finished])
        values = self.low.policy.value(low_obs)
        next_values = self.low.policy.value(low_next_obs)
        rollout = {"obs": low_obs, "next_obs": low_next_obs, "actions": actions, "logprobs": logprobs,
                   "rewards": torch.from_numpy(low_rewards), "env_rewards": torch.from_numpy(env_rewards),
                   "terminations": torch.from_numpy(low_terms), "truncations": torch.from_numpy(low_truncs),
                   "values": values, "next_values": next_values,
                   "state_keys": torch.from_numpy(self.keys.state_keys),
                   "next_state_keys": torch.from_numpy(self.keys.next_state_keys)}
        return rollout, episodes, pursuits

    # ------------------------------------------------------------------ both levels' learning

    def _gae(self, level: Level):
        h = self.cfg.hppo
        return lambda rewards, values, next_values, terms, truncs: compute_gae(
            rewards, values, next_values, terms, truncs, level.gamma, h.gae_lambda)

    def _learn(self, level: Level, batch: Batch, evaluate, epochs: int, minibatches: int, ent_coef: float,
               extra: dict) -> dict:
        """Advantages (through the level's signal, if any), the PPO update, the signal's after_update."""
        h = self.cfg.hppo
        gae = self._gae(level)
        estimate = lambda r: gae(r, batch.values, batch.next_values, batch.terminations, batch.truncations)  # noqa: E731
        signal_time = Stopwatch()
        weights = None
        if level.signal is None:
            advantages, returns = estimate(batch.rewards)
        else:
            batch.estimate, batch.gae = estimate, gae
            with signal_time:
                result = apply_signals(level.signal, batch, estimate)
                advantages, returns, weights = result.advantages, result.returns, result.weights
            signal_time.seconds -= result.own_estimate.seconds
        b = {"logprobs": extra["logprobs"].reshape(-1), "advantages": advantages.reshape(-1),
             "returns": returns.reshape(-1), "values": batch.values.reshape(-1),
             "weights": None if weights is None else weights.reshape(-1)}
        knobs = ClipKnobs.of(h, update_epochs=epochs, num_minibatches=minibatches, ent_coef=ent_coef)
        stats = clipped_update(level.flat, level.optimizer, evaluate, b, knobs, self.generator, self.global_step)
        if level.signal is not None:
            with signal_time:
                level.signal.after_update(batch)
            stats.update(level.signal.metrics())
        stats["_signal_seconds"] = signal_time.seconds
        return stats

    def learn_low(self, ro: dict) -> dict:
        h = self.cfg.hppo
        policy = self.low.policy
        batch = Batch(obs=ro["obs"], actions=ro["actions"], rewards=ro["rewards"], terminations=ro["terminations"],
                      truncations=ro["truncations"], values=ro["values"], next_values=ro["next_values"],
                      next_obs=ro["next_obs"], iteration=self.iteration, global_step=self.global_step,
                      value_fn=policy.value, features_fn=policy.features,
                      state_keys=ro["state_keys"], next_state_keys=ro["next_state_keys"])
        if self.low.signal is not None and self.low.signal.wants_features:
            with torch.no_grad():
                batch.features = policy.features(ro["obs"])
        b_obs, b_actions = ro["obs"].reshape(-1, self.low_in), ro["actions"].reshape(-1)
        return self._learn(self.low, batch, lambda idx: policy.evaluate(b_obs[idx], b_actions[idx]),
                           h.update_epochs, h.num_minibatches, h.ent_coef, ro)

    def learn_high(self) -> dict:
        """One high-level update on the oldest high_num_steps finished decisions of every env."""
        h = self.cfg.hppo
        T = h.high_num_steps
        taken = [q[:T] for q in self.pending]
        self.pending = [q[T:] for q in self.pending]

        def stack(key, dtype=None):
            rows = [[torch.as_tensor(step[key], dtype=dtype) for step in column] for column in taken]
            return torch.stack([torch.stack(col) for col in zip(*rows)])  # (T, N, ...)

        obs, next_obs, masks = stack("obs"), stack("next_obs"), stack("mask")
        choices, logprobs = stack("choice"), stack("logprob")
        policy = self.high.policy
        with torch.no_grad():
            values, next_values = policy.value(obs), policy.value(next_obs)
        batch = Batch(obs=obs, actions=choices, rewards=stack("reward", torch.float32),
                      terminations=stack("termination"), truncations=stack("truncation"),
                      values=values, next_values=next_values, next_obs=next_obs, iteration=self.iteration,
                      global_step=self.global_step, value_fn=policy.value, features_fn=policy.features,
                      state_keys=stack("key"), next_state_keys=stack("next_key"))
        if self.high.signal is not None and self.high.signal.wants_features:
            with torch.no_grad():
                batch.features = policy.features(obs)
        b_obs, b_choices = obs.reshape(-1, self.high_in), choices.reshape(-1)
        b_masks = masks.reshape(-1, masks.shape[-1])
        stats = self._learn(self.high, batch, lambda idx: policy.evaluate(b_obs[idx], b_masks[idx], b_choices[idx]),
                            h.high_update_epochs, h.high_num_minibatches, h.high_ent_coef, {"logprobs": logprobs})
        self.high_updates += 1
        return stats

    # ------------------------------------------------------------------ loop

    def run_iteration(self) -> dict:
        h = self.cfg.hppo
        self.iteration += 1
        if h.anneal_lr:
            frac = 1.0 - (self.iteration - 1.0) / self.num_iterations
            for level in (self.low, self.high):
                level.optimizer.param_groups[0]["lr"] = frac * h.learning_rate
        start = time.perf_counter()
        step_before = self.global_step
        rollout, episodes, pursuits = self.collect()
        self.keys.finish()
        exploration = self.exploration.update(self.keys.state_keys, rollout["env_rewards"].numpy(), step_before)
        stats = self.learn_low(rollout)
        signal_seconds = stats.pop("_signal_seconds")
        low_signal = {f"low/{k}": v for k, v in stats.items() if k not in UPDATE_METRICS}
        stats = {k: v for k, v in stats.items() if k in UPDATE_METRICS}
        while min(len(q) for q in self.pending) >= h.high_num_steps:
            high = self.learn_high()
            signal_seconds += high.pop("_signal_seconds")
            self.high_stats = {(f"high_{k}" if k in UPDATE_METRICS else f"high/{k}"): v for k, v in high.items()}
        elapsed = time.perf_counter() - start
        returns = [r for r, _ in episodes]
        self.recent_returns.extend(returns)
        row = {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "episodic_return": float(np.mean(returns)) if returns else None,
            "episodic_length": float(np.mean([n for _, n in episodes])) if episodes else None,
            "episodes": len(episodes),
            "learning_rate": self.low.optimizer.param_groups[0]["lr"],
            **stats,
            **low_signal,
            **self.high_stats,
            "high_updates": self.high_updates,
            "subgoals": len(pursuits),
            "subgoal_success": float(np.mean([ok for ok, _ in pursuits])) if pursuits else None,
            "subgoal_steps": float(np.mean([n for _, n in pursuits])) if pursuits else None,
            **exploration,
            "steps_per_second": h.batch_size / elapsed,
        }
        if self.low.signal is not None or self.high.signal is not None:
            row["signal_time_fraction"] = signal_seconds / elapsed
        return row

    @property
    def policy_module(self) -> torch.nn.Module:
        return nn.ModuleDict({"low": self.low.policy, "high": self.high.policy})

    def total_units(self) -> int:
        return self.num_iterations * self.cfg.hppo.batch_size

    # ------------------------------------------------------------------ checkpoints

    def _check_finite(self, tensor: torch.Tensor, quantity: str) -> None:
        if not torch.isfinite(tensor).all():
            raise NonFiniteError(quantity, self.global_step)

    def state_dict(self) -> dict:
        levels = {}
        for name, level in (("low", self.low), ("high", self.high)):
            levels[name] = {"policy": level.policy.state_dict(), "optimizer": level.optimizer.state_dict(),
                            "signal": None if level.signal is None else level.signal.state_dict()}
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.cfg.to_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "high_updates": self.high_updates,
            "levels": levels,
            "generator": self.generator.get_state(),
            **global_rngs(),
            "envs": snapshot.dumps(self.envs),
            "next_obs": self.next_obs.copy(),
            "cells": self.cells.copy(),
            "pursuit": {"goal": self.goal.copy(), "steps": self.option_steps.copy(),
                        "reward": self.option_reward.copy(),
                        "decision": {k: v.copy() if isinstance(v, np.ndarray) else v.clone()
                                     for k, v in self.decision.items()}},
            "pending": self.pending,
            "high_stats": dict(self.high_stats),
            "recent_returns": list(self.recent_returns),
            "params_sha256": params_sha256(self.policy_module),
            "exploration": exploration_state(self),
        }

    def load_state_dict(self, state: dict) -> None:
        self.global_step, self.iteration = state["global_step"], state["iteration"]
        self.high_updates = state["high_updates"]
        for name, level in (("low", self.low), ("high", self.high)):
            saved = state["levels"][name]
            level.policy.load_state_dict(saved["policy"])
            level.optimizer.load_state_dict(saved["optimizer"])
            if level.signal is not None:
                level.signal.load_state_dict(saved["signal"])
        self.generator.set_state(state["generator"])
        restore_global_rngs(state)
        self.recent_returns = deque(state["recent_returns"], maxlen=RECENT_EPISODES)
        restore_exploration(self, state.get("exploration"))
        self.next_obs, self.cells = state["next_obs"].copy(), state["cells"].copy()
        p = state["pursuit"]
        self.goal, self.option_steps, self.option_reward = p["goal"].copy(), p["steps"].copy(), p["reward"].copy()
        self.decision = {k: v.copy() if isinstance(v, np.ndarray) else v.clone() for k, v in p["decision"].items()}
        self.pending = state["pending"]
        self.high_stats = dict(state["high_stats"])
        restarted = restore_envs(self, state["envs"])
        for i, obs in restarted:  # an episode that could not be snapshotted restarted: so does its pursuit
            self.next_obs[i] = obs
            self.cells[i] = agent_cell(self.envs.envs[i].unwrapped)
            self._choose(np.array([i]))

    def save_checkpoint(self) -> None:
        assert self.run is not None
        self.run.save_checkpoint(self.state_dict())

    def close(self) -> None:
        self.envs.close()



class HierarchicalAgent(nn.Module):
    """Both levels of a trained run as one acting agent, for `reflectrl eval`: it keeps the sub-goal of
    the episode it is in. The caller passes every reset's and step's info (`observe`), from an env
    wrapped in goals.AgentCell; `act` and `deterministic_action` then read one observation at a time."""

    def __init__(self, low: ActorCritic, high: SubgoalPolicy, goals, horizon: int):
        super().__init__()
        self.low, self.high, self.goals, self.horizon = low, high, goals, horizon
        self.cell = np.zeros((1, 2), dtype=np.int64)
        self.goal = np.zeros(1, dtype=np.int64)
        self.steps, self.need_goal = 0, True

    def wrap_env(self, env):
        """The env as `observe` reads it: each step's info carries the agent's cell."""
        return AgentCell(env)

    def observe(self, info: dict, reset: bool = False) -> None:
        self.cell = np.asarray(info["agent_cell"], dtype=np.int64).reshape(1, 2)
        if reset:
            self.steps, self.need_goal = 0, True
            return
        self.steps += 1
        if self.goals.reached(self.goal, self.cell)[0] or self.steps >= self.horizon:
            self.steps, self.need_goal = 0, True

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.reshape(1, -1), self.goals.positions(self.cell)], -1)

    def _low_inputs(self, x: torch.Tensor, choose) -> torch.Tensor:
        high_in = self._inputs(x)
        if self.need_goal:
            self.goal = self.goals.goal_of(choose(high_in, self.goals.masks(self.cell)).numpy(), self.cell)
            self.need_goal = False
        return torch.cat([high_in, self.goals.features(self.goal, self.cell)], -1)

    def act(self, x: torch.Tensor, generator: torch.Generator | None = None):
        low_in = self._low_inputs(x, lambda h, mask: self.high.act(h, mask, generator)[0])
        return self.low.act(low_in, generator)

    obs_ndim = 1  # the rank of one observation (takes_numpy)

    @takes_numpy
    def deterministic_action(self, x: torch.Tensor) -> torch.Tensor:
        low_in = self._low_inputs(x, lambda h, mask: self.high._logp(h, mask).argmax(-1))
        return self.low.deterministic_action(low_in)


def load_policy(cfg: RunConfig, state: dict, env=None) -> HierarchicalAgent:
    """`reflectrl eval`'s policy of an hppo run: both levels, acting as one agent that keeps its sub-goal."""
    return load_agent(cfg, state)


def load_agent(cfg: RunConfig, state: dict) -> HierarchicalAgent:
    """The acting agent of a run's checkpoint (both levels, built as the trainer builds them)."""
    from reflectrl.envs import make_env

    h = cfg.hppo
    env = make_env(cfg.env_id, wrapper=cfg.wrapper, env_kwargs=cfg.env)
    try:
        goals = goal_space_for(env, h.goal_region, h.goals, h.goal_reach, cfg.env_id)
        obs_dim, n_actions = int(np.prod(env.observation_space.shape)), int(env.action_space.n)
    finally:
        env.close()
    low = ActorCritic(obs_dim + goals.position_dim + goals.feature_dim, n_actions, False, h.hidden_sizes)
    high = SubgoalPolicy(obs_dim + goals.position_dim, goals.n_choices, h.hidden_sizes)
    low.load_state_dict(state["levels"]["low"]["policy"])
    high.load_state_dict(state["levels"]["high"]["policy"])
    return HierarchicalAgent(low, high, goals, h.horizon)
