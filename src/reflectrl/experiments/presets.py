"""Named experiments for `reflectrl compare --preset NAME`: the envs, algo entries, seeds,
budget, --set items and reward wrapper of an experiment, in one place. Flags given beside
--preset replace the preset's value for that flag (--set items are added after the preset's).
The scripts of examples/experiments/ that add their own tables to an experiment (hppo.py,
safety.py, mappo.py) run these presets."""

from __future__ import annotations

from dataclasses import dataclass, field

from reflectrl.errors import UserError
from reflectrl.registry import DEFAULT_TRAINER

# the seed signals alone, and each on top of the episodic count bonus (the baseline that
# published work on MiniGrid says a new bonus must beat, and the best one on the 15x15 maze)
_BASE = DEFAULT_TRAINER["control"]
_SEED_SIGNALS = tuple(f"{_BASE}+{s}" for s in ("calibration", "shaping[mode=potential]", "gear"))
_ENTRIES = (_BASE, f"{_BASE}+count", f"{_BASE}+rnd", *_SEED_SIGNALS,
            *(s.replace(f"{_BASE}+", f"{_BASE}+count+", 1) for s in _SEED_SIGNALS))


@dataclass(frozen=True)
class Preset:
    summary: str
    envs: tuple[str, ...]
    algos: tuple[str, ...]
    seeds: int
    total_steps: int
    sets: tuple[str, ...] = field(default_factory=tuple)
    wrapper: str | None = None  # --wrapper for every run


# seed 002 section 6.1, hierarchical vs flat (docs/hierarchy.md): the grid world's hardest layouts
_HPPO = ("ppo", "ppo+shaping", "hppo", "hppo+shaping")
# the maze's ablations: which level's shaper does what, the loop-proof mode, and the exploration baseline
_HPPO_ABLATIONS = ("ppo+count", "ppo+shaping[mode=potential]", "hppo+shaping[mode=potential]",
                   "hppo+shaping[shaped_levels=low]", "hppo+shaping[shaped_levels=high]")
_MAZE15 = ("env.size=15", "env.layout=maze")
# seed 002 section 6.3, constrained RL (docs/safety.md): PPOLag and the shaper's safety term at a cost limit of 25
_SAFETY = ("ppo", "ppo_lag", "ppo+shaping[safety_beta=1]")
_COST_LIMIT = "cost_limit=25"


PRESETS = {
    "hard-exploration": Preset(
        summary="MiniGrid hard exploration: DoorKey-8x8 and 16x16, MultiRoom-N4-S5, KeyCorridorS3R3; PPO, the count "
                "and RND baselines, each seed signal alone and on the count bonus; 3 seeds x 1M steps (EnvPool)",
        envs=("MiniGrid-DoorKey-8x8-v0", "MiniGrid-DoorKey-16x16-v0", "MiniGrid-MultiRoom-N4-S5-v0",
              "MiniGrid-KeyCorridorS3R3-v0"),
        algos=_ENTRIES, seeds=3, total_steps=1_000_000, sets=("backend=envpool",)),
    "maze15": Preset(
        summary="the demo (make demo): the built-in 15x15 maze, where plain PPO never finds the goal in 100k steps; "
                "the same entries, 5 seeds",
        envs=("reflectrl/GridWorld-v0",), algos=_ENTRIES, seeds=5, total_steps=100_000,
        sets=_MAZE15),
    "hppo-maze15": Preset(
        summary="hppo and hppo+shaping vs flat ppo and ppo+shaping on the 15x15 maze (900-step episodes), "
                "5 seeds x 200k",
        envs=("reflectrl/GridWorld-v0",), algos=_HPPO, seeds=5, total_steps=200_000, sets=_MAZE15),
    "hppo-rooms16": Preset(
        summary="the same entries on 16x16 four rooms with 300-step episodes, 5 seeds x 150k",
        envs=("reflectrl/GridWorld-v0",), algos=_HPPO, seeds=5, total_steps=150_000,
        sets=("env.size=16", "env.layout=rooms", "env.max_episode_steps=300")),
    "hppo-rooms9": Preset(
        summary="the same entries on 9x9 four rooms with 100-step episodes, 5 seeds x 50k",
        envs=("reflectrl/GridWorld-v0",), algos=_HPPO, seeds=5, total_steps=50_000,
        sets=("env.size=9", "env.layout=rooms", "env.max_episode_steps=100")),
    "hppo-maze15-ablations": Preset(
        summary="the maze with ppo+count, potential-mode shaping flat and in the hierarchy, and hppo's shaping at "
                "one level only, 5 seeds x 200k",
        envs=("reflectrl/GridWorld-v0",), algos=_HPPO_ABLATIONS, seeds=5, total_steps=200_000, sets=_MAZE15),
    "safety-grid8": Preset(
        summary="ppo vs ppo_lag vs ppo+shaping[safety_beta=1] at cost_limit=25 on the 8x8 hazard grid, 5 seeds x 100k",
        envs=("reflectrl/GridWorld-v0",), algos=_SAFETY, seeds=5, total_steps=100_000,
        sets=("env.size=8", "env.hazards=0.2", _COST_LIMIT)),
    "safety-grid12": Preset(
        summary="the same on the 12x12 grid with denser hazards, 5 seeds x 100k",
        envs=("reflectrl/GridWorld-v0",), algos=_SAFETY, seeds=5, total_steps=100_000,
        sets=("env.size=12", "env.hazards=0.4", _COST_LIMIT)),
    "safety-hopper": Preset(
        summary="the same on Hopper-v5 with the velocity cost, 5 seeds x 150k",
        envs=("Hopper-v5",), algos=_SAFETY, seeds=5, total_steps=150_000, sets=(_COST_LIMIT,),
        wrapper="velocity-cost"),
    "mappo-spread": Preset(
        summary="mappo vs mappo+shaping with team or own labels on MPE's simple_spread (3 agents, 25 cycles), "
                "5 seeds x 150k",
        envs=("pettingzoo:mpe2.simple_spread_v3",),
        algos=("mappo", "mappo+shaping[labels=team]", "mappo+shaping[labels=own]"), seeds=5, total_steps=150_000,
        sets=("env.max_cycles=25", "env.N=3")),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise UserError(f"--preset '{name}': no such preset; use one of {', '.join(PRESETS)}")
    return PRESETS[name]


def presets_help() -> str:
    return "; ".join(f"{name}: {p.summary}" for name, p in PRESETS.items())
