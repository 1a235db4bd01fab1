"""Signals: small heads fit by regression onto what a trainer already computes, then applied.

A signal sees tensors and returns tensors; it never imports a trainer. See base.py for the
protocol and the points at which a trainer calls it.
"""

from reflectrl.signals.base import Batch, Signal, SignalContext, SignalOutput

__all__ = ["Batch", "Signal", "SignalContext", "SignalOutput"]


def make_signal(cfg) -> Signal | None:
    """The signal a run's algo uses (None for plain PPO), configured from its section."""
    from reflectrl.config import ALGO_SECTIONS
    from reflectrl.signals.calibration import CalibrationBonus
    from reflectrl.signals.reweighting import GEARReweighting
    from reflectrl.signals.shaping import SelfDistilledShaping

    section = ALGO_SECTIONS.get(cfg.algo)
    if section is None:
        return None
    factories = {"calibration": CalibrationBonus, "shaping": SelfDistilledShaping, "gear": GEARReweighting}
    return factories[section](cfg.sections[section])
