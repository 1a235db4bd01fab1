"""IMPALA (Espeholt et al. 2018) on Ray: many actors step envs in parallel with a local copy of
the policy, one learner applies V-trace to their trajectories and publishes new weights;
seed 002 section 6.4's setting for self-distilled shaping, and the home of any signal.

Per iteration (one learner update):

    unrolls = pool.collect(weights, version, batch_trajectories / envs_per_actor)   (pool.py)
    batch (T = unroll_length, N = batch_trajectories): obs, actions, mu's log-probs, rewards, ends
    pi's log-probs, entropies and V(x_t) in one pass with gradients; V at each trajectory's end
      and at truncations without
    the signals' hooks as under PPO (signals/base.py), with V-trace as the trainer's estimator
    loss = -mean(A_vtrace * w * log pi) + vf_coef * 0.5 * mean((v_s - V)^2) - ent_coef * H
    one Adam step (global grad-norm clip), version += 1, new weights to the object store

Choices, each a DECISION with its reason:

* The signals run on the learner, on each batch, after collection, as under PPO: the
  signals' protocol has no acting-time hook, and the learner holds the one signal whose heads
  it fits. Seed 002 section 6.4 has actors compute F with a possibly stale copy of the shaper;
  here F is the learner's current F_target (zero shaper lag), the seed's design at its
  freshest; the policy is what runs stale on the actors (`policy_lag_*`), and V-trace corrects
  for that. A shaper evaluated on actors would cost nothing on the learner but add a second
  lag; at this project's network sizes the learner-side pass is a few percent of a step.
* One gradient step per batch (the paper's learner), no minibatches or epochs; V-trace's
  advantages unnormalised (`norm_adv=false`), as the paper and RLlib.
* The value loss is a mean over the batch's steps (RLlib's), not the paper's sum, so
  `vf_coef` means what it means under PPO.
* No observation or reward normalisation: each actor's running statistics would differ, and
  the learner would learn from inconsistently scaled data.
* Batch.env_ids names each column's env slot (actor slot * envs_per_actor + env), so signals
  that carry per-env state across batches (the episodic count, RND's reward filter) stay right when a batch's
  columns come from different actors than the last one's.

Bit-identity with an uninterrupted run is not expected with asynchronous actors (which unroll
arrives first depends on the machine); `synchronous=true` (any number of actors) or
actors=inline is deterministic, and a synchronous checkpoint holds the actors' envs so that
resuming it is exact on CPU. An asynchronous run resumes with fresh actors on new slots.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from types import SimpleNamespace

import numpy as np
import torch

from reflectrl.config import RunConfig
from reflectrl.envs import is_continuous, make_vector_env
from reflectrl.envs.statekey import is_montezuma
from reflectrl.errors import NonFiniteError, UserError
from reflectrl.estimators import vtrace
from reflectrl.nets import flatten_parameters
from reflectrl.runs import MetricsLogger, RunDir
from reflectrl.runs.progress import RECENT_EPISODES
from reflectrl.runs.state_samples import StateSampler
from reflectrl.signals import Batch, Signal, SignalContext, make_signal
from reflectrl.trainers.base import EnvStepTrainer, Stopwatch, apply_signals, global_rngs, restore_global_rngs
from reflectrl.trainers.cnn import make_policy
from reflectrl.trainers.exploration_metrics import ExplorationTracker
from reflectrl.trainers.impala.actor import Unroll
from reflectrl.trainers.impala.pool import InlinePool, RayPool
from reflectrl.trainers.policies import params_sha256
from reflectrl.trainers.streams import ValueStreams

CHECKPOINT_FORMAT = 1


class IMPALATrainer(EnvStepTrainer):

    def __init__(self, cfg: RunConfig, run: RunDir | None = None, signal: Signal | None = None):
        torch.set_num_threads(cfg.torch_threads)
        self.cfg, self.run = cfg, run
        d = self.knobs = cfg.impala
        probe = make_vector_env(cfg)  # the spaces as the actors' envs give them
        obs_space, act_space = probe.single_observation_space, probe.single_action_space
        probe.close()
        self.continuous = is_continuous(act_space)
        self.obs_shape = tuple(obs_space.shape)
        self.obs_dim = int(np.prod(self.obs_shape))
        self.action_shape = act_space.shape if self.continuous else ()
        action_dim = act_space.shape[0] if self.continuous else int(act_space.n)

        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.agent = make_policy(self.obs_shape, action_dim, self.continuous, d.encoder, d.hidden_sizes)
        self.flat_params = flatten_parameters(self.agent)
        self.optimizer = torch.optim.Adam([self.flat_params], lr=d.learning_rate, eps=1e-5, fused=True)
        self.unrolls_per_batch = d.trajectories // d.envs_per_actor
        self.num_iterations = math.ceil(cfg.total_steps / d.batch_size)
        self.signal = signal if signal is not None else make_signal(cfg)
        if self.signal is not None:
            self.signal.bind(SignalContext(
                obs_dim=self.obs_dim, action_dim=action_dim, discrete=not self.continuous,
                feature_dim=self.agent.feature_dim, learning_rate=d.learning_rate, gamma=d.gamma,
                gae_lambda=d.vtrace_lambda, seed=cfg.seed, total_iterations=self.num_iterations,
                obs_shape=self.obs_shape, image_obs=d.encoder == "cnn"))
        self.streams = None
        if self.signal is not None and self.signal.reward_streams():
            self.streams = ValueStreams(self.signal, self.obs_shape, d.hidden_sizes, cfg.seed, d.vtrace_lambda,
                                        d.encoder)
            self.optimizer.add_param_group({"params": [self.streams.flat]})
        self.global_step = 0        # env steps the learner has learnt from
        self.iteration = 0          # learner updates
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self.exploration = ExplorationTracker(rooms=is_montezuma(cfg.env_id))
        self.samples = StateSampler(run.path if run is not None else None, cfg.seed, self.num_iterations,
                                    cfg.state_map_snapshots)
        self.logger: MetricsLogger | None = None
        self.pool = None
        self.first_slot = 0           # the slot the next pool's first actor takes
        self.actor_states = None      # the actors' states a synchronous checkpoint restores
        self.restarts_before = 0      # actor restarts of earlier sessions of this run
        self.started = None           # wall-clock start of this session's training
        self._own_estimate = Stopwatch()

    # ------------------------------------------------------------------ actors

    def prepare(self) -> None:
        self._ensure_pool()

    def _ensure_pool(self):
        if self.pool is None:
            d = self.knobs
            config = self.cfg.to_dict()
            if d.actors == "inline":
                self.pool = InlinePool(config, d.num_actors, self.first_slot)
            else:
                self.pool = RayPool(config, d.num_actors, synchronous=d.synchronous, address=d.ray_address,
                                    actor_cpus=d.actor_cpus, max_failures=d.max_actor_failures,
                                    first_slot=self.first_slot)
            if self.actor_states is not None:
                self.pool.load_states(self.actor_states)
                self.actor_states = None
        return self.pool

    def weights(self) -> np.ndarray:
        return self.flat_params.detach().numpy().copy()

    @property
    def exact_actors(self) -> bool:
        """Whether the actors' state is part of a checkpoint (synchronous collection)."""
        return self.knobs.actors == "inline" or self.knobs.synchronous

    # ------------------------------------------------------------------ batch

    def assemble(self, unrolls: list[Unroll]) -> SimpleNamespace:
        """The unrolls side by side as one (T, N) batch, columns in the unrolls' order."""
        T, E = self.knobs.unroll_length, self.knobs.envs_per_actor
        cat = lambda name: np.concatenate([getattr(u, name) for u in unrolls], axis=1)  # noqa: E731
        for u in unrolls:
            if u.nonfinite is not None:
                raise NonFiniteError(u.nonfinite, self.global_step)
        ended = [(t, k * E + e, o) for k, u in enumerate(unrolls) for t, e, o in u.ended]
        obs = torch.as_tensor(cat("obs"), dtype=torch.float32)
        return SimpleNamespace(
            obs=obs, actions=torch.as_tensor(cat("actions")), behaviour_logprobs=torch.as_tensor(cat("logprobs")),
            rewards=torch.as_tensor(cat("rewards")), terminations=torch.as_tensor(cat("terminations")),
            truncations=torch.as_tensor(cat("truncations")),
            last_obs=torch.as_tensor(np.concatenate([u.last_obs for u in unrolls]), dtype=torch.float32),
            ended=ended, episodes=[ep for u in unrolls for ep in u.episodes],
            state_keys=torch.as_tensor(cat("state_keys")), next_state_keys=torch.as_tensor(cat("next_state_keys")),
            env_ids=torch.as_tensor([u.slot * E + e for u in unrolls for e in range(E)]),
            lags=[self.iteration - u.version for u in unrolls], shape=(T, len(unrolls) * E))

    def next_values(self, b, values: torch.Tensor) -> tuple[torch.Tensor, list, torch.Tensor | None]:
        """V(x_{t+1}) of every step (V of the final observation at a truncation), without gradients;
        also the truncated steps and their final observations."""
        T, N = b.shape
        truncated = [(t, i, o) for t, i, o in b.ended if not b.terminations[t, i]]
        inputs = [b.last_obs]
        final_obs = None
        if truncated:
            final_obs = torch.as_tensor(np.stack([o for _, _, o in truncated]), dtype=torch.float32)
            inputs.append(final_obs)
        with torch.no_grad():
            tail = self.agent.value(torch.cat(inputs))
        nv = torch.empty_like(values)
        nv[:-1] = values[1:]
        nv[-1] = tail[:N]
        for k, (t, i, _) in enumerate(truncated):
            nv[t, i] = tail[N + k]
        return nv, truncated, final_obs

    # ------------------------------------------------------------------ learner

    def run_iteration(self) -> dict:
        d = self.knobs
        pool = self._ensure_pool()
        if self.started is None:
            self.started = time.perf_counter()
        if d.anneal_lr:
            frac = 1.0 - self.iteration / self.num_iterations
            for group in self.optimizer.param_groups:
                group["lr"] = frac * d.learning_rate
        start = time.perf_counter()
        step_before = self.global_step
        unrolls = pool.collect(self.weights(), self.iteration, self.unrolls_per_batch)
        waited = time.perf_counter() - start
        b = self.assemble(unrolls)
        T, N = b.shape
        self.global_step += T * N
        exploration = self.exploration.update(b.state_keys.numpy(), b.rewards.numpy(), step_before)

        learn_start = time.perf_counter()
        b_obs = self.agent.batch_layout(b.obs.reshape(T * N, -1))
        b_actions = b.actions.reshape(T * N, *self.action_shape)
        logprobs, entropy, values = self.agent.evaluate(b_obs, b_actions)
        target_logprobs = logprobs.detach().reshape(T, N)
        values_d = values.detach().reshape(T, N)
        next_values, truncated, final_obs = self.next_values(b, values_d)
        self._check_finite(values_d, "value")

        def estimator(rewards, v, nv, terms, truncs, gamma=d.gamma):
            """V-trace under this batch's importance weights: (advantages, targets, clip statistics)."""
            return vtrace(b.behaviour_logprobs, target_logprobs, rewards, v, nv, terms, truncs, gamma, d.rho_bar,
                          d.c_bar, vtrace_lambda=d.vtrace_lambda)

        weights, batch, terms = None, None, {}
        signal_stats, watch, self._own_estimate = {}, Stopwatch(), Stopwatch()
        if self.signal is None:
            advantages, targets, vstats = estimator(b.rewards, values_d, next_values, b.terminations, b.truncations)
        else:
            with watch:
                batch, advantages, targets, vstats, weights, terms = self.apply_signal(
                    b, values_d, next_values, truncated, final_obs, estimator)
        if self.samples.wants(self.iteration + 1):
            self.samples.record(self.iteration + 1, self.global_step, b.obs, b.state_keys, b.rewards, terms)

        adv = advantages.reshape(-1)
        if d.norm_adv:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        if weights is not None:
            adv = adv * weights.reshape(-1)
        pg_loss = -(adv * logprobs).mean()
        v_loss = 0.5 * (values - targets.reshape(-1)).square().mean()
        entropy_loss = entropy.mean()
        loss = pg_loss + d.vf_coef * v_loss - d.ent_coef * entropy_loss
        if self.streams is not None:
            loss = loss + d.vf_coef * self.streams.value_loss(b.obs.reshape(T * N, -1), torch.arange(T * N))
        self._check_finite(loss, "loss")
        grad = self.flat_params.grad
        grad.zero_()
        if self.streams is not None:
            self.streams.flat.grad.zero_()
        loss.backward()
        grad_norm = torch.linalg.vector_norm(grad) if self.streams is None else self.streams.global_norm(grad)
        self._check_finite(grad_norm, "gradient")
        scale = torch.clamp(d.max_grad_norm / (grad_norm + 1e-6), max=1.0)
        grad.mul_(scale)
        if self.streams is not None:
            self.streams.flat.grad.mul_(scale)
        self.optimizer.step()
        self.iteration += 1
        if self.signal is not None:
            with watch:
                self.signal.after_update(batch)
            signal_stats = {**self.signal.metrics(),
                            "signal_time_fraction": (watch.seconds - self._own_estimate.seconds)
                            / (time.perf_counter() - start)}
        now = time.perf_counter()
        learned = now - learn_start
        elapsed = now - start
        returns = [r for r, _ in b.episodes]
        self.recent_returns.extend(returns)
        y, pred = targets.numpy().reshape(-1), values_d.numpy().reshape(-1)
        var_y = float(np.var(y))
        restarts = self.restarts_before + pool.restarts
        return {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "episodic_return": float(np.mean(returns)) if returns else None,
            "episodic_length": float(np.mean([n for _, n in b.episodes])) if b.episodes else None,
            "episodes": len(b.episodes),
            "learning_rate": self.optimizer.param_groups[0]["lr"],
            "policy_loss": pg_loss.item(),
            "value_loss": v_loss.item(),
            "entropy": entropy_loss.item(),
            "grad_norm": grad_norm.item(),
            "explained_variance": float("nan") if var_y == 0 else float(1 - np.var(y - pred) / var_y),
            **vstats,
            **signal_stats,
            **self.streams_metrics(),
            **exploration,
            "policy_lag_mean": float(np.mean(b.lags)),
            "policy_lag_max": int(np.max(b.lags)),
            "actor_restarts": restarts,
            "actor_steps_per_second": float(np.mean([u.steps / u.seconds for u in unrolls if u.seconds > 0]))
            * d.num_actors,
            "learner_updates_per_second": 1.0 / elapsed,
            "learner_wait_fraction": waited / elapsed,
            "learner_update_seconds": learned,
            "steps_per_second": T * N / elapsed,
            "wall_time": now - self.started,
        }

    def streams_metrics(self) -> dict:
        return {} if self.streams is None else self.streams.metrics()

    def apply_signal(self, b, values, next_values, truncated, final_obs, estimator):
        """The signal's hooks around V-trace (signals/base.py), as PPOTrainer.apply_signal: the
        trainer's own estimate is made once, on the rewards with the signal's terms."""
        signal = self.signal
        T, N = b.shape
        features = None
        if signal.wants_features:
            with torch.no_grad():
                features = self.agent.features(b.obs.reshape(T * N, -1)).reshape(T, N, -1)
        next_obs = None
        if signal.wants_next_obs:
            next_obs = torch.empty_like(b.obs)
            next_obs[:-1] = b.obs[1:]
            next_obs[-1] = b.last_obs
            for t, i, o in b.ended:
                next_obs[t, i] = torch.tensor(o, dtype=torch.float32)  # a copy: o may be read-only (Ray)

        def gae(rewards, v, nv, terms, truncs, gamma=self.knobs.gamma):
            return estimator(rewards, v, nv, terms, truncs, gamma)[:2]

        def estimate(rewards):
            return gae(rewards, values, next_values, b.terminations, b.truncations)

        batch = Batch(obs=b.obs, actions=b.actions, rewards=b.rewards, terminations=b.terminations,
                      truncations=b.truncations, values=values, next_values=next_values, features=features,
                      next_obs=next_obs, iteration=self.iteration, global_step=self.global_step, estimate=estimate,
                      value_fn=self.agent.value, gae=gae, features_fn=self.agent.features,
                      state_keys=b.state_keys, next_state_keys=b.next_state_keys, env_ids=b.env_ids)
        rollout = None
        if self.streams is not None:
            self.streams.estimator = gae
            rollout = SimpleNamespace(obs=b.obs, last_obs=b.last_obs, terminations=b.terminations,
                                      truncations=b.truncations, trunk=None,
                                      truncated_final=([(t, i) for t, i, _ in truncated], final_obs)
                                      if truncated else None)
            batch.stream_weights = self.streams.weights()
            batch.stream_values = lambda: self.streams.rollout_values(rollout)
        result = apply_signals(signal, batch, lambda rewards: estimator(rewards, values, next_values, b.terminations,
                                                                         b.truncations))
        self._own_estimate.seconds += result.own_estimate.seconds  # the estimate made with or without a signal
        advantages, targets, vstats = result.advantages, result.returns, result.estimated[2]
        weights, terms = result.weights, result.terms
        if self.streams is not None:
            advantages = self.streams.advantages(rollout, result.streams, advantages)
            batch.stream_advantages = dict(self.streams.advantages_of)
        return batch, advantages, targets, vstats, weights, terms

    # ------------------------------------------------------------------ what the shared loop needs

    @property
    def discrete_entropy(self) -> bool:
        return not self.continuous

    @property
    def policy_module(self) -> torch.nn.Module:
        return self.agent

    iteration_knobs = "batch_trajectories x unroll_length"

    def total_units(self) -> int:
        return self.num_iterations * self.knobs.batch_size


    def postfix(self, row: dict) -> str:
        return f"{super().postfix(row)} lag={row['policy_lag_mean']:.1f}".strip()

    # ------------------------------------------------------------------ checkpoints

    def _check_finite(self, tensor: torch.Tensor, quantity: str) -> None:
        if not torch.isfinite(tensor).all():
            raise NonFiniteError(quantity, self.global_step)

    def state_dict(self) -> dict:
        pool = self.pool
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.cfg.to_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "agent": self.agent.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **global_rngs(),
            "recent_returns": list(self.recent_returns),
            "params_sha256": params_sha256(self.agent),
            "signal": None if self.signal is None else self.signal.state_dict(),
            "streams": None if self.streams is None else self.streams.state_dict(),
            "exploration": self.exploration.state_dict(),
            # the actors: their exact state where collection is synchronous, else only the slots used
            "actors": (pool.states() if pool is not None else self.actor_states) if self.exact_actors else None,
            "first_slot": self.first_slot if self.exact_actors else (pool.next_slot if pool else self.first_slot),
            "actor_restarts": self.restarts_before + (pool.restarts if pool is not None else 0),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise UserError("this IMPALA checkpoint was written by another version of reflectrl; start the run again")
        self.global_step, self.iteration = state["global_step"], state["iteration"]
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        restore_global_rngs(state)
        self.recent_returns = deque(state["recent_returns"], maxlen=RECENT_EPISODES)
        if self.signal is not None:
            self.signal.load_state_dict(state["signal"])
        if self.streams is not None:
            self.streams.load_state_dict(state["streams"])
        self.exploration.load_state_dict(state["exploration"])
        self.first_slot = state["first_slot"]
        self.actor_states = state["actors"]
        self.restarts_before = state["actor_restarts"]

    def save_checkpoint(self) -> None:
        assert self.run is not None
        self.run.save_checkpoint(self.state_dict())

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
