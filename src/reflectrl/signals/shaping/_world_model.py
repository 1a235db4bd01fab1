"""A learned world model for imagination distillation (seed 002 section 6.2: "the agent learns a
world model M that predicts state transitions and rewards ... rolls out virtual trajectories
from the current states with the current policy ... evaluates them with the value function ...
and trains F on these imagined advantages").

`WorldModel` is an ensemble of small MLPs on vector observations (MBPO, Janner et al. 2019:
an ensemble, each member trained on its own bootstrap of the data, one member drawn per
imagined step). Each member maps (s, a) to (s' - s, r, logit of termination), trained by
MSE on the observation delta and the reward (inputs and targets standardised by the
buffer's running statistics) plus a binary cross-entropy on termination, with Adam.

`imagine` branches `horizon`-step rollouts from real states with the current policy
(`Batch.act_fn`); `imagined_advantages` values them with the critic (`Batch.value_fn`) and
turns them into GAE advantages with the trainer's estimator: a predicted termination drops
the bootstrap and ends the rollout (later steps are masked out), and the last imagined
state is bootstrapped from V. The shaper (shaping.py, `imagined_fraction`) then fits its
soft labels on real and imagined transitions together, each source's labels normalised on
its own (shaping.py, distillation_set).

DECISIONs. Imagined states are clipped to the range of the observations seen (a model that
extrapolates does not feed the critic states it has never valued); a coordinate that never
varied in the data is not standardised. Observations that are images are refused (the seed's model predicts states; on
pixels that is a video model, out of scope). The model trains on the last `buffer` real
transitions (a FIFO), `steps` minibatch steps per fit for each member; its held-out error is
measured on the newest rollout before the model has seen it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from reflectrl.nets import mlp


class WorldModel:
    def __init__(self, obs_dim: int, action_dim: int, *, ensemble: int, hidden_sizes, lr: float, buffer: int):
        self.obs_dim, self.action_dim, self.capacity = obs_dim, action_dim, buffer
        # SiLU MLPs with PyTorch's default init
        self.members = nn.ModuleList([mlp(obs_dim + action_dim, hidden_sizes, obs_dim + 2, activation=nn.SiLU)
                                      for _ in range(ensemble)])
        self.optimizer = torch.optim.Adam(self.members.parameters(), lr=lr)
        self.data: dict[str, torch.Tensor] = {}
        self.stats: dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ data

    def add(self, obs, actions, next_obs, rewards, terminations) -> None:
        """Append real transitions (flat rows) to the model's FIFO buffer."""
        new = {"x": torch.cat([obs, actions], 1), "delta": next_obs - obs, "reward": rewards.reshape(-1).float(),
               "done": terminations.reshape(-1).float()}
        for key, value in new.items():
            self.data[key] = torch.cat([self.data[key], value])[-self.capacity:] if key in self.data else value

    def _normalise(self) -> None:
        for key in ("x", "delta", "reward"):
            std = self.data[key].std(0)
            # a coordinate that never varied (a one-hot cell never visited) is left unscaled
            self.stats[key] = (self.data[key].mean(0), torch.where(std < 1e-3, torch.ones_like(std), std))
        obs = self.data["x"][:, :self.obs_dim]
        self.stats["bounds"] = (torch.minimum(obs.min(0).values, (obs + self.data["delta"]).min(0).values),
                                torch.maximum(obs.max(0).values, (obs + self.data["delta"]).max(0).values))

    def _predict(self, member: nn.Module, x: torch.Tensor):
        mean, std = self.stats["x"]
        out = member((x - mean) / std)
        return out[:, :self.obs_dim], out[:, self.obs_dim], out[:, self.obs_dim + 1]

    def _losses(self, member, x, delta, reward, done) -> tuple[torch.Tensor, torch.Tensor]:
        d_hat, r_hat, logit = self._predict(member, x)
        (dm, ds), (rm, rs) = self.stats["delta"], self.stats["reward"]
        mse = ((d_hat - (delta - dm) / ds).square().mean(1) + (r_hat - (reward - rm) / rs).square()).mean()
        return mse, F.binary_cross_entropy_with_logits(logit, done)

    # ------------------------------------------------------------------ fit

    def heldout_error(self, obs, actions, next_obs, rewards) -> tuple[float, float]:
        """The ensemble mean's MSE on transitions it has not been fit on: of s' (raw units) and of r."""
        if not self.stats:
            return float("nan"), float("nan")
        with torch.no_grad():
            x = torch.cat([obs, actions], 1)
            preds = [self.step(x, m) for m in range(len(self.members))]
            next_hat = torch.stack([p[0] for p in preds]).mean(0)
            r_hat = torch.stack([p[1] for p in preds]).mean(0)
        return float((next_hat - next_obs).square().mean()), float((r_hat - rewards.reshape(-1)).square().mean())

    def fit(self, steps: int, minibatch_size: int, generator: torch.Generator) -> float:
        """`steps` Adam steps, each member on its own bootstrap minibatch; returns the last loss."""
        self._normalise()
        n = len(self.data["x"])
        loss = torch.zeros(())
        for _ in range(steps):
            total = 0.0
            for member in self.members:
                idx = torch.randint(n, (min(minibatch_size, n),), generator=generator)
                mse, bce = self._losses(member, *(self.data[k][idx] for k in ("x", "delta", "reward", "done")))
                total = total + mse + bce
            self.optimizer.zero_grad()
            total.backward()
            self.optimizer.step()
            loss = total.detach() / len(self.members)
        return float(loss)

    # ------------------------------------------------------------------ imagine

    def step(self, x: torch.Tensor, member: int):
        """One member's prediction for rows x = [s, a]: (s', r, P(termination)), raw units."""
        d_hat, r_hat, logit = self._predict(self.members[member], x)
        (dm, ds), (rm, rs) = self.stats["delta"], self.stats["reward"]
        low, high = self.stats["bounds"]
        next_obs = torch.maximum(torch.minimum(x[:, :self.obs_dim] + d_hat * ds + dm, high), low)
        return next_obs, r_hat * rs + rm, torch.sigmoid(logit)

    @torch.no_grad()
    def imagine(self, start: torch.Tensor, act_fn, encode_actions, horizon: int, generator: torch.Generator) -> dict:
        """(horizon, M) imagined steps from the M real states `start` under the current policy."""
        obs, out = start, {k: [] for k in ("obs", "actions", "raw_actions", "next_obs", "rewards", "terminations")}
        for _ in range(horizon):
            raw = act_fn(obs, generator)
            actions = encode_actions(raw)
            member = int(torch.randint(len(self.members), (1,), generator=generator))
            next_obs, reward, p_done = self.step(torch.cat([obs, actions], 1), member)
            for key, value in (("obs", obs), ("actions", actions), ("raw_actions", raw), ("next_obs", next_obs),
                               ("rewards", reward), ("terminations", p_done > 0.5)):
                out[key].append(value)
            obs = next_obs
        return {k: torch.stack(v) for k, v in out.items()}

    def state_dict(self) -> dict:
        return {"members": self.members.state_dict(), "optimizer": self.optimizer.state_dict(), "data": self.data,
                "stats": self.stats}

    def load_state_dict(self, state: dict) -> None:
        self.members.load_state_dict(state["members"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.data, self.stats = state["data"], state["stats"]


def imagined_advantages(rollout: dict, value_fn, gae) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages of an imagined rollout under the critic, and the (H, M) mask of its steps that
    come before (or at) its first predicted termination."""
    H, M = rollout["rewards"].shape
    with torch.no_grad():
        values = value_fn(rollout["obs"].reshape(H * M, -1)).reshape(H, M)
        next_values = value_fn(rollout["next_obs"].reshape(H * M, -1)).reshape(H, M)
    terms = rollout["terminations"]
    ended_before = torch.cumsum(terms.long(), 0) - terms.long()  # terminations strictly before step k
    alive = ended_before == 0
    adv, _ = gae(rollout["rewards"], values, next_values, terms, torch.zeros_like(terms))
    return adv, alive
