"""IMPALA's knobs (`--algo impala`: bare names, or impala.NAME; defaults follow RLlib's IMPALA where
it has one), their checks and its resolve."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from reflectrl.config import ENCODERS, EnvSettings, RunConfig
from reflectrl.config import finite as _finite
from reflectrl.errors import UserError

ACTOR_KINDS = ("ray", "inline")
NEEDS_RAY = ("--algo impala with actors=ray needs Ray: pip install 'reflectrl[ray]' "
             "(or --set actors=inline to step the actors in this process)")


@dataclass
class IMPALAConfig:
    """The IMPALA actor-learner's knobs (trainers/impala/trainer.py); RLlib's IMPALA defaults where it has one."""

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

    def env_settings(self) -> EnvSettings:
        # no normalising wrappers: each actor's running statistics would differ
        return EnvSettings(self.envs_per_actor, False, False, 10.0, 10.0, self.gamma, self.encoder)

    def validate(self, total_steps: int) -> None:
        for name in ("num_actors", "envs_per_actor", "unroll_length"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.batch_trajectories is not None:
            if self.batch_trajectories < 1:
                raise UserError(f"batch_trajectories={self.batch_trajectories}: must be a positive integer (or none)")
            if self.batch_trajectories % self.envs_per_actor:
                raise UserError(f"batch_trajectories={self.batch_trajectories} is not a multiple of envs_per_actor="
                                f"{self.envs_per_actor} (an actor sends one trajectory per env per unroll); "
                                "pick a multiple")
        if self.actors not in ACTOR_KINDS:
            raise UserError(f"actors='{self.actors}': use one of {', '.join(ACTOR_KINDS)}")
        if self.actors == "inline" and self.ray_address is not None:
            raise UserError("actors=inline steps the actors in this process and uses no Ray: drop --ray-address")
        if self.actors == "ray":
            if importlib.util.find_spec("ray") is None:  # said before a run directory exists
                raise UserError(NEEDS_RAY)
        if self.max_actor_failures < 0:
            raise UserError(f"max_actor_failures={self.max_actor_failures}: must be >= 0")
        for name in ("actor_cpus", "rho_bar", "c_bar", "vtrace_lambda", "learning_rate", "gamma", "ent_coef", "vf_coef",
                     "max_grad_norm"):
            _finite(name, getattr(self, name))
        for name in ("rho_bar", "c_bar", "learning_rate", "max_grad_norm"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name}={getattr(self, name)}: must be > 0")
        if self.actor_cpus < 0:
            raise UserError(f"actor_cpus={self.actor_cpus}: must be >= 0")
        if not 0.0 <= self.vtrace_lambda <= 1.0:
            raise UserError(f"vtrace_lambda={self.vtrace_lambda}: must be in [0, 1]")
        if not 0.0 < self.gamma <= 1.0:
            raise UserError(f"gamma={self.gamma}: must be in (0, 1]")
        for name in ("ent_coef", "vf_coef"):
            if getattr(self, name) < 0:
                raise UserError(f"{name}={getattr(self, name)}: must be >= 0")
        if self.norm_adv and self.batch_size < 2:
            raise UserError("norm_adv needs batches of 2 or more steps; raise unroll_length or batch_trajectories")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            raise UserError(f"hidden_sizes={self.hidden_sizes}: give one or more positive layer widths, e.g. 64,64")
        if self.encoder not in ENCODERS:
            raise UserError(f"encoder='{self.encoder}': use one of {', '.join(ENCODERS)}")
        if self.batch_size > total_steps:
            raise UserError(f"--total-steps {total_steps} is smaller than one learner batch (batch_trajectories*"
                            f"unroll_length={self.batch_size}); raise --total-steps or lower unroll_length")


def resolve(cfg: RunConfig) -> RunConfig:
    from reflectrl.trainers.resolve import check_image_encoder, probe_env

    facts = probe_env(cfg)
    check_image_encoder(cfg.impala.encoder, facts)
    if cfg.impala.encoder == "auto":
        cfg.impala.encoder = "cnn" if facts.pixels else "mlp"
    return cfg
