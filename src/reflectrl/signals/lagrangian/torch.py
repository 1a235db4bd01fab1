"""PPO-Lagrangian (`--algo ppo_lag` = `ppo+lagrangian`): the constrained-RL baseline users know,
as OmniSafe's PPOLag (Ray, Achiam & Amodei 2019, "Benchmarking Safe Exploration"; OmniSafe's
`algorithms/on_policy/naive_lagrange/ppo_lag.py` and `common/lagrange.py`). It keeps the
expected episode cost J_c (the env's cost channel, info["cost"]: envs/cost.py) below the run's
`cost_limit` (`--set cost_limit=25`) with a Lagrange multiplier lambda >= 0:

1. a cost critic V_c (cost_critic.py) gives the cost advantages A_c by GAE under the trainer's
   gamma and lambda;
2. lambda is updated once per iteration by Adam (lr `lambda_lr`) on the loss -lambda (J_c - limit),
   i.e. it grows while the episodes cost more than the limit and shrinks (to 0, then stays) while
   they cost less; J_c is the mean cost of the episodes that ended in this rollout; then it is
   clipped to [0, lambda_max];
3. the policy's advantage becomes (A_r - lambda A_c) / (1 + lambda), with A_r standardised and A_c
   centred first (OmniSafe's buffer does both);
4. V_c is fit to the cost returns (`critic_epochs` epochs of minibatch MSE).

DECISIONs. An iteration in which no episode ended (a rollout shorter than an episode) leaves
lambda as it is: J_c is measured on finished episodes only, as OmniSafe's epoch statistics.
While lambda is exactly 0 the advantage is left as the trainer made it (PPO standardises its
minibatches' advantages anyway), so `lambda_max=0` runs PPO bit for bit.

Metrics: lagrange_multiplier, lagrangian_episode_cost (the J_c of the update), cost_value_loss,
and the trainer's episode_cost / cost_limit_violations.
"""

from __future__ import annotations

import torch

from reflectrl.signals._cost_critic import CostCritic
from reflectrl.signals.base import Batch, Signal, SignalContext, SignalOutput
from reflectrl.signals.lagrangian import SPEC, LagrangianConfig


def cost_rows(signal: Signal, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """What a cost critic reads of s and s' of each step, (T*N, d) each: the observations, or on
    images read by the policy's CNN the policy's features of them."""
    n = batch.values.numel()
    obs, next_obs = batch.obs.reshape(n, *batch.obs.shape[2:]), batch.next_obs.reshape(n, *batch.obs.shape[2:])
    if signal.ctx.image_obs:
        with torch.no_grad():
            return batch.features_fn(obs), batch.features_fn(next_obs)
    return obs.reshape(n, -1), next_obs.reshape(n, -1)


class Lagrangian(Signal):
    name = "lagrangian"

    def __init__(self, cfg: LagrangianConfig):
        self.built_from(cfg, SPEC)
        self.cfg = cfg
        self._last: dict = {}

    def bind(self, ctx: SignalContext) -> None:
        super().bind(ctx)
        with self.own_rng():
            in_dim = ctx.feature_dim if ctx.image_obs else ctx.obs_dim
            self.critic = CostCritic(in_dim, self.cfg.hidden_sizes, self.cfg.critic_lr_multiplier * ctx.learning_rate)
        self.multiplier = torch.nn.Parameter(torch.tensor(min(float(self.cfg.lambda_init), self.cfg.lambda_max)))
        self.lambda_optimizer = torch.optim.Adam([self.multiplier], lr=self.cfg.lambda_lr)

    @property
    def penalty(self) -> float:
        return float(self.multiplier.detach().clamp(min=0.0))

    def update_multiplier(self, episode_cost: float) -> None:
        """One Adam step on -lambda (J_c - cost_limit), then lambda clipped to [0, lambda_max]."""
        self.lambda_optimizer.zero_grad()
        loss = -self.multiplier * (episode_cost - self.ctx.cost_limit)
        loss.backward()
        self.lambda_optimizer.step()
        with torch.no_grad():
            self.multiplier.clamp_(0.0, self.cfg.lambda_max)

    def after_advantages(self, batch: Batch) -> SignalOutput | None:
        x, next_x = cost_rows(self, batch)
        adv_c, returns_c = self.critic.estimate(batch.gae, batch.costs, x, next_x, batch.terminations,
                                                batch.truncations)
        if batch.episode_costs:
            episode_cost = sum(batch.episode_costs) / len(batch.episode_costs)
            self.update_multiplier(episode_cost)
            self._last["lagrangian_episode_cost"] = episode_cost
        self.critic.fit(x, returns_c, epochs=self.cfg.critic_epochs, minibatch_size=self.cfg.critic_minibatch_size,
                        generator=self.generator)
        lam = self.penalty
        self._last.update(lagrange_multiplier=lam, cost_value_loss=self.critic.last_loss,
                          cost_advantage_mean=float(adv_c.mean()))
        if lam == 0.0:
            return None
        adv_r = batch.advantages
        adv_r = (adv_r - adv_r.mean()) / (adv_r.std() + 1e-8)
        combined = (adv_r - lam * (adv_c - adv_c.mean())) / (1.0 + lam)
        return SignalOutput(advantage=combined - batch.advantages)

    def metrics(self) -> dict:
        return dict(self._last)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "critic": self.critic.state_dict(), "multiplier": self.multiplier.detach(),
                "lambda_optimizer": self.lambda_optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.critic.load_state_dict(state["critic"])
        with torch.no_grad():
            self.multiplier.copy_(state["multiplier"])
        self.lambda_optimizer.load_state_dict(state["lambda_optimizer"])
