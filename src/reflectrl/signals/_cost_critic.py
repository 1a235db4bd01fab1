"""The constraint critic (seed 002 section 6.3): V_c(s), the expected discounted cost-to-go of
the env's cost channel (Batch.costs, info["cost"]) under the current policy, as OmniSafe's
cost critic. The signals that need it own one each: the Lagrangian baseline (`ppo_lag`) and
shaping's safety term (`shaping.safety_beta`).

Each fit: TD(lambda) returns of the costs, bootstrapped with V_c as it is, made by the trainer's
own estimator (`Batch.gae`: GAE's recursion, episode ends as the trainer treats them: a
termination drops the bootstrap, a truncation bootstraps from V_c of the final observation,
which `next_obs` holds), then `epochs` epochs of minibatch MSE (fit.py's HeadFitter). On image
observations read by the policy's CNN, V_c reads the policy's features, as the other heads.
"""

from __future__ import annotations

import torch

from reflectrl.nets import relu_mlp
from reflectrl.signals.fit import HeadFitter, predict_in_chunks


class CostCritic:
    def __init__(self, in_dim: int, hidden_sizes, lr: float):
        self.net = relu_mlp(in_dim, hidden_sizes, near_zero_output=False)
        self.fitter = HeadFitter(self.net, lr=lr)
        self.last_loss: float | None = None

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """V_c of each row of x (observations, or the policy's features of them), flat."""
        with torch.no_grad():
            return predict_in_chunks(lambda p: self.net(p[0]).squeeze(-1), (x,))

    def estimate(self, gae, costs, x, next_x, terminations, truncations):
        """(advantages, returns) of the (T, N) costs under V_c as it is; x, next_x: (T*N, d) rows of s and s'."""
        shape = costs.shape
        values, next_values = self.values(x).reshape(shape), self.values(next_x).reshape(shape)
        return gae(costs.float(), values, next_values, terminations, truncations)

    def fit(self, x: torch.Tensor, returns: torch.Tensor, *, epochs: int, minibatch_size: int,
            generator: torch.Generator) -> float:
        self.last_loss = self.fitter.fit(x, returns.reshape(-1), epochs=epochs, minibatch_size=minibatch_size,
                                         generator=generator, shuffle="always", loss_after=True).loss_after
        return self.last_loss

    def state_dict(self) -> dict:
        return self.fitter.state_dict(head_key="net")

    def load_state_dict(self, state: dict) -> None:
        self.fitter.load_state_dict(state, head_key="net")
