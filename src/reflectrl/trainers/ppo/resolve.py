"""PPO's resolve (its per-env defaults). The policy `reflectrl eval` loads from its runs is the trainer
kit's actor-critic (trainers/resolve.py load_actor_critic, which IMPALA's runs share)."""

from __future__ import annotations

from reflectrl.config import RunConfig
from reflectrl.errors import UserError
from reflectrl.registry import parse_algo, signal_spec
from reflectrl.trainers.resolve import check_image_encoder, probe_env


def resolve(cfg: RunConfig) -> RunConfig:
    check_recurrent_signals(cfg)
    facts = probe_env(cfg)
    check_image_encoder(cfg.ppo.encoder, facts)
    cfg.ppo = cfg.ppo.resolved(facts.continuous, atari=facts.atari, pixels=facts.pixels)
    return cfg


def check_recurrent_signals(cfg: RunConfig) -> None:
    """A recurrent policy acts on its memory, which an observation alone does not give: a signal that needs
    the policy's actions on any observation (shaping's imagined rollouts) cannot have them. One line."""
    if cfg.ppo.policy == "mlp":
        return
    for name in parse_algo(cfg.algo, "control").signals:
        section = cfg.sections.get(name) or signal_spec(name).config()
        if "policy" in signal_spec(name).wants_for(section):
            raise UserError(f"--algo {cfg.algo}: the {name} signal acts the policy on observations out of their "
                            f"episodes (imagined rollouts), which a recurrent policy (policy={cfg.ppo.policy}) "
                            "cannot do without its memory; use policy=mlp or turn that part of the signal off")
