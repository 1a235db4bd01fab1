"""What the replay trainers (DQN, SAC) share, as SB3's OffPolicyAlgorithm: acting in vector
envs into a replay buffer, learning from sampled transitions, the metrics row, checkpoints
that hold the buffer, and the signals on replay data.

A subclass provides `select_actions(obs)` (numpy actions for a batch of observations),
`learn(before, stats)` (the gradient steps due after the vector step that moved global_step
from `before`; it appends each step's statistics to `stats`), `row_extras()`, its networks'
`network_state()` / `load_network_state(state)`, and `policy_module` (what params_sha256
hashes).

Signals on replay data (step kind "transition", signals/base.py): at every gradient step the
trainer hands the signal its sampled minibatch as a Batch of shape (1, B), with
`values` = V(s), `next_values` = the bootstrap value of s' (the target networks'),
`advantages` = Q(s, a) - V(s) and `td_error_fn` (the trainer's TD errors of any transitions
under its current networks); the reward terms the signal returns (from shape_rewards and
after_advantages) are added to the sampled rewards before the TD target is formed, so they are
applied at learning time with the signal's current (target) heads, never stored in the
buffer; per-transition weights multiply the TD loss. After the gradient step,
`after_update` sees the same batch. A signal's metrics are averaged over the iteration's
gradient steps. The signal's randomness is its own, and the trainer's draws for the signal
(SAC's V(s) needs a sampled action) come from a second generator, so a neutral signal leaves
the trainer bit-identical to the plain one.
"""

from __future__ import annotations

import math
import random
import time
import warnings
from collections import deque

import numpy as np
import torch

from reflectrl.config import RunConfig, trainer_knobs
from reflectrl.envs import make_vector_env, snapshot
from reflectrl.envs.statekey import is_montezuma
from reflectrl.errors import NonFiniteError
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
from reflectrl.trainers.policies import params_sha256
from reflectrl.trainers.replay.buffer import ReplayBuffer

CHECKPOINT_FORMAT = 1
SIGNAL_STREAM_OFFSET = 7_919  # the trainer's second generator (its draws for the signal): seed + this


def adam(params, lr: float) -> torch.optim.Adam:
    """Adam as the replay trainers use it: PyTorch's fused kernel where it has one (one pass
    over each parameter instead of a dozen small ops: most of an optimiser step's time on
    small networks), its default implementation elsewhere."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


class AdamStep:
    """`zero_grad()` and `step()` of a fused Adam (adam() above) at a fraction of their cost:
    once the optimiser has its state, a step is the two calls Adam.step makes on CPU
    (`torch._foreach_add_` of the step counts, `torch._fused_adam_`) on the same tensors with
    the same hyperparameters, read from the param group at every step, so the weights are
    bit-identical; what Adam.step adds around them (the profiler's record_function, hooks,
    regrouping the tensors by device, checking each state entry) was ~160 us per step on this
    machine, as long as a small network's whole update. Anything else (a first step, a
    missing gradient, a non-fused or amsgrad optimiser, a reloaded state) takes Adam.step."""

    def __init__(self, optimizer: torch.optim.Adam):
        self.optimizer = optimizer
        self._state = None  # optimizer.state when the tensors below were collected
        self._params: list = []
        groups = optimizer.param_groups
        self._usable = (len(groups) == 1 and bool(groups[0].get("fused")) and not groups[0]["amsgrad"]
                        and not groups[0].get("differentiable") and not groups[0].get("capturable")
                        and not groups[0].get("decoupled_weight_decay"))

    def zero_grad(self) -> None:
        """optimizer.zero_grad() (set_to_none, its default)."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        opt = self.optimizer
        group = opt.param_groups[0]
        params = self._params
        if (opt.state is not self._state or group["params"] is not params or len(opt.param_groups) != 1
                or not isinstance(group["lr"], float) or any(p.grad is None for p in params)):
            opt.step()
            if self._usable:
                self._collect()
            return
        grads = [p.grad for p in params]
        torch._foreach_add_(self._steps, 1)
        beta1, beta2 = group["betas"]
        torch._fused_adam_(params, grads, self._exp_avgs, self._exp_avg_sqs, [], self._steps, amsgrad=False,
                           lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                           eps=group["eps"], maximize=group["maximize"], grad_scale=None, found_inf=None)

    def _collect(self) -> None:
        opt = self.optimizer
        params = opt.param_groups[0]["params"]
        if not all(p in opt.state and torch.is_tensor(opt.state[p].get("step")) and p.device.type == "cpu"
                   and p.dtype == torch.float32 for p in params):
            self._state, self._params = None, []
            return
        self._state, self._params = opt.state, params
        self._steps = [opt.state[p]["step"] for p in params]
        self._exp_avgs = [opt.state[p]["exp_avg"] for p in params]
        self._exp_avg_sqs = [opt.state[p]["exp_avg_sq"] for p in params]


def mean_metrics(rows: list[dict]) -> dict:
    """Each key's mean over the rows where it is a number (None where it never is)."""
    out: dict = {}
    for key in dict.fromkeys(k for row in rows for k in row):
        values = [float(row[key]) for row in rows if isinstance(row.get(key), (int, float))]
        out[key] = float(np.mean(values)) if values else None
    return out


class ReplayTrainer(EnvStepTrainer):
    # what the shared loop (trainers/base.py) needs beyond EnvStepTrainer's
    discrete_entropy = False  # no discrete policy entropy to watch
    name = "replay"
    has_features = False  # features(obs) gives the networks' features (a signal's heads may read them)

    def __init__(self, cfg: RunConfig, run: RunDir | None, signal: Signal | None):
        torch.set_num_threads(cfg.torch_threads)
        self.cfg, self.run = cfg, run
        self.knobs = d = trainer_knobs(cfg)
        self.envs = make_vector_env(cfg)
        obs_space = self.envs.single_observation_space
        self.obs_shape = tuple(obs_space.shape)
        self.num_envs = d.num_envs
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.signal_generator = torch.Generator().manual_seed(cfg.seed + SIGNAL_STREAM_OFFSET)
        obs_dtype = obs_space.dtype if np.issubdtype(obs_space.dtype, np.integer) else np.float32
        act_space = self.envs.single_action_space
        discrete = hasattr(act_space, "n")
        self.buffer = ReplayBuffer(d.buffer_size, self.obs_shape, obs_dtype, () if discrete else act_space.shape,
                                   np.int64 if discrete else np.float32)
        self.steps_per_iteration = max(d.log_every // d.num_envs, 1) * d.num_envs
        self.num_iterations = math.ceil(cfg.total_steps / self.steps_per_iteration)
        # the budget exactly (to a multiple of num_envs): the last iteration is shorter where log_every
        # does not divide it
        self.budget = math.ceil(cfg.total_steps / d.num_envs) * d.num_envs
        self.global_step = 0
        self.iteration = 0
        self.updates = 0
        self.learn_from = d.learning_starts  # learning starts once global_step passes this
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        obs, info = self.envs.reset(seed=cfg.seed)
        self.next_obs = np.asarray(obs)
        self.keys = RolloutKeys(obs, info)
        self.exploration = ExplorationTracker(rooms=is_montezuma(cfg.env_id))
        self.logger: MetricsLogger | None = None
        self.signal = signal if signal is not None else make_signal(cfg)
        self._signal_rows: list[dict] = []
        self._signal_clock = Stopwatch()

    def bind_signal(self, action_dim: int, discrete: bool, feature_dim: int, learning_rate: float,
                    image_obs: bool = False) -> None:
        """Bind the run's signal (if any) to this trainer; called by the subclass once its networks exist."""
        if self.signal is None:
            return
        self.signal.bind(SignalContext(
            obs_dim=int(np.prod(self.obs_shape)), action_dim=action_dim, discrete=discrete, feature_dim=feature_dim,
            learning_rate=learning_rate, gamma=self.knobs.gamma, gae_lambda=0.0, seed=self.cfg.seed,
            total_iterations=self.num_iterations, obs_shape=self.obs_shape, image_obs=image_obs))

    # ------------------------------------------------------------------ subclass hooks

    def select_actions(self, obs: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def learn(self, before: int, stats: list[dict]) -> None:
        raise NotImplementedError

    def row_extras(self) -> dict:
        return {}

    def features(self, obs: torch.Tensor) -> torch.Tensor | None:
        """The networks' features of observations for a signal's heads (None: the trainer has none)."""
        return None

    def td_errors(self, obs, actions, rewards, next_obs, terminations) -> torch.Tensor:
        """The TD errors of transitions under the current networks (shaping's labels)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ signals on replay data

    def _td0(self, rewards, values, next_values, terminations, truncations):
        returns = rewards + self.knobs.gamma * next_values * (1.0 - terminations)
        return returns - values, returns

    def signal_batch(self, sample: dict, q_sa: torch.Tensor, values: torch.Tensor,
                     next_values: torch.Tensor) -> Batch:
        """A sampled minibatch as the signal's Batch, shape (1, B) (see the module's docstring)."""
        def row(x):
            return x.unsqueeze(0)

        terms = sample["terminations"]
        advantages = q_sa - values
        returns = sample["rewards"] + self.knobs.gamma * next_values * (1.0 - terms)
        signal = self.signal
        features = None
        if signal.wants_features:
            features = row(self.features(sample["obs"]))
        return Batch(
            obs=row(sample["obs"]), actions=row(sample["actions"]), rewards=row(sample["rewards"]),
            terminations=row(terms), truncations=torch.zeros_like(row(terms)), values=row(values),
            next_values=row(next_values), advantages=row(advantages), returns=row(returns), features=features,
            next_obs=row(sample["next_obs"]), iteration=self.iteration, global_step=self.global_step,
            # a reward term changes the TD target, not the advantage Q(s, a) - V(s)
            estimate=lambda r: (row(advantages), r + self.knobs.gamma * row(next_values) * (1.0 - row(terms))),
            gae=self._td0, features_fn=self.features if self.has_features else None,
            td_error_fn=self.td_errors)

    def signal_rewards(self, batch: Batch) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The signal's reward term (B,) for the sampled transitions, and its per-transition
        weights (B,) of the TD loss; None for either it does not give."""
        with self._signal_clock:
            # a reward term changes the TD target (batch.estimate's returns), not the advantage Q(s, a) - V(s)
            result = apply_signals(self.signal, batch, batch.estimate, advantage_terms=False)
            reward, weights = result.reward_term, result.weights
            if result.shaped is not None:
                batch.rewards = batch.rewards - result.shaped  # as sampled, for after_update
        return (None if reward is None else reward.reshape(-1)), (None if weights is None else weights.reshape(-1))

    def signal_after_update(self, batch: Batch) -> None:
        with self._signal_clock:
            self.signal.after_update(batch)
            self._signal_rows.append(self.signal.metrics())

    # ------------------------------------------------------------------ loop

    def run_iteration(self) -> dict:
        """`log_every` env steps of acting, storing and learning; their metrics row."""
        n = self.num_envs
        self.iteration += 1
        start = time.perf_counter()
        self._signal_clock.seconds = 0.0
        self._signal_rows = []
        step_before = self.global_step
        T = min(self.steps_per_iteration, self.budget - self.global_step) // n
        self.keys.start(T, self.envs)
        rewards_seen = np.zeros((T, n), dtype=np.float32)
        episodes: list[tuple[float, int]] = []
        stats: list[dict] = []
        for t in range(T):
            obs = self.next_obs
            actions = self.select_actions(obs)
            next_obs, rewards, terms, truncs, info = self.envs.step(actions)
            if not (np.isfinite(next_obs).all() and np.isfinite(rewards).all()):
                raise NonFiniteError("observation" if not np.isfinite(next_obs).all() else "reward", self.global_step)
            real_next = next_obs  # the buffer copies it; a copy only where an episode ended
            if "final_obs" in info:
                real_next = np.array(next_obs, copy=True)
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
                self.learn(before, stats)
        self.keys.finish()
        exploration = self.exploration.update(self.keys.state_keys, rewards_seen, step_before)
        returns = [r for r, _ in episodes]
        self.recent_returns.extend(returns)
        learned = {k: float(torch.stack([torch.as_tensor(s[k]) for s in stats if k in s]).mean())
                   for k in dict.fromkeys(k for s in stats for k in s)}
        elapsed = time.perf_counter() - start
        row = {
            "global_step": self.global_step,
            "iteration": self.iteration,
            "episodic_return": float(np.mean(returns)) if returns else None,
            "episodic_length": float(np.mean([n for _, n in episodes])) if episodes else None,
            "episodes": len(episodes),
            **self.row_extras(),
            **learned,
            "gradient_steps": self.updates,
            "buffer_fill": len(self.buffer) / self.buffer.capacity,
            **exploration,
            "steps_per_second": (self.global_step - step_before) / elapsed,
        }
        if self.signal is not None:
            row.update(mean_metrics(self._signal_rows))
            row["signal_time_fraction"] = self._signal_clock.seconds / elapsed
        return row

    iteration_knobs = "num_envs"

    def total_units(self) -> int:
        return self.budget


    # ------------------------------------------------------------------ checkpoints

    def network_state(self) -> dict:
        raise NotImplementedError

    def load_network_state(self, state: dict) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.cfg.to_dict(),
            "global_step": self.global_step,
            "iteration": self.iteration,
            "updates": self.updates,
            "learn_from": self.learn_from,
            **self.network_state(),
            "generator": self.generator.get_state(),
            "signal_generator": self.signal_generator.get_state(),
            **global_rngs(),
            "envs": snapshot.dumps(self.envs),
            "next_obs": self.next_obs.copy(),
            "replay": self.buffer.state_dict() if self.knobs.save_replay else None,
            "recent_returns": list(self.recent_returns),
            "obs_normalizer": None,
            "params_sha256": params_sha256(self.policy_module),
            "exploration": exploration_state(self),
            "signal": None if self.signal is None else self.signal.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.global_step, self.iteration = state["global_step"], state["iteration"]
        self.updates, self.learn_from = state["updates"], state["learn_from"]
        self.load_network_state(state)
        self.generator.set_state(state["generator"])
        if "signal_generator" in state:
            self.signal_generator.set_state(state["signal_generator"])
        restore_global_rngs(state)
        self.recent_returns = deque(state["recent_returns"], maxlen=RECENT_EPISODES)
        restore_exploration(self, state["exploration"])
        if self.signal is not None and state.get("signal") is not None:
            self.signal.load_state_dict(state["signal"])
        if state["replay"] is not None:
            self.buffer.load_state_dict(state["replay"])
        elif self.global_step > 0:
            # without the buffer: refill it, and learn again from learning_starts new steps on
            starts = self.knobs.learning_starts
            self.learn_from = self.global_step + starts
            warnings.warn("this checkpoint holds no replay buffer (save_replay=false): the buffer refills from "
                          f"empty and learning resumes after {starts:,} more steps, so the "
                          "run is not bit-identical to an uninterrupted one", stacklevel=2)
        self.next_obs = state["next_obs"].copy()
        for i, obs in restore_envs(self, state["envs"]):
            self.next_obs[i] = obs

    def save_checkpoint(self) -> None:
        assert self.run is not None
        self.run.save_checkpoint(self.state_dict())

    def close(self) -> None:
        self.envs.close()
