"""Run configuration: dataclasses with one name per knob, `--set key=value` parsing, validation.

PPO knobs carry CleanRL's names (`num_envs, num_steps, ...`). A knob left as `None` takes
its default for the env's action type (CleanRL's ppo.py for discrete actions,
ppo_continuous_action.py for continuous ones) when the run is resolved; the resolved values
are what `config.json` in the run directory records.

`--set` keys: a bare name sets a PPO knob or a run knob (`num_envs=8`,
`checkpoint_every=10000`); `env.NAME=VALUE` passes a keyword to the env's constructor;
`SECTION.NAME=VALUE` sets a knob of a signal's section (registered by the signal modules).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from reflectrl import overrides as overrides_mod
from reflectrl.errors import UserError
from reflectrl.hierarchy.config import HPPOConfig
from reflectrl.multiagent.config import MAPPOConfig
from reflectrl.registry import aliases, check_sections, parse_algo, section_types, signal_spec


def __getattr__(name: str):
    # the lists the project started with, now read from the registry
    if name == "SECTION_TYPES":
        return section_types()
    if name == "ALGOS":
        return tuple(aliases("control"))
    if name == "ALGO_SECTIONS":
        return {a: comp.split("+")[1] for a, comp in aliases("control").items() if "+" in comp}
    raise AttributeError(name)


@dataclass
class PPOConfig:
    num_envs: int | None = None
    """parallel envs"""
    num_steps: int | None = None
    """steps per env per rollout"""
    num_minibatches: int | None = None
    """minibatches per epoch"""
    update_epochs: int | None = None
    """epochs over each rollout"""
    learning_rate: float | None = None
    """Adam step size"""
    anneal_lr: bool = True
    """decay the learning rate linearly to 0 over training"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE's lambda"""
    clip_coef: float | None = None
    """PPO's clip range for the ratio (and for the value, with clip_vloss)"""
    clip_vloss: bool = True
    """clip the value loss as CleanRL does"""
    ent_coef: float | None = None
    """entropy bonus weight"""
    vf_coef: float = 0.5
    """value loss weight"""
    max_grad_norm: float = 0.5
    """global gradient-norm clip"""
    target_kl: float | None = None
    """stop the epochs of an update once the approximate KL exceeds this (none: never)"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """actor and critic MLP widths, e.g. 64,64 (also above the small CNN; the Nature CNN's heads are linear)"""
    encoder: str = "auto"
    """mlp, cnn, or auto: cnn for pixel images (Atari's Nature CNN), mlp otherwise (MiniGrid's view flattened)"""
    stream_heads: str = "auto"
    """value heads of signals' reward streams (RND's): shared (on the CNN trunk, as CleanRL), separate, or auto"""
    # Continuous control: observation/reward normalisation and clipping (CleanRL's wrappers).
    norm_obs: bool | None = None
    """normalise observations with running statistics"""
    norm_reward: bool | None = None
    """scale rewards by the running std of the discounted return"""
    clip_obs: float = 10.0
    """clip normalised observations to +-this"""
    clip_reward: float = 10.0
    """clip normalised rewards to +-this"""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches


# CleanRL's defaults: ppo.py (Atari-free classic control), ppo_continuous_action.py and ppo_atari.py.
DISCRETE_DEFAULTS = dict(
    num_envs=4, num_steps=128, num_minibatches=4, update_epochs=4, learning_rate=2.5e-4,
    ent_coef=0.01, clip_coef=0.2, norm_obs=False, norm_reward=False,
)
CONTINUOUS_DEFAULTS = dict(
    num_envs=1, num_steps=2048, num_minibatches=32, update_epochs=10, learning_rate=3e-4,
    ent_coef=0.0, clip_coef=0.2, norm_obs=True, norm_reward=True,
)
ATARI_DEFAULTS = dict(
    num_envs=8, num_steps=128, num_minibatches=4, update_epochs=4, learning_rate=2.5e-4,
    ent_coef=0.01, clip_coef=0.1, norm_obs=False, norm_reward=False,
)
@dataclass
class DQNConfig:
    """DQN's knobs, CleanRL's names (dqn.py / dqn_atari.py); None: the env family's default."""

    num_envs: int = 1
    """parallel envs"""
    learning_rate: float | None = None
    """Adam step size"""
    buffer_size: int | None = None
    """replay buffer capacity (transitions)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 1.0
    """target network update rate (1: a hard copy)"""
    target_network_frequency: int | None = None
    """env steps between target network updates"""
    batch_size: int | None = None
    """transitions per gradient step"""
    start_e: float = 1.0
    """epsilon at the start"""
    end_e: float | None = None
    """epsilon at the end of the schedule"""
    exploration_fraction: float | None = None
    """share of training over which epsilon falls linearly from start_e to end_e"""
    learning_starts: int | None = None
    """env steps before learning starts"""
    train_frequency: int | None = None
    """env steps between gradient steps"""
    loss: str = "mse"
    """mse (CleanRL) or huber (smooth L1, the Nature paper's clipped error)"""
    double_dqn: bool = False
    """Double DQN: the online network picks a', the target network values it"""
    hidden_sizes: tuple[int, ...] = (120, 84)
    """the MLP Q-network's widths (ReLU); Atari's Nature CNN has a 512 layer"""
    encoder: str = "auto"
    """mlp, cnn, or auto: cnn (the Nature CNN) for pixel images, mlp otherwise"""
    save_replay: bool = True
    """keep the replay buffer in checkpoints (false: smaller checkpoints, but a resumed run refills its buffer and
    learns from learning_starts new steps on, so it is no longer bit-identical to an uninterrupted one)"""
    log_every: int = 1000
    """env steps per metrics row (and per iteration: checkpoints and stops fall on these)"""


# CleanRL's dqn.py (classic control) and dqn_atari.py.
DQN_DEFAULTS = dict(
    learning_rate=2.5e-4, buffer_size=10_000, target_network_frequency=500, batch_size=128, end_e=0.05,
    exploration_fraction=0.5, learning_starts=10_000, train_frequency=10,
)
DQN_ATARI_DEFAULTS = dict(
    learning_rate=1e-4, buffer_size=1_000_000, target_network_frequency=1000, batch_size=32, end_e=0.01,
    exploration_fraction=0.10, learning_starts=80_000, train_frequency=4,
)
DQN_LOSSES = ("mse", "huber")


@dataclass
class SACConfig:
    """SAC's knobs, CleanRL's names and defaults (sac_continuous_action.py)."""

    num_envs: int = 1
    """parallel envs (one gradient step per vector step, as CleanRL)"""
    buffer_size: int = 1_000_000
    """replay buffer capacity (transitions)"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """Polyak rate of the target Q-networks"""
    batch_size: int = 256
    """transitions per gradient step"""
    learning_starts: int = 5_000
    """env steps of uniformly random actions before learning starts"""
    policy_lr: float = 3e-4
    """the actor's Adam step size"""
    q_lr: float = 1e-3
    """the Q-networks' (and the entropy temperature's) Adam step size"""
    policy_frequency: int = 2
    """env steps between actor updates (each does policy_frequency actor steps: TD3's delayed update)"""
    target_network_frequency: int = 1
    """env steps between target-network updates"""
    alpha: float = 0.2
    """entropy temperature (its starting value is 1 with autotune, as CleanRL's log_alpha = 0)"""
    autotune: bool = True
    """tune the temperature so the policy's entropy tracks target_entropy"""
    target_entropy: float | None = None
    """the entropy autotune aims at (none: -action_dim, CleanRL's)"""
    hidden_sizes: tuple[int, ...] = (256, 256)
    """the actor's and each Q-network's widths (ReLU)"""
    save_replay: bool = True
    """keep the replay buffer in checkpoints (false: smaller checkpoints, but a resumed run refills its buffer and
    learns from learning_starts new steps on, so it is no longer bit-identical to an uninterrupted one)"""
    log_every: int = 1000
    """env steps per metrics row (and per iteration: checkpoints and stops fall on these)"""

@dataclass
class IMPALAConfig:
    """The IMPALA actor-learner's knobs (distributed/impala.py); defaults follow RLlib's IMPALA where it has one."""

    num_actors: int = 2
    """Ray actors, each stepping its own vector envs with a local copy of the policy"""
    envs_per_actor: int = 4
    """envs in each actor's vector env (one trajectory each per unroll)"""
    unroll_length: int = 50
    """steps per trajectory (RLlib's rollout_fragment_length)"""
    batch_trajectories: int | None = None
    """trajectories per learner update, a multiple of envs_per_actor (none: num_actors*envs_per_actor)"""
    synchronous: bool = False
    """the learner waits for unrolls made with its current weights: deterministic, no policy lag (and no overlap)"""
    actors: str = "ray"
    """ray (actor processes on a Ray instance) or inline (stepped in the learner's process, synchronous, no Ray)"""
    ray_address: str | None = None
    """the Ray instance: none starts a local one (or joins $RAY_ADDRESS), auto or HOST:PORT a cluster (--ray-address)"""
    actor_cpus: float = 1.0
    """CPUs Ray reserves for each actor"""
    max_actor_failures: int = 20
    """actor deaths the run survives (each actor is replaced); one more stops it with its checkpoint kept"""
    rho_bar: float = 1.0
    """V-trace's truncation of the importance weight in the value targets and the policy gradient"""
    c_bar: float = 1.0
    """V-trace's truncation of the trace-cutting weights c_t"""
    vtrace_lambda: float = 1.0
    """V-trace's lambda (remark 1 of the paper: c_t = lambda * min(c_bar, pi/mu))"""
    learning_rate: float = 5e-4
    """Adam step size (RLlib's lr)"""
    anneal_lr: bool = False
    """decay the learning rate linearly to 0 over training"""
    gamma: float = 0.99
    """discount factor"""
    ent_coef: float = 0.01
    """entropy bonus weight (RLlib's entropy_coeff)"""
    vf_coef: float = 0.5
    """value loss weight (RLlib's vf_loss_coeff)"""
    max_grad_norm: float = 40.0
    """global gradient-norm clip (RLlib's grad_clip)"""
    norm_adv: bool = False
    """normalise the V-trace advantages over each batch (IMPALA does not)"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """actor and critic MLP widths (as PPO's policy)"""
    encoder: str = "auto"
    """mlp, cnn, or auto: cnn for pixel images, mlp otherwise"""

    @property
    def batch_size(self) -> int:
        """Env steps per learner update."""
        return self.trajectories * self.unroll_length

    @property
    def trajectories(self) -> int:
        """Trajectories per learner update."""
        return self.batch_trajectories if self.batch_trajectories is not None else self.num_actors * self.envs_per_actor


ACTOR_KINDS = ("ray", "inline")

# the trainers with a knob section of their own: RunConfig.NAME is set for --algo NAME runs only
TRAINER_SECTIONS = {"dqn": DQNConfig, "sac": SACConfig, "impala": IMPALAConfig, "mappo": MAPPOConfig,
                    "hppo": HPPOConfig}
# the replay trainers among them
OFF_POLICY = {"dqn": DQNConfig, "sac": SACConfig}

ENCODERS = ("auto", "mlp", "cnn")
STREAM_HEADS = ("auto", "shared", "separate")
BACKENDS = ("gymnasium", "envpool")


@dataclass
class RunConfig:
    algo: str = "ppo"
    """ppo, refgrpo, sdrs or gear (--algo)"""
    env_id: str = "reflectrl/GridWorld-v0"
    """Gymnasium env id (--env)"""
    seed: int = 1
    """random seed (--seed)"""
    total_steps: int = 100_000
    """env steps to train for (--total-steps)"""
    wrapper: str | None = None
    """reward wrapper: sparse, delayed:K or velocity-cost[:V] (a cost channel), or several joined by commas
    (--wrapper)"""
    env: dict[str, Any] = field(default_factory=dict)
    """keywords for the env's constructor (--set env.NAME=VALUE)"""
    checkpoint_every: int = 50_000
    """env steps between checkpoints"""
    torch_threads: int = 1
    """torch's intra-op threads"""
    backend: str = "gymnasium"
    """training envs: gymnasium, or envpool (EnvPool's C++ vector envs for Atari and MiniGrid: the envpool extra)"""
    envpool_threads: int = 0
    """EnvPool's worker threads with backend=envpool (0: EnvPool's default, min(num_envs, cores))"""
    state_map_snapshots: int = 5
    """points of training whose visited states, rewards and signal terms are kept for `plot state-map`"""
    cost_limit: float = 25.0
    """the limit on the expected episode cost (info["cost"]) that constrained algos keep to (ppo_lag, shaping's
    safety term); also what `cost_limit_violations` counts against"""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """the PPO knobs"""
    dqn: DQNConfig | None = None
    """the DQN knobs (--algo dqn runs only)"""
    sac: SACConfig | None = None
    """the SAC knobs (--algo sac runs only)"""
    impala: IMPALAConfig | None = None
    """the IMPALA knobs (--algo impala runs only)"""
    mappo: MAPPOConfig | None = None
    """the MAPPO knobs (--algo mappo runs only: multiagent/config.py)"""
    hppo: HPPOConfig | None = None
    """the HPPO knobs (--algo hppo runs only: hierarchy/config.py)"""
    # Signal sections (calibration, shaping, gear) are added by the signal modules.
    sections: dict[str, Any] = field(default_factory=dict)
    """the signals' knobs, by section"""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ppo"]["hidden_sizes"] = list(self.ppo.hidden_sizes)
        for name in TRAINER_SECTIONS:
            if getattr(self, name) is None:
                del d[name]
            else:
                d[name]["hidden_sizes"] = list(getattr(self, name).hidden_sizes)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RunConfig:
        check_saved_config(d, cls, REQUIRED_KEYS, "reflectrl train", optional_sections=tuple(TRAINER_SECTIONS))
        d = dict(d)
        ppo_values = dict(d.pop("ppo", {}))
        if ppo_values and "stream_heads" not in ppo_values:  # written before the knob: its heads were separate
            ppo_values["stream_heads"] = "separate"
        ppo = overrides_mod.from_dict(PPOConfig, ppo_values)
        trainers = {name: overrides_mod.from_dict(cls, d.pop(name)) if d.get(name) is not None else None
                    for name, cls in TRAINER_SECTIONS.items()}
        for name in TRAINER_SECTIONS:
            d.pop(name, None)
        sections = sections_from_dict(d.pop("sections", {}))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise UserError(f"config has unknown keys {sorted(unknown)}; was it written by a newer reflectrl?")
        return cls(**d, ppo=ppo, **trainers, sections=sections)


# what every saved config of `reflectrl train` holds (to_dict writes them all): a file without them
# was not written by it, and filling them with defaults would rebuild some other run's network
REQUIRED_KEYS = ("algo", "env_id")


def check_saved_config(d, cls, required: tuple[str, ...], command: str,
                       optional_sections: tuple[str, ...] = ()) -> None:
    """One line, not a traceback, for a saved config of the wrong shape: not an object, keys
    its writer always writes missing, or a section (a field with a default factory, or one of
    `optional_sections`) that is not an object."""
    if not isinstance(d, dict):
        raise UserError(f"the saved config is a JSON {type(d).__name__}, not the object '{command}' writes")
    missing = [k for k in required if k not in d]
    if missing:
        raise UserError(f"the saved config lacks {', '.join(missing)}: it was not written by '{command}' "
                        "(train the run again)")
    nested = {f.name for f in dataclasses.fields(cls) if f.default_factory is not dataclasses.MISSING}
    for key in sorted((nested | set(optional_sections)) & set(d)):
        if d[key] is not None and not isinstance(d[key], dict):
            raise UserError(f"the saved config's '{key}' is a JSON {type(d[key]).__name__}, not an object: it was "
                            f"not written by '{command}' (train the run again)")


def sections_from_dict(values: dict) -> dict:
    """The signals' knob sections of a saved config, as their dataclasses."""
    types = section_types()
    sections = {}
    for name, knobs in values.items():
        if name not in types:
            raise UserError(f"config has an unknown section '{name}'; was it written by a newer reflectrl?")
        sections[name] = overrides_mod.from_dict(types[name], knobs)
    return sections


_dataclass_from_dict = overrides_mod.from_dict  # the name other modules used


RUN_KNOBS = ("checkpoint_every", "torch_threads", "backend", "envpool_threads", "state_map_snapshots", "cost_limit")
EVAL_MAX_STEPS = 10_000  # `eval`'s cap on an episode's steps when the env has no time limit
SEED_MAX = 2**32 - 1     # numpy's and Gymnasium's seeds are unsigned 32-bit integers


def resolve_defaults(ppo: PPOConfig, continuous: bool, *, atari: bool = False, pixels: bool = False) -> PPOConfig:
    """Fill the knobs left as None with the defaults for the env (Atari) or its action type,
    and `encoder=auto` with cnn for pixel observations, mlp otherwise."""
    defaults = ATARI_DEFAULTS if atari else CONTINUOUS_DEFAULTS if continuous else DISCRETE_DEFAULTS
    values = {k: (defaults[k] if getattr(ppo, k) is None else getattr(ppo, k)) for k in defaults}
    if ppo.encoder == "auto":
        values["encoder"] = "cnn" if pixels else "mlp"
    if ppo.stream_heads == "auto":
        values["stream_heads"] = "shared" if values.get("encoder", ppo.encoder) == "cnn" else "separate"
    return dataclasses.replace(ppo, **values)


# --------------------------------------------------------------------------- --set

def trainer_name(cfg: RunConfig) -> str:
    """The trainer a control run's --algo names (ppo, dqn, sac)."""
    return parse_algo(cfg.algo, "control").trainer


def trainer_knobs(cfg: RunConfig):
    """The run's DQNConfig, SACConfig or IMPALAConfig (created with its defaults if unset); None for PPO."""
    name = trainer_name(cfg)
    if name not in TRAINER_SECTIONS:
        return None
    if getattr(cfg, name) is None:
        setattr(cfg, name, TRAINER_SECTIONS[name]())
    return getattr(cfg, name)


off_policy_knobs = trainer_knobs  # the name the replay trainers started with


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """Apply `--set key=value` strings to a config, in order (routing: overrides.py). Bare
    names go to the run's trainer (PPO's, DQN's or SAC's knobs), then to the run knobs."""
    types = section_types()
    sections = {name: (lambda name=name: cfg.sections.setdefault(name, types[name]())) for name in types}
    own = trainer_knobs(cfg)
    trainer = trainer_name(cfg)
    bare = ("PPO", cfg.ppo, None) if own is None else (trainer.upper(), own, None)

    def refuse(name):
        def knobs():
            raise UserError(f"--set {name}.* knobs apply to --algo {name}, not --algo {cfg.algo}")
        return knobs

    prefixed = {name: (own if name == trainer else refuse(name)) for name in TRAINER_SECTIONS}
    overrides_mod.apply(overrides, bare=[bare, ("run", cfg, RUN_KNOBS)],
                        prefixed={"env": cfg.env, "ppo": cfg.ppo, **prefixed, **sections})
    return cfg


def resolve_dqn_defaults(dqn: DQNConfig, *, atari: bool = False, pixels: bool = False) -> DQNConfig:
    """DQN's knobs left as None, from CleanRL's dqn.py or (Atari) dqn_atari.py; encoder=auto:
    cnn for pixel observations."""
    defaults = DQN_ATARI_DEFAULTS if atari else DQN_DEFAULTS
    values = {k: (defaults[k] if getattr(dqn, k) is None else getattr(dqn, k)) for k in defaults}
    if dqn.encoder == "auto":
        values["encoder"] = "cnn" if pixels else "mlp"
    return dataclasses.replace(dqn, **values)


@dataclass(frozen=True)
class EnvSettings:
    """What building a run's training envs reads of its trainer's knobs."""

    num_envs: int
    norm_obs: bool
    norm_reward: bool
    clip_obs: float
    clip_reward: float
    gamma: float
    encoder: str


def env_settings(cfg: RunConfig) -> EnvSettings:
    name = trainer_name(cfg)
    if name == "impala" and cfg.impala is not None:
        d = cfg.impala  # no normalising wrappers: each actor's running statistics would differ
        return EnvSettings(d.envs_per_actor, False, False, 10.0, 10.0, d.gamma, d.encoder)
    if name == "hppo" and cfg.hppo is not None:  # both levels read the env's own observations and rewards
        d = cfg.hppo
        return EnvSettings(d.num_envs, False, False, 10.0, 10.0, d.gamma, "mlp")
    if name in OFF_POLICY and getattr(cfg, name) is not None:
        d = getattr(cfg, name)  # a replay trainer learns from the env's own observations and rewards
        return EnvSettings(d.num_envs, False, False, 10.0, 10.0, d.gamma, getattr(d, "encoder", "mlp"))
    p = cfg.ppo
    return EnvSettings(p.num_envs, bool(p.norm_obs), bool(p.norm_reward), p.clip_obs, p.clip_reward, p.gamma,
                       p.encoder)


# --------------------------------------------------------------------------- validation

def _finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise UserError(f"{name}={value} must be a finite number")


# The largest budget a run takes: 10^12 env steps is about 12 days at a million steps per second and
# 30 years at a thousand, and far inside the int64 counters every log and checkpoint keeps.
MAX_BUDGET = 10**12


def check_budget(value: int, flag: str, unit: str) -> None:
    if value <= 0:
        raise UserError(f"{flag} {value}: must be a positive integer")
    if value > MAX_BUDGET:
        raise UserError(f"{flag} {value}: above the limit of 10^12 {unit} (about 12 days at a million per second, "
                        "years on one machine); give a budget a run can finish")


def check_seed(seed: int, flag: str = "--seed") -> None:
    if not 0 <= seed <= SEED_MAX:
        raise UserError(f"{flag} {seed}: must be between 0 and 2**32 - 1 ({SEED_MAX})")


def validate(cfg: RunConfig) -> None:
    """Check a resolved config; raise UserError naming the first bad value and the fix."""
    algo = parse_algo(cfg.algo, "control")
    check_seed(cfg.seed)
    check_budget(cfg.total_steps, "--total-steps", "env steps")
    _validate_run_knobs(cfg)
    if algo.trainer == "dqn":
        validate_dqn(cfg.dqn, cfg.total_steps)
    elif algo.trainer == "sac":
        validate_sac(cfg.sac, cfg.total_steps)
    elif algo.trainer == "impala":
        validate_impala(cfg.impala, cfg.total_steps)
    elif algo.trainer == "mappo":
        cfg.mappo.validate(cfg.total_steps)
    elif algo.trainer == "hppo":
        cfg.hppo.validate(cfg.total_steps)
    else:
        _validate_ppo(cfg)
    validate_sections(cfg.algo, algo, cfg.sections, run=cfg)


def validate_dqn(d: DQNConfig, total_steps: int) -> None:
    for name in ("num_envs", "buffer_size", "target_network_frequency", "batch_size", "train_frequency",
                 "log_every"):
        if getattr(d, name) < 1:
            raise UserError(f"{name}={getattr(d, name)}: must be a positive integer")
    if d.learning_starts < 0:
        raise UserError(f"learning_starts={d.learning_starts}: must be >= 0")
    for name in ("learning_rate", "gamma", "tau", "start_e", "end_e", "exploration_fraction"):
        _finite(name, getattr(d, name))
    if d.learning_rate <= 0:
        raise UserError(f"learning_rate={d.learning_rate}: must be > 0")
    if not 0.0 < d.gamma <= 1.0:
        raise UserError(f"gamma={d.gamma}: must be in (0, 1]")
    if not 0.0 < d.tau <= 1.0:
        raise UserError(f"tau={d.tau}: must be in (0, 1] (1: a hard copy every target_network_frequency steps)")
    for name in ("start_e", "end_e"):
        if not 0.0 <= getattr(d, name) <= 1.0:
            raise UserError(f"{name}={getattr(d, name)}: an epsilon must be in [0, 1]")
    if not 0.0 < d.exploration_fraction <= 1.0:
        raise UserError(f"exploration_fraction={d.exploration_fraction}: must be in (0, 1]")
    if d.loss not in DQN_LOSSES:
        raise UserError(f"loss='{d.loss}': use one of {', '.join(DQN_LOSSES)}")
    if d.encoder not in ENCODERS:
        raise UserError(f"encoder='{d.encoder}': use one of {', '.join(ENCODERS)}")
    if not d.hidden_sizes or any(h < 1 for h in d.hidden_sizes):
        raise UserError(f"hidden_sizes={d.hidden_sizes}: give one or more positive layer widths, e.g. 120,84")
    if d.batch_size > d.buffer_size:
        raise UserError(f"batch_size={d.batch_size} is larger than buffer_size={d.buffer_size}; raise buffer_size")
    if d.num_envs * d.train_frequency > d.log_every:
        raise UserError(f"log_every={d.log_every} is shorter than one gradient step's worth of env steps "
                        f"(num_envs*train_frequency={d.num_envs * d.train_frequency}); raise log_every")
    if d.learning_starts >= total_steps:
        raise UserError(f"learning_starts={d.learning_starts} is not below --total-steps {total_steps}: the run "
                        "would never learn; lower learning_starts or raise --total-steps")


def validate_sac(d: SACConfig, total_steps: int) -> None:
    for name in ("num_envs", "buffer_size", "batch_size", "policy_frequency", "target_network_frequency",
                 "log_every"):
        if getattr(d, name) < 1:
            raise UserError(f"{name}={getattr(d, name)}: must be a positive integer")
    if d.learning_starts < 0:
        raise UserError(f"learning_starts={d.learning_starts}: must be >= 0")
    for name in ("policy_lr", "q_lr", "gamma", "tau", "alpha"):
        _finite(name, getattr(d, name))
        if getattr(d, name) <= 0 and name != "alpha":
            raise UserError(f"{name}={getattr(d, name)}: must be > 0")
    if d.alpha < 0:
        raise UserError(f"alpha={d.alpha}: must be >= 0 (0: no entropy term)")
    if not 0.0 < d.gamma <= 1.0:
        raise UserError(f"gamma={d.gamma}: must be in (0, 1]")
    if not 0.0 < d.tau <= 1.0:
        raise UserError(f"tau={d.tau}: must be in (0, 1]")
    if d.target_entropy is not None:
        _finite("target_entropy", d.target_entropy)
    if not d.hidden_sizes or any(h < 1 for h in d.hidden_sizes):
        raise UserError(f"hidden_sizes={d.hidden_sizes}: give one or more positive layer widths, e.g. 256,256")
    if d.batch_size > d.buffer_size:
        raise UserError(f"batch_size={d.batch_size} is larger than buffer_size={d.buffer_size}; raise buffer_size")
    if d.num_envs > d.log_every:
        raise UserError(f"log_every={d.log_every} is shorter than one vector step (num_envs={d.num_envs}); "
                        "raise log_every")
    if d.learning_starts >= total_steps:
        raise UserError(f"learning_starts={d.learning_starts} is not below --total-steps {total_steps}: the run "
                        "would never learn; lower learning_starts or raise --total-steps")


NEEDS_RAY = ("--algo impala with actors=ray needs Ray: pip install 'reflectrl[ray]' "
             "(or --set actors=inline to step the actors in this process)")


def validate_impala(d: IMPALAConfig, total_steps: int) -> None:
    for name in ("num_actors", "envs_per_actor", "unroll_length"):
        if getattr(d, name) < 1:
            raise UserError(f"{name}={getattr(d, name)}: must be a positive integer")
    if d.batch_trajectories is not None:
        if d.batch_trajectories < 1:
            raise UserError(f"batch_trajectories={d.batch_trajectories}: must be a positive integer (or none)")
        if d.batch_trajectories % d.envs_per_actor:
            raise UserError(f"batch_trajectories={d.batch_trajectories} is not a multiple of envs_per_actor="
                            f"{d.envs_per_actor} (an actor sends one trajectory per env per unroll); pick a multiple")
    if d.actors not in ACTOR_KINDS:
        raise UserError(f"actors='{d.actors}': use one of {', '.join(ACTOR_KINDS)}")
    if d.actors == "inline" and d.ray_address is not None:
        raise UserError("actors=inline steps the actors in this process and uses no Ray: drop --ray-address")
    if d.actors == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # said before a run directory exists
            raise UserError(NEEDS_RAY)
    if d.max_actor_failures < 0:
        raise UserError(f"max_actor_failures={d.max_actor_failures}: must be >= 0")
    for name in ("actor_cpus", "rho_bar", "c_bar", "vtrace_lambda", "learning_rate", "gamma", "ent_coef", "vf_coef",
                 "max_grad_norm"):
        _finite(name, getattr(d, name))
    for name in ("rho_bar", "c_bar", "learning_rate", "max_grad_norm"):
        if getattr(d, name) <= 0:
            raise UserError(f"{name}={getattr(d, name)}: must be > 0")
    if d.actor_cpus < 0:
        raise UserError(f"actor_cpus={d.actor_cpus}: must be >= 0")
    if not 0.0 <= d.vtrace_lambda <= 1.0:
        raise UserError(f"vtrace_lambda={d.vtrace_lambda}: must be in [0, 1]")
    if not 0.0 < d.gamma <= 1.0:
        raise UserError(f"gamma={d.gamma}: must be in (0, 1]")
    for name in ("ent_coef", "vf_coef"):
        if getattr(d, name) < 0:
            raise UserError(f"{name}={getattr(d, name)}: must be >= 0")
    if d.norm_adv and d.batch_size < 2:
        raise UserError("norm_adv needs batches of 2 or more steps; raise unroll_length or batch_trajectories")
    if not d.hidden_sizes or any(h < 1 for h in d.hidden_sizes):
        raise UserError(f"hidden_sizes={d.hidden_sizes}: give one or more positive layer widths, e.g. 64,64")
    if d.encoder not in ENCODERS:
        raise UserError(f"encoder='{d.encoder}': use one of {', '.join(ENCODERS)}")
    if d.batch_size > total_steps:
        raise UserError(f"--total-steps {total_steps} is smaller than one learner batch (batch_trajectories*"
                        f"unroll_length={d.batch_size}); raise --total-steps or lower unroll_length")


def _validate_ppo(cfg: RunConfig) -> None:
    p = cfg.ppo
    for name in ("num_envs", "num_steps", "num_minibatches", "update_epochs"):
        if getattr(p, name) < 1:
            raise UserError(f"{name}={getattr(p, name)}: must be a positive integer")
    if p.batch_size % p.num_minibatches:
        raise UserError(
            f"batch of num_envs*num_steps={p.batch_size} does not divide into num_minibatches={p.num_minibatches}; "
            "pick num_minibatches that divides it"
        )
    if p.norm_adv and p.minibatch_size < 2:
        raise UserError(
            f"minibatches of {p.minibatch_size} sample (num_envs*num_steps={p.batch_size} / num_minibatches="
            f"{p.num_minibatches}) with norm_adv: an advantage cannot be normalised over one sample (its std "
            "is undefined); use fewer num_minibatches, a larger batch, or norm_adv=false"
        )
    if p.batch_size > cfg.total_steps:
        raise UserError(
            f"--total-steps {cfg.total_steps} is smaller than one batch (num_envs*num_steps={p.batch_size}); "
            "raise --total-steps or lower num_steps"
        )
    for name in ("learning_rate", "gamma", "gae_lambda", "clip_coef", "ent_coef", "vf_coef", "max_grad_norm",
                 "clip_obs", "clip_reward"):
        _finite(name, getattr(p, name))
    if not 0.0 < p.gamma <= 1.0:
        raise UserError(f"gamma={p.gamma}: must be in (0, 1]")
    if not 0.0 <= p.gae_lambda <= 1.0:
        raise UserError(f"gae_lambda={p.gae_lambda}: must be in [0, 1]")
    if p.learning_rate <= 0:
        raise UserError(f"learning_rate={p.learning_rate}: must be > 0")
    for name in ("clip_coef", "max_grad_norm", "clip_obs", "clip_reward"):
        if getattr(p, name) <= 0:
            raise UserError(f"{name}={getattr(p, name)}: must be > 0")
    for name in ("ent_coef", "vf_coef"):
        if getattr(p, name) < 0:
            raise UserError(f"{name}={getattr(p, name)}: must be >= 0")
    if p.target_kl is not None and (not math.isfinite(p.target_kl) or p.target_kl <= 0):
        raise UserError(f"target_kl={p.target_kl}: must be a positive number, or none to disable")
    if not p.hidden_sizes or any(h < 1 for h in p.hidden_sizes):
        raise UserError(f"hidden_sizes={p.hidden_sizes}: give one or more positive layer widths, e.g. 64,64")
    if p.encoder not in ENCODERS:
        raise UserError(f"encoder='{p.encoder}': use one of {', '.join(ENCODERS)}")
    if p.stream_heads not in STREAM_HEADS:
        raise UserError(f"stream_heads='{p.stream_heads}': use one of {', '.join(STREAM_HEADS)}")
    if p.stream_heads == "shared" and p.encoder == "mlp":
        raise UserError("stream_heads=shared needs a CNN policy (encoder=cnn): an MLP policy's actor and critic "
                        "share no trunk; use stream_heads=separate or auto")


def _validate_run_knobs(cfg: RunConfig) -> None:
    if cfg.checkpoint_every < 1:
        raise UserError(f"checkpoint_every={cfg.checkpoint_every}: must be a positive number of env steps")
    if cfg.torch_threads < 1:
        raise UserError(f"torch_threads={cfg.torch_threads}: must be >= 1")
    if cfg.state_map_snapshots < 0:
        raise UserError(f"state_map_snapshots={cfg.state_map_snapshots}: must be >= 0 (0 keeps none)")
    if cfg.envpool_threads < 0:
        raise UserError(f"envpool_threads={cfg.envpool_threads}: must be >= 0 (0: EnvPool's default)")
    if not (math.isfinite(cfg.cost_limit) and cfg.cost_limit >= 0):
        raise UserError(f"cost_limit={cfg.cost_limit}: must be a finite number >= 0 (an episode's cost budget)")
    if cfg.backend not in BACKENDS:
        raise UserError(f"backend='{cfg.backend}': use one of {', '.join(BACKENDS)}")


def validate_sections(text: str, algo, sections: dict, run=None) -> None:
    """The knob sections of an algo's signals: none for a signal it does not run, each valid,
    and each asking only for what the trainer provides."""
    check_sections(algo, sections, text)
    for name in algo.signals:
        section = sections.setdefault(name, signal_spec(name).config())  # kept: its resolved knobs are saved
        section.validate()
        signal_spec(name).check(section, algo.trainer, text, run=run)


def add_algo_section(cfg: RunConfig, family: str = "control") -> None:
    """Record every knob of the algo's signals (defaults included) in the config."""
    for name in parse_algo(cfg.algo, family).signals:
        cfg.sections.setdefault(name, signal_spec(name).config())
