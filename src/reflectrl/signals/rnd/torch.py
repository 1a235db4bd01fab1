"""Random Network Distillation (Burda et al. 2018, "Exploration by Random Network
Distillation"), as CleanRL's ppo_rnd_envpool.py does it (issue 15 item 5).

- A fixed, randomly initialised target network g and a predictor f trained to match it; the
  intrinsic reward of step t is the prediction error on the state it reached,
  r_int = ||f(x) - g(x)||^2 / 2, with x = clip((s' - mu) / sigma, -5, 5): the observation
  normalised by running statistics (per input; on pixels, per pixel of the last frame).
  DECISION: CleanRL initialises those statistics with 50 rollouts of random actions before
  training; a signal does not step the envs, so the first rollout initialises them (the
  initial policy is near-uniform, so that rollout is about as random).
- The reward is divided by the running std of the intrinsic returns: a forward filter
  R_t = gamma_int R_{t-1} + r_int,t per env, running over episode ends, whose values feed a
  running variance (`RewardForwardFilter` and `reward_rms` in CleanRL). The filter runs over
  time, as in Burda et al.'s code (CleanRL iterates over the transposed (T, N) buffer, i.e.
  over envs, which looks like a slip).
- The intrinsic reward is its own reward stream (signals/base.py RewardStream; the trainer's
  second value head, trainers/streams.py): non-episodic, gamma `int_gamma` (0.99), and the
  policy's advantage is ext_coef * A_ext + int_coef * A_int (2 and 1). The extrinsic gamma
  is the trainer's `gamma`; Burda et al. and CleanRL use 0.999 on Atari (set gamma=0.999 for
  a like-for-like run there; the Atari defaults are the trainer's).
- After each update the predictor is trained for `epochs` epochs of `num_minibatches`
  minibatches, each step on a random `update_proportion` (0.25) of the minibatch's rows, with
  its own Adam at `lr_multiplier` x the policy's (annealed as the policy's), its gradient
  norm clipped to `max_grad_norm`; then the observation statistics include the batch.
- Networks: for vector observations (and MiniGrid's symbolic view) MLPs, LeakyReLU trunks of
  `hidden_sizes`, the target ending in a linear `embedding_dim` layer, the predictor in two
  more ReLU layers (the shape of CleanRL's conv nets); for pixels (a CNN encoder on images of
  sides >= 36: Atari) CleanRL's conv nets on the last frame.

`schedule` (issue 42) decays the intrinsic reward over the run (linear or exponential,
signals/schedule.py): the stream's rewards are multiplied by the factor, so its value head
learns the decayed reward; `constant`, the default, leaves them as they are.

`int_coef=0` turns the intrinsic stream off (no second value head, no ext_coef scaling):
the run equals --algo ppo bit for bit, while the RND nets still train and log.
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium.wrappers import utils as gym_utils
from torch import nn
from torch.nn import functional as F

from reflectrl.nets import flatten_parameters, layer_init, mlp
from reflectrl.signals.base import Batch, RewardStream, Signal, SignalContext, SignalOutput
from reflectrl.signals.rnd import SPEC, RndConfig
from reflectrl.signals.schedule import factor_at

PIXEL_MIN_SIDE = 36  # images at least this big get CleanRL's conv nets (the Nature CNN's smallest input)


class RunningMeanStd(gym_utils.RunningMeanStd):
    """Gymnasium's running mean and variance (the parallel update of Chan et al.; mean 0, var
    1, count 1e-4 before any data), fed float64 and checkpointable."""

    def __init__(self, shape=()):
        super().__init__(shape=shape)

    def update(self, x: np.ndarray) -> None:
        super().update(np.asarray(x, np.float64))

    def state_dict(self) -> dict:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = state["mean"], state["var"], state["count"]


class RewardForwardFilter:
    """R_t = gamma R_{t-1} + r_t per env, carried across rollouts and episode ends."""

    def __init__(self, gamma: float):
        self.gamma = gamma
        self.rewems: np.ndarray | None = None  # column i is env i (PPO's rollouts)
        self.by_env: dict = {}                 # {env id: R} where batches name their envs (Batch.env_ids)

    def update(self, rewards: np.ndarray, env_ids: np.ndarray | None = None) -> np.ndarray:
        """(T, N) rewards -> (T, N) filtered values, in time order. With `env_ids` (N,), each
        column continues its env's R, columns in order (a later column of the same env after
        an earlier one)."""
        out = np.empty(rewards.shape, np.float64)
        if env_ids is not None:
            for j, env in enumerate(int(e) for e in env_ids):
                value = self.by_env.get(env)
                for t, r in enumerate(np.asarray(rewards[:, j], np.float64)):
                    value = r if value is None else value * self.gamma + r
                    out[t, j] = value
                self.by_env[env] = value
            return out
        for t, r in enumerate(np.asarray(rewards, np.float64)):
            self.rewems = r.copy() if self.rewems is None else self.rewems * self.gamma + r
            out[t] = self.rewems
        return out


def mlp_nets(in_dim: int, hidden_sizes, embedding_dim: int) -> tuple[nn.Module, nn.Module]:
    """(target, predictor) MLPs, LeakyReLU and orthogonally initialised (gain sqrt 2, bias 0):
    the predictor is the target's shape plus two ReLU layers."""
    target = mlp(in_dim, hidden_sizes, embedding_dim, activation=nn.LeakyReLU, init=layer_init)
    last = hidden_sizes[-1] if hidden_sizes else in_dim
    predictor = nn.Sequential(*mlp(in_dim, hidden_sizes, None, activation=nn.LeakyReLU, init=layer_init),
                              *mlp(last, (embedding_dim, embedding_dim), embedding_dim, init=layer_init))
    return target, predictor


def conv_nets(height: int, width: int) -> tuple[nn.Module, nn.Module]:
    """CleanRL's RND conv nets on one (1, H, W) frame; 512 outputs."""
    def trunk():
        return [layer_init(nn.Conv2d(1, 32, 8, stride=4)), nn.LeakyReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)), nn.LeakyReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)), nn.LeakyReLU(), nn.Flatten()]

    with torch.no_grad():
        flat = nn.Sequential(*trunk())(torch.zeros(1, 1, height, width)).shape[1]
    target = nn.Sequential(nn.Unflatten(1, (1, height, width)), *trunk(), *mlp(flat, (), 512, init=layer_init))
    predictor = nn.Sequential(nn.Unflatten(1, (1, height, width)), *trunk(),
                              *mlp(flat, (512, 512), 512, init=layer_init))
    return target, predictor


class RND(Signal):
    name = "rnd"

    def __init__(self, cfg: RndConfig):
        self.built_from(cfg, SPEC)
        self.cfg = cfg
        self._last: dict = {}
        self._train_obs: np.ndarray | None = None
        self.extrinsic_coef = cfg.ext_coef if cfg.int_coef > 0 else 1.0

    def bind(self, ctx: SignalContext) -> None:
        super().bind(ctx)
        shape = tuple(ctx.obs_shape) or (ctx.obs_dim,)
        self.frame = None  # (channel axis, index, H, W) of the last frame, for pixels
        if ctx.image_obs and len(shape) == 3 and min(sorted(shape)[1:]) >= PIXEL_MIN_SIDE:
            channels_last = shape[-1] <= 4 < shape[0]
            h, w = (shape[0], shape[1]) if channels_last else (shape[1], shape[2])
            self.frame = (2 if channels_last else 0, h, w)
            in_dim = h * w
        else:
            in_dim = ctx.obs_dim
        with self.own_rng():
            if self.frame is not None:
                self.target, self.predictor = conv_nets(self.frame[1], self.frame[2])
            else:
                self.target, self.predictor = mlp_nets(in_dim, self.cfg.hidden_sizes, self.cfg.embedding_dim)
        self.target.requires_grad_(False)
        self.obs_shape = shape
        # one flat parameter, one fused Adam and a one-tensor clip: most of a small net's step
        self.flat = flatten_parameters(self.predictor)
        self.optimizer = torch.optim.Adam([self.flat], lr=self.cfg.lr_multiplier * ctx.learning_rate, eps=1e-5,
                                          fused=True)
        self.obs_rms = RunningMeanStd(in_dim)
        self.reward_rms = RunningMeanStd()
        self.filter = RewardForwardFilter(self.cfg.int_gamma)
        self.initialised = False

    def reward_streams(self) -> list[RewardStream]:
        if self.cfg.int_coef == 0:
            return []
        return [RewardStream("rnd", gamma=self.cfg.int_gamma, episodic=False, coef=self.cfg.int_coef)]

    # -------------------------------------------------------------------------- pieces

    def inputs(self, obs: torch.Tensor) -> np.ndarray:
        """(B, in_dim) float64 rows the nets read, before normalisation (the last frame for pixels)."""
        x = obs.reshape(-1, *self.obs_shape)
        if self.frame is not None:
            x = x[..., -1] if self.frame[0] == 2 else x[:, -1]
        return x.reshape(x.shape[0], -1).double().numpy()

    def normalise(self, x: np.ndarray) -> torch.Tensor:
        z = (x - self.obs_rms.mean) / np.sqrt(self.obs_rms.var + 1e-8)
        return torch.from_numpy(np.clip(z, -self.cfg.obs_clip, self.cfg.obs_clip).astype(np.float32))

    @torch.no_grad()
    def prediction_error(self, z: torch.Tensor) -> torch.Tensor:
        """||f(z) - g(z)||^2 / 2 per row."""
        return (self.predictor(z) - self.target(z)).square().sum(-1) / 2

    def normalise_rewards(self, raw: np.ndarray, env_ids: np.ndarray | None = None) -> np.ndarray:
        """(T, N) raw errors divided by the running std of the forward-filtered returns."""
        filtered = self.filter.update(raw, env_ids)
        self.reward_rms.update_from_moments(filtered.mean(), filtered.var(), filtered.size)
        return raw / np.sqrt(self.reward_rms.var)

    # -------------------------------------------------------------------------- hooks

    def after_advantages(self, batch: Batch) -> SignalOutput | None:
        shape = batch.rewards.shape
        x = self.inputs(batch.next_obs)
        if not self.initialised:  # DECISION (module docstring): the first rollout initialises the statistics
            self.obs_rms.update(x)
            self.initialised = True
            first = True
        else:
            first = False
        raw = self.prediction_error(self.normalise(x)).double().numpy().reshape(shape)
        reward = self.normalise_rewards(raw, None if batch.env_ids is None else batch.env_ids.numpy())
        if not first:
            self.obs_rms.update(x)
        factor = factor_at(self.cfg, batch, self.ctx.total_iterations)
        if factor != 1.0:  # the decayed reward is what the intrinsic value head learns (schedule)
            reward = reward * factor
        self._train_obs = x
        self._last = {"rnd_intrinsic_mean": float(reward.mean()), "rnd_intrinsic_max": float(reward.max()),
                      "rnd_error_mean": float(raw.mean()), "rnd_return_std": float(np.sqrt(self.reward_rms.var)),
                      "rnd_schedule_factor": factor}
        if self.cfg.int_coef == 0:
            return None
        return SignalOutput(streams={"rnd": torch.from_numpy(reward.astype(np.float32))})

    def after_update(self, batch: Batch) -> None:
        self.train_predictor(self.normalise(self._train_obs), batch.iteration)

    def train_predictor(self, z: torch.Tensor, iteration: int) -> float:
        cfg = self.cfg
        frac = 1.0 - (iteration - 1.0) / max(1, self.ctx.total_iterations)
        self.optimizer.param_groups[0]["lr"] = frac * cfg.lr_multiplier * self.ctx.learning_rate
        n = z.shape[0]
        size = max(1, n // cfg.num_minibatches)
        with torch.no_grad():
            target = self.target(z)
        losses = []
        for _ in range(cfg.epochs):
            order = torch.randperm(n, generator=self.generator)
            for start in range(0, size * cfg.num_minibatches, size):
                idx = order[start:start + size]
                mask = torch.rand(len(idx), generator=self.generator) < cfg.update_proportion
                # CleanRL's (per_row * mask).sum() / max(mask.sum(), 1), on the chosen rows only:
                # the others' error would be computed and multiplied by 0
                rows = idx[mask] if bool(mask.any()) else idx[:0]
                per_row = F.mse_loss(self.predictor(z[rows]), target[rows], reduction="none").mean(-1)
                loss = per_row.sum() / max(len(rows), 1)
                self.flat.grad.zero_()
                loss.backward()
                nn.utils.clip_grad_norm_([self.flat], cfg.max_grad_norm)
                self.optimizer.step()
                losses.append(loss.detach())
        self._last["rnd_predictor_loss"] = float(torch.stack(losses).mean())
        return self._last["rnd_predictor_loss"]

    def metrics(self) -> dict:
        return dict(self._last)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "target": self.target.state_dict(), "predictor": self.predictor.state_dict(),
                "optimizer": self.optimizer.state_dict(), "obs_rms": self.obs_rms.state_dict(),
                "reward_rms": self.reward_rms.state_dict(), "rewems": self.filter.rewems,
                "rewems_by_env": self.filter.by_env, "initialised": self.initialised}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.target.load_state_dict(state["target"])
        self.predictor.load_state_dict(state["predictor"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.obs_rms.load_state_dict(state["obs_rms"])
        self.reward_rms.load_state_dict(state["reward_rms"])
        self.filter.rewems = state["rewems"]
        self.filter.by_env = state.get("rewems_by_env", {})
        self.initialised = state["initialised"]
