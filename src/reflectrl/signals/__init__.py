"""Signals: small heads fit by regression onto what a trainer already computes, then applied.

One package per signal, NAME/:
  __init__.py   its knobs (the config dataclass: every default), their checks and its registry entry
                (SignalSpec); imports no torch, JAX or env package, so that reading a command line
                (`--algo`, `--set`) and refusing a bad one needs only these (bench/refusal_time.py)
  torch.py      its torch form (a Signal: base.py)
  jax.py        its JAX form where it has one (a jax_base.Signal), configured by the same dataclass

Your own training loop runs a signal through `make` (standalone.py: `reflectrl.signals.make("calibration",
obs_space, action_space, ...)`, then `process(...)` per rollout), which calls the hooks exactly as the
trainers do (apply.py's apply_signals). A signal never imports a trainer. Shared by them: base.py (the
torch protocol and the points at which a trainer calls it), compose.py (several at once), fit.py (the
head fitter), schedule.py (coefficient decay), jax_base.py (the JAX protocol), and the private helpers
_jax.py and _cost_critic.py. reflectrl/registry.py says how a signal declares itself.

A knob dataclass is decorated with config.checked_once: its validate() runs once per value set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reflectrl.signals.base import Signal

# the built-in signals' registrations (their knobs and registry entries: no torch or JAX), loaded with this
# package as Gymnasium's envs/__init__ registers its envs: every package here (signals/NAME/), so that a new
# signal is its package alone; a signal from elsewhere: a module named by an entry point of the group below,
# loaded on the first look-up of the signals
import importlib as _importlib  # noqa: E402
import pkgutil as _pkgutil  # noqa: E402

from reflectrl.registry import add_plugin_group  # noqa: E402

for _info in _pkgutil.iter_modules(__path__):
    if _info.ispkg and not _info.name.startswith("_"):
        _importlib.import_module(f"{__name__}.{_info.name}")

add_plugin_group("reflectrl.signals")

__all__ = ["Batch", "RewardStream", "Signal", "SignalContext", "SignalOutput", "build_signals", "make_signal",
           "make", "make_jax", "state_keys", "StandaloneSignal", "Terms"]
_PROTOCOL = ("Batch", "RewardStream", "Signal", "SignalContext", "SignalOutput")
_STANDALONE = ("make", "state_keys", "StandaloneSignal", "Terms")  # a signal in anyone's loop: standalone.py


def __getattr__(name: str):
    # the protocol's classes from base.py, which imports torch: imported on first use, so that reading the
    # signals' knobs (NAME/__init__.py) to check a command line imports none
    if name in _PROTOCOL:
        from reflectrl.signals import base

        return getattr(base, name)
    if name == "make_jax":  # the JAX signals in anyone's loop, optax style: jax_standalone.signals("count+gear", ...)
        from reflectrl.signals.jax_standalone import signals

        return signals
    if name in _STANDALONE:
        from reflectrl.signals import standalone

        return getattr(standalone, name)
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


def jax_signal_names() -> list[str]:
    """The signals with a JAX form (their registry entries name it), in the registry's order."""
    from reflectrl.registry import signals

    return [name for name, spec in signals().items() if spec.jax]


def jax_signal_class(name: str) -> type | None:
    """The JAX form of a signal (its registry entry's `jax`, NAME/jax.py), imported; None where it has none."""
    import importlib

    from reflectrl.registry import signal_spec

    target = signal_spec(name).jax
    if not target:
        return None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def torch_only_knobs(name: str, section) -> list[tuple[str, str]]:
    """The knobs of a signal's section, as set, that only its torch form runs: [(the knob as said, why)]."""
    from reflectrl.registry import signal_spec

    listed = signal_spec(name).jax_torch_only
    return [(knob, why) for refused, knob, why in (listed(section) if listed else ()) if refused]


def signal_terms(signal: Signal, reward, output) -> dict:
    """The per-step terms each signal gave this iteration, by "NAME KIND" (a stack keeps its
    members' apart); `reward` and `output` are what the trainer got from shape_rewards and
    after_advantages."""
    from reflectrl.signals.base import terms_from
    from reflectrl.signals.compose import SignalStack

    return dict(signal.terms) if isinstance(signal, SignalStack) else terms_from(signal.name, reward, output)
