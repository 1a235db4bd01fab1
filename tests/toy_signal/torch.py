"""The toy signal's torch form: a constant reward term on every step."""

from __future__ import annotations

import torch

from reflectrl.signals.base import Signal


class ToyBonus(Signal):
    name = "toy"

    def __init__(self, cfg):
        from toy_signal import SPEC

        self.cfg = cfg
        self.built_from(cfg, SPEC)
        self._last = 0.0

    def shape_rewards(self, batch):
        if self.cfg.size == 0:
            return None  # neutral: nothing added, the plain trainer's run bit for bit
        self._last = self.cfg.size
        return torch.full_like(batch.rewards, self.cfg.size)

    def metrics(self):
        return {"toy_size": self._last}
