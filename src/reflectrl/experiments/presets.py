"""Named experiments for `reflectrl compare --preset NAME`: the envs, algo entries, seeds,
budget and --set items of a benchmark, in one place. Flags given beside --preset replace
the preset's value for that flag (--set items are added after the preset's)."""

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
        sets=("env.size=15", "env.layout=maze")),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise UserError(f"--preset '{name}': no such preset; use one of {', '.join(PRESETS)}")
    return PRESETS[name]


def presets_help() -> str:
    return "; ".join(f"{name}: {p.summary}" for name, p in PRESETS.items())
