"""The verbal verdict bonus of the RefGRPO paper ("Closing the Reflection Gap: A Free
Calibration Bonus for Agentic RL", arXiv 2606.14211; seed 000 section 6).

The agent acts, then states in words whether it solved the task ("solved" / "not solved";
llm/tasks/reflect.py), never seeing the outcome. The reward is the paper's reported form

    r = outcome + c * 1[verdict == outcome]

added on the turn where the verdict is stated (a missing or malformed verdict earns no
bonus), with c on a schedule: the paper's is about 0.1 for the first two thirds of training,
then 0 (`schedule=step`, `until=0.667`, the defaults); `constant` keeps c throughout,
`linear` brings it from c to 0 at `until`. A task with several reflections per episode (the
`rag` task's "relevant" / "not relevant" after each search) gets a term for each, of
c / (the episode's number of reflections), each judged against its own truth where it has one
(`Reflection.target`: with `reflect_after=feedback`, whether the search it judges found a
needed document) and against the episode's final outcome otherwise,
and the GRPO trainer credits the terms back over turns (see trainers/grpo/trainer.py: the undiscounted
return-to-go, so c = 0 is plain GRPO bit for bit).

DECISION (measured, docs/llm.md): an episode's bonus is at most c. With c per judgement, a
tiny model on `rag`, which fails most sampled episodes, learnt to search until the turns ran
out, saying "not relevant" each time (each judgement "agreed" with the failure), and its
accuracy went from 0.8 to 0.

Running `grpo+verdict` switches the task's `reflect=verdict` on (tasks/reflect.py).
"""

from __future__ import annotations

import torch

from reflectrl.signals.base import Batch, Signal, scheduled
from reflectrl.signals.verdict import SPEC, VerdictConfig


def verdict_terms(episode: list[list], outcome: float, coef: float) -> tuple[list[float], int]:
    """Per turn of one episode, the bonus of the judgements stated there (c / the episode's number of
    judgements for each that agrees with its truth, its `target` where it has one, else the outcome:
    an episode's bonus is at most c, however many), and how many agree. `episode[k]`: the
    Reflections stated in turn k. Also TRL's reward (integrations/rewards.py)."""
    count = sum(len(turn) for turn in episode)
    terms, agree = [], 0
    for turn in episode:
        right = sum(r.stated_verdict is not None
                    and float(r.stated_verdict) == (outcome if r.target is None else float(r.target)) for r in turn)
        agree += right
        terms.append(right * coef / count if right else 0.0)
    return terms, agree


class VerdictBonus(Signal):
    name = "verdict"

    def __init__(self, config: VerdictConfig):
        self.built_from(config, SPEC)
        self.config = config
        self.coef = config.coef
        self._metrics: dict = {}

    def shape_rewards(self, batch: Batch) -> torch.Tensor | None:
        c = self.config
        self.coef = scheduled(c.coef, c.schedule, c.until, batch.global_step, self.ctx.total_iterations)
        bonus = torch.zeros_like(batch.outcomes)
        agree = stated = 0
        for i, episode in enumerate(batch.reflections):
            terms, right = verdict_terms(episode, batch.outcomes[len(episode) - 1, i].item(), self.coef)
            bonus[:len(terms), i] = torch.tensor(terms)
            agree += right
            stated += sum(len(turn) for turn in episode)
        self._metrics = {"verdict_coef": self.coef, "verdict_agreement": agree / max(stated, 1),
                         "verdict_bonus": bonus.sum().item() / max(len(batch.reflections), 1)}
        return bonus

    def metrics(self) -> dict:
        return dict(self._metrics)
