"""The learned reward map of an SDRS run on the built-in grid world (seed 002 section 7):
F(s, a, s') for every free cell and action (direct mode: one panel per action), or Phi(s)
per cell (potential mode), at the points of training the run kept, as PNGs and one
animated GIF.

MiniGrid is not drawn yet: its observation is an egocentric view, so drawing F per
position needs the env's full state at every position; see the SDRS issue's note."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from reflectrl.config import RunConfig  # noqa: E402
from reflectrl.errors import UserError  # noqa: E402
from reflectrl.runs import RunDir, atomic_write_bytes  # noqa: E402

ACTIONS = ("up", "right", "down", "left")


def _grid_env(cfg: RunConfig):
    from reflectrl.envs import make_env

    return make_env(cfg.env_id, env_kwargs=cfg.env).unwrapped


def reward_maps(run_path) -> tuple[RunConfig, list[dict], list[np.ndarray], object]:
    """(config, snapshots, one (actions or 1, size, size) array per snapshot, env)."""
    from reflectrl.signals.shaping import RewardShaper

    run = RunDir.open(run_path)
    cfg = RunConfig.from_dict(run.config())
    if cfg.algo != "sdrs":
        raise UserError(f"{run.path} is a '{cfg.algo}' run; the reward map needs --algo sdrs")
    if not cfg.env_id.startswith("reflectrl/GridWorld"):
        raise UserError(f"the reward map is drawn for reflectrl/GridWorld-v0 runs; {run.path} ran {cfg.env_id}")
    shaping = cfg.sections["shaping"]
    if shaping.mode == "off":
        raise UserError(f"{run.path} ran with shaping.mode=off: there is no reward to draw")
    snapshots = (run.load_checkpoint().get("signal") or {}).get("snapshots") or []
    if not snapshots:
        raise UserError(f"{run.path} kept no reward-map snapshots (shaping.map_snapshots=0?)")
    env = _grid_env(cfg)
    obs_dim, n_actions = env.observation_space.shape[0], env.action_space.n
    shaper = RewardShaper(obs_dim, n_actions, shaping.hidden_sizes, shaping.mode, shaping.eta,
                          cfg.ppo.gamma, shaping.hard_clip)
    cells = env.free_cells()
    maps = []
    for snap in snapshots:
        shaper.load_state_dict(snap["state"])
        if shaping.mode == "potential":
            grid = np.full((1, env.size, env.size), np.nan)
            obs = torch.as_tensor(np.stack([env.obs_for_cell(*c) for c in cells]), dtype=torch.float32)
            with torch.no_grad():
                phi = shaper.potential(obs).numpy()
            for (r, c), v in zip(cells, phi):
                grid[0, r, c] = v if (r, c) != env.goal else 0.0  # Phi(terminal) = 0
        else:
            grid = np.full((n_actions, env.size, env.size), np.nan)
            for a in range(n_actions):
                nxt = [env.next_cell(c, a) for c in cells]
                obs = torch.as_tensor(np.stack([env.obs_for_cell(*c) for c in cells]), dtype=torch.float32)
                next_obs = torch.as_tensor(np.stack([env.obs_for_cell(*c) for c in nxt]), dtype=torch.float32)
                terms = torch.tensor([n == env.goal for n in nxt])
                acts = torch.nn.functional.one_hot(torch.full((len(cells),), a), n_actions).float()
                with torch.no_grad():
                    f = shaper(obs, acts, next_obs, terms).numpy()
                for (r, c), v in zip(cells, f):
                    if (r, c) != env.goal:
                        grid[a, r, c] = v
        maps.append(grid)
    return cfg, snapshots, maps, env


def _figure(cfg, snap, grid, env, vmax) -> bytes:
    panels = grid.shape[0]
    fig, axes = plt.subplots(1, panels, figsize=(max(3.0 * panels + 0.8, 5.5), 3.4), squeeze=False)
    title = "Phi(s)" if panels == 1 else "F(s, a, s')"
    for k, ax in enumerate(axes[0]):
        image = ax.imshow(np.ma.masked_invalid(grid[k]), cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        walls = np.ma.masked_where(~env.walls, np.ones_like(grid[k]))
        ax.imshow(walls, cmap="Greys", vmin=0, vmax=1.5)
        ax.plot(env.goal[1], env.goal[0], "*", color="gold", ms=14, mec="k")
        ax.plot(env.start[1], env.start[0], "o", color="k", ms=6)
        ax.set_title(title if panels == 1 else f"action {ACTIONS[k]}", fontsize=9)
        ax.set_xticks([]), ax.set_yticks([])
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(f"{cfg.env_id} learned shaping, step {snap['global_step']:,} (weight {snap['weight']:.2f})",
                 fontsize=10)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def plot_reward_map(run_path, out_dir=None) -> Path:
    cfg, snapshots, maps, env = reward_maps(run_path)
    out = Path(out_dir) if out_dir else Path(run_path) / "reward_map"
    out.mkdir(parents=True, exist_ok=True)
    vmax = max(float(np.nanmax(np.abs(m))) for m in maps) or 1e-6  # one colour scale across training
    frames = []
    for snap, grid in zip(snapshots, maps):
        png = _figure(cfg, snap, grid, env, vmax)
        atomic_write_bytes(out / f"step_{snap['global_step']:09d}.png", png)
        frames.append(png)
    from PIL import Image

    images = [Image.open(io.BytesIO(p)).convert("RGB") for p in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:], duration=700, loop=0)
    atomic_write_bytes(out / "reward_map.gif", buf.getvalue())
    return out
