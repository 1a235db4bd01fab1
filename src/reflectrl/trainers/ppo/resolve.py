"""PPO's resolve (its per-env defaults) and the policy `reflectrl eval` loads from its runs
(IMPALA's runs hold the same actor-critic, with their own widths)."""

from __future__ import annotations

from reflectrl.config import RunConfig, env_settings, trainer_knobs
from reflectrl.trainers.resolve import check_image_encoder, policy_space, probe_env


def resolve(cfg: RunConfig) -> RunConfig:
    facts = probe_env(cfg)
    check_image_encoder(cfg.ppo.encoder, facts)
    cfg.ppo = cfg.ppo.resolved(facts.continuous, atari=facts.atari, pixels=facts.pixels)
    return cfg


def load_policy(cfg: RunConfig, state: dict, env):
    from reflectrl.trainers.cnn import make_policy

    obs_shape, action_dim, continuous, _ = policy_space(env)
    agent = make_policy(obs_shape, action_dim, continuous, "cnn" if env_settings(cfg).encoder == "cnn" else "mlp",
                        trainer_knobs(cfg).hidden_sizes)
    agent.load_state_dict(state["agent"])
    return agent
