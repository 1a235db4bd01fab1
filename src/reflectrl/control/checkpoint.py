"""What every control trainer's checkpoint holds beyond its own networks: the global RNGs,
the exploration bookkeeping, and the envs (an exact snapshot, with the episodes that cannot
be snapshotted restarted and said so). PPOTrainer and DQNTrainer both use these."""

from __future__ import annotations

import random
import warnings

import numpy as np
import torch

from reflectrl.envs import snapshot
from reflectrl.exploration import RolloutKeys


def global_rngs() -> dict:
    return {"torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}


def restore_global_rngs(state: dict) -> None:
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def exploration_state(trainer) -> dict:
    return {"tracker": trainer.exploration.state_dict(), "current_keys": trainer.keys.current.copy()}


def restore_exploration(trainer, state: dict | None) -> None:
    if state:  # a checkpoint from before the exploration metrics starts them afresh
        trainer.exploration.load_state_dict(state["tracker"])
        trainer.keys.current = state["current_keys"].copy()


def restore_envs(trainer, data: bytes) -> list[tuple[int, np.ndarray]]:
    """Replace `trainer.envs` with the snapshot `data`; the (env index, first observation) of
    each env whose episode had to restart (its state keys are reset here; the caller puts the
    observation into its own next-observation buffer)."""
    trainer.envs.close()
    trainer.envs, stale = snapshot.loads(data)
    restarted = []
    if stale:
        warnings.warn(
            f"env '{trainer.cfg.env_id}' cannot be snapshotted exactly; its {len(stale)} in-progress "
            "episode(s) restart on resume, so this run is not bit-identical to an uninterrupted one",
            stacklevel=3,
        )
        for i in stale:
            obs, info = trainer.envs.envs[i].reset(seed=trainer.cfg.seed + trainer.global_step + i)
            trainer.keys.current[i] = RolloutKeys(obs[None], {k: [v] for k, v in info.items()}).current[0]
            restarted.append((i, obs))
    return restarted
