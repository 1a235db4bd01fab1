"""The learned reward map of an SDRS run (seed 002 section 7): F(s, a, s') for every free
cell and action (direct mode: one panel per action), or Phi(s) per cell (potential mode),
at the points of training the run kept, as PNGs and one animated GIF.

The built-in grid world's observation is the cell itself. MiniGrid's is the agent's
egocentric view, so a cell's value is read through the env: the layout of the run's first
episode (reset with the run's seed) with the agent placed on the cell, facing each of the
four directions in turn; the map shows the mean over the directions, for the turn-left,
turn-right and forward actions (s' is the view after the action)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from reflectrl.config import RunConfig, env_settings  # noqa: E402
from reflectrl.envs import make_env  # noqa: E402
from reflectrl.errors import UserError  # noqa: E402
from reflectrl.outputs import check_writable, write_files  # noqa: E402
from reflectrl.report.plots import gif_bytes, png_bytes  # noqa: E402
from reflectrl.runs import RunDir  # noqa: E402

ACTIONS = ("up", "right", "down", "left")
MINIGRID_ACTIONS = ("turn left", "turn right", "forward")  # MiniGrid's actions 0, 1, 2


@dataclass
class Layout:
    """What the picture draws around the values: (row, col) cells, walls as a bool grid."""

    walls: np.ndarray
    goal: tuple[int, int] | None
    start: tuple[int, int]
    actions: tuple[str, ...]


def reward_maps(run_path) -> tuple[RunConfig, list[dict], list[np.ndarray], Layout]:
    """(config, snapshots, one (actions or 1, rows, cols) array per snapshot, layout)."""
    from reflectrl.registry import parse_algo
    from reflectrl.signals.compose import member_state
    from reflectrl.signals.shaping.torch import RewardShaper

    run = RunDir.open(run_path, kind="control")
    cfg = RunConfig.from_dict(run.config())
    if "shaping" not in parse_algo(cfg.algo).signals:
        raise UserError(f"{run.path} is a '{cfg.algo}' run; the reward map needs --algo sdrs "
                        "(or any algo with the shaping signal, e.g. ppo+shaping+gear)")
    minigrid = cfg.env_id.startswith(("MiniGrid", "BabyAI"))
    if not (cfg.env_id.startswith("reflectrl/GridWorld") or minigrid):
        raise UserError(f"the reward map is drawn for reflectrl/GridWorld-v0 and MiniGrid runs; "
                        f"{run.path} ran {cfg.env_id}")
    shaping = cfg.sections["shaping"]
    if env_settings(cfg).encoder == "cnn":
        raise UserError(f"{run.path} ran with encoder=cnn: its shaper reads the policy's CNN features, which the "
                        "reward map does not rebuild; train with encoder=mlp to draw one")
    if shaping.mode == "off":
        raise UserError(f"{run.path} ran with shaping.mode=off: there is no reward to draw")
    snapshots = member_state(run.load_checkpoint().get("signal"), "shaping").get("snapshots") or []
    if not snapshots:
        raise UserError(f"{run.path} kept no reward-map snapshots (shaping.snapshots=0?)")
    # every (obs, action, next obs) the map needs, and where each value goes
    queries, layout = (_minigrid_queries if minigrid else _grid_queries)(cfg, shaping.mode)
    env = make_env(cfg.env_id, env_kwargs=cfg.env)
    obs_dim, n_actions = env.observation_space.shape[0], env.action_space.n
    env.close()
    shaper = RewardShaper(obs_dim, n_actions, shaping.hidden_sizes, shaping.mode, shaping.eta,
                          env_settings(cfg).gamma, shaping.hard_clip)
    obs, acts, next_obs, terms, where = queries
    panels = 1 if shaping.mode == "potential" else len(layout.actions)
    maps = []
    for snap in snapshots:
        shaper.load_state_dict(snap["state"])
        with torch.no_grad():
            values = (shaper.potential(obs) if shaping.mode == "potential"
                      else shaper(obs, torch.nn.functional.one_hot(acts, n_actions).float(), next_obs, terms)).numpy()
        total = np.zeros((panels, *layout.walls.shape))
        count = np.zeros_like(total)
        for (k, r, c), v in zip(where, values):
            total[k, r, c] += v
            count[k, r, c] += 1
        grid = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        if shaping.mode == "potential" and layout.goal is not None:
            grid[0][layout.goal] = 0.0  # Phi(terminal) = 0
        maps.append(grid)
    return cfg, snapshots, maps, layout


def _tensor(rows) -> torch.Tensor:
    return torch.as_tensor(np.stack(rows), dtype=torch.float32)


def _grid_queries(cfg: RunConfig, mode: str):
    env = make_env(cfg.env_id, env_kwargs=cfg.env).unwrapped
    cells = [c for c in env.free_cells() if c != env.goal]
    obs, acts, next_obs, terms, where = [], [], [], [], []
    for a in range(1 if mode == "potential" else len(ACTIONS)):
        for cell in cells:
            nxt = env.next_cell(cell, a)
            obs.append(env.obs_for_cell(*cell))
            next_obs.append(env.obs_for_cell(*nxt))
            acts.append(a)
            terms.append(nxt == env.goal)
            where.append((a, *cell))
    layout = Layout(walls=env.walls, goal=env.goal, start=env.start, actions=ACTIONS)
    return (_tensor(obs), torch.tensor(acts), _tensor(next_obs), torch.tensor(terms), where), layout


def _minigrid_queries(cfg: RunConfig, mode: str):
    env = make_env(cfg.env_id, env_kwargs=cfg.env)
    env.reset(seed=cfg.seed)
    base = env.unwrapped
    walls = np.zeros((base.height, base.width), dtype=bool)
    goal, cells = None, []
    for y in range(base.height):
        for x in range(base.width):
            obj = base.grid.get(x, y)
            if obj is not None and obj.type == "goal":
                goal = (y, x)
            elif obj is None or obj.can_overlap():
                cells.append((y, x))
            else:
                walls[y, x] = obj.type == "wall"
    start = (int(base.agent_pos[1]), int(base.agent_pos[0]))
    view = lambda e: e.gen_obs()["image"].reshape(-1)  # noqa: E731  (what make_env's wrappers flatten)
    obs, acts, next_obs, terms, where = [], [], [], [], []
    for (y, x) in cells:
        for direction in range(4):
            placed = copy.deepcopy(base)
            placed.agent_pos, placed.agent_dir = (x, y), direction
            here = view(placed)
            for a in range(1 if mode == "potential" else len(MINIGRID_ACTIONS)):
                moved = copy.deepcopy(placed)
                _, _, terminated, _, _ = moved.step(a)
                obs.append(here)
                next_obs.append(view(moved))
                acts.append(a)
                terms.append(terminated)
                where.append((a, y, x))
    env.close()
    layout = Layout(walls=walls, goal=goal, start=start, actions=MINIGRID_ACTIONS)
    return (_tensor(obs), torch.tensor(acts), _tensor(next_obs), torch.tensor(terms), where), layout


def _figure(cfg, snap, grid, layout: Layout, vmax) -> bytes:
    panels = grid.shape[0]
    fig, axes = plt.subplots(1, panels, figsize=(max(3.0 * panels + 0.8, 5.5), 3.4), squeeze=False)
    title = "Phi(s)" if panels == 1 else "F(s, a, s')"
    for k, ax in enumerate(axes[0]):
        image = ax.imshow(np.ma.masked_invalid(grid[k]), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        walls = np.ma.masked_where(~layout.walls, np.ones_like(grid[k]))
        ax.imshow(walls, cmap="Greys", vmin=0, vmax=1.5)
        if layout.goal is not None:
            ax.plot(layout.goal[1], layout.goal[0], "*", color="gold", ms=14, mec="k")
        ax.plot(layout.start[1], layout.start[0], "o", color="k", ms=6)
        ax.set_title(title if panels == 1 else f"action {layout.actions[k]}", fontsize=9)
        ax.set_xticks([]), ax.set_yticks([])
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(f"{cfg.env_id} learned shaping, step {snap['global_step']:,} (weight {snap['weight']:.2f})",
                 fontsize=10)
    return png_bytes(fig, dpi=90)


def plot_reward_map(run_path, out_dir=None) -> Path:
    cfg, snapshots, maps, layout = reward_maps(run_path)
    out = check_writable(Path(out_dir) if out_dir else Path(run_path) / "reward_map", "--out", directory=True)
    vmax = max(float(np.nanmax(np.abs(m))) for m in maps) or 1e-6  # one colour scale across training
    files = {f"step_{snap['global_step']:09d}.png": _figure(cfg, snap, grid, layout, vmax)
             for snap, grid in zip(snapshots, maps)}
    files["reward_map.gif"] = gif_bytes(list(files.values()), ms_per_frame=700)
    return write_files(out, files)
