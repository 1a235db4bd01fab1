"""Several signals as one: `--algo ppo+calibration+gear`.

The members apply in the order written, each with its own random generator (seeded from the
run's seed and its own name), and the stack combines their outputs in one way:

- reward terms (from `shape_rewards`, and from `after_advantages` with `recompute`) add, and
  the advantages are estimated once on the sum (GAE is linear in the rewards, so this is the
  same as re-estimating after each member);
- advantage terms add;
- per-step weights multiply;
- auxiliary losses add;
- reward streams with their own value heads (RewardStream) are all learnt, each member's
  under its own name; the extrinsic advantage's weights (extrinsic_coef) multiply.

Each member sees the batch as the members before it left it: its rewards include their
reward terms, its advantages their advantage terms (weights apply in the loss, not to the
advantages a member sees). A stack whose members are all neutral (alpha=0, mode=off,
temperature=inf) leaves the trainer bit-identical to the plain one: a zero reward term
re-estimates the same advantages, a weight of 1 multiplies exactly.
"""

from __future__ import annotations

import torch

from reflectrl.signals.base import Batch, RewardStream, Signal, SignalContext, SignalOutput, merge_terms, terms_from


class SignalStack(Signal):
    name = "stack"

    def __init__(self, members: list[Signal]):
        self.members = list(members)
        self.name = "+".join(m.name for m in self.members)
        self.terms: dict[str, torch.Tensor] = {}
        # the trainer fills what any member asks for: the union of their needs, fixed as theirs are
        self.fix_wants(frozenset().union(*(m.wants for m in self.members)))

    def bind(self, ctx: SignalContext) -> None:
        self.ctx = ctx
        for m in self.members:
            m.bind(ctx)

    def reward_streams(self) -> list[RewardStream]:
        streams = [s for m in self.members for s in m.reward_streams()]
        names = [s.name for s in streams]
        if len(set(names)) != len(names):
            raise ValueError(f"two members of {self.name} declare a reward stream of the same name: {names}")
        return streams

    @property
    def extrinsic_coef(self) -> float:
        coef = 1.0
        for m in self.members:
            coef *= m.extrinsic_coef
        return coef

    def shape_rewards(self, batch: Batch) -> torch.Tensor | None:
        total = None
        base = batch.rewards
        self.terms = {}  # each member's per-step terms this iteration, by "NAME KIND" (state maps)
        for m in self.members:
            term = m.shape_rewards(batch)
            if term is not None:
                merge_terms(self.terms, terms_from(m.name, term))
                total = term if total is None else total + term
                batch.rewards = base + total  # the next member sees the shaped rewards
        batch.rewards = base
        return total

    def after_advantages(self, batch: Batch) -> SignalOutput | None:
        # members see what the ones before them did; after_update sees the batch as a lone
        # signal would (the trainer's rewards and advantages before this hook)
        saved = batch.rewards, batch.advantages, batch.returns
        try:
            return self._combine(batch)
        finally:
            batch.rewards, batch.advantages, batch.returns = saved

    def _combine(self, batch: Batch) -> SignalOutput | None:
        combined = SignalOutput(recompute=False)
        for m in self.members:
            out = m.after_advantages(batch)
            if out is None:
                continue
            merge_terms(self.terms, terms_from(m.name, None, out))
            if out.reward is not None:
                combined.reward = out.reward if combined.reward is None else combined.reward + out.reward
                batch.rewards = batch.rewards + out.reward
                if out.recompute:
                    combined.recompute = True
                    batch.advantages, batch.returns = batch.estimate(batch.rewards)
                    if combined.advantage is not None:  # advantage terms of earlier members still apply
                        batch.advantages = batch.advantages + combined.advantage
            if out.advantage is not None:
                combined.advantage = out.advantage if combined.advantage is None else combined.advantage + out.advantage
                batch.advantages = batch.advantages + out.advantage
            if out.weights is not None:
                combined.weights = out.weights if combined.weights is None else combined.weights * out.weights
            combined.streams.update(out.streams)
            if out.streams:  # later members may read them (gear.advantage=total)
                batch.stream_rewards = {**(batch.stream_rewards or {}), **out.streams}
            combined.metrics.update(out.metrics)
        if combined.reward is None and combined.advantage is None and combined.weights is None and not combined.streams:
            return None
        return combined

    def auxiliary_loss(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor | None:
        total = None
        for m in self.members:
            if m.wants_feature_grad:
                term = m.auxiliary_loss(features, index)
                if term is not None:
                    total = term if total is None else total + term
        return total

    def after_update(self, batch: Batch) -> None:
        for m in self.members:
            m.after_update(batch)

    def metrics(self) -> dict:
        out: dict = {}
        for m in self.members:
            for key, value in m.metrics().items():
                out[key if key not in out else f"{m.name}/{key}"] = value
        return out

    def state_dict(self) -> dict:
        return {"members": {m.name: m.state_dict() for m in self.members}}

    def load_state_dict(self, state: dict) -> None:
        for m in self.members:
            m.load_state_dict(state["members"][m.name])


def member_state(signal_state: dict | None, name: str) -> dict:
    """The checkpointed state of signal `name`, whether the run had it alone or in a stack."""
    if not signal_state:
        return {}
    if "members" in signal_state:
        return signal_state["members"].get(name) or {}
    return signal_state
