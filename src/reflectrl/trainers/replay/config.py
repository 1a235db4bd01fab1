"""The replay trainers' knobs: DQN's (`--algo dqn`) and SAC's (`--algo sac`), CleanRL's names and
defaults (dqn.py / dqn_atari.py, sac_continuous_action.py); bare names, or dqn.NAME / sac.NAME."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from reflectrl.config import ENCODERS, EnvSettings
from reflectrl.config import finite as _finite
from reflectrl.errors import UserError


def replay_env_settings(knobs) -> EnvSettings:
    """A replay trainer learns from the env's own observations and rewards."""
    return EnvSettings(knobs.num_envs, False, False, 10.0, 10.0, knobs.gamma, getattr(knobs, "encoder", "mlp"))


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

    def env_settings(self) -> EnvSettings:
        return replay_env_settings(self)

    def validate(self, total_steps: int) -> None:
        for name in ("num_envs", "buffer_size", "target_network_frequency", "batch_size", "train_frequency",
                     "log_every"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.learning_starts < 0:
            raise UserError(f"learning_starts={self.learning_starts}: must be >= 0")
        for name in ("learning_rate", "gamma", "tau", "start_e", "end_e", "exploration_fraction"):
            _finite(name, getattr(self, name))
        if self.learning_rate <= 0:
            raise UserError(f"learning_rate={self.learning_rate}: must be > 0")
        if not 0.0 < self.gamma <= 1.0:
            raise UserError(f"gamma={self.gamma}: must be in (0, 1]")
        if not 0.0 < self.tau <= 1.0:
            raise UserError(f"tau={self.tau}: must be in (0, 1] (1: a hard copy every target_network_frequency steps)")
        for name in ("start_e", "end_e"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserError(f"{name}={getattr(self, name)}: an epsilon must be in [0, 1]")
        if not 0.0 < self.exploration_fraction <= 1.0:
            raise UserError(f"exploration_fraction={self.exploration_fraction}: must be in (0, 1]")
        if self.loss not in DQN_LOSSES:
            raise UserError(f"loss='{self.loss}': use one of {', '.join(DQN_LOSSES)}")
        if self.encoder not in ENCODERS:
            raise UserError(f"encoder='{self.encoder}': use one of {', '.join(ENCODERS)}")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            raise UserError(f"hidden_sizes={self.hidden_sizes}: give one or more positive layer widths, e.g. 120,84")
        if self.batch_size > self.buffer_size:
            raise UserError(f"batch_size={self.batch_size} is larger than buffer_size={self.buffer_size}; "
                            "raise buffer_size")
        if self.num_envs * self.train_frequency > self.log_every:
            raise UserError(f"log_every={self.log_every} is shorter than one gradient step's worth of env steps "
                            f"(num_envs*train_frequency={self.num_envs * self.train_frequency}); raise log_every")
        if self.learning_starts >= total_steps:
            raise UserError(f"learning_starts={self.learning_starts} is not below --total-steps {total_steps}: the run "
                            "would never learn; lower learning_starts or raise --total-steps")

    def resolved(self, *, atari: bool = False, pixels: bool = False) -> DQNConfig:
        """The knobs left as None, from CleanRL's dqn.py or (Atari) dqn_atari.py; encoder=auto: cnn for
        pixel observations."""
        defaults = DQN_ATARI_DEFAULTS if atari else DQN_DEFAULTS
        values = {k: (defaults[k] if getattr(self, k) is None else getattr(self, k)) for k in defaults}
        if self.encoder == "auto":
            values["encoder"] = "cnn" if pixels else "mlp"
        return dataclasses.replace(self, **values)

    ENV_DEFAULTS: ClassVar[tuple[str, ...]] = ("", "Atari")

    @classmethod
    def env_defaults(cls) -> dict[str, tuple]:
        """{knob: (classic control, Atari) default}."""
        return {k: (DQN_DEFAULTS[k], DQN_ATARI_DEFAULTS[k]) for k in DQN_DEFAULTS}


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

    def env_settings(self) -> EnvSettings:
        return replay_env_settings(self)

    def validate(self, total_steps: int) -> None:
        for name in ("num_envs", "buffer_size", "batch_size", "policy_frequency", "target_network_frequency",
                     "log_every"):
            if getattr(self, name) < 1:
                raise UserError(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.learning_starts < 0:
            raise UserError(f"learning_starts={self.learning_starts}: must be >= 0")
        for name in ("policy_lr", "q_lr", "gamma", "tau", "alpha"):
            _finite(name, getattr(self, name))
            if getattr(self, name) <= 0 and name != "alpha":
                raise UserError(f"{name}={getattr(self, name)}: must be > 0")
        if self.alpha < 0:
            raise UserError(f"alpha={self.alpha}: must be >= 0 (0: no entropy term)")
        if not 0.0 < self.gamma <= 1.0:
            raise UserError(f"gamma={self.gamma}: must be in (0, 1]")
        if not 0.0 < self.tau <= 1.0:
            raise UserError(f"tau={self.tau}: must be in (0, 1]")
        if self.target_entropy is not None:
            _finite("target_entropy", self.target_entropy)
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            raise UserError(f"hidden_sizes={self.hidden_sizes}: give one or more positive layer widths, e.g. 256,256")
        if self.batch_size > self.buffer_size:
            raise UserError(f"batch_size={self.batch_size} is larger than buffer_size={self.buffer_size}; "
                            "raise buffer_size")
        if self.num_envs > self.log_every:
            raise UserError(f"log_every={self.log_every} is shorter than one vector step (num_envs={self.num_envs}); "
                            "raise log_every")
        if self.learning_starts >= total_steps:
            raise UserError(f"learning_starts={self.learning_starts} is not below --total-steps {total_steps}: the run "
                            "would never learn; lower learning_starts or raise --total-steps")


