"""Signals: small heads fit by regression onto what a trainer already computes, then applied.

A signal sees tensors and returns tensors; it never imports a trainer. See base.py for the
protocol and the points at which a trainer calls it, compose.py for several at once, and
reflectrl/registry.py for how a signal declares itself.
"""

from reflectrl.signals.base import Batch, Signal, SignalContext, SignalOutput

__all__ = ["Batch", "Signal", "SignalContext", "SignalOutput", "build_signals", "make_signal"]


def build_signals(signal_names, sections: dict) -> list[Signal]:
    """One configured signal per name, in order (each from its section of `sections`)."""
    from reflectrl.registry import signal_spec

    out = []
    for name in signal_names:
        spec = signal_spec(name)
        out.append(spec.factory(sections.get(name) or spec.config()))
    return out


def make_signal(cfg, family: str = "control") -> Signal | None:
    """What a run's --algo runs on top of its trainer: None, one signal, or a SignalStack."""
    from reflectrl.registry import parse_algo
    from reflectrl.signals.compose import SignalStack

    members = build_signals(parse_algo(cfg.algo, family).signals, cfg.sections)
    if not members:
        return None
    return members[0] if len(members) == 1 else SignalStack(members)
