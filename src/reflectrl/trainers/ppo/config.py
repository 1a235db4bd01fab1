"""PPO's knobs (`--algo ppo`: bare names, or ppo.NAME), CleanRL's names; every default once.

A knob left as `None` takes its default for the env when the run is resolved (resolve.py):
CleanRL's ppo.py for discrete actions, ppo_continuous_action.py for continuous ones, ppo_atari.py
for Atari; the resolved values are what `config.json` records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from reflectrl.config import ENCODERS, EnvSettings, finite
from reflectrl.errors import UserError
from reflectrl.trainers.onpolicy.config import OnPolicyConfig

STREAM_HEADS = ("auto", "shared", "separate")
POLICIES = ("mlp", "gru", "lstm")


@dataclass
class PPOConfig(OnPolicyConfig):
    SECTION: ClassVar[str] = ""  # bare names in the error messages, as users type them

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
    clip_coef: float | None = None
    """PPO's clip range for the ratio (and for the value, with clip_vloss)"""
    ent_coef: float | None = None
    """entropy bonus weight"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """actor and critic MLP widths, e.g. 64,64 (also above the small CNN; the Nature CNN's heads are linear)"""
    encoder: str = "auto"
    """mlp, cnn, or auto: cnn for pixel images (Atari's Nature CNN), mlp otherwise (MiniGrid's view flattened)"""
    policy: str = "mlp"
    """mlp (feed-forward), or a recurrent policy: gru, lstm (one recurrent layer above the encoder, its hidden
    state kept through the rollout and reset at episode starts; minibatches are whole per-env sequences)"""
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

    # the defaults of the knobs left as None, by env: `reflectrl knobs` lists them so
    ENV_DEFAULTS: ClassVar[tuple[str, ...]] = ("discrete", "continuous", "Atari")

    @classmethod
    def env_defaults(cls) -> dict[str, tuple]:
        """{knob: (discrete, continuous, Atari) default}."""
        return {k: (DISCRETE_DEFAULTS[k], CONTINUOUS_DEFAULTS[k], ATARI_DEFAULTS[k]) for k in DISCRETE_DEFAULTS}

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    def env_settings(self) -> EnvSettings:
        return EnvSettings(self.num_envs, bool(self.norm_obs), bool(self.norm_reward), self.clip_obs,
                           self.clip_reward, self.gamma, self.encoder)

    def validate(self, total_steps: int) -> None:
        super().validate(total_steps)
        if self.norm_adv and self.minibatch_size < 2:
            raise UserError(
                f"minibatches of {self.minibatch_size} sample (num_envs*num_steps={self.batch_size} / num_minibatches="
                f"{self.num_minibatches}) with norm_adv: an advantage cannot be normalised over one sample (its std "
                "is undefined); use fewer num_minibatches, a larger batch, or norm_adv=false")
        for name in ("clip_obs", "clip_reward"):
            finite(name, getattr(self, name))
            if getattr(self, name) <= 0:
                raise UserError(f"{name}={getattr(self, name)}: must be > 0")
        if self.encoder not in ENCODERS:
            raise UserError(f"encoder='{self.encoder}': use one of {', '.join(ENCODERS)}")
        if self.policy not in POLICIES:
            raise UserError(f"policy='{self.policy}': use one of {', '.join(POLICIES)}")
        if self.policy != "mlp" and self.num_envs % self.num_minibatches:
            raise UserError(f"policy={self.policy} splits the num_envs={self.num_envs} envs into num_minibatches="
                            f"{self.num_minibatches} minibatches of whole sequences: make num_envs a multiple of "
                            "num_minibatches")
        if self.stream_heads not in STREAM_HEADS:
            raise UserError(f"stream_heads='{self.stream_heads}': use one of {', '.join(STREAM_HEADS)}")
        if self.stream_heads == "shared" and self.encoder == "mlp":
            raise UserError("stream_heads=shared needs a CNN policy (encoder=cnn): an MLP policy's actor and critic "
                            "share no trunk; use stream_heads=separate or auto")

    def resolved(self, continuous: bool, *, atari: bool = False, pixels: bool = False) -> PPOConfig:
        """The knobs left as None filled with the defaults for the env (Atari) or its action type,
        and `encoder=auto` with cnn for pixel observations, mlp otherwise."""
        defaults = ATARI_DEFAULTS if atari else CONTINUOUS_DEFAULTS if continuous else DISCRETE_DEFAULTS
        values = {k: (defaults[k] if getattr(self, k) is None else getattr(self, k)) for k in defaults}
        if self.encoder == "auto":
            values["encoder"] = "cnn" if pixels else "mlp"
        if self.stream_heads == "auto":
            values["stream_heads"] = "shared" if values.get("encoder", self.encoder) == "cnn" else "separate"
        return dataclasses.replace(self, **values)


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


