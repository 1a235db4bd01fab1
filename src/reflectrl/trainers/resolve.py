"""A new run's config, resolved: the env probed once, the trainer's env-dependent defaults filled
(its TrainerSpec.resolve), the signals' sections added, and everything checked before a run
directory exists. Every trainer's resolve starts from `probe_env`."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym

from reflectrl.config import (
    RunConfig,
    add_algo_section,
    check_config,
    env_settings,
    new_config,
    trainer_knobs,
    trainer_name,
    validate,
)
from reflectrl.envs import is_atari_id, is_continuous, is_image_space, is_minigrid, is_pettingzoo_id, make_env
from reflectrl.envs.cost import has_cost_channel
from reflectrl.envs.envpool_backend import check_backend
from reflectrl.envs.jax_ids import canonical_env_id, check_jax_env_id
from reflectrl.errors import UserError
from reflectrl.registry import TRAINERS, parse_algo, signal_spec, trainer_spec


def new_run_config(*, algo: str | None = None, env_id: str | None = None, seed: int | None = None,
                   total_steps: int | None = None, wrapper: str | None = None,
                   overrides: list[str] | None = None) -> RunConfig:
    """The resolved, validated config of a new run; None means "not given": RunConfig's default. The
    --algo may carry knobs in brackets (config.split_algo)."""
    return resolve_config(new_config(algo=algo, env_id=env_id, seed=seed, total_steps=total_steps, wrapper=wrapper,
                                     overrides=overrides))


def resolve_config(cfg: RunConfig) -> RunConfig:
    """What needs no env checked first (config.check_config), then the resolve of the trainer's form on
    the run's backend (per-env defaults, its refusals), then the signals' sections and every check."""
    check_config(cfg)
    spec = trainer_spec(trainer_name(cfg), cfg.backend)
    cfg.env_id = canonical_env_id(cfg.env_id, cfg.backend)  # the grid world in either spelling, its backend's recorded
    if is_pettingzoo_id(cfg.env_id) and not spec.multiagent:
        hosts = [t.name for t in TRAINERS.values() if t.multiagent]
        raise UserError(f"--env {cfg.env_id} is a multi-agent (PettingZoo) env; --algo {cfg.algo} trains "
                        f"single-agent Gymnasium envs: use --algo {' or '.join(hosts)}")
    check_jax_env_id(cfg.env_id, cfg.backend)  # a JAX env's id needs backend=jax, and backend=jax one
    cfg = spec.load("resolve")(cfg)
    add_algo_section(cfg)
    validate(cfg)
    return cfg


@dataclass(frozen=True)
class EnvFacts:
    """What a trainer's defaults depend on, read from one probe of the env."""

    continuous: bool           # Box actions
    obs_shape: tuple
    pixels: bool               # an image observation a CNN fits (not MiniGrid's symbolic view)
    atari: bool


def load_actor_critic(cfg: RunConfig, state: dict, env):
    """The actor-critic policy of a run's checkpoint (PPO's, IMPALA's: trainers/cnn.make_policy), for
    `reflectrl eval` (their TrainerSpec.load_policy)."""
    from reflectrl.trainers.cnn import make_policy

    obs_shape, action_dim, continuous, _ = policy_space(env)
    knobs = trainer_knobs(cfg)
    agent = make_policy(obs_shape, action_dim, continuous, "cnn" if env_settings(cfg).encoder == "cnn" else "mlp",
                        knobs.hidden_sizes, getattr(knobs, "policy", "mlp"))  # PPO's policy=gru/lstm: recurrent
    agent.load_state_dict(state["agent"])
    return agent


def probe_env(cfg: RunConfig, inspect=None) -> EnvFacts:
    """Build the env once (EnvPool checked first where chosen), check the signals' cost channel,
    and read what the defaults depend on; `inspect(env)` sees the probe before it closes."""
    from reflectrl.trainers.cnn import cnn_fits

    check_backend(cfg)  # EnvPool installed and shipping the env, before the Gymnasium probe
    probe = make_env(cfg.env_id, wrapper=cfg.wrapper, env_kwargs=cfg.env, keep_image=True)
    try:
        shape = probe.observation_space.shape
        facts = EnvFacts(is_continuous(probe.action_space), shape,
                         is_image_space(probe.observation_space) and not is_minigrid(probe) and cnn_fits(shape),
                         is_atari_id(cfg.env_id))
        check_cost_channel(cfg, probe)
        if inspect is not None:
            inspect(probe, facts)
    finally:
        probe.close()
    return facts


def check_image_encoder(encoder: str, facts: EnvFacts) -> None:
    """encoder=cnn on an observation that is no image: one line (trainers/cnn.py says which)."""
    from reflectrl.trainers.cnn import image_layout

    if encoder == "cnn":
        image_layout(facts.obs_shape)


def check_cost_channel(cfg: RunConfig, probe: gym.Env) -> None:
    """An algo whose signals need costs (ppo_lag, shaping's safety term) runs only on an env with a
    cost channel (info["cost"]): one line naming how to get one otherwise. A cost wrapper is
    stepped once here so that an env it does not fit fails now, not in training."""
    algo = parse_algo(cfg.algo, "control")
    needs = [name for name in algo.signals
             if "costs" in signal_spec(name).wants_for(cfg.sections.get(name) or signal_spec(name).config())]
    if not needs and "velocity-cost" not in (cfg.wrapper or ""):
        return
    try:
        found = has_cost_channel(probe, cfg.seed)
    except ValueError as err:  # velocity-cost on an env without info["x_velocity"]
        raise UserError(str(err)) from None
    if needs and not found:
        raise UserError(f"--algo {cfg.algo}: the {', '.join(needs)} signal needs a cost channel (info['cost']) and "
                        f"'{cfg.env_id}' has none; add one: --wrapper velocity-cost (MuJoCo locomotion), "
                        "--set env.hazards=K (the grid world), or an env of your own that reports info['cost']")


def policy_space(env: gym.Env) -> tuple[tuple, int, bool, tuple | None]:
    """(observation shape, action dim, continuous, action bounds) of an env, for building a policy."""
    continuous = is_continuous(env.action_space)
    action_dim = env.action_space.shape[0] if continuous else int(env.action_space.n)
    bounds = (env.action_space.low, env.action_space.high) if continuous else None
    return env.observation_space.shape, action_dim, continuous, bounds
