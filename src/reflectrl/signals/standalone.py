"""A signal in anyone's torch training loop (a CleanRL-style script, your own PPO): built from the env's
spaces and its knobs, given each rollout as (T, N) arrays, giving back its terms.

    sig = reflectrl.signals.make("calibration+count", envs.single_observation_space, envs.single_action_space,
                                 num_envs=4, num_steps=128, total_steps=100_000, gamma=0.99, gae_lambda=0.95,
                                 learning_rate=2.5e-4, seed=1, calibration={"alpha": 0.05}, count={"beta": 0.01})
    ...collect T steps of N envs...
    terms = sig.process(obs=obs, actions=actions, rewards=rewards, terminations=terminations,
                        truncations=truncations, values=values, next_values=next_values, estimate=my_gae,
                        state_keys=sig.state_keys(obs), next_state_keys=sig.state_keys(reached))
    ...the policy update on terms.advantages (times terms.weights) and terms.returns...
    sig.after_update(value_fn=agent.get_value)  # the signals that fit a head on the updated critic

`process` runs exactly what reflectrl's own trainers run (signals/apply.apply_signals: shape_rewards,
your estimate on the shaped rewards, after_advantages), so a signal behaves here as under `reflectrl
train`; a stack ("calibration+count") composes as the trainers' SignalStack does (signals/compose.py).
Knobs: bare names for a lone signal (`alpha=0.05`), a section per signal (`calibration={"alpha": 0.05}`)
or dotted names (`**{"calibration.alpha": 0.05}`), checked as the command line checks them. At its
neutral setting (the registry's SignalSpec.neutral: calibration alpha=0, count beta=0, gear
temperature=inf) a signal leaves the loop's results bit for bit as they are without it.

Each step is an env step: step t of env n, time-major, numpy arrays or torch tensors on any device
(the signals run on the CPU; the terms come back on the rewards' device). What a signal needs beyond
the rollout's arrays (registry.WANTS) is given to `process` by name: `next_obs` (s' of each step: the
episode's final observation where it ended), `features` (with `feature_dim=` at make), `state_keys` and
`next_state_keys` (`sig.state_keys(obs)`: the keys reflectrl's trainers use where the env has none of
its own), `costs`, `act_fn`, `team_rewards` and `team_value_fn`; a missing one is a one-line UserError.
A signal with a value head of its own (rnd's intrinsic stream) or an LLM's teacher runs under
reflectrl's trainers only.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from reflectrl.errors import UserError
from reflectrl.signals.apply import apply_signals
from reflectrl.signals.base import Batch, Signal, SignalContext

# what a signal may ask of the standalone interface (registry.WANTS), and the argument of process() that
# gives it; "feature_grad": the loop adds sig.auxiliary_loss(features, index) to its loss
TAKES = {"features": ("features",), "feature_grad": (), "next_obs": ("next_obs",),
         "state_keys": ("state_keys", "next_state_keys"), "costs": ("costs",), "policy": ("act_fn",),
         "team": ("team_rewards", "team_value_fn")}
HINTS = {"next_obs": "s' of each step, the final observation where an episode ended (info['final_obs'])",
         "features": "the policy's features of each step, (T, N, feature_dim)",
         "state_keys": "sig.state_keys(obs)", "next_state_keys": "sig.state_keys(the states each step reached)",
         "costs": "the env's cost of each step, info['cost']", "act_fn": "act_fn(obs, generator) -> actions",
         "team_rewards": "the team's reward in each agent's column", "team_value_fn": "the team's critic"}


@dataclass
class Terms:
    """What the signal made of one rollout, each (T, N) on the rewards' device."""

    rewards: torch.Tensor         # what the advantages were estimated from: the env's rewards plus the reward term
    advantages: torch.Tensor      # the estimate on `rewards`, plus the advantage term
    returns: torch.Tensor         # the value targets of that estimate
    weights: torch.Tensor         # multiplies each step's advantage in the policy loss (ones where none)
    reward_term: torch.Tensor     # the signals' reward terms summed (zeros where none)
    advantage_term: torch.Tensor  # their advantage terms (zeros where none)
    metrics: dict                 # the signals' metrics of this rollout (signal.metrics())


class StandaloneSignal:
    """A signal (or a stack) bound to a loop of `num_envs` envs stepped `num_steps` times per rollout;
    made by `make`. Counts rollouts (`iteration`) and env steps (`global_step`) as the trainers do."""

    def __init__(self, signal: Signal, ctx: SignalContext, observation_space):
        self.signal, self.ctx, self.observation_space = signal, ctx, observation_space
        self.iteration = 0
        self.global_step = 0
        self._batch: Batch | None = None  # the last rollout (after_update reads it), and its arrays' device
        self._device = torch.device("cpu")

    @property
    def name(self) -> str:
        return self.signal.name

    @property
    def wants(self) -> frozenset:
        """What it needs beyond the rollout's arrays (registry.WANTS)."""
        return self.signal.wants

    def state_keys(self, obs) -> torch.Tensor:
        """int64 keys of observations shaped (..., *observation shape): a SimHash of each, as reflectrl's
        trainers key the states of an env without keys of its own (envs/statekey.py)."""
        return state_keys(obs, self.observation_space)

    def process(self, obs, actions, rewards, terminations, truncations, values, next_values, *,
                estimate: Callable | None = None, gae: Callable | None = None, next_obs=None, features=None,
                state_keys=None, next_state_keys=None, costs=None, episode_costs=None,
                value_fn: Callable | None = None, features_fn: Callable | None = None, act_fn: Callable | None = None,
                team_rewards=None, team_value_fn: Callable | None = None, global_step: int | None = None) -> Terms:
        """One rollout through the signal's hooks (apply_signals). `estimate(rewards) -> (advantages,
        returns)` is your advantage estimator (default: GAE with the gamma and gae_lambda given to make,
        bootstrapping from next_values); `gae(rewards, values, next_values, terminations, truncations)` the
        same for any values (default: that GAE), for the signals that estimate on their own heads' values.
        `global_step`: your env-step counter after this rollout (default: counted here)."""
        device = torch.as_tensor(rewards).device
        rewards = _tensor(rewards, torch.float32)
        if rewards.dim() != 2:
            raise UserError(f"{self.name}: process(rewards=...) has shape {tuple(rewards.shape)}; give (T, N) arrays, "
                            "T steps of N envs, time-major")
        given = {"next_obs": next_obs, "features": features, "state_keys": state_keys,
                 "next_state_keys": next_state_keys, "costs": costs, "act_fn": act_fn, "team_rewards": team_rewards,
                 "team_value_fn": team_value_fn}
        members = getattr(self.signal, "members", [self.signal])
        for want in sorted(self.wants):
            for arg in TAKES.get(want, ()):
                if given[arg] is None:
                    who = next(m.name for m in members if want in m.wants)
                    raise UserError(f"the {who} signal needs {arg}: pass process(..., {arg}=...) ({HINTS[arg]})")
        shape = tuple(rewards.shape)
        action_dtype = torch.int64 if self.ctx.discrete else torch.float32
        arrays = {"obs": (obs, torch.float32), "actions": (actions, action_dtype),
                  "terminations": (terminations, torch.bool), "truncations": (truncations, torch.bool),
                  "values": (values, torch.float32), "next_values": (next_values, torch.float32),
                  "next_obs": (next_obs, torch.float32), "features": (features, torch.float32),
                  "state_keys": (state_keys, torch.int64), "next_state_keys": (next_state_keys, torch.int64),
                  "costs": (costs, torch.float32), "team_rewards": (team_rewards, torch.float32)}
        t = {}
        for name, (value, dtype) in arrays.items():
            if value is None:
                t[name] = None
                continue
            t[name] = _tensor(value, dtype)
            if tuple(t[name].shape[:2]) != shape:
                raise UserError(f"{self.name}: process({name}=...) has shape {tuple(t[name].shape)} where rewards' is "
                                f"{shape}; give every array time-major, (T steps, N envs, ...)")
        if t["features"] is not None and t["features"].shape[-1] != self.ctx.feature_dim:
            raise UserError(f"{self.name}: process(features=...) are {t['features'].shape[-1]} wide where make() was "
                            f"given feature_dim={self.ctx.feature_dim}; give make(feature_dim=) their width")
        self.iteration += 1
        self.global_step = self.global_step + shape[0] * shape[1] if global_step is None else int(global_step)
        gae = self._gae if gae is None else _on_cpu(gae, device)
        if estimate is None:
            def estimate(r):
                return gae(r, t["values"], t["next_values"], t["terminations"], t["truncations"])
        else:
            estimate = _on_cpu(estimate, device)
        batch = Batch(obs=t["obs"], actions=t["actions"], rewards=rewards, terminations=t["terminations"],
                      truncations=t["truncations"], values=t["values"], next_values=t["next_values"],
                      features=t["features"], next_obs=t["next_obs"], iteration=self.iteration,
                      global_step=self.global_step, estimate=estimate, gae=gae,
                      value_fn=_on_cpu(value_fn, device) if value_fn is not None else self._no_value_fn,
                      features_fn=_on_cpu(features_fn, device), state_keys=t["state_keys"],
                      next_state_keys=t["next_state_keys"], costs=t["costs"], episode_costs=episode_costs,
                      act_fn=act_fn, team_rewards=t["team_rewards"], team_value_fn=_on_cpu(team_value_fn, device))
        result = apply_signals(self.signal, batch, estimate)
        self._batch, self._device = batch, device
        zeros = torch.zeros(shape)
        return Terms(
            rewards=result.rewards.to(device), advantages=result.advantages.to(device),
            returns=result.returns.to(device),
            weights=(torch.ones(shape) if result.weights is None else result.weights).to(device),
            reward_term=(zeros if result.reward_term is None else result.reward_term).to(device),
            advantage_term=(zeros if result.advantage_term is None else result.advantage_term).to(device),
            metrics=self.signal.metrics())

    def after_update(self, value_fn: Callable | None = None, features_fn: Callable | None = None) -> dict:
        """After your policy update: the signals that fit a head on the updated critic do it here
        (`value_fn(obs) -> values`, your critic). Returns the signals' metrics."""
        if self._batch is None:
            raise UserError(f"{self.name}: after_update() comes after a process() of the rollout the update used")
        device = self._device
        if value_fn is not None:
            self._batch.value_fn = _on_cpu(value_fn, device)
        if features_fn is not None:
            self._batch.features_fn = _on_cpu(features_fn, device)
        self.signal.after_update(self._batch)
        return self.signal.metrics()

    def auxiliary_loss(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor | None:
        """The signal's loss on the policy's features of the rows `index` of the last rollout (flattened
        T x N), with gradients, for a signal that trains the policy's trunk (calibration.shared_trunk)."""
        return self.signal.auxiliary_loss(features, index)

    def metrics(self) -> dict:
        return self.signal.metrics()

    def state_dict(self) -> dict:
        return {"signal": self.signal.state_dict(), "iteration": self.iteration, "global_step": self.global_step}

    def load_state_dict(self, state: dict) -> None:
        self.signal.load_state_dict(state["signal"])
        self.iteration, self.global_step = state["iteration"], state["global_step"]

    def _gae(self, rewards, values, next_values, terminations, truncations):
        from reflectrl.estimators import compute_gae

        return compute_gae(rewards, values, next_values, terminations, truncations, self.ctx.gamma, self.ctx.gae_lambda)

    def _no_value_fn(self, obs):
        raise UserError(f"the {self.name} signal reads your critic: pass process(..., value_fn=...) and "
                        "after_update(value_fn=...), value_fn(obs) -> values")


def make(signals: str, observation_space, action_space, *, num_envs: int, num_steps: int, total_steps: int,
         gamma: float, gae_lambda: float, learning_rate: float, seed: int = 0, feature_dim: int = 0,
         cost_limit: float | None = None, **knobs) -> StandaloneSignal:
    """The signal(s) `signals` ("calibration", "calibration+count") for a loop of `num_envs` envs stepped
    `num_steps` times per rollout over `total_steps` env steps (their schedules read it), under your
    loop's `gamma`, `gae_lambda` and policy `learning_rate` (the heads learn at a multiple of it).
    `feature_dim`: the width of the features you will give process(features=...), for a signal that
    reads them; `cost_limit`: the episode-cost limit (lagrangian; default: RunConfig's). Knobs as
    `alpha=0.05` (a lone signal), `calibration={"alpha": 0.05}` or `**{"calibration.alpha": 0.05}`."""
    from reflectrl.config import RunConfig, validate_once
    from reflectrl.registry import STEP_TEXT, signal_spec, wants_text
    from reflectrl.signals import build_signals
    from reflectrl.signals.compose import SignalStack

    names = [n.strip() for n in signals.split("+")]
    specs = [signal_spec(n) for n in names]
    if len(set(names)) != len(names):
        raise UserError(f"signals '{signals}' names a signal twice; give each once")
    for name, value in (("num_envs", num_envs), ("num_steps", num_steps), ("total_steps", total_steps)):
        if not isinstance(value, int) or value < 1:
            raise UserError(f"make({name}={value!r}): must be a positive integer")
    obs_shape, action_dim, discrete = _spaces(observation_space, action_space)
    sections = _sections(specs, knobs)
    provides = set(TAKES) - ({"features", "feature_grad"} if feature_dim < 1 else set())
    for spec in specs:
        config = sections[spec.name]
        validate_once(config)
        if "env_step" not in spec.step_kinds:
            kinds = " and ".join(STEP_TEXT[k] for k in spec.step_kinds)
            raise UserError(f"the {spec.name} signal works on {kinds}, not env steps: train it with "
                            "`reflectrl llm train` (or, in TRL, reflectrl.integrations.trl)")
        if spec.resolve is not None:
            spec.resolve(config, frozenset(provides))
        missing = spec.wants_for(config) - provides
        if missing:
            hint = ("pass make(feature_dim=...) and process(features=...)" if missing <= {"features", "feature_grad"}
                    else f"train it with reflectrl's own trainers (reflectrl train --algo ppo+{spec.name})")
            raise UserError(f"the {spec.name} signal, as configured, needs {wants_text(missing)}, which a "
                            f"standalone loop does not give; {hint}")
        if "env_step" in spec.step_checks:
            spec.step_checks["env_step"](config)
    members = build_signals(names, sections)
    signal = members[0] if len(members) == 1 else SignalStack(members)
    ctx = SignalContext(
        obs_dim=int(np.prod(obs_shape)), action_dim=action_dim, discrete=discrete, feature_dim=feature_dim,
        learning_rate=learning_rate, gamma=gamma, gae_lambda=gae_lambda, seed=seed,
        total_iterations=math.ceil(total_steps / (num_envs * num_steps)), obs_shape=obs_shape,
        cost_limit=RunConfig.cost_limit if cost_limit is None else cost_limit)
    signal.bind(ctx)
    return StandaloneSignal(signal, ctx, observation_space)


def state_keys(obs, observation_space) -> torch.Tensor:
    """int64 keys of observations shaped (..., *observation_space.shape): reflectrl's state keys of an
    env without keys of its own, a SimHash of the observation (envs/statekey.simhash_observations). An
    env with its own (the grid world, MiniGrid, Montezuma) gives them as info["state_key"] once wrapped
    in envs.statekey.StateKey."""
    from reflectrl.envs.statekey import simhash_observations

    x = _tensor(obs, torch.float32).numpy()
    lead = x.shape[:x.ndim - len(observation_space.shape)]
    rows = int(np.prod(lead))
    if rows == 0:
        return torch.zeros(lead, dtype=torch.int64)
    return torch.from_numpy(simhash_observations(x.reshape(rows, *observation_space.shape))).reshape(lead)


# ---------------------------------------------------------------------------- helpers

def _tensor(value, dtype) -> torch.Tensor:
    """A CPU tensor of `dtype` from a numpy array or a tensor on any device (detached)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", dtype)
    return torch.as_tensor(np.asarray(value)).to(dtype)


def _on_cpu(fn: Callable | None, device) -> Callable | None:
    """`fn` of CPU tensors where the user's works on `device`: inputs moved there, outputs back."""
    if fn is None or torch.device(device).type == "cpu":
        return fn

    def call(*args):
        out = fn(*(a.to(device) if isinstance(a, torch.Tensor) else a for a in args))
        if isinstance(out, tuple):
            return tuple(o.detach().cpu() if isinstance(o, torch.Tensor) else o for o in out)
        return out.detach().cpu()

    return call


def _spaces(observation_space, action_space) -> tuple[tuple[int, ...], int, bool]:
    """(observation shape, action dim, discrete) of Gymnasium spaces."""
    from gymnasium import spaces

    if not isinstance(observation_space, spaces.Box):
        raise UserError(f"observation_space {observation_space}: a standalone signal reads Box observations "
                        "(flatten a Dict or Discrete one with gymnasium's FlattenObservation)")
    if isinstance(action_space, spaces.Discrete):
        return tuple(observation_space.shape), int(action_space.n), True
    if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        return tuple(observation_space.shape), int(action_space.shape[0]), False
    raise UserError(f"action_space {action_space}: a standalone signal takes Discrete or 1-D Box actions")


def _sections(specs, knobs: dict) -> dict:
    """Each signal's knob dataclass with `knobs` set: `NAME={...}`, `NAME.KNOB=v`, or a lone signal's `KNOB=v`."""
    from reflectrl.overrides import field_name, parse_value

    sections = {spec.name: spec.config() for spec in specs}
    items = []
    for key, value in knobs.items():
        if key in sections:
            if not isinstance(value, dict):
                raise UserError(f"make({key}={value!r}): give a signal's knobs as a dict, {key}={{'knob': value}}")
            items += [(key, k, v) for k, v in value.items()]
        elif "." in key:
            section, name = key.split(".", 1)
            if section not in sections:
                raise UserError(f"make('{key}'): '{section}' is not among the signals made ({', '.join(sections)})")
            items.append((section, name, value))
        elif len(sections) == 1:
            items.append((next(iter(sections)), key, value))
        else:
            raise UserError(f"make({key}=...): with several signals, say whose knob it is: "
                            f"{next(iter(sections))}={{'{key}': ...}} or '{next(iter(sections))}.{key}'")
    for section, name, value in items:
        config = sections[section]
        name = field_name(config, name)
        fields = [f.name for f in dataclasses.fields(config)]
        if name not in fields:
            close = difflib.get_close_matches(name, fields, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else f"; known: {', '.join(fields)}"
            raise UserError(f"unknown knob '{section}.{name}'{hint}")
        if isinstance(value, str):
            annotation = typing.get_type_hints(type(config))[name]
            try:
                value = parse_value(f"{section}.{name}", value, annotation)
            except ValueError as err:
                raise UserError(f"{section}.{name}={value}: expected {err}") from None
        setattr(config, name, value)
    return sections
