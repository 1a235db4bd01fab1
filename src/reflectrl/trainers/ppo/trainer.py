"""PPO for Gymnasium vector envs, in three phases per iteration: collect, estimate, update.

Follows CleanRL's ppo.py / ppo_continuous_action.py (GAE, advantage normalisation, clipped
policy and value losses, entropy bonus, global grad-norm clip, lr annealing, minibatch
epochs, optional target-KL stop, orthogonal init, obs/reward normalisation for continuous
control) with one correction: at a time-limit truncation the TD target bootstraps from
V(final observation) instead of treating the cut as a termination (see gae.py).

A recurrent policy (`policy=gru`, `lstm`: trainers/policies.py RecurrentActorCritic) carries its memory
through the rollouts, zeroed where an episode begins, and its update takes whole per-env sequences,
re-run from the memory the rollout began with (`update_sequences`; CleanRL's ppo_atari_lstm.py).

Everything random in training draws from the trainer's own `torch.Generator` (action
sampling, minibatch order), so a checkpoint holding that generator, the networks, the
optimiser and an exact snapshot of the envs resumes to bit-identical weights on CPU.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from reflectrl.config import RunConfig
from reflectrl.envs import find_wrapper, is_continuous, make_vector_env, snapshot
from reflectrl.envs.cost import CostTracker
from reflectrl.envs.statekey import is_montezuma
from reflectrl.errors import NonFiniteError, UserError
from reflectrl.estimators import compute_gae
from reflectrl.nets import flatten_parameters
from reflectrl.runs import MetricsLogger, RunDir
from reflectrl.runs.progress import RECENT_EPISODES
from reflectrl.runs.state_samples import StateSampler
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
from reflectrl.trainers.cnn import make_policy
from reflectrl.trainers.exploration_metrics import ExplorationTracker, RolloutKeys
from reflectrl.trainers.onpolicy.update import ClipKnobs, clipped_update
from reflectrl.trainers.policies import params_sha256
from reflectrl.trainers.streams import ValueStreams

CHECKPOINT_FORMAT = 1


@dataclass
class Rollout:
    """One iteration's experience, each tensor (num_steps, num_envs, ...)."""

    obs: torch.Tensor
    actions: torch.Tensor
    logprobs: torch.Tensor
    rewards: torch.Tensor
    terminations: torch.Tensor
    truncations: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    next_obs: torch.Tensor | None = None       # s' of each step (filled when the signal asks for it)
    learn_rewards: torch.Tensor | None = None  # what advantages are estimated from (env reward + signal terms)
    weights: torch.Tensor | None = None        # per-step weights on the advantage in the policy loss
    state_keys: torch.Tensor | None = None     # int64 exploration state keys of obs[t] (exploration_metrics.py)
    next_state_keys: torch.Tensor | None = None  # ... and of the state each step reached
    last_obs: torch.Tensor | None = None       # the observation after the rollout (N, ...)
    truncated_final: tuple | None = None       # ([(t, env)], final observations) of the truncated steps
    signal_terms: dict | None = None           # each signal's per-step terms ("NAME KIND": (T, N)), for state maps
    trunk: torch.Tensor | None = None          # the CNN trunk's outputs of obs, last_obs and the truncated finals,
                                               # in that order (kept for value heads on the trunk: streams.py)
    costs: torch.Tensor | None = None          # info["cost"] of each step, where the env has a cost channel
    stream_values: dict | None = None          # the reward streams' values over the rollout (streams.py, cached)
    memory: torch.Tensor | None = None         # a recurrent policy's memory before the rollout's first step
    starts: torch.Tensor | None = None         # ... and where an episode begins, bool (T, N) (its memory zeroed)


class PPOTrainer(EnvStepTrainer):
    def __init__(self, cfg: RunConfig, run: RunDir | None = None, signal: Signal | None = None):
        torch.set_num_threads(cfg.torch_threads)
        self.cfg = cfg
        self.run = run
        p = cfg.ppo
        self.envs = make_vector_env(cfg)
        obs_space = self.envs.single_observation_space
        act_space = self.envs.single_action_space
        self.continuous = is_continuous(act_space)
        self.obs_dim = int(np.prod(obs_space.shape))
        self.obs_shape = obs_space.shape  # (obs_dim,), or an image's shape for a CNN encoder
        self.action_shape = act_space.shape if self.continuous else ()
        action_dim = act_space.shape[0] if self.continuous else int(act_space.n)
        if self.continuous:
            self.action_low, self.action_high = act_space.low, act_space.high

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.agent = make_policy(self.obs_shape, action_dim, self.continuous, p.encoder, p.hidden_sizes, p.policy)
        # policy=gru/lstm: the memory carried from step to step, and which envs' next observation begins an episode
        self.recurrent = p.policy != "mlp"
        if self.recurrent:
            self.memory = self.agent.initial_memory(p.num_envs)
            self.episode_starts = torch.ones(p.num_envs, dtype=torch.bool)
        self.flat_params = flatten_parameters(self.agent)
        self.optimizer = torch.optim.Adam([self.flat_params], lr=p.learning_rate, eps=1e-5, fused=True)
        self.generator = torch.Generator().manual_seed(cfg.seed)

        self.num_iterations = math.ceil(cfg.total_steps / p.batch_size)
        self.signal = signal if signal is not None else make_signal(cfg)
        if self.signal is not None:
            self.signal.bind(SignalContext(
                obs_dim=self.obs_dim, action_dim=action_dim, discrete=not self.continuous,
                feature_dim=self.agent.feature_dim, learning_rate=p.learning_rate, gamma=p.gamma,
                gae_lambda=p.gae_lambda, seed=cfg.seed, total_iterations=self.num_iterations,
                obs_shape=tuple(self.obs_shape), image_obs=p.encoder == "cnn", cost_limit=cfg.cost_limit))
        self.streams = None  # value heads of the signals' own reward streams (trainers/streams.py)
        if self.signal is not None and self.signal.reward_streams():
            shared = p.stream_heads == "shared" or (p.stream_heads == "auto" and p.encoder == "cnn")
            if shared and not getattr(self.agent, "shared_trunk", False):
                raise UserError(f"stream_heads={p.stream_heads} needs a CNN policy (encoder=cnn): this run's "
                                f"encoder={p.encoder} has no trunk to share; use stream_heads=separate")
            trunk = (self.agent.head_in_dim, self.agent.head_hidden) if shared else None
            self.streams = ValueStreams(self.signal, tuple(self.obs_shape), p.hidden_sizes, cfg.seed, p.gae_lambda,
                                        p.encoder, trunk=trunk)
            self.optimizer.add_param_group({"params": [self.streams.flat]})
        self.global_step = 0
        self.iteration = 0
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        obs, info = self.envs.reset(seed=cfg.seed)
        self.next_obs = torch.as_tensor(obs, dtype=torch.float32)
        self.keys = RolloutKeys(obs, info)  # exploration state keys, and the metrics counted on them
        self.cost_tracker = CostTracker(p.num_envs)  # the env's cost channel, where it has one (envs/cost.py)
        self.exploration = ExplorationTracker(rooms=is_montezuma(cfg.env_id))
        self._check_finite(self.next_obs, "observation")
        self.logger: MetricsLogger | None = None
        self._own_estimate = Stopwatch()  # times the trainer's own advantage estimate inside apply_signal
        # where the run goes and what it is paid there, at a few points of training (plot state-map)
        self.samples = StateSampler(run.path if run is not None else None, cfg.seed, self.num_iterations,
                                    cfg.state_map_snapshots)

    # ------------------------------------------------------------------ collect

    @torch.no_grad()  # once around the loop: entering it per step costs more than the policy
    def collect(self) -> tuple[Rollout, list[tuple[float, int]]]:
        """Run the policy for num_steps in every env; returns the rollout and finished episodes."""
        p = self.cfg.ppo
        T, N = p.num_steps, p.num_envs
        # numpy buffers: per-step writes into them cost a fraction of torch indexing
        obs = np.zeros((T, N, *self.obs_shape), dtype=np.float32)
        rewards = np.zeros((T, N), dtype=np.float32)
        terminations = np.zeros((T, N), dtype=bool)
        truncations = np.zeros((T, N), dtype=bool)
        actions = np.zeros((T, N, *self.action_shape), dtype=np.float32 if self.continuous else np.int64)
        logprobs = np.zeros((T, N), dtype=np.float32)
        ended_at: list[tuple[int, int, np.ndarray]] = []  # (step, env, final observation) of every episode end
        episodes: list[tuple[float, int]] = []

        # a policy whose actor and critic share an expensive trunk (the CNNs) gives each step's
        # value with its action; the others' values come from one batched pass after the loop
        shared = getattr(self.agent, "values_with_actions", False)
        step_values = torch.zeros((T, N)) if shared else None
        keep_trunk = self.streams is not None and self.streams.shared  # reward streams' heads read the trunk
        recurrent = self.recurrent  # its outputs are kept (what signals' features and stream heads read)
        keep_trunk = keep_trunk or recurrent
        if recurrent:
            memory, starts = self.memory, torch.zeros((T, N), dtype=torch.bool)
            first_memory, final_memory = memory, {}  # the memory of each truncated step, for V(final obs)
        step_trunk = torch.zeros((T, N, self.agent.head_in_dim)) if keep_trunk else None
        # the MLP policy samples in numpy (policies.NumpySampler: a few us where act() is ~50)
        sampler = self.agent.numpy_sampler() if self.agent.numpy_acting and not (shared or keep_trunk) else None
        next_obs = self.next_obs.numpy()
        self.keys.start(T, self.envs)
        self.cost_tracker.start(T)
        for t in range(T):
            obs[t] = next_obs
            if sampler is not None:
                action, logprob = sampler(obs[t], self.generator)
            elif recurrent:
                starts[t] = self.episode_starts
                action, logprob, step_values[t], step_trunk[t], memory = self.agent.act_value(
                    torch.from_numpy(obs[t]), memory, starts[t], self.generator)
            elif keep_trunk:
                action, logprob, step_values[t], step_trunk[t] = self.agent.act_value(
                    torch.from_numpy(obs[t]), self.generator, with_trunk=True)
            elif shared:
                action, logprob, step_values[t] = self.agent.act_value(torch.from_numpy(obs[t]), self.generator)
            else:
                action, logprob = self.agent.act(torch.from_numpy(obs[t]), self.generator)
            actions[t], logprobs[t] = action, logprob
            env_action = actions[t]
            if self.continuous:
                env_action = np.clip(env_action, self.action_low, self.action_high)
            next_obs, reward, term, trunc, info = self.envs.step(env_action)
            self.global_step += N
            if not (np.isfinite(next_obs).all() and np.isfinite(reward).all()):
                raise NonFiniteError("observation" if not np.isfinite(next_obs).all() else "reward", self.global_step)
            rewards[t], terminations[t], truncations[t] = reward, term, trunc
            self.keys.record(t, next_obs, info)
            self.cost_tracker.record(t, info, term | trunc)
            if recurrent:
                self.episode_starts = torch.from_numpy(term | trunc)
            if "final_obs" in info:
                for i in np.flatnonzero(info["_final_obs"]):
                    ended_at.append((t, int(i), info["final_obs"][i]))
                    if recurrent and not term[i]:
                        final_memory[t, int(i)] = memory[:, i]
                final = info["final_info"]
                if "episode" in final:
                    for i in np.flatnonzero(final["_episode"]):
                        episodes.append((float(final["episode"]["r"][i]), int(final["episode"]["l"][i])))
        self.keys.finish()
        self.next_obs = torch.as_tensor(next_obs, dtype=torch.float32)

        # Values do not steer the rollout, so one batched pass after it replaces T small ones:
        # V(s_t) for every step, V(s_T) and V(final observation) at each truncation.
        obs = torch.from_numpy(obs)
        truncated_at = [(t, i, o) for t, i, o in ended_at if not terminations[t, i]]
        inputs = ([] if shared else [obs.reshape(-1, *self.obs_shape)]) + [self.next_obs]
        if truncated_at:
            final_obs = torch.as_tensor(np.stack([o for _, _, o in truncated_at]), dtype=torch.float32)
            self._check_finite(final_obs, "observation")
            inputs.append(final_obs)
        trunk = None
        if recurrent:  # V(s_T) from the memory carried on, V(final obs) from the memory its episode ended with
            self.memory = memory
            memories = torch.cat([memory, *(final_memory[t, i].unsqueeze(1) for t, i, _ in truncated_at)], 1)
            tail_starts = torch.cat([self.episode_starts, torch.zeros(len(truncated_at), dtype=torch.bool)])
            trunk = self.agent.step(torch.cat(inputs), memories, tail_starts)[0]
            all_values = self.agent.value_from_trunk(trunk)
            trunk = torch.cat([step_trunk.reshape(T * N, -1), trunk])
        elif keep_trunk:
            trunk = self.agent.encode(torch.cat(inputs))
            all_values = self.agent.value_from_trunk(trunk)
            trunk = torch.cat([step_trunk.reshape(T * N, -1), trunk])
        else:
            all_values = self.agent.value(torch.cat(inputs))
        if shared:
            values, all_values = step_values, torch.cat([step_values.reshape(-1), all_values])
        else:
            values = all_values[:T * N].reshape(T, N)
        next_values = torch.empty_like(values)
        next_values[:-1] = values[1:]
        next_values[-1] = all_values[T * N:T * N + N]
        for k, (t, i, _) in enumerate(truncated_at):
            next_values[t, i] = all_values[T * N + N + k]
        next_obs = None
        if self.signal is not None and self.signal.wants_next_obs:
            # s' of every step: the next row, or the episode's last observation where it ended
            next_obs = torch.empty_like(obs)
            next_obs[:-1] = obs[1:]
            next_obs[-1] = self.next_obs
            for t, i, o in ended_at:
                next_obs[t, i] = torch.as_tensor(o, dtype=torch.float32)
        rewards, terminations, truncations, actions, logprobs = map(
            torch.from_numpy, (rewards, terminations, truncations, actions, logprobs))
        rollout = Rollout(obs, actions, logprobs, rewards, terminations, truncations, values, next_values,
                          next_obs=next_obs, state_keys=torch.from_numpy(self.keys.state_keys),
                          next_state_keys=torch.from_numpy(self.keys.next_state_keys), last_obs=self.next_obs,
                          truncated_final=([(t, i) for t, i, _ in truncated_at], final_obs) if truncated_at else None,
                          trunk=trunk,
                          costs=torch.from_numpy(self.cost_tracker.costs) if self.cost_tracker.seen else None)
        if recurrent:
            rollout.memory, rollout.starts = first_memory, starts
        return rollout, episodes

    # ------------------------------------------------------------------ estimate

    def estimate(self, rollout: Rollout) -> None:
        rewards = rollout.rewards if rollout.learn_rewards is None else rollout.learn_rewards
        rollout.advantages, rollout.returns = self._gae(rollout, rewards)

    def _gae(self, rollout: Rollout, rewards: torch.Tensor):
        return self._gae_with(rewards, rollout.values, rollout.next_values, rollout.terminations, rollout.truncations)

    def _gae_with(self, rewards, values, next_values, terminations, truncations):
        p = self.cfg.ppo
        return compute_gae(rewards, values, next_values, terminations, truncations, p.gamma, p.gae_lambda)

    # ------------------------------------------------------------------ signal

    def apply_signal(self, rollout: Rollout) -> Batch:
        """Call the signal's hooks around advantage estimation (see signals/base.py)."""
        signal = self.signal
        features = None
        if signal.wants_features and self.recurrent:  # the recurrent outputs the heads read in the rollout
            features = rollout.trunk[:rollout.values.numel()].reshape(*rollout.values.shape, -1)
        elif signal.wants_features:
            with torch.no_grad():
                features = self.agent.features(rollout.obs.reshape(-1, self.obs_dim)).reshape(
                    *rollout.values.shape, -1)
        batch = Batch(obs=rollout.obs, actions=rollout.actions, rewards=rollout.rewards,
                      terminations=rollout.terminations, truncations=rollout.truncations,
                      values=rollout.values, next_values=rollout.next_values, features=features,
                      next_obs=rollout.next_obs, iteration=self.iteration, global_step=self.global_step,
                      estimate=lambda r: self._gae(rollout, r), value_fn=self.agent.value, gae=self._gae_with,
                      features_fn=self.agent.features,
                      state_keys=rollout.state_keys, next_state_keys=rollout.next_state_keys,
                      costs=rollout.costs, episode_costs=list(self.cost_tracker.finished),
                      act_fn=None if self.recurrent else lambda obs, generator: self.agent.act(obs, generator)[0])
        if self.streams is not None:
            batch.stream_weights = self.streams.weights()
            batch.stream_values = lambda: self.streams.rollout_values(rollout)
        result = apply_signals(signal, batch, lambda rewards: self._gae(rollout, rewards))
        self._own_estimate.seconds += result.own_estimate.seconds  # the estimate made with or without a signal
        rollout.learn_rewards, rollout.advantages, rollout.returns = result.rewards, result.advantages, result.returns
        rollout.weights, rollout.signal_terms = result.weights, result.terms
        if self.streams is not None:  # the signals' own reward streams, each with its value head
            rollout.advantages = self.streams.advantages(rollout, result.streams, rollout.advantages)
            batch.stream_advantages = dict(self.streams.advantages_of)
        return batch

    # ------------------------------------------------------------------ update

    def update(self, rollout: Rollout) -> dict:
        """The clipped update (trainers/onpolicy/update.py), with the signal's auxiliary loss and the
        reward streams' value heads added to each minibatch's loss."""
        if self.recurrent:
            return self.update_sequences(rollout)
        b_obs = self.agent.batch_layout(rollout.obs.reshape(-1, self.obs_dim))
        b_actions = rollout.actions.reshape(-1, *self.action_shape)
        b = {"logprobs": rollout.logprobs.reshape(-1), "advantages": rollout.advantages.reshape(-1),
             "returns": rollout.returns.reshape(-1), "values": rollout.values.reshape(-1),
             "weights": None if rollout.weights is None else rollout.weights.reshape(-1)}
        aux = self.signal is not None and self.signal.wants_feature_grad
        streams = self.streams
        on_trunk = streams is not None and streams.shared  # the streams' heads read this pass's trunk output

        def evaluate(idx):
            if on_trunk:
                newlogprob, entropy, newvalue, *features, trunk = self.agent.evaluate(
                    b_obs[idx], b_actions[idx], aux, with_trunk=True)
                features = features[0] if aux else None
            elif aux:
                newlogprob, entropy, newvalue, features = self.agent.evaluate(b_obs[idx], b_actions[idx], True)
            else:
                newlogprob, entropy, newvalue = self.agent.evaluate(b_obs[idx], b_actions[idx])
            heads_read = trunk if on_trunk else (None if streams is None else b_obs[idx])
            return newlogprob, entropy, newvalue, self.extra_losses(features if aux else None, heads_read, idx)

        return self.clipped(evaluate, b)

    def extra_losses(self, features, heads_read, idx) -> list:
        """A minibatch's terms beside PPO's loss: the signal's auxiliary loss on `features` (None: the
        signal wants none) and the reward streams' value loss on `heads_read`, for the rows `idx`."""
        extras = []
        if features is not None:
            extra = self.signal.auxiliary_loss(features, idx)
            if extra is not None:
                extras.append(extra)
        if self.streams is not None:
            extras.append(self.cfg.ppo.vf_coef * self.streams.value_loss(heads_read, idx))
        return extras

    def clipped(self, evaluate, b: dict) -> dict:
        """PPO's clipped update over the batch `b` (rows: steps, or envs for sequences), with the stream
        heads' parameters beside the policy's where a signal has reward streams."""
        streams = self.streams
        flats = [self.flat_params] if streams is None else [self.flat_params, streams.flat]
        norm = None if streams is None else (lambda: streams.global_norm(self.flat_params.grad))
        stats = clipped_update(flats, self.optimizer, evaluate, b, ClipKnobs.of(self.cfg.ppo), self.generator,
                               self.global_step, grad_norm=norm)
        return {**({} if streams is None else streams.metrics()), **stats}

    def update_sequences(self, rollout: Rollout) -> dict:
        """A recurrent policy's update: the clipped update over whole per-env sequences, each minibatch a
        set of envs (CleanRL's ppo_atari_lstm.py), the recurrence re-run over their T steps from the memory
        the rollout began with. The update's rows are envs (each holds its T steps), so the minibatches split
        the envs; a signal's auxiliary loss and the stream heads see the steps by their flat index t*N + env."""
        T, N = rollout.values.shape
        steps = torch.arange(T * N).reshape(T, N).T  # (N, T): each env's steps by their flat index
        rows = lambda x: None if x is None else x.T  # noqa: E731  (T, N) -> (N, T): a row per env
        b = {"logprobs": rows(rollout.logprobs), "advantages": rows(rollout.advantages),
             "returns": rows(rollout.returns), "values": rows(rollout.values), "weights": rows(rollout.weights)}
        aux = self.signal is not None and self.signal.wants_feature_grad
        streams = self.streams
        on_trunk = streams is not None and streams.shared
        flat_obs = rollout.obs.reshape(T * N, -1)

        def evaluate(envs):
            idx = steps[envs].reshape(-1)
            newlogprob, entropy, newvalue, out = self.agent.evaluate_sequences(
                rollout.obs[:, envs], rollout.actions[:, envs], rollout.memory[:, envs], rollout.starts[:, envs])
            out = out.transpose(0, 1).reshape(len(idx), -1)  # in the order of idx
            heads_read = out if on_trunk else (None if streams is None else flat_obs[idx])
            return newlogprob.T, entropy.T, newvalue.T, self.extra_losses(out if aux else None, heads_read, idx)

        return self.clipped(evaluate, b)

    # ------------------------------------------------------------------ loop

    def run_iteration(self) -> dict:
        """One iteration: collect, estimate (with the signal's hooks), update; its metrics row."""
        p = self.cfg.ppo
        self.iteration += 1
        if p.anneal_lr:
            frac = 1.0 - (self.iteration - 1.0) / self.num_iterations
            for group in self.optimizer.param_groups:  # the policy's, and the reward streams' heads
                group["lr"] = frac * p.learning_rate
        start = time.perf_counter()
        step_before = self.global_step
        self.keys.seconds = 0.0
        rollout, episodes = self.collect()
        began = time.perf_counter()
        exploration = self.exploration.update(self.keys.state_keys, rollout.rewards.numpy(), step_before)
        exploration_seconds = self.keys.seconds + time.perf_counter() - began
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
            # the signal's share of the iteration's time: its hooks and the advantage estimates
            # they cause, not the one the trainer makes without a signal too
            own = watch.seconds - self._own_estimate.seconds
            stats["signal_time_fraction"] = own / (time.perf_counter() - start)
        if self.samples.wants(self.iteration):
            self.samples.record(self.iteration, self.global_step, rollout.obs, rollout.state_keys, rollout.rewards,
                                rollout.signal_terms or {})
        elapsed = time.perf_counter() - start
        returns = [r for r, _ in episodes]
        self.recent_returns.extend(returns)
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "episodic_return": float(np.mean(returns)) if returns else None,
            "episodic_length": float(np.mean([n for _, n in episodes])) if episodes else None,
            "episodes": len(episodes),
            "learning_rate": self.optimizer.param_groups[0]["lr"],
            **stats,
            **exploration,
            # the state keys' bookkeeping and the metrics (the wrappers' per-step copy of an observation
            # runs inside the env step and is not counted)
            "exploration_time_fraction": exploration_seconds / elapsed,
            **self.cost_tracker.metrics(self.cfg.cost_limit),
            "steps_per_second": p.batch_size / elapsed,
        }

    # what the shared loop (trainers/base.py) needs beyond EnvStepTrainer's

    @property
    def discrete_entropy(self) -> bool:
        return not self.continuous

    @property
    def policy_module(self) -> torch.nn.Module:
        """What a finished run's params_sha256 hashes."""
        return self.agent

    def total_units(self) -> int:
        return self.num_iterations * self.cfg.ppo.batch_size


    # ------------------------------------------------------------------ checkpoints

    def _check_finite(self, tensor: torch.Tensor, quantity: str) -> None:
        if not torch.isfinite(tensor).all():
            raise NonFiniteError(quantity, self.global_step)

    def obs_normalizer_state(self) -> dict | None:
        wrapper = find_wrapper(self.envs.envs[0], gym.wrappers.NormalizeObservation)
        if wrapper is None:
            return None
        rms = wrapper.obs_rms
        return {"mean": rms.mean.copy(), "var": rms.var.copy(), "count": rms.count}

    def state_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.cfg.to_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            **global_rngs(),
            "envs": snapshot.dumps(self.envs),
            "next_obs": self.next_obs.clone(),
            "recent_returns": list(self.recent_returns),
            "obs_normalizer": self.obs_normalizer_state(),
            "params_sha256": params_sha256(self.agent),
            "signal": None if self.signal is None else self.signal.state_dict(),
            "streams": None if self.streams is None else self.streams.state_dict(),
            "exploration": exploration_state(self),
            "cost_tracker": self.cost_tracker.state_dict(),
            # a recurrent policy's memory, carried into the next rollout
            **({"memory": self.memory.clone(), "episode_starts": self.episode_starts.clone()}
               if self.recurrent else {}),
        }

    def load_state_dict(self, state: dict) -> None:
        self.global_step = state["global_step"]
        self.iteration = state["iteration"]
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        restore_global_rngs(state)
        self.recent_returns = deque(state["recent_returns"], maxlen=RECENT_EPISODES)
        if self.signal is not None:
            self.signal.load_state_dict(state["signal"])
        if self.streams is not None:
            try:
                self.streams.load_state_dict(state["streams"])
            except RuntimeError:
                raise UserError(f"the checkpoint's reward-stream value heads do not match stream_heads="
                                f"{self.cfg.ppo.stream_heads} of this run's config; was config.json edited?") from None
        restore_exploration(self, state.get("exploration"))
        if state.get("cost_tracker") is not None:
            self.cost_tracker.load_state_dict(state["cost_tracker"])
        self.next_obs = state["next_obs"].clone()
        if self.recurrent:
            self.memory, self.episode_starts = state["memory"].clone(), state["episode_starts"].clone()
        for i, obs in restore_envs(self, state["envs"]):
            self.next_obs[i] = torch.as_tensor(obs, dtype=torch.float32)
            if self.recurrent:
                self.episode_starts[i] = True  # its episode restarted: so does its memory

    def save_checkpoint(self) -> None:
        assert self.run is not None
        self.run.save_checkpoint(self.state_dict())

    def close(self) -> None:
        self.envs.close()
