"""A run's config on backend=jax: what the JAX backend trains, and one clear line for what it
does not (a torch-only trainer, signal, knob or env), checked before a run directory exists."""

from __future__ import annotations

import dataclasses

from reflectrl.config import RunConfig, trainer_knobs
from reflectrl.errors import UserError
from reflectrl.registry import parse_algo, signal_spec
from reflectrl.signals import jax_signal_class as jax_form
from reflectrl.signals import jax_signal_names, torch_only_knobs

FIX = "use backend=gymnasium for it"


def torch_only(knob: str, why: str = "") -> UserError:
    """The one-line refusal of a knob the JAX backend does not run."""
    reason = f" ({why})" if why else ""
    return UserError(f"{knob} is torch-only on backend=jax{reason}; use backend=gymnasium for it, "
                     "or leave the knob at its default")


def check_signal_knobs(name: str, section) -> None:
    """A JAX signal's section: refused where it sets a knob only the torch signal runs."""
    for knob, why in torch_only_knobs(name, section)[:1]:
        raise torch_only(knob, why)


def check(cfg: RunConfig) -> None:
    """What backend=jax refuses that needs no env: a torch-only signal, wrapper or knob (a trainer with no
    form on backend=jax is refused by registry.trainer_spec). Imports no JAX, torch or env package
    (config.check_config runs it, the TrainerSpec's `check`, as a command line is read)."""
    have = jax_signal_names()
    missing = [s for s in parse_algo(cfg.algo, "control").signals if s not in have]
    if missing:
        raise UserError(f"signal '{missing[0]}' has no JAX implementation; backend=jax runs "
                        f"{', '.join(have)} ({FIX})")
    if cfg.wrapper:
        raise UserError(f"--wrapper {cfg.wrapper} is torch-only ({FIX})")
    knobs = trainer_knobs(cfg)
    mlp_only = {"encoder": ("auto", "mlp"), "stream_heads": ("auto", "separate")}
    for name, allowed in mlp_only.items():
        if getattr(knobs, name) not in allowed:
            raise UserError(f"{name}={getattr(knobs, name)} is torch-only ({FIX}); backend=jax runs MLP policies")
    if knobs.policy == "lstm":
        raise UserError("policy=lstm runs on the torch backend; on backend=jax use policy=gru")
    if knobs.target_kl is not None:
        raise UserError(f"target_kl={knobs.target_kl} is torch-only ({FIX}): the compiled update runs every epoch")
    for name, section in cfg.sections.items():
        check_signal_knobs(name, section)


def resolve(cfg: RunConfig) -> RunConfig:
    """The JAX PPO's knobs resolved for the env (PPOConfig's discrete or continuous defaults), after
    refusing what the backend lacks. norm_obs and norm_reward stay off unless the run sets them: PPOConfig's
    continuous defaults turn them on, and the JAX envs' results at the defaults stay what they were."""
    from reflectrl.envs.jax_ids import check_jax_env_id

    check(cfg)
    check_jax_env_id(cfg.env_id, cfg.backend)
    from reflectrl.envs.jax_envs import make_env  # (after the checks: it imports JAX)

    knobs = trainer_knobs(cfg)
    env = make_env(cfg.env_id, cfg.env)
    knobs = dataclasses.replace(knobs, norm_obs=bool(knobs.norm_obs), norm_reward=bool(knobs.norm_reward))
    cfg.knobs = dataclasses.replace(knobs.resolved(not env.discrete), encoder="mlp", stream_heads="separate")
    check_recurrent(cfg.knobs)
    build_signals(cfg)  # what only building the signals finds is refused here, before a run directory exists
    return cfg


def check_recurrent(knobs) -> None:
    """policy=gru's minibatches are whole per-env sequences: the envs split evenly into them."""
    if knobs.policy == "gru" and knobs.num_envs % knobs.num_minibatches:
        raise UserError(f"policy=gru splits the num_envs={knobs.num_envs} envs into num_minibatches="
                        f"{knobs.num_minibatches} minibatches of whole sequences: make num_envs a multiple of "
                        "num_minibatches")


def build_signals(cfg: RunConfig) -> tuple:
    """The run's JAX signals, in --algo order, from its sections (added with their defaults)."""
    from reflectrl.config import add_algo_section
    add_algo_section(cfg)
    signals = tuple(make_signal(name, cfg.sections[name]) for name in parse_algo(cfg.algo, "control").signals)
    check_streams(signals)
    return signals


def check_streams(signals: tuple) -> None:
    """gear.advantage/select other than extrinsic read the reward streams (RND's): the stream's
    signal must be written before gear, and intrinsic needs one (issue 42; the torch side's
    GEARReweighting.check_position, the same lines)."""
    from reflectrl.signals.gear.jax import NEEDS_STREAM

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


def jax_signal_class(name: str) -> type:
    """The JAX form of a signal (signals.jax_signal_class), imported; one line where it has none."""
    cls = jax_form(name)
    if cls is None:
        raise UserError(f"signal '{name}' has no JAX implementation; backend=jax runs "
                        f"{', '.join(jax_signal_names())} ({FIX})")
    return cls


def make_signal(name: str, cfg):
    """The JAX signal `name` configured by `cfg` (its config dataclass; None: its defaults)."""
    cls = jax_signal_class(name)
    cfg = signal_spec(name).config() if cfg is None else cfg
    check_signal_knobs(name, cfg)
    return cls(cfg)
