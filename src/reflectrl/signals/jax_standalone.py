"""The JAX signals in anyone's training loop (issue 58), optax style: pure functions that `jit` and `vmap`.

    tx = reflectrl.signals.make_jax("count+gear", beta=0.01, temperature=2.0)  # or count={"beta": 0.01}, ...
    state = tx.init(key, spec)                              # spec: a Context (the static facts)
    state, terms, metrics = tx.update(state, batch, key)    # batch: a Batch of (T, N) arrays (make_batch)
    ... the policy learns from terms.advantages (times terms.weights), the critic from terms.returns ...
    state, metrics = tx.after_update(state, terms.batch, key, value_fn)  # value_fn: the critic after the update

`update` runs each signal's hooks in the order written and combines them as signals/compose.py says:
reward terms add before one estimate of the advantages (GAE from batch.values and batch.next_values with
the spec's gamma and gae_lambda, or the `estimate(rewards) -> (advantages, returns)` given), then each
signal's after-advantages output: reward terms (advantages estimated again), advantage terms (added),
weights (multiplied) and the rewards of a signal's own reward stream (rnd). `after_update` lets the signals
fit to the updated critic (shaping) and distil what they learnt (gear). reflectrl's JAX PPO
(trainers/ppo_jax/ppo.py) calls these same functions: one code path. The protocol each signal
implements: jax_base.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from reflectrl.errors import UserError
from reflectrl.estimators_jax import gae
from reflectrl.signals.jax_base import Batch, Context, Output

__all__ = ["Batch", "Context", "Terms", "Transform", "compose", "make_batch", "signals"]


class Terms(NamedTuple):
    """What `update` gives for a batch: (T, N) arrays; a term no signal gives is None."""

    advantages: jax.Array       # the policy's advantages after every signal
    returns: jax.Array          # the critic's targets
    reward: jax.Array | None    # the signals' reward terms, summed (what they added to batch.rewards)
    weights: jax.Array | None   # multiply each step's advantage in the policy loss (None: 1)
    stream: jax.Array | None    # the rewards of a signal's own reward stream (rnd), for a second value head
    batch: Batch                # the batch as after_update reads it: the reward terms of the hooks before
                                # the estimate added to its rewards, its advantages and returns that estimate's
    by_signal: dict             # each signal's term by the torch side's name: {"count reward": ..., "gear weight": ...}


class Transform(NamedTuple):
    """A signal, or several in order, as three pure functions (optax's GradientTransformation idea)."""

    init: Callable          # (key, spec) -> state
    update: Callable        # (state, batch, key, estimate=None) -> (state, Terms, metrics)
    after_update: Callable  # (state, batch, key, value_fn, estimate=None) -> (state, metrics)
    signals: tuple          # the JAX signals (jax_base.Signal), in order


def compose(signals) -> Transform:
    """The Transform of JAX signal objects (signals/NAME/jax.py), applied in the order given."""
    signals = tuple(signals)
    spec_of = {}  # the spec init was given: the default estimate's gamma and gae_lambda (a static fact)

    def init(key, spec: Context) -> list:
        spec_of["spec"] = spec
        keys = jax.random.split(key, max(len(signals), 1))
        return [s.init(k, spec) for s, k in zip(signals, keys, strict=False)]

    def default_estimate(batch: Batch):
        if "spec" not in spec_of:
            raise UserError("call the signals' init(key, spec) before update (or give update an estimate)")
        spec = spec_of["spec"]
        return lambda rewards: gae(rewards, batch.values, batch.next_values, batch.terminations,
                                   batch.truncations, spec.gamma, spec.gae_lambda)

    def update(state, batch: Batch, key, estimate=None):
        check_batch(signals, batch)
        return apply(signals, state, batch, key, estimate or default_estimate(batch))

    def after_update(state, batch: Batch, key, value_fn, estimate=None):
        """`value_fn(obs) -> values`: the critic after the policy's update."""
        estimate = estimate or default_estimate(batch)
        states, metrics = list(state), {}
        keys = jax.random.split(key, max(len(signals), 1))
        for i, s in enumerate(signals):
            states[i], m = s.after_update(states[i], batch, keys[i], value_fn, estimate)
            metrics.update(m)
        return states, metrics

    return Transform(init=init, update=update, after_update=after_update, signals=signals)


def apply(signals: tuple, state, batch: Batch, key, estimate):
    """The hooks before and after the estimate (trainers/base.apply_signals, signals/compose.py): the
    state, the Terms and the metrics. A signal's reward stream reaches the later signals weighted by its
    k_s (the Batch's intrinsic_rewards: gear's select and advantage read it)."""
    metrics, states, by_signal = {}, list(state), {}

    def add_term(name, value):
        by_signal[name] = value if name not in by_signal or not name.endswith(" reward") else by_signal[name] + value

    keys = jax.random.split(key, 2 * max(len(signals), 1))
    base, total = batch.rewards, None
    for i, s in enumerate(signals):
        states[i], term, m = s.shape_rewards(states[i], batch._replace(rewards=base if total is None else base + total),
                                             keys[2 * i])
        metrics.update(m)
        if term is not None:
            add_term(f"{s.name} reward", term)
            total = term if total is None else total + term
    rewards = base if total is None else base + total
    advantages, returns = estimate(rewards)
    batch = batch._replace(rewards=rewards, advantages=advantages, returns=returns)
    seen_by = batch
    adv_term, weights, stream = None, None, None
    for i, s in enumerate(signals):
        states[i], out, m = s.after_advantages(states[i], seen_by, keys[2 * i + 1], estimate)
        metrics.update(m)
        out = out if out is not None else Output()
        for kind, value in (("reward", out.reward), ("advantage", out.advantage), ("weight", out.weights)):
            if value is not None:
                add_term(f"{s.name} {kind}", value)
        if out.stream is not None and s.stream is not None:
            add_term(f"{s.name} {s.stream.name}", out.stream)
        if out.reward is not None:
            total = out.reward if total is None else total + out.reward
            rewards = seen_by.rewards + out.reward
            seen_by = seen_by._replace(rewards=rewards)
            if out.recompute:
                a, r = estimate(rewards)
                seen_by = seen_by._replace(advantages=a if adv_term is None else a + adv_term, returns=r)
        if out.advantage is not None:
            adv_term = out.advantage if adv_term is None else adv_term + out.advantage
            seen_by = seen_by._replace(advantages=seen_by.advantages + out.advantage)
        if out.weights is not None:
            weights = out.weights if weights is None else weights * out.weights
        if out.stream is not None:
            stream = out.stream
            if s.stream is not None:  # the later signals see the stream's rewards (gear's select, advantage)
                seen_by = seen_by._replace(intrinsic_rewards=s.seed_stream(batch.knobs).weight * out.stream)
    terms = Terms(advantages=seen_by.advantages, returns=seen_by.returns, reward=total, weights=weights,
                  stream=stream, batch=batch, by_signal=by_signal)
    return states, terms, metrics


def check_batch(signals: tuple, batch: Batch) -> None:
    """One line where a signal reads a field the batch left out (None)."""
    for s in signals:
        for field in (*s.reads, *(("features",) if s.wants_features else ())):
            if getattr(batch, field) is None:
                raise UserError(f"signal {s.name} reads batch.{field}, which is None: give it to make_batch "
                                f"(Batch.{field}: {FIELD_HELP[field]})")


FIELD_HELP = {"state_keys": "(T, N) int32 keys in [0, spec.key_space) of obs[t], e.g. a hash of the observation",
              "next_state_keys": "(T, N) int32 keys of the state step t reached",
              "next_obs": "(T, N, obs_dim) the state step t reached, the episode's last where it ended",
              "features": "(T, N, feature_dim) the actor's last hidden layer; or set the signal's inputs to obs"}


def make_batch(*, obs, actions, rewards, terminations, truncations, values, next_values, iteration,
               global_step, next_obs=None, features=None, state_keys=None, next_state_keys=None) -> Batch:
    """A Batch of one rollout, time-major (T, N, ...): advantages and returns zeros (update estimates them).
    `iteration`: 0-based; `global_step`: env steps before this rollout (schedules read them). The fields a
    signal reads beyond the first seven (next_obs, features, state_keys, next_state_keys) may be left out
    where no signal reads them (update says which one does)."""
    zeros = jnp.zeros_like(rewards)
    as_keys = lambda k: None if k is None else jnp.asarray(k, jnp.int32)  # noqa: E731
    return Batch(obs=obs, actions=actions, rewards=rewards, terminations=terminations, truncations=truncations,
                 values=values, next_values=next_values, next_obs=next_obs, features=features,
                 state_keys=as_keys(state_keys), next_state_keys=as_keys(next_state_keys), advantages=zeros,
                 returns=zeros, iteration=jnp.asarray(iteration, jnp.int32),
                 global_step=jnp.asarray(global_step, jnp.int32))


def signals(names: str, **knobs) -> Transform:
    """The Transform of the signals `names` ("count", "count+gear"; those with a JAX form), each set up
    from its knobs' defaults and `knobs`, checked as `--set` checks them: a knob by its name where one of
    the signals has it (beta=0.01), by SIGNAL.KNOB (**{"count.beta": 0.01}), or a signal's knobs as a dict
    or its config dataclass (count={"beta": 0.01}, gear=GEARConfig(...))."""
    from reflectrl import overrides
    from reflectrl.registry import signal_spec
    from reflectrl.signals import jax_signal_class, jax_signal_names, torch_only_knobs

    order = [n.strip() for n in names.split("+")] if isinstance(names, str) else []
    jax_forms = jax_signal_names()
    for name in order or [repr(names)]:
        if name not in jax_forms:
            raise UserError(f"signal {name!r} has no JAX form; JAX signals: {', '.join(jax_forms)} "
                            "(several: 'count+gear')")
    if len(set(order)) < len(order):
        raise UserError(f"signals {names!r} names a signal twice")
    sections = {n: signal_spec(n).config() for n in order}
    items = []
    for key, value in knobs.items():
        if key in sections:
            if isinstance(value, type(sections[key])):
                sections[key] = dataclasses.replace(value)
                continue
            if not isinstance(value, dict):
                raise UserError(f"{key}= takes a dict of {key}'s knobs or a {type(sections[key]).__name__}, "
                                f"not {type(value).__name__}")
            items += [(f"{key}.{k}", v) for k, v in value.items()]
        elif isinstance(value, dict) or dataclasses.is_dataclass(value):
            raise UserError(f"{key}= gives the knobs of a signal {names!r} does not name (its signals: "
                            f"{', '.join(order)})")
        elif "." in key:
            items.append((key, value))
        else:
            owners = [n for n in order if key in {f.name for f in dataclasses.fields(sections[n])}]
            if len(owners) > 1:
                raise UserError(f"knob {key!r} is a knob of {' and '.join(owners)}: give it as "
                                f"{' or '.join(f'{n}={{{key!r}: ...}}' for n in owners)}")
            if not owners and len(order) > 1:
                raise UserError(f"no signal of {names!r} has a knob {key!r} (their knobs: reflectrl knobs)")
            items.append((f"{owners[0] if owners else order[0]}.{key}", value))
    overrides.apply([f"{key}={overrides.value_text(value)}" for key, value in items], bare=[], prefixed=sections)
    built = []
    for name in order:
        for knob, why in torch_only_knobs(name, sections[name])[:1]:
            raise UserError(f"{knob} is torch-only{f' ({why})' if why else ''}; leave it at its default "
                            "for the JAX form")
        built.append(jax_signal_class(name)(sections[name]))
    return compose(built)
