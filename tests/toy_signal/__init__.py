"""A toy signal with a torch form and a JAX form: one package plus one registration (issue 58).

Its knobs and registry entry live here (no torch, no JAX: a command line is checked with these alone);
its torch form is toy_signal/torch.py and its JAX form toy_signal/jax.py, named by module path.
tests/test_new_signal.py trains it through `reflectrl train` on both backends."""

from __future__ import annotations

import math
from dataclasses import dataclass

from reflectrl.errors import UserError
from reflectrl.registry import SignalSpec


@dataclass
class ToyConfig:
    size: float = 0.1
    """reward added to every step (0: the run equals --algo ppo bit for bit)"""

    def validate(self) -> None:
        if not math.isfinite(self.size) or self.size < 0:
            raise UserError(f"toy.size={self.size}: must be a finite number >= 0")


SPEC = SignalSpec(
    name="toy", config=ToyConfig, factory="toy_signal.torch:ToyBonus", jax="toy_signal.jax:ToyBonus",
    step_kinds=("env_step",), summary="a constant reward on every step (tests/toy_signal)", neutral="size=0")
