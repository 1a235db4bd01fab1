"""A small, deterministic, sparse-reward grid maze.

`GridWorldEnv` is the built-in testbed for reward-learning experiments: the
only extrinsic reward is 1.0 on reaching the goal, so an agent that learns a
useful intrinsic reward should beat one that does not.  Because the state
space is tiny and enumerable, the env also exposes helpers (`free_cells`,
`obs_for_cell`, `cell_of`, `next_cell`) that let analysis code evaluate a
learned reward on every cell and draw a "reward map".

Layouts:
    "empty"  - no inner walls.
    "rooms"  - four rooms: a horizontal and a vertical wall through the middle,
               one doorway in each of the four wall segments.
    "maze"   - a perfect maze carved by depth-first search from a fixed seed,
               so the map depends only on `size`.
    ASCII    - rows separated by newlines or '/', using '#' wall, '.' free,
               'S' start, 'G' goal, 'H' hazard (free, but costly); `size` is then
               inferred from the map.

Hazards (a cost channel for constrained RL, envs/cost.py): `hazards=K` marks K free cells
(a float in (0, 1): that share of them), never the start or the goal, drawn from a fixed seed
so the map depends only on the layout and K; 'H' cells of an ASCII map are hazards too. With
any hazard the info of every step has "cost": 1.0 when the step ends on a hazard, else 0.0
(as Safety-Gymnasium's hazard areas); rewards are unchanged. Without hazards there is no cost
channel at all (`hazards=0` gives one that is always 0).

Actions are 0 up, 1 right, 2 down, 3 left.  Moving off the grid or into a wall
leaves the agent where it is.  Episodes are truncated inside the env after
`max_episode_steps` (default 4 * size * size), so no TimeLimit wrapper is
needed when registering it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

Cell = tuple[int, int]

BUILTIN_LAYOUTS = ("empty", "rooms", "maze")
OBS_MODES = ("onehot", "coords")
MAX_SIZE = 64
MIN_SIZE = {"empty": 3, "rooms": 3, "maze": 5}
MAP_CHARS = set("#.SGH")
# Characters allowed in a layout string for it to be treated as an ASCII map.
_MAP_STRING_CHARS = MAP_CHARS | set("/\n\r\t ")
# (row, col) deltas indexed by action: up, right, down, left.
ACTION_DELTAS: tuple[Cell, ...] = ((-1, 0), (0, 1), (1, 0), (0, -1))
# The maze must depend only on `size`, so it is carved from a fixed seed that
# is independent of the seed passed to reset().
_MAZE_SEED = 0

CELL_PIXELS = 16
_WALL_RGB = (64, 64, 64)
_FREE_RGB = (255, 255, 255)
_GOAL_RGB = (0, 170, 0)
_AGENT_RGB = (220, 0, 0)
_HAZARD_RGB = (255, 160, 0)
_HAZARD_SEED = 1  # hazards=K cells are drawn from this fixed seed: the map depends only on the layout and K


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _bfs_distances(walls: np.ndarray, start: Cell) -> dict[Cell, int]:
    """Shortest-path step counts from `start` to every reachable free cell."""
    rows, cols = walls.shape
    dist = {start: 0}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ACTION_DELTAS:
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and not walls[nr, nc] and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist


def _rooms_walls(size: int) -> np.ndarray:
    walls = np.zeros((size, size), dtype=bool)
    mid = size // 2
    walls[mid, :] = True
    walls[:, mid] = True
    # One doorway in the middle of each of the four segments the cross makes;
    # a segment of length 1 is entirely doorway, which keeps tiny grids solvable.
    for lo, hi in ((0, mid - 1), (mid + 1, size - 1)):
        door = (lo + hi) // 2
        walls[mid, door] = False
        walls[door, mid] = False
    return walls


def _maze_walls(size: int) -> np.ndarray:
    """Perfect maze: passages live on even (row, col); odd cells are carved to join them."""
    walls = np.ones((size, size), dtype=bool)
    rng = np.random.default_rng(_MAZE_SEED)
    # With an even size the last row/column has no room cells and stays wall.
    n = (size + 1) // 2
    visited = np.zeros((n, n), dtype=bool)
    visited[0, 0] = True
    walls[0, 0] = False
    stack = [(0, 0)]
    while stack:
        r, c = stack[-1]
        options = [
            (r + dr, c + dc)
            for dr, dc in ACTION_DELTAS
            if 0 <= r + dr < n and 0 <= c + dc < n and not visited[r + dr, c + dc]
        ]
        if not options:
            stack.pop()
            continue
        nr, nc = options[int(rng.integers(len(options)))]
        visited[nr, nc] = True
        walls[2 * nr, 2 * nc] = False
        walls[r + nr, c + nc] = False  # the cell between (2r,2c) and (2nr,2nc)
        stack.append((nr, nc))
    return walls


def parse_ascii_map(text: str, with_hazards: bool = False):
    """Parse an ASCII map into (walls, start, goal) (and its 'H' cells' bool mask with
    `with_hazards`); raise ValueError on a bad map."""
    rows = [row.strip() for row in text.replace("/", "\n").splitlines()]
    rows = [row for row in rows if row]
    if not rows:
        raise ValueError("ASCII map is empty")
    for row in rows:
        bad = set(row) - MAP_CHARS
        if bad:
            raise ValueError(
                f"ASCII map has invalid character {sorted(bad)[0]!r}: "
                "use '#' wall, '.' free, 'S' start, 'G' goal, 'H' hazard"
            )
    widths = sorted({len(row) for row in rows})
    if len(widths) != 1 or widths[0] != len(rows):
        raise ValueError(
            f"ASCII map must be square: got {len(rows)} rows of width {'/'.join(map(str, widths))}"
        )
    size = len(rows)
    if not 2 <= size <= MAX_SIZE:
        raise ValueError(f"ASCII map side must be in [2, {MAX_SIZE}], got {size}")
    grid = np.array([list(row) for row in rows])
    for mark, name in (("S", "start"), ("G", "goal")):
        count = int((grid == mark).sum())
        if count != 1:
            raise ValueError(f"ASCII map must contain exactly one {mark!r} ({name}), found {count}")
    start = tuple(int(x) for x in np.argwhere(grid == "S")[0])
    goal = tuple(int(x) for x in np.argwhere(grid == "G")[0])
    walls = grid == "#"
    if goal not in _bfs_distances(walls, start):
        raise ValueError(f"ASCII map goal G at {goal} is not reachable from start S at {start}")
    return (walls, start, goal, grid == "H") if with_hazards else (walls, start, goal)


def place_hazards(walls: np.ndarray, start: Cell, goal: Cell, hazards) -> np.ndarray:
    """The bool mask of `hazards` cells (a count, or a share of the free cells in (0, 1)),
    drawn from a fixed seed among the free cells other than the start and the goal."""
    candidates = [(int(r), int(c)) for r, c in np.argwhere(~walls) if (r, c) not in (start, goal)]
    bad = f"hazards={hazards!r}: give a number of cells or a share of them in (0, 1)"
    if isinstance(hazards, bool) or not isinstance(hazards, (int, float, np.integer, np.floating)):
        raise ValueError(bad)
    if float(hazards).is_integer():
        count = int(hazards)
    elif 0.0 < hazards < 1.0:
        count = round(hazards * len(candidates))
    else:
        raise ValueError(bad)
    if not 0 <= count <= len(candidates):
        raise ValueError(f"hazards={hazards!r}: the layout has {len(candidates)} free cells besides the start "
                         "and the goal")
    mask = np.zeros(walls.shape, dtype=bool)
    picks = np.random.default_rng(_HAZARD_SEED).choice(len(candidates), size=count, replace=False)
    for k in picks:
        mask[candidates[int(k)]] = True
    return mask


class GridWorldEnv(gym.Env):
    """Deterministic sparse-reward maze; see the module docstring for details."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        size: int = 8,
        layout: str = "rooms",
        max_episode_steps: int | None = None,
        obs_mode: str = "onehot",
        render_mode: str | None = None,
        hazards: int | float | None = None,
    ) -> None:
        if obs_mode not in OBS_MODES:
            raise ValueError(f"unknown obs_mode {obs_mode!r}: use 'onehot' or 'coords'")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"unknown render_mode {render_mode!r}: use None or 'rgb_array'")
        if not isinstance(layout, str):
            raise ValueError(f"layout must be a string, got {type(layout).__name__}")

        if layout in BUILTIN_LAYOUTS:
            lo = MIN_SIZE[layout]
            if not (_is_int(size) and lo <= size <= MAX_SIZE):
                raise ValueError(
                    f"size must be an integer in [{lo}, {MAX_SIZE}] for layout {layout!r}, got {size!r}"
                )
            size = int(size)
            if layout == "empty":
                walls = np.zeros((size, size), dtype=bool)
            elif layout == "rooms":
                walls = _rooms_walls(size)
            else:
                walls = _maze_walls(size)
            free = np.argwhere(~walls)  # row-major order
            start = tuple(int(x) for x in free[0])
            goal = tuple(int(x) for x in free[-1])
            assert goal in _bfs_distances(walls, start), f"built-in layout {layout!r} has unreachable goal"
        elif set(layout) <= _MAP_STRING_CHARS:
            walls, start, goal, marked = parse_ascii_map(layout, with_hazards=True)
            size = walls.shape[0]
        else:
            raise ValueError(
                f"unknown layout {layout!r}: use 'empty', 'rooms', 'maze' or an ASCII map "
                "('#' wall, '.' free, 'S' start, 'G' goal, 'H' hazard; rows separated by '/' or newlines)"
            )
        hazard_mask = None if layout in BUILTIN_LAYOUTS or not marked.any() else marked
        if hazards is not None:
            placed = place_hazards(walls, start, goal, hazards)
            hazard_mask = placed if hazard_mask is None else hazard_mask | placed

        if max_episode_steps is None:
            max_episode_steps = 4 * size * size
        if not (_is_int(max_episode_steps) and max_episode_steps >= 1):
            raise ValueError(
                f"max_episode_steps must be a positive integer or None, got {max_episode_steps!r}"
            )

        self.size = size
        self.layout = layout
        self.obs_mode = obs_mode
        self.render_mode = render_mode
        self.max_episode_steps = int(max_episode_steps)
        self.walls: np.ndarray = walls
        self.start: Cell = start
        self.goal: Cell = goal
        self.hazards: np.ndarray | None = hazard_mask  # bool (size, size), None: no cost channel

        self.action_space = spaces.Discrete(4)
        if obs_mode == "onehot":
            self.observation_space = spaces.Box(0.0, 1.0, shape=(size * size,), dtype=np.float32)
        else:
            self.observation_space = spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)

        # Valid before the first reset so helpers and render work immediately.
        self._agent: Cell = start
        self._steps = 0

    # ----- helpers used by reward-map analysis -----

    def free_cells(self) -> list[Cell]:
        """All non-wall cells in row-major order."""
        return [(int(r), int(c)) for r, c in np.argwhere(~self.walls)]

    def obs_for_cell(self, row: int, col: int) -> np.ndarray:
        """The observation the agent would receive standing at (row, col)."""
        if self.obs_mode == "onehot":
            obs = np.zeros(self.size * self.size, dtype=np.float32)
            obs[row * self.size + col] = 1.0
            return obs
        return np.array([row / (self.size - 1), col / (self.size - 1)], dtype=np.float32)

    def cell_of(self, obs: np.ndarray) -> Cell:
        """Inverse of `obs_for_cell`."""
        obs = np.asarray(obs)
        if self.obs_mode == "onehot":
            row, col = divmod(int(np.argmax(obs)), self.size)
            return row, col
        row, col = np.rint(obs * (self.size - 1)).astype(int)
        return int(row), int(col)

    def next_cell(self, cell: Cell, action: int) -> Cell:
        """Deterministic transition; blocked moves leave the agent in place."""
        dr, dc = ACTION_DELTAS[int(action)]
        r, c = cell[0] + dr, cell[1] + dc
        if 0 <= r < self.size and 0 <= c < self.size and not self.walls[r, c]:
            return r, c
        return cell

    # ----- gymnasium API -----

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        # The start cell is fixed; the seed only seeds self.np_random for callers.
        super().reset(seed=seed)
        self._agent = self.start
        self._steps = 0
        return self.obs_for_cell(*self._agent), {"cell": self._agent}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}: expected an integer in [0, 3]")
        self._agent = self.next_cell(self._agent, action)
        self._steps += 1
        terminated = self._agent == self.goal
        reward = 1.0 if terminated else 0.0
        # Reaching the goal on the last allowed step is a termination, not a truncation,
        # so value bootstrapping treats it as a true end.
        truncated = not terminated and self._steps >= self.max_episode_steps
        info = {"cell": self._agent}
        if self.hazards is not None:
            info["cost"] = float(self.hazards[self._agent])
        return self.obs_for_cell(*self._agent), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode is None:
            gym.logger.warn("GridWorldEnv.render() called without a render_mode; use render_mode='rgb_array'")
            return None
        colors = np.empty((self.size, self.size, 3), dtype=np.uint8)
        colors[:] = _FREE_RGB
        colors[self.walls] = _WALL_RGB
        if self.hazards is not None:
            colors[self.hazards] = _HAZARD_RGB
        colors[self.goal] = _GOAL_RGB
        colors[self._agent] = _AGENT_RGB
        return np.repeat(np.repeat(colors, CELL_PIXELS, axis=0), CELL_PIXELS, axis=1)


def register_gridworld() -> None:
    """Register `reflectrl/GridWorld-v0` with gymnasium (idempotent)."""
    env_id = "reflectrl/GridWorld-v0"
    if env_id not in gym.registry:
        # No max_episode_steps here: the env truncates itself.
        gym.register(id=env_id, entry_point="reflectrl.envs.gridworld:GridWorldEnv")
