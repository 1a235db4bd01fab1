"""A run's config on backend=jax: what the JAX backend trains, and one clear line for what it
does not (a torch-only trainer, signal, knob or env), checked before a run directory exists."""

from __future__ import annotations

import dataclasses

from reflectrl.config import RunConfig, trainer_knobs, trainer_name
from reflectrl.errors import UserError
from reflectrl.registry import parse_algo

JAX_TRAINERS = ("ppo",)
# the signals with a JAX implementation (jaxrl/signals): kept here so that checking a config imports no JAX
JAX_SIGNAL_NAMES = ("count", "calibration", "shaping", "gear", "rnd")
FIX = "use backend=gymnasium for it"
# each JAX signal's knobs that only the torch signal runs: config -> [(refused, the knob as said, why)]
TORCH_ONLY_SIGNAL_KNOBS = {
    "calibration": lambda c: [(c.shared_trunk, "calibration.shared_trunk",
                               "its auxiliary loss trains the actor's trunk inside the torch PPO update")],
    "gear": lambda c: [(c.history > 0, f"gear.history={c.history}", "the past winners' rows are a growing list"),
                       (c.rank_groups, "gear.rank_groups", "it ranks GRPO's groups; a PPO batch has none")],
    "shaping": lambda c: [(c.mode in ("bootstrap", "advice"), f"shaping.mode={c.mode}", ""),
                          (bool(c.prior), "shaping.prior", ""),
                          (c.safety_beta > 0, "shaping.safety_beta", ""),
                          (c.imagined_fraction > 0, "shaping.imagined_fraction", ""),
                          (c.encoder == "cnn", "shaping.encoder=cnn", ""),
                          (c.labels == "team", "shaping.labels=team", "")],
}


def torch_only(knob: str, why: str = "") -> UserError:
    """The one-line refusal of a knob the JAX backend does not run."""
    reason = f" ({why})" if why else ""
    return UserError(f"{knob} is torch-only on backend=jax{reason}; use backend=gymnasium for it, "
                     "or leave the knob at its default")


def check_signal_knobs(name: str, section) -> None:
    """A JAX signal's section: refused where it sets a knob only the torch signal runs."""
    for refused, knob, why in TORCH_ONLY_SIGNAL_KNOBS.get(name, lambda c: [])(section):
        if refused:
            raise torch_only(knob, why)


def check(cfg: RunConfig) -> None:
    """What backend=jax refuses that needs no env: a torch-only trainer, signal, wrapper or knob. Imports
    no JAX, torch or env package (config.check_config runs it as a command line is read)."""
    trainer = trainer_name(cfg)
    if trainer not in JAX_TRAINERS:
        raise UserError(f"backend=jax trains --algo ppo and its signals; {trainer} is torch-only ({FIX})")
    missing = [s for s in parse_algo(cfg.algo, "control").signals if s not in JAX_SIGNAL_NAMES]
    if missing:
        raise UserError(f"signal '{missing[0]}' has no JAX implementation; backend=jax runs "
                        f"{', '.join(JAX_SIGNAL_NAMES)} ({FIX})")
    if cfg.wrapper:
        raise UserError(f"--wrapper {cfg.wrapper} is torch-only ({FIX})")
    knobs = trainer_knobs(cfg)
    mlp_only = {"encoder": ("auto", "mlp"), "stream_heads": ("auto", "separate")}
    for name, allowed in mlp_only.items():
        if getattr(knobs, name) not in allowed:
            raise UserError(f"{name}={getattr(knobs, name)} is torch-only ({FIX}); backend=jax runs MLP policies")
    for name in ("norm_obs", "norm_reward"):
        if getattr(knobs, name):
            raise UserError(f"{name}=true is torch-only ({FIX}); backend=jax learns from the env's own "
                            f"observations and rewards (set {name}=false)")
    if knobs.target_kl is not None:
        raise UserError(f"target_kl={knobs.target_kl} is torch-only ({FIX}): the compiled update runs every epoch")
    for name, section in cfg.sections.items():
        check_signal_knobs(name, section)


def resolve(cfg: RunConfig) -> RunConfig:
    """The JAX PPO's knobs resolved for the env (PPOConfig's discrete or continuous defaults), after
    refusing what the backend lacks."""
    from reflectrl.envs.jax_ids import check_jax_env_id

    check(cfg)
    check_jax_env_id(cfg.env_id, cfg.backend)
    from reflectrl.jaxrl.envs import make_env  # (after the checks: it imports JAX)

    knobs = trainer_knobs(cfg)
    env = make_env(cfg.env_id, cfg.env)
    resolved = knobs.resolved(not env.discrete)
    cfg.knobs = dataclasses.replace(resolved, norm_obs=False, norm_reward=False, encoder="mlp",
                                    stream_heads="separate")
    build_signals(cfg)  # what only building the signals finds is refused here, before a run directory exists
    return cfg


def build_signals(cfg: RunConfig) -> tuple:
    """The run's JAX signals, in --algo order, from its sections (added with their defaults)."""
    from reflectrl.config import add_algo_section
    from reflectrl.jaxrl.signals import make_signal

    add_algo_section(cfg)
    signals = tuple(make_signal(name, cfg.sections[name]) for name in parse_algo(cfg.algo, "control").signals)
    check_streams(signals)
    return signals


def check_streams(signals: tuple) -> None:
    """gear.advantage/select other than extrinsic read the reward streams (RND's): the stream's
    signal must be written before gear, and intrinsic needs one (issue 42; the torch side's
    GEARReweighting.check_position, the same lines)."""
    from reflectrl.jaxrl.signals.gear import NEEDS_STREAM

    for i, s in enumerate(signals):
        if s.name != "gear":
            continue
        kinds = {s.cfg.advantage, s.cfg.select} - {"extrinsic"}
        if not kinds:
            continue
        after = [m.name for m in signals[i + 1:] if m.stream is not None]
        if after:
            raise UserError(f"gear.advantage/select={'/'.join(sorted(kinds))} reads the reward streams of "
                            f"{', '.join(after)}, written after gear: write them before it, e.g. ppo+rnd+gear")
        if "intrinsic" in kinds and not any(m.stream is not None for m in signals[:i]):
            raise UserError(NEEDS_STREAM)
