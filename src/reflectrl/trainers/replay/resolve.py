"""The replay trainers' resolve (DQN's per-env defaults, each one's refusals) and the policies
`reflectrl eval` loads from their runs."""

from __future__ import annotations

import numpy as np

from reflectrl.config import RunConfig
from reflectrl.errors import UserError
from reflectrl.trainers.resolve import check_image_encoder, policy_space, probe_env


def resolve_dqn(cfg: RunConfig) -> RunConfig:
    facts = probe_env(cfg)
    if facts.continuous:
        raise UserError(f"--algo dqn needs discrete actions; '{cfg.env_id}' has continuous (Box) actions: "
                        "use --algo ppo on it")
    check_image_encoder(cfg.dqn.encoder, facts)
    cfg.dqn = cfg.dqn.resolved(atari=facts.atari, pixels=facts.pixels)
    return cfg


def resolve_sac(cfg: RunConfig) -> RunConfig:
    facts = probe_env(cfg)
    if not facts.continuous:
        raise UserError(f"--algo sac needs continuous (Box) actions; '{cfg.env_id}' has discrete ones: "
                        "use --algo dqn or ppo on it")
    if len(facts.obs_shape) != 1:
        raise UserError(f"--algo sac reads flat vector observations; '{cfg.env_id}' gives {facts.obs_shape}: "
                        "use --algo ppo on it")
    return cfg


def load_dqn_policy(cfg: RunConfig, state: dict, env):
    from reflectrl.trainers.replay.dqn import QNetwork

    obs_shape, action_dim, _, _ = policy_space(env)
    agent = QNetwork(obs_shape, action_dim, cfg.dqn.encoder, cfg.dqn.hidden_sizes)
    agent.load_state_dict(state["agent"])
    return agent


def load_sac_policy(cfg: RunConfig, state: dict, env):
    from reflectrl.trainers.replay.sac import Actor

    obs_shape, _, _, bounds = policy_space(env)
    agent = Actor(int(np.prod(obs_shape)), *bounds, cfg.sac.hidden_sizes)
    agent.load_state_dict(state["agent"])
    return agent
