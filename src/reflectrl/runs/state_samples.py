"""Samples of where a run went and what it was paid there, for state maps (seed 000
section 5.3, seed 002 section 7; `reflectrl plot state-map`).

At `RunConfig.state_map_snapshots` evenly spaced iterations (the first and the last) the trainer
hands its rollout to `StateSampler.record`, which keeps up to `SAMPLES` of its steps, chosen
by a generator of its own (seeded from the run's seed and the iteration: the trainer's
random stream is never touched, so a run with or without samples is the same run):

- `obs`: the observation, when it is a flat vector of at most `MAX_OBS_DIM` numbers (an
  image is not kept: its state key places it);
- `state_keys`: the exploration state key (envs/statekey.py: a cell, MiniGrid's position,
  Montezuma's room and position, else a SimHash);
- `rewards`: the environment's reward (as the trainer learns from it, before any signal);
- one array per signal term (`signal_terms`): "calibration reward", "shaping reward",
  "gear weight", "rnd intrinsic", ...

The samples of every snapshot so far are rewritten to the run's `state_samples.npz`
(atomically) when one is taken. A resumed run takes the same snapshots again at the same
iterations, with the same rows, so the file ends the same either way.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from reflectrl.runs.rundir import STATE_SAMPLES, atomic_write_bytes

SAMPLES = 2048      # steps kept per snapshot
MAX_OBS_DIM = 64    # larger observations are placed by their state key only



def snapshot_iterations(total_iterations: int, k: int) -> list[int]:
    """k iterations (of `total_iterations`) evenly spaced from the first to the last (fewer
    where training has fewer iterations; k = 1: the last)."""
    if k <= 0 or total_iterations <= 0:
        return []
    if k == 1:
        return [total_iterations]
    return sorted({1 + (total_iterations - 1) * i // (k - 1) for i in range(k)})

class StateSampler:
    def __init__(self, path: str | Path | None, seed: int, total_iterations: int, snapshots: int):
        self.path = Path(path) / STATE_SAMPLES if path is not None else None
        self.seed = seed
        self.at = set(snapshot_iterations(total_iterations, snapshots))
        self.kept: dict[int, dict[str, np.ndarray]] = {}
        if self.path is not None and self.path.is_file():
            self.kept = load_samples(self.path)

    def wants(self, iteration: int) -> bool:
        return self.path is not None and iteration in self.at

    def record(self, iteration: int, global_step: int, obs, state_keys, rewards, terms: dict) -> None:
        """One snapshot of a rollout: `obs` (steps, envs, ...), `state_keys` and `rewards` (steps, envs), and each
        signal term's (steps, envs) values; numpy arrays or torch tensors (the torch trainers' rollout)."""
        obs, state_keys, rewards = _numpy(obs), _numpy(state_keys), _numpy(rewards)
        n = rewards.size
        rng = np.random.default_rng([self.seed, iteration])
        rows = np.sort(rng.choice(n, size=min(SAMPLES, n), replace=False))
        sample = {"global_step": np.array(global_step), "state_keys": state_keys.reshape(-1)[rows],
                  "rewards": rewards.reshape(-1)[rows].astype(np.float32)}
        flat = obs.reshape(n, -1)
        if obs.ndim == 3 and flat.shape[1] <= MAX_OBS_DIM:
            sample["obs"] = flat[rows].astype(np.float32)
        for name, values in terms.items():
            sample[f"term:{name}"] = _numpy(values).reshape(-1).astype(np.float32)[rows]
        self.kept[iteration] = sample
        self._save()

    def _save(self) -> None:
        arrays = {f"{it}/{key}": value for it, sample in self.kept.items() for key, value in sample.items()}
        arrays["iterations"] = np.array(sorted(self.kept))
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        atomic_write_bytes(self.path, buf.getvalue())


def _numpy(values) -> np.ndarray:
    """A numpy array of a numpy array or (on the torch trainers' side) a tensor, with no torch imported here; a
    floating tensor as float32 (what every floating array is kept as; numpy has no bfloat16)."""
    if hasattr(values, "detach"):
        values = values.detach().cpu()
        values = (values.float() if values.is_floating_point() else values).numpy()
    return np.asarray(values)


def load_samples(path: str | Path) -> dict[int, dict[str, np.ndarray]]:
    """{iteration: {"global_step", "state_keys", "rewards", "obs"?, "term:NAME"...}} of a run's file."""
    with np.load(path) as data:
        out: dict[int, dict[str, np.ndarray]] = {int(it): {} for it in data["iterations"]}
        for key in data.files:
            if key == "iterations":
                continue
            it, name = key.split("/", 1)
            out[int(it)][name] = data[key]
    return out


