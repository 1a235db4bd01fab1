"""Atari through ale-py, preprocessed as CleanRL's ppo_atari.py (issue 15, item 1).

Any `ALE/<Game>-v5` id and the classic `<Game>[NoFrameskip]-v0/v4` ids (ale-py's wheel ships
the ROMs: nothing is downloaded). The emulator is created with `frameskip=1` whatever the id
says, so frames are skipped once, by the max-and-skip below; sticky actions
(`repeat_action_probability`) stay as the id defines them (0.25 for v5, 0 for v4).

The wrapper chain, innermost first:

1. the ALE env (grayscale screens: the preprocessing reads the screen itself);
2. `RecordEpisodeStatistics`: the *true* game score and length (in emulator frames) of a
   whole game, below every wrapper that ends episodes early or changes rewards, so the
   logged and evaluated returns are the full game's score;
3. Gymnasium's `AtariPreprocessing`: noop reset (1 to 30 no-ops), max-and-skip 4 (the max
   of the last two frames), 84x84 grayscale; its own `terminal_on_life_loss` restarts the
   whole game, which is not the "episodic life" of the DQN papers, so it is off here;
4. `EpisodicLife`: a lost life ends the episode *for learning* (terminated=True); the next
   reset only steps a no-op, so the game goes on and its score keeps adding up in (2);
5. `FireReset`: presses FIRE (then action 2) after every reset, for games that wait for it;
6. reward clipping to its sign, for learning only (`learning=False` leaves it out);
7. `FrameStackObservation`: the last 4 frames, shape (4, 84, 84), uint8.

`eval` keeps (4) and (5) (the policy learnt with them) and plays on through lost lives
until the game is over (see `life_lost`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym
import numpy as np

from reflectrl.errors import UserError

INSTALL = "pip install 'reflectrl[envs]' (or: pip install ale-py opencv-python-headless)"
NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4
_ENTRY_POINT = "ale_py.env:AtariEnv"
# ids that only ale-py registers: ALE/<Game>-v5 and <Game>NoFrameskip-v4 (plain Pong-v4 too,
# but that one we only recognise once ale-py is installed)
_PREFIX = "ALE/"


def ale_installed() -> bool:
    return importlib.util.find_spec("ale_py") is not None


def register_atari() -> bool:
    """Register ale-py's ids with Gymnasium; False when ale-py is not installed."""
    if not ale_installed():
        return False
    import ale_py

    gym.register_envs(ale_py)
    return True


def looks_like_atari(env_id: str) -> bool:
    """An id only ale-py could provide (checked before ale-py is known to be installed)."""
    return env_id.startswith(_PREFIX) or "NoFrameskip-v" in env_id


def is_atari_id(env_id: str) -> bool:
    spec = gym.registry.get(env_id)
    return spec is not None and spec.entry_point == _ENTRY_POINT


def is_atari_env(env: gym.Env) -> bool:
    return type(env.unwrapped).__module__.startswith("ale_py.")


def missing_ale_error(env_id: str) -> UserError:
    return UserError(f"env '{env_id}' is an Atari game and needs ale-py, which is not installed: {INSTALL}")


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode for the learner; only game over resets the game.

    As CleanRL's / SB3's EpisodicLifeEnv: after a life is lost, `reset` takes one no-op step
    instead of restarting, so the same game continues. `was_real_done` says whether the last
    episode end was the game's own.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op itself ended the game
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE, then action 2, after each reset (games that wait for FIRE to start)."""

    def reset(self, **kwargs):
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(2)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def make_atari(make, env_id: str, kwargs: dict[str, Any], *, learning: bool = True) -> gym.Env:
    """The preprocessed Atari env; `make(env_id, kwargs)` builds the raw env (make_env's _make)."""
    if "frameskip" in kwargs:
        raise UserError(f"env.frameskip: '{env_id}' skips {FRAME_SKIP} frames in its preprocessing "
                        "(max-and-skip), so the emulator's own frameskip is always 1; drop env.frameskip")
    if importlib.util.find_spec("cv2") is None:
        raise UserError(f"env '{env_id}': Atari preprocessing needs OpenCV, which is not installed: {INSTALL}")
    env = make(env_id, {"obs_type": "grayscale", **kwargs, "frameskip": 1})
    env = gym.wrappers.RecordEpisodeStatistics(env)  # the true score: below every wrapper that changes it
    env = gym.wrappers.AtariPreprocessing(env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
                                          terminal_on_life_loss=False, grayscale_obs=True)
    env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env)
    if learning:
        env = gym.wrappers.TransformReward(env, np.sign)  # clipped for learning only
    return gym.wrappers.FrameStackObservation(env, FRAME_STACK)


def step_limit(env: gym.Env) -> int | None:
    """Agent steps in the longest game: the emulator's frame limit over the frames skipped per step."""
    frames = env.unwrapped.ale.getInt("max_num_frames_per_episode")
    inner, skip = env, 1
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, gym.wrappers.AtariPreprocessing):
            skip = inner.frame_skip
        inner = inner.env
    return frames // skip if frames > 0 else None


def life_lost(env: gym.Env) -> bool:
    """Whether the episode that just ended was a lost life only (the game goes on after reset)."""
    inner = env
    while isinstance(inner, gym.Wrapper):
        if isinstance(inner, EpisodicLife):
            return not inner.was_real_done
        inner = inner.env
    return False
