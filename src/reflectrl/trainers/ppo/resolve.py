"""PPO's resolve (its per-env defaults). The policy `reflectrl eval` loads from its runs is the trainer
kit's actor-critic (trainers/resolve.py load_actor_critic, which IMPALA's runs share)."""

from __future__ import annotations

from reflectrl.config import RunConfig
from reflectrl.trainers.resolve import check_image_encoder, probe_env


def resolve(cfg: RunConfig) -> RunConfig:
    facts = probe_env(cfg)
    check_image_encoder(cfg.ppo.encoder, facts)
    cfg.ppo = cfg.ppo.resolved(facts.continuous, atari=facts.atari, pixels=facts.pixels)
    return cfg
