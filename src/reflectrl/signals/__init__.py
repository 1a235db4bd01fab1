"""Signals: small heads fit by regression onto what a trainer already computes, then applied.

One package per signal, NAME/:
  __init__.py   its knobs (the config dataclass: every default), their checks and its registry entry
                (SignalSpec); imports no torch, JAX or env package, so that reading a command line
                (`--algo`, `--set`) and refusing a bad one needs only these (bench/refusal_time.py)
  torch.py      its torch form (a Signal: base.py)
  jax.py        its JAX form where it has one (a jax_base.Signal), configured by the same dataclass

A signal never imports a trainer. Shared by them: base.py (the torch protocol and the points at
which a trainer calls it), compose.py (several at once), fit.py (the head fitter), schedule.py
(coefficient decay), jax_base.py (the JAX protocol), and the private helpers _jax.py and
_cost_critic.py. reflectrl/registry.py says how a signal declares itself.

A knob dataclass is decorated with config.checked_once: its validate() runs once per value set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reflectrl.signals.base import Signal

__all__ = ["Batch", "RewardStream", "Signal", "SignalContext", "SignalOutput", "build_signals", "make_signal"]
_PROTOCOL = ("Batch", "RewardStream", "Signal", "SignalContext", "SignalOutput")


def __getattr__(name: str):
    # the protocol's classes from base.py, which imports torch: imported on first use, so that reading the
    # signals' knobs (NAME/__init__.py) to check a command line imports none
    if name in _PROTOCOL:
        from reflectrl.signals import base

        return getattr(base, name)
    raise AttributeError(f"module 'reflectrl.signals' has no attribute '{name}'")


def build_signals(signal_names, sections: dict) -> list[Signal]:
    """One configured signal per name, in order (each from its section of `sections`), each
    needing what its registry entry says for its section (fixed by its constructor; here for a
    signal whose constructor does not, and an error where the constructor fixed something else)."""
    from reflectrl.registry import signal_spec

    out = []
    for name in signal_names:
        spec = signal_spec(name)
        config = sections.get(name) or spec.config()
        signal = spec.factory(config)
        signal.fix_wants(spec.wants_for(config))
        out.append(signal)
    for i, signal in enumerate(out):  # what a member needs of the others (gear.advantage=total: rnd before it)
        signal.check_position(out[:i], out[i + 1:])
    return out


def make_signal(cfg, family: str = "control") -> Signal | None:
    """What a run's --algo runs on top of its trainer: None, one signal, or a SignalStack."""
    from reflectrl.registry import parse_algo
    from reflectrl.signals.compose import SignalStack

    members = build_signals(parse_algo(cfg.algo, family).signals, cfg.sections)
    if not members:
        return None
    return members[0] if len(members) == 1 else SignalStack(members)


def signal_terms(signal: Signal, reward, output) -> dict:
    """The per-step terms each signal gave this iteration, by "NAME KIND" (a stack keeps its
    members' apart); `reward` and `output` are what the trainer got from shape_rewards and
    after_advantages."""
    from reflectrl.signals.base import terms_from
    from reflectrl.signals.compose import SignalStack

    return dict(signal.terms) if isinstance(signal, SignalStack) else terms_from(signal.name, reward, output)
