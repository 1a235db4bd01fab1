"""The trainer's facility "a signal may ask for a value head on its own reward stream, with its
own gamma and episodic flag" (issue 15 item 5; RND's two value heads, Burda et al. 2018 and
CleanRL's ppo_rnd_envpool.py).

A signal declares its streams once, after bind (`Signal.reward_streams()`: name, gamma,
episodic, coef), and gives each stream's (T, N) rewards in every `after_advantages`
(`SignalOutput.streams`). For each stream the PPO trainer keeps a value head of the critic's
shape, with CleanRL's init and its own weights drawn from a generator derived from the run's
seed (so the trainer's random stream is untouched). Where the head sits is `stream_heads`:

* `shared` (what `auto` picks under a CNN policy): on the policy's CNN trunk, as CleanRL's
  ppo_rnd_envpool.py puts `critic_int` beside `critic_ext`: the critic's head shape (a linear
  layer on the Nature CNN's 512 units; the `hidden_sizes` MLP above the small MiniGrid CNN)
  reading the trunk's output. Collection keeps each step's trunk output from the pass that
  picks its action, and the stream's value loss trains the trunk too.
* `separate` (what `auto` picks under an MLP policy, whose actor and critic have no common
  trunk, as CleanRL's ppo.py): a network of its own on the observation, an MLP of the critic's
  shape, or under a CNN policy a second CNN actor-critic of the policy's kind whose critic is
  used (what every run before `stream_heads` did).

Each iteration:

1. V_s over the rollout with the head as it was during collection (as CleanRL records the
   intrinsic values while collecting);
2. GAE under the stream's gamma and the trainer's lambda. An episodic stream treats episode
   ends as the extrinsic one does (a termination drops the bootstrap, a truncation
   bootstraps from V_s of the final observation); a non-episodic one ignores them: its
   returns run on into the next episode's first state, as RND's intrinsic returns do;
3. the policy's advantage becomes extrinsic_coef * A_ext + sum_s coef_s * A_s;
4. in the update, each head's loss 0.5 * (V_s - R_s)^2 (unclipped, as CleanRL's intrinsic
   value loss) is added with vf_coef, and the heads' gradients join the policy's global
   grad-norm clip; one Adam (the policy's, a second parameter group) steps them.

A run whose signals declare no stream builds none of this: its weights are the plain trainer's.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

from reflectrl.estimators import compute_gae
from reflectrl.nets import flatten_parameters
from reflectrl.signals.base import RewardStream, Signal
from reflectrl.trainers.cnn import make_policy
from reflectrl.trainers.policies import _forward, mlp


class ValueStreams:
    def __init__(self, signal: Signal, obs_shape: tuple[int, ...], hidden_sizes, seed: int, gae_lambda: float,
                 encoder: str = "mlp", trunk: tuple[int, tuple[int, ...]] | None = None, estimator=None):
        """`trunk`: (its output width, the critic's hidden widths above it) to put the heads on
        the policy's shared trunk; None for heads with networks of their own. `estimator`:
        estimator(rewards, values, next_values, terminations, truncations, gamma) -> (advantages,
        returns), the trainer's (IMPALA's V-trace); None: GAE under the trainer's lambda."""
        self.estimator = estimator
        self.streams: list[RewardStream] = list(signal.reward_streams())
        self.extrinsic_coef = float(signal.extrinsic_coef)
        obs_dim = int(math.prod(obs_shape))
        self.shared = trunk is not None
        self.cnn = encoder == "cnn" and not self.shared
        self.gae_lambda = gae_lambda
        digest = hashlib.sha256(f"value_streams:{seed}".encode()).digest()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
            if self.shared:
                width, widths = trunk
                self.heads = nn.ModuleDict({s.name: mlp(width, tuple(widths), 1, out_std=1.0) for s in self.streams})
            elif self.cnn:
                self.heads = nn.ModuleDict({s.name: make_policy(tuple(obs_shape), 1, False, encoder, hidden_sizes)
                                            for s in self.streams})
            else:
                self.heads = nn.ModuleDict({s.name: mlp(obs_dim, tuple(hidden_sizes), 1, out_std=1.0)
                                            for s in self.streams})
        self.flat = flatten_parameters(self.heads)
        self.returns: dict[str, torch.Tensor] = {}
        self.advantages_of: dict[str, torch.Tensor] = {}
        self.losses: dict[str, float] = {}

    def value(self, name: str, obs: torch.Tensor) -> torch.Tensor:
        """V_s of observations, or with shared heads of the policy trunk's outputs."""
        if self.cnn:
            return self.heads[name].value(obs)
        return _forward(self.heads[name], obs).squeeze(-1)

    def weights(self) -> dict[str, float]:
        """Each stream's weight relative to the extrinsic advantage's, coef_s / extrinsic_coef:
        the policy's advantage is extrinsic_coef x (A_ext + sum_s weight_s A_s)."""
        if self.extrinsic_coef == 0:  # an intrinsic-only policy (rnd.ext_coef=0): the streams' own coefs
            return {s.name: s.coef for s in self.streams}
        return {s.name: s.coef / self.extrinsic_coef for s in self.streams}

    @torch.no_grad()
    def rollout_values(self, rollout) -> dict[str, tuple[torch.Tensor, torch.Tensor, bool]]:
        """{stream: (V_s, V_s of the state each step reached, episodic)} over the rollout, (T, N) each,
        with the heads as they were during collection (computed once per rollout)."""
        cached = getattr(rollout, "stream_values", None)
        if cached is not None:
            return cached
        T, N = rollout.terminations.shape
        out = {}
        for s in self.streams:
            truncated = rollout.truncated_final if s.episodic else None
            if self.shared:  # the trunk's outputs of every step, the last observation and the truncated finals
                n = T * N + N + (len(truncated[0]) if truncated is not None else 0)
                inputs = [rollout.trunk[:n]]
            else:
                inputs = [rollout.obs.reshape(T * N, -1), rollout.last_obs.reshape(N, -1)]
                if truncated is not None:
                    inputs.append(truncated[1].reshape(len(truncated[0]), -1))
            v = self.value(s.name, torch.cat(inputs))
            values = v[:T * N].reshape(T, N)
            next_values = torch.empty_like(values)
            next_values[:-1] = values[1:]
            next_values[-1] = v[T * N:T * N + N]
            if s.episodic:
                for k, (t, i) in enumerate(truncated[0] if truncated is not None else []):
                    next_values[t, i] = v[T * N + N + k]
            out[s.name] = (values, next_values, s.episodic)
        rollout.stream_values = out
        return out

    @torch.no_grad()
    def advantages(self, rollout, stream_rewards: dict, extrinsic: torch.Tensor) -> torch.Tensor:
        """The policy's combined advantage; keeps each stream's returns for the update and its
        advantage in `self.advantages_of` (what shaping's distill=total adds to its labels)."""
        missing = [s.name for s in self.streams if s.name not in stream_rewards]
        if missing:
            raise RuntimeError(f"the signal declared reward streams {missing} but gave no rewards for them")
        combined = extrinsic if self.extrinsic_coef == 1.0 else self.extrinsic_coef * extrinsic
        values_of = self.rollout_values(rollout)
        self.advantages_of = {}
        for s in self.streams:
            values, next_values, _ = values_of[s.name]
            if s.episodic:
                terms, truncs = rollout.terminations, rollout.truncations
            else:
                terms = truncs = torch.zeros_like(rollout.terminations)
            if self.estimator is not None:
                adv, self.returns[s.name] = self.estimator(stream_rewards[s.name].float(), values, next_values,
                                                           terms, truncs, s.gamma)
            else:
                adv, self.returns[s.name] = compute_gae(stream_rewards[s.name].float(), values, next_values, terms,
                                                        truncs, s.gamma, self.gae_lambda)
            self.returns[s.name] = self.returns[s.name].reshape(-1)
            self.advantages_of[s.name] = adv
            combined = combined + s.coef * adv
        return combined

    def value_loss(self, obs: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """The heads' loss on minibatch rows `idx`: `obs` are the rows' observations, or with
        shared heads the policy trunk's outputs on them (from the update's forward pass)."""
        total = 0.0
        for s in self.streams:
            loss = 0.5 * (self.value(s.name, obs) - self.returns[s.name][idx]).square().mean()
            self.losses[s.name] = loss.detach()
            total = total + loss
        return total

    def global_norm(self, policy_grad: torch.Tensor) -> torch.Tensor:
        """The grad norm over the policy's and the heads' gradients together."""
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(policy_grad),
                                                     torch.linalg.vector_norm(self.flat.grad)]))

    def metrics(self) -> dict:
        return {f"{name}_value_loss": float(loss) for name, loss in self.losses.items()}

    def state_dict(self) -> dict:
        return self.heads.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.heads.load_state_dict(state)
