"""reflectrl's Python API on an env of your own: a gymnasium.Env subclass (defined right here, registered
nowhere) trained with PPO and the calibration bonus, saved, loaded, asked for actions and evaluated.

    python examples/python_api.py          # 16,384 env steps
    python examples/python_api.py 2048     # a smaller budget (CI runs this)

The class lives in this script (__main__), which no other process imports: the run trains all the same (with
a warning saying so), and `reflectrl eval DIR` says in one line that it cannot make the env, while
`reflectrl.load(DIR, env=Corridor())` reads the run in Python. Put the class in a module of its own
(my_envs.py) and the run records my_envs:Corridor, which every reflectrl command makes again.
"""

import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np

import reflectrl


class Corridor(gym.Env):
    """Walk right along a corridor of `length` cells to the reward of 1 at its end; each step costs 0.01."""

    action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def __init__(self, length: int = 8):
        self.length = length  # kept under its keyword's name: how reflectrl rebuilds an instance
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return self._obs(), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        at_end = self.pos == self.length
        return self._obs(), (1.0 if at_end else -0.01), at_end, False, {}

    def _obs(self):
        return np.array([self.pos / self.length], np.float32)


def main(total_steps: int) -> None:
    env = gym.wrappers.TimeLimit(Corridor(length=8), max_episode_steps=50)
    run = reflectrl.train("ppo+calibration", env, total_steps, seed=1, calibration={"alpha": 0.05})
    print(f"trained {run.global_step:,} steps; {len(run.metrics)} metrics rows, e.g. {sorted(run.metrics[-1])[:5]}")

    path = run.save(Path(tempfile.mkdtemp()) / "corridor")  # a run directory, as `reflectrl train --out` writes
    run = reflectrl.load(path)  # (in another process: reflectrl.load(path, env=Corridor(length=8)))

    start = np.zeros(1, np.float32)
    print("action at the start:", run.policy.predict(start, deterministic=True))
    print("actions for a batch:", run.policy.predict(np.linspace(0, 1, 5, dtype=np.float32)[:, None]))
    result = run.evaluate(episodes=10)
    print(f"mean return {result['mean_return']:.3f} over {result['episodes']} episodes "
          f"(best possible {1 - 0.01 * 7:.2f}); run: {path}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16_384)
