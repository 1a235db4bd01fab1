"""The confidence reward of RLCR ("Beyond Binary Rewards: Training LMs to Reason About Their
Uncertainty", arXiv 2507.16806): the agent states a confidence q in [0, 1] after its answer
(llm/tasks/reflect.py) and earns, beside the outcome,

    coef * S(q, y),   y = 1[correct],   S = -(q - y)^2 (Brier, the default)
                                          or y log q + (1 - y) log(1 - q), q clipped to
                                          [log_eps, 1 - log_eps] (`score=log`)

RLCR's reward is 1[correct] - (q - 1[correct])^2, i.e. coef = 1 with the Brier score. Both are
bounded proper scoring rules, so the reward's optimum is an accurate answer with a calibrated
confidence. A missing or malformed confidence earns the rule's worst value (-1; log(log_eps)),
so leaving it out never pays. `schedule`/`until` as the verdict signal's (default constant).

Running `grpo+confidence` switches the task's `reflect=confidence` on.
"""

from __future__ import annotations

import math

import torch

from reflectrl.signals.base import Batch, Signal, scheduled
from reflectrl.signals.confidence import SPEC, ConfidenceConfig


def proper_score(q: float | None, y: float, score: str = "brier", log_eps: float = 0.01) -> float:
    """S(q, y); the worst value where no confidence was stated."""
    if score == "brier":
        return -1.0 if q is None else -(q - y) ** 2
    if q is None:
        return math.log(log_eps)
    q = min(max(q, log_eps), 1 - log_eps)
    return y * math.log(q) + (1 - y) * math.log(1 - q)


def confidence_terms(episode: list[list], outcome: float, coef: float, config: ConfidenceConfig
                     ) -> tuple[list[float], list[float]]:
    """Per turn of one episode, coef x the score of the confidences stated on its answer there (a
    search's "relevant" states none), and the scores. Also TRL's reward (integrations/rewards.py)."""
    terms, scores = [], []
    for turn in episode:
        here = [proper_score(r.confidence, outcome, config.score, config.log_eps) for r in turn if r.final]
        scores += here
        terms.append(coef * sum(here))
    return terms, scores


class ConfidenceReward(Signal):
    name = "confidence"

    def __init__(self, config: ConfidenceConfig):
        self.built_from(config, SPEC)
        self.config = config
        self._metrics: dict = {}

    def shape_rewards(self, batch: Batch) -> torch.Tensor | None:
        c = self.config
        coef = scheduled(c.coef, c.schedule, c.until, batch.global_step, self.ctx.total_iterations)
        reward = torch.zeros_like(batch.outcomes)
        scores = []
        for i, episode in enumerate(batch.reflections):
            terms, here = confidence_terms(episode, batch.outcomes[len(episode) - 1, i].item(), coef, c)
            reward[:len(terms), i] = torch.tensor(terms)
            scores += here
        self._metrics = {"confidence_coef": coef,
                         "confidence_score": sum(scores) / len(scores) if scores else float("nan")}
        return reward

    def metrics(self) -> dict:
        return dict(self._metrics)
