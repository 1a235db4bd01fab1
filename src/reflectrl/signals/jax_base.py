"""The protocol between the JAX PPO (trainers/ppo_jax/ppo.py) and its signals: pure functions on pytrees.

The torch protocol (signals/base.py) with its state made explicit so that a whole iteration
(rollout, GAE, the signals' fits and terms, the update) compiles into one program and
vectorises over seeds with `vmap`. Per iteration the trainer calls, inside `jax.jit`:

    state, term, m1 = signal.shape_rewards(state, batch, key)      # before advantages: (T, N) or None
    advantages, returns = batch.estimate(rewards + term)
    state, out, m2 = signal.after_advantages(state, batch, key)     # Output: reward / advantage / weights / stream
    ... the PPO update ...
    state, m3 = signal.after_update(state, batch, key, value_fn)    # value_fn: the critic after the update

Every hook returns its metrics as a dict of scalars (the torch signal's metric names, so that
`report` and the claims read both backends alike). `state` is the signal's own pytree (its
networks' parameters, optimiser state, running statistics); the trainer carries it, vmaps it
over seeds and checkpoints it. A signal is configured by the torch signal's own config
dataclass (`CountConfig`, `CalibrationConfig`, ...): one set of knob names and defaults.

Shapes are static: a signal may not depend on traced values for shapes or Python control
flow (use `jnp.where`, `lax.cond`, `lax.scan`). Randomness comes only from `key`.

The trainer does not call these hooks itself: jax_standalone.py composes them into the pure
`init`/`update`/`after_update` that the trainer and a user's own loop both call.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class Context(NamedTuple):
    """What a signal may know of the trainer (static, given once): torch's SignalContext."""

    obs_dim: int
    action_dim: int        # number of discrete actions, or the Box dimension
    discrete: bool
    feature_dim: int       # width of Batch.features (the actor's last hidden layer)
    learning_rate: float
    gamma: float
    gae_lambda: float
    num_steps: int         # T
    num_envs: int          # N
    total_iterations: int
    key_space: int         # state keys are ints in [0, key_space)


class Batch(NamedTuple):
    """One rollout, time-major (T, N, ...), as the torch Batch names it."""

    obs: jax.Array              # (T, N, obs_dim) float32
    actions: jax.Array          # (T, N) int32, or (T, N, action_dim) float32
    rewards: jax.Array          # (T, N): what the advantages are estimated from (terms of earlier hooks included)
    terminations: jax.Array     # (T, N) float32 0/1
    truncations: jax.Array      # (T, N) float32 0/1
    values: jax.Array           # (T, N) V(obs[t]) under the critic that acted
    next_values: jax.Array      # (T, N) V of the state step t reached (0 where it terminated)
    next_obs: jax.Array         # (T, N, obs_dim) the state step t reached (the episode's last where it ended)
    features: jax.Array         # (T, N, feature_dim) the actor's last hidden layer
    state_keys: jax.Array       # (T, N) int32 exploration keys of obs[t]
    next_state_keys: jax.Array  # (T, N) int32 keys of the state step t reached
    advantages: jax.Array       # (T, N) after the estimate (zeros before it)
    returns: jax.Array          # (T, N)
    iteration: jax.Array        # () int32, 0-based: the iteration this batch belongs to
    global_step: jax.Array      # () int32 env steps before this rollout
    # The run's reward streams (RND's intrinsic one) as one "intrinsic" part, each stream weighted by
    # k_s = coef / extrinsic_coef (Stream.weight); None where the run has no stream (issue 42):
    intrinsic_values: jax.Array | None = None       # (T, N) sum_s k_s V_s(obs[t]), the heads at collection
    intrinsic_next_values: jax.Array | None = None  # (T, N) sum_s k_s V'_s, each by its stream's episodic rule
    intrinsic_rewards: jax.Array | None = None      # (T, N) sum_s k_s r_s: set once the stream's signal gave them
    intrinsic_advantages: jax.Array | None = None   # (T, N) sum_s k_s A_s as the policy used them (after_update)
    # The signals' knobs that differ between the program's seeds (a sweep's trials, `sweep --vmap-trials`):
    # {"SIGNAL.KNOB": () float32}, this seed's values; None where none differ (Signal.seed_cfg reads them)
    knobs: dict | None = None


class Output(NamedTuple):
    """after_advantages' result; a field left None is not given (static structure)."""

    reward: jax.Array | None = None     # added to the rewards (advantages re-estimated when recompute)
    recompute: bool = True
    advantage: jax.Array | None = None  # added to the advantages
    weights: jax.Array | None = None    # multiplies each step's advantage in the policy loss
    stream: jax.Array | None = None     # rewards of the signal's own reward stream (see Signal.stream)


class Stream(NamedTuple):
    """A reward stream with its own value head (RND's intrinsic stream): torch's RewardStream."""

    name: str
    gamma: float
    episodic: bool
    coef: float
    extrinsic_coef: float  # the extrinsic advantage's weight while this stream is learnt

    @property
    def weight(self) -> float:
        """k_s = coef / extrinsic_coef: the stream's weight relative to the extrinsic advantage (the
        policy's advantage is extrinsic_coef x (A_ext + k_s A_s)); coef itself where extrinsic_coef = 0."""
        if isinstance(self.extrinsic_coef, (int, float)):  # constants: the program of before exactly
            return self.coef / self.extrinsic_coef if self.extrinsic_coef > 0 else self.coef
        # one seed's (traced) values (Signal.seed_stream): the quotient in float32, where constants divide in
        # float64 and round once, so k_s may be one float32 step off the run's alone (the intrinsic_* fields)
        positive = self.extrinsic_coef > 0
        return jnp.where(positive, self.coef / jnp.where(positive, self.extrinsic_coef, 1.0), self.coef)


class SeedKnobs:
    """A config as one seed sees it: the knobs in `varying` (traced, this seed's values) in place of the
    config's constants; everything else from the config."""

    def __init__(self, cfg, varying: dict):
        self._cfg, self._varying = cfg, varying

    def __getattr__(self, name):
        varying = self.__dict__["_varying"]
        return varying[name] if name in varying else getattr(self.__dict__["_cfg"], name)


class Signal:
    """A JAX signal: every hook is optional; the defaults do nothing."""

    name = "signal"
    stream: Stream | None = None  # a reward stream the trainer must learn (a second value head)
    wants_features = False
    reads: tuple[str, ...] = ()  # the Batch fields it reads that a standalone batch may leave out (besides features)
    vector_knobs: tuple[str, ...] = ()  # knobs that may differ between a program's seeds (read via seed_cfg)
    stream_knobs: dict[str, str] = {}   # its stream's fields read from its vector_knobs (seed_stream)
    positive_knobs: tuple[str, ...] = ()  # vector_knobs whose 0 is another program (0 turns the stream off)

    def __init__(self, cfg: Any):
        """Its knobs checked (once: a run's config check usually did it), then kept."""
        from reflectrl.signals.base import validate_once

        validate_once(cfg)
        self.cfg = cfg

    def seed_cfg(self, batch: Batch):
        """The config as this seed sees it: its values of the vector_knobs that differ between the
        program's seeds (Batch.knobs), the constants of `cfg` for the rest (cfg itself where none differ)."""
        varying = self._own_knobs(batch.knobs)
        return SeedKnobs(self.cfg, varying) if varying else self.cfg

    def _own_knobs(self, knobs: dict | None) -> dict:
        """Its knobs among a seed's differing ones ("SIGNAL.KNOB": value), by their own names."""
        prefix = f"{self.name}."
        return {k[len(prefix):]: v for k, v in (knobs or {}).items() if k.startswith(prefix)}

    def seed_stream(self, knobs: dict | None):
        """Its reward stream as this seed sees it: the stream_knobs from the seed's values where they
        differ between the program's seeds (`knobs`: Batch.knobs), the stream itself where none do."""
        varying = self._own_knobs(knobs)
        fields = {field: varying[knob] for field, knob in self.stream_knobs.items() if knob in varying}
        return self.stream._replace(**fields) if fields and self.stream is not None else self.stream

    def term_kinds(self) -> tuple[str, ...]:
        """The kinds of per-step term it gives besides a reward stream ("reward", "advantage", "weight"), as the
        trainer keeps them for the state maps ("NAME KIND", the torch side's names)."""
        return ("reward",)

    def init(self, key: jax.Array, ctx: Context) -> Any:
        """The signal's initial state (a pytree; {} when it keeps none)."""
        self.ctx = ctx
        return {}

    def shape_rewards(self, state, batch: Batch, key: jax.Array):
        return state, None, {}

    def after_advantages(self, state, batch: Batch, key: jax.Array, estimate):
        """`estimate(rewards) -> (advantages, returns)` on this batch's values (GAE)."""
        return state, Output(), {}

    def after_update(self, state, batch: Batch, key: jax.Array, value_fn, estimate):
        """`value_fn(obs) -> values` is the critic after the update."""
        return state, {}


def mean_abs_ratio(term: jax.Array, rewards: jax.Array) -> jax.Array:
    """mean |term| / mean |r| (nan where the batch has no reward), as the torch signals log it."""
    denom = jnp.abs(rewards).mean()
    return jnp.where(denom > 0, jnp.abs(term).mean() / jnp.where(denom > 0, denom, 1.0), jnp.nan)
