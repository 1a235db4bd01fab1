"""Sub-goals over the cells of a grid: the built-in grid world's and MiniGrid's (seed 002 section 6.1's
"move to some room").

The grid is cut into square regions of `goal_region` cells (the last row and column of regions may be
smaller); a sub-goal is one region, and it is reached on the first step that ends with the agent in it.
`goals=absolute`: the high level picks any region; `goals=relative`: one of the regions within
`goal_reach` regions of the agent's, rows and columns (HIRO's goals relative to the current state, on a
grid). Never the agent's own region (already reached), nor a region with no free cell: those choices
are masked out of the high level's distribution.

What the levels read besides the env's observation:
* the low level: the goal region's one-hot and the displacement from the agent's cell to the goal
  region's centre (free cells' mean), divided by the grid's side;
* both levels, where the env's observation does not say where the agent is (MiniGrid's egocentric
  view): the agent's cell, each coordinate divided by the side minus one. The grid world's observation
  (one-hot cell or coordinates) is the cell already.

`AgentCell` puts the agent's (row, col) into every step's info as `agent_cell` (in `final_info` too,
where a vector env reset the episode), which is what the trainer reads the cell from.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from reflectrl.errors import UserError


def agent_cell(base) -> np.ndarray:
    if hasattr(base, "agent_pos") and hasattr(base, "grid"):  # MiniGrid: (x, y) = (col, row)
        x, y = base.agent_pos
        return np.array([int(y), int(x)], dtype=np.int64)
    return np.array(base._agent, dtype=np.int64)  # the built-in grid world


def supported(env: gym.Env) -> str | None:
    """'gridworld' or 'minigrid' for an env whose agent stands on a cell of a grid, else None."""
    from reflectrl.envs.gridworld import GridWorldEnv

    base = env.unwrapped
    if isinstance(base, GridWorldEnv):
        return "gridworld"
    if type(base).__module__.startswith("minigrid.") and hasattr(base, "agent_pos"):
        return "minigrid"
    return None


class AgentCell(gym.Wrapper):
    """info["agent_cell"]: the agent's (row, col) after each reset and step."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "agent_cell": agent_cell(self.env.unwrapped)}

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "agent_cell": agent_cell(self.env.unwrapped)}


class GoalSpace:
    """Regions of a rows x cols grid whose free cells are `free` (bool (rows, cols)), and the high
    level's choices over them (see the module docstring)."""

    def __init__(self, free: np.ndarray, region: int, kind: str, reach: int, position_features: bool):
        self.rows, self.cols = free.shape
        self.region, self.kind, self.reach, self.position_features = region, kind, reach, position_features
        self.grid_rows, self.grid_cols = -(-self.rows // region), -(-self.cols // region)
        self.n_regions = self.grid_rows * self.grid_cols
        self.side = max(self.rows, self.cols)
        cell_region = (np.arange(self.rows)[:, None] // region) * self.grid_cols + np.arange(self.cols)[None] // region
        self.valid = np.zeros(self.n_regions, dtype=bool)
        centres = np.zeros((self.n_regions, 2), dtype=np.float32)
        for k in range(self.n_regions):
            cells = np.argwhere(free & (cell_region == k))
            self.valid[k] = len(cells) > 0
            centres[k] = cells.mean(0) if len(cells) else ((k // self.grid_cols + 0.5) * region,
                                                           (k % self.grid_cols + 0.5) * region)
        self.centres = torch.from_numpy(centres)
        if kind == "relative":
            span = np.arange(-reach, reach + 1)
            self.offsets = np.array([(dr, dc) for dr in span for dc in span], dtype=np.int64)
        else:
            self.offsets = None
        self.n_choices = self.n_regions if kind == "absolute" else len(self.offsets)
        self.feature_dim = self.n_regions + 2
        self.position_dim = 2 if position_features else 0
        # the choices open from each region, and the region each choice leads to: (n_regions, n_choices)
        self._targets = np.stack([self._targets_from(k) for k in range(self.n_regions)])
        self._masks = (self._targets >= 0) & (self._targets != np.arange(self.n_regions)[:, None])
        self._masks &= np.where(self._targets >= 0, self.valid[np.maximum(self._targets, 0)], False)
        stuck = np.flatnonzero(self.valid & ~self._masks.any(1))
        if len(stuck):
            raise UserError(f"hppo: region {int(stuck[0])} of the grid has no other free region within goal_reach="
                            f"{reach}; raise hppo.goal_reach, lower hppo.goal_region or use hppo.goals=absolute")

    def _targets_from(self, k: int) -> np.ndarray:
        if self.offsets is None:
            return np.arange(self.n_regions)
        r, c = divmod(k, self.grid_cols)
        rr, cc = r + self.offsets[:, 0], c + self.offsets[:, 1]
        inside = (rr >= 0) & (rr < self.grid_rows) & (cc >= 0) & (cc < self.grid_cols)
        return np.where(inside, rr * self.grid_cols + cc, -1)

    def region_of(self, cells: np.ndarray) -> np.ndarray:
        """(N, 2) cells -> (N,) region indices."""
        cells = np.asarray(cells)
        return (cells[:, 0] // self.region) * self.grid_cols + cells[:, 1] // self.region

    def masks(self, cells: np.ndarray) -> torch.Tensor:
        """(N, n_choices) bool: the choices open to an agent on each of these cells."""
        return torch.from_numpy(self._masks[self.region_of(cells)])

    def goal_of(self, choices: np.ndarray, cells: np.ndarray) -> np.ndarray:
        """The region each choice names, from the agent's cell."""
        return self._targets[self.region_of(cells), np.asarray(choices)]

    def reached(self, goals: np.ndarray, cells: np.ndarray) -> np.ndarray:
        return self.region_of(cells) == np.asarray(goals)

    def positions(self, cells: np.ndarray) -> torch.Tensor:
        """(N, position_dim): the agent's cell scaled to [0, 1], where the observation does not give it."""
        if not self.position_features:
            return torch.zeros((len(cells), 0))
        return torch.as_tensor(np.asarray(cells), dtype=torch.float32) / max(self.side - 1, 1)

    def features(self, goals: np.ndarray, cells: np.ndarray) -> torch.Tensor:
        """(N, feature_dim): the goal region's one-hot and (its centre - the agent's cell) / side."""
        goals = torch.as_tensor(np.asarray(goals), dtype=torch.long)
        one_hot = torch.nn.functional.one_hot(goals, self.n_regions).float()
        delta = (self.centres[goals] - torch.as_tensor(np.asarray(cells), dtype=torch.float32)) / self.side
        return torch.cat([one_hot, delta], -1)


def goal_space_for(env: gym.Env, region: int, kind: str, reach: int, env_id: str = "") -> GoalSpace:
    """The goal space of an env (the grid world or MiniGrid), or one line saying why there is none."""
    which = supported(env)
    base = env.unwrapped
    if which is None:
        raise UserError(f"--algo hppo picks sub-goals among the cells of a grid: it runs on reflectrl/GridWorld-v0 "
                        f"and MiniGrid envs, not on '{env_id or type(base).__name__}'")
    if which == "gridworld":
        free = ~np.asarray(base.walls)
        position = False  # the observation is the agent's cell (one-hot or coordinates)
    else:
        free = np.zeros((base.height, base.width), dtype=bool)
        free[1:-1, 1:-1] = True  # the outer wall is always there; the inner walls may change per episode
        position = True
    if region > max(free.shape):
        raise UserError(f"hppo.goal_region={region} is larger than the grid ({free.shape[0]}x{free.shape[1]}); "
                        "pick a region smaller than the grid")
    return GoalSpace(free, region, kind, reach, position)


def resolve(cfg):
    """HPPO's resolve: discrete actions on a grid, its knobs checked, and its goal space built once
    from the probe (one line if the env has none)."""
    from reflectrl.trainers.resolve import probe_env

    def goal_space(probe, facts):
        if facts.continuous:
            raise UserError(f"--algo hppo needs discrete actions; '{cfg.env_id}' has continuous (Box) actions")
        if cfg.backend != "gymnasium":
            raise UserError(f"--algo hppo reads the agent's cell from each env: it runs on backend=gymnasium, "
                            f"not {cfg.backend}")
        h = cfg.hppo
        h.validate(cfg.total_steps)  # before its goal space is built from them
        goal_space_for(probe, h.goal_region, h.goals, h.goal_reach, cfg.env_id)

    probe_env(cfg, inspect=goal_space)
    return cfg
