"""Fixed references: each env family's floor and ceiling, the scores a report normalises by.

A report's normalised score is (return - floor) / (ceiling - floor): 0 is what a policy that
learned nothing scores, 1 is the solved or published score. Normalising by fixed numbers,
not by the returns the experiment happened to see, keeps a small effect small: on DoorKey-16x16
a +0.014 return is +0.014 here, where the observed range (0 to 0.166) made it +0.086. An env
with no reference here falls back to its observed return range (the report says so).

The margin of the untestable rule (analysis.untestable_reason: "both at the floor", "the baseline
is at the ceiling") is MARGIN_SHARE of (ceiling - floor), in the env's return units.

`solved`: the final return (the mean over the last 10% of training) at or above which a run's
final policy solves the task; None where the task has no such score (MuJoCo). It is the one
definition of "solved" in the report (docs/evidence.md): the final policy, never "reached once",
never a share of the best return seen.

Where each number comes from (docs/evidence.md, "Fixed references", repeats this table):
* success-reward grid tasks (MiniGrid, BabyAI, navix, xminigrid, the built-in grid world): 0, the
  return of an episode that never reaches the goal, and 1, the success reward's upper bound.
  MiniGrid pays 1 - 0.9 x steps / max_steps, below 1 for any episode; we take 1 and not a solved
  episode's return because the shortest solving episode differs per layout (and per seed on the
  random layouts), and the best returns are within the 5% margin of 1 (the RL Zoo's PPO on
  DoorKey-5x5: 0.964; the best run here on DoorKey-8x8: 0.973), so a solved entry reads "at the
  ceiling". The grid world pays exactly 1. Solved: 0.8, which (a return <= 1 per success) a
  final return reaches only with a success rate of 0.8 or more.
* CartPole-v1: 0 and 500 (the episode cap); solved 475, Gymnasium's reward_threshold.
  CartPole-v0: 0 and 200; solved 195.
* LunarLander (v2, v3): a uniform random policy measured here (-192.0, the mean of 100 episodes of
  LunarLander-v3, seeds 0-99, standard error 11.5; the script is in docs/evidence.md) and 200,
  Gymnasium's reward_threshold ("solved"), also its solved score.
* MuJoCo locomotion: a uniform random policy measured here the same way (the -v5 envs, 100
  episodes) and the published PPO score of the RL Baselines3 Zoo's benchmark (benchmark.md: the
  -v3 envs, 1M steps; Humanoid has no PPO row there: its SAC score at 2M); no solved score.
* language tasks (reflectrl.llm's tasks: a reward of 1 for a correct answer, 0 otherwise): 0 and 1;
  solved 0.8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RANDOM_POLICY = "a uniform random policy, measured here (100 episodes, seeds 0-99)"
RL_ZOO = "RL Baselines3 Zoo benchmark.md, PPO at 1M steps"


@dataclass(frozen=True)
class Reference:
    family: str
    floor: float
    ceiling: float
    solved: float | None  # the final return a solving policy reaches; None: the task has no such score
    floor_source: str
    ceiling_source: str

    @property
    def range(self) -> tuple[float, float]:
        return self.floor, self.ceiling


_SUCCESS = ("no goal reached", "the success reward's upper bound (MiniGrid's 1 - 0.9 steps / max_steps < 1; "
            "the grid world's 1)")


def _mujoco(name: str, random: float, published: float, where: str = RL_ZOO) -> tuple[str, Reference]:
    return (rf"{name}-v\d+", Reference(f"MuJoCo {name}", random, published, None, RANDOM_POLICY, where))


# (env id pattern, matched from the start of the id; its reference), the first match wins.
REFERENCES: tuple[tuple[str, Reference], ...] = (
    (r"(MiniGrid-|BabyAI-|navix:|xminigrid:|reflectrl[/:]GridWorld)",
     Reference("success-reward grid tasks", 0.0, 1.0, 0.8, *_SUCCESS)),
    (r"CartPole-v1", Reference("CartPole-v1", 0.0, 500.0, 475.0, "no step balanced", "the 500-step episode cap")),
    (r"CartPole-v0", Reference("CartPole-v0", 0.0, 200.0, 195.0, "no step balanced", "the 200-step episode cap")),
    (r"LunarLander-v\d+", Reference("LunarLander", -192.0, 200.0, 200.0, RANDOM_POLICY,
                                    "Gymnasium's reward_threshold (solved)")),
    _mujoco("HalfCheetah", -282.5, 5819.1),
    _mujoco("Hopper", 16.7, 2410.4),
    _mujoco("Walker2d", 1.8, 3478.8),
    _mujoco("Ant", -48.0, 1327.2),
    _mujoco("Humanoid", 112.6, 6232.3, "RL Baselines3 Zoo benchmark.md, SAC at 2M steps (no PPO row)"),
    (r"(llm:)?(arith|code|rag|reasoning_gym|reflect|tools)\b",
     Reference("language tasks", 0.0, 1.0, 0.8, "no answer correct", "every answer correct")),
)


def reference_for(env_id: str) -> Reference | None:
    """The env's fixed reference, or None (the report then normalises by the observed range)."""
    for pattern, ref in REFERENCES:
        if re.match(pattern, env_id):
            return ref
    return None


def norm_range(env_id: str, observed: tuple[float, float]) -> tuple[float, float]:
    """The (floor, ceiling) an env's scores are normalised by: its fixed reference, else the
    observed return range, widened to 1 where every return was the same."""
    ref = reference_for(env_id)
    if ref is not None:
        return ref.range
    lo, hi = observed
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def describe(env_id: str, observed: tuple[float, float] | None = None) -> str:
    """One line: what the env is normalised by, and where the numbers come from."""
    ref = reference_for(env_id)
    if ref is None:
        lo, hi = norm_range(env_id, observed or (0.0, 0.0))
        return (f"{env_id}: no fixed reference; normalised by the observed return range [{lo:.4g}, {hi:.4g}], "
                "and no solved count")
    solved = f"; solved: final return >= {ref.solved:g}" if ref.solved is not None else "; no solved score"
    return (f"{env_id}: floor {ref.floor:g} ({ref.floor_source}), ceiling {ref.ceiling:g} ({ref.ceiling_source})"
            f"{solved}")
