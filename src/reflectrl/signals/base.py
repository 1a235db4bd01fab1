"""The protocol between trainers and signals.

A trainer calls its signal at fixed points of each iteration, and knows nothing else of it:

    collect a rollout
    extra = signal.shape_rewards(batch)        # before advantages: a reward term, or None
    estimate advantages on rewards (+ extra)
    out = signal.after_advantages(batch)       # a reward term (then advantages are
                                               # recomputed if out.recompute), or an
                                               # additive advantage term, or per-step weights,
                                               # or the rewards of its own reward streams
                                               # (RewardStream: a value head each, own gamma)
    policy update (loss uses weights * advantages; adds signal.auxiliary_loss(...) if any)
    signal.after_update(batch)                 # fit heads that need the updated critic
    log signal.metrics()

The hooks around the estimate are called in one place, signals/apply.py's `apply_signals`: every trainer
of reflectrl calls it, and so does signals/standalone.py, which runs a signal in anyone's training loop
(`reflectrl.signals.make`).

A replay trainer (DQN, SAC: step kind "transition") calls the same hooks at every gradient
step on the minibatch it sampled from its replay buffer, as a Batch of shape (1, B): `values`
are V(s), `next_values` the bootstrap values of s', `advantages` Q(s, a) - V(s), `returns` the
TD targets, `td_error_fn` its TD errors of any transitions under its current networks. The
reward terms a signal gives (shape_rewards, after_advantages) join the sampled rewards in the
TD target at learning time, and weights multiply each transition's TD loss; an advantage term
or a reward stream has no meaning there (the registry refuses such signals). See
trainers/replay/base.py.

Tensors in a `Batch` are time-major, (T, N, ...): T steps of N envs (the PPO trainer), or
the L token positions of N sequences, or the K agent turns of N episodes (the LLM
trainer). `features` are whatever the trainer's policy computes per step (the actor's
hidden layer, an LM's hidden state). An LLM batch also carries `mask` (which entries are
real steps: completion tokens, not prompt, tool output or padding; signals ignore the
rest) and `groups` (the prompt each sequence answers: GRPO's groups).

Randomness: a signal draws from its own `torch.Generator` (seeded from the run's seed and
the signal's name) and builds its networks under `torch.random.fork_rng`, so adding a
signal whose strength is zero leaves the trainer's random stream, and therefore its
weights, bit-identical to the plain trainer's.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from reflectrl.config import (  # noqa: F401 (a signal's knobs checked once: in config.py, still importable here)
    checked_once,
    passed,
    remember_valid,
    validate_once,
)
from reflectrl.runs.state_samples import snapshot_iterations


@dataclass
class SignalContext:
    """What a signal may know about the trainer it is plugged into, given once at bind time."""

    obs_dim: int
    action_dim: int          # number of discrete actions, or the Box dimension
    discrete: bool
    feature_dim: int         # width of `Batch.features`
    learning_rate: float     # the policy's base learning rate
    gamma: float
    gae_lambda: float
    seed: int
    total_iterations: int
    obs_shape: tuple[int, ...] = ()  # one observation's shape ((obs_dim,) for a flat vector)
    image_obs: bool = False  # images read by the policy's CNN: heads read `features` by default
    cost_limit: float = 25.0  # the run's limit on the expected episode cost (RunConfig.cost_limit)


@dataclass
class Batch:
    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor            # the rewards the trainer learns from (env reward, as wrapped/normalised)
    terminations: torch.Tensor
    truncations: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    features: torch.Tensor | None = None
    next_obs: torch.Tensor | None = None  # observation after each step (the final one where an episode ended)
    iteration: int = 0
    global_step: int = 0
    # recompute advantages and returns for a given reward tensor (the trainer's estimator)
    estimate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None
    # the trainer's critic (after the update, in after_update) and its advantage estimator,
    # gae(rewards, values, next_values, terminations, truncations) -> (advantages, returns)
    value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    gae: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    # the policy's features (as `features`) of any observations, without gradients: what a head
    # reads in place of an image observation (shaping's s and s' on pixels)
    features_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    mask: torch.Tensor | None = None    # bool (T, N): real steps; None means all are
    groups: torch.Tensor | None = None  # int (T, N): the group of each step's trajectory; None means one group
    # int64 (T, N) exploration state keys (envs/statekey.py) of obs[t] and of the state step t
    # reached (the episode's last where it ended); filled by a trainer that provides "state_keys"
    state_keys: torch.Tensor | None = None
    next_state_keys: torch.Tensor | None = None
    # a replay trainer's TD errors of transitions under its current networks,
    # td_error_fn(obs, actions, rewards, next_obs, terminations) -> (B,): what shaping distils there
    td_error_fn: Callable[..., torch.Tensor] | None = None
    # what a language-model agent stated about its work (a turn batch on a task with reflect=...):
    # reflections[i][k] lists the Reflections (llm/tasks/reflect.py) episode i stated in turn k;
    # outcomes (K, N): 1.0 where episode i was solved (on each of its turns), else 0
    reflections: list | None = None
    outcomes: torch.Tensor | None = None
    # int64 (N,) the env slot each column's steps come from, where columns are not the same envs
    # from one batch to the next (IMPALA's batches mix actors); None: column i is env i throughout
    env_ids: torch.Tensor | None = None
    # a language-model trainer's teacher pass (a trainer that provides "teacher"):
    # teacher_fn(refresh, reference) -> (student, teacher), each (T, N, V) log-softmax over the
    # vocabulary at the token steps: the policy's own distributions, and the distributions of
    # the policy (refresh=0) or of a copy frozen every `refresh` steps that reads the task's
    # reference ("solution" or "answer") between the prompt and the completion
    teacher_fn: Callable[[int, str], tuple[torch.Tensor, torch.Tensor]] | None = None
    # (T, N) the env's cost of each step (info["cost"], envs/cost.py), filled by a trainer that provides
    # "costs"; `episode_costs`: the costs of the episodes that ended in this rollout
    costs: torch.Tensor | None = None
    episode_costs: list | None = None
    # the current policy's sampled actions for any observations, act_fn(obs, generator) -> actions,
    # filled by a trainer that provides "policy" (imagined rollouts: shaping's imagined_fraction)
    act_fn: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    # a multi-agent trainer's team (a trainer that provides "team"; columns are agents): the team's reward
    # (every agent's summed) in each agent's column, (T, N), and the team's value of any column observations
    team_rewards: torch.Tensor | None = None
    team_value_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    # the run's reward streams (signals with a value head of their own: RND), filled by a trainer that
    # keeps them: `stream_weights` {stream: coef_s / extrinsic_coef}; `stream_values()` {stream: (V_s,
    # V_s of the state reached, episodic)} (T, N) under the heads that acted; `stream_rewards` {stream:
    # (T, N) rewards} as the stack's members give them (a member sees those of the members before it);
    # `stream_advantages` {stream: A_s} as the policy used them, set before after_update
    stream_weights: dict | None = None
    stream_values: Callable[[], dict] | None = None
    stream_rewards: dict | None = None
    stream_advantages: dict | None = None


@dataclass(frozen=True)
class RewardStream:
    """A reward stream learnt beside the extrinsic one, with its own value head (a trainer
    that provides "value_stream"; RND's intrinsic reward). The trainer estimates the stream's
    advantages with GAE under its own `gamma` (non-`episodic`: episode ends do not cut its
    returns, as RND's intrinsic stream) and trains the head on its returns; the policy's
    advantage is `extrinsic_coef * A_ext + sum(coef * A_stream)` (see Signal.extrinsic_coef)."""

    name: str               # the stream's key in SignalOutput.streams and in its metrics
    gamma: float
    episodic: bool = True
    coef: float = 1.0


@dataclass
class SignalOutput:
    reward: torch.Tensor | None = None      # added to the rewards
    recompute: bool = True                  # recompute advantages after adding `reward`
    advantage: torch.Tensor | None = None   # added to the advantages directly
    weights: torch.Tensor | None = None     # multiplies each step's advantage in the policy loss
    streams: dict = field(default_factory=dict)  # {RewardStream.name: (T, N) rewards} of the streams it declared
    metrics: dict = field(default_factory=dict)


def terms_from(name: str, reward: torch.Tensor | None = None,
               output: SignalOutput | None = None) -> dict[str, torch.Tensor]:
    """The per-step terms one signal gave: its reward terms (summed), advantage term,
    weights and reward streams, as {"NAME reward": ..., "NAME weight": ..., "NAME STREAM": ...}."""
    terms: dict[str, torch.Tensor] = {}
    if output is not None and output.reward is not None:
        reward = output.reward if reward is None else reward + output.reward
    if reward is not None:
        terms[f"{name} reward"] = reward
    if output is not None:
        if output.advantage is not None:
            terms[f"{name} advantage"] = output.advantage
        if output.weights is not None:
            terms[f"{name} weight"] = output.weights
        for stream, values in output.streams.items():
            terms[f"{name} {stream}"] = values
    return terms


def merge_terms(into: dict, terms: dict) -> dict:
    """Add `terms` to `into`: a reward term given twice (before and after advantages) sums."""
    for key, value in terms.items():
        into[key] = into[key] + value if key in into and key.endswith(" reward") else value
    return into


def scheduled(coef: float, schedule: str, until: float, step: int, total: int) -> float:
    """A coefficient over training: `constant`; `step`: coef before the fraction `until` of the
    `total` steps, 0 from it on; `linear`: from coef at step 0 down to 0 at `until`."""
    progress = step / max(total, 1)
    if schedule == "constant":
        return coef
    if schedule == "step":
        return coef if progress < until else 0.0
    return coef * max(0.0, 1.0 - progress / until) if until > 0 else 0.0


class Signal:
    """Base class: every hook is optional and does nothing by default.

    What a signal needs of its trainer (`wants`: names of registry.WANTS) is declared once, by
    its registry entry (SignalSpec.wants: a set, or a function of the signal's config), and is
    fixed when the signal is built: its constructor calls `self.built_from(config, spec)`
    (make_signal fixes it for a signal whose constructor does not). The `wants_*` flags the
    trainers read are read-only views of that one set."""

    name = "signal"
    _wants: frozenset = frozenset()  # a signal that declares nothing needs nothing

    def built_from(self, config, spec) -> None:
        """What a registered signal's constructor does first: check its knobs (once: a run's
        config check has usually done it) and fix what it needs, `spec.wants_for(config)`."""
        validate_once(config)
        self.fix_wants(spec.wants_for(config))

    def fix_wants(self, wants) -> None:
        """Fix what this signal needs of its trainer; once: a later call may only repeat it."""
        wants = frozenset(wants)
        if "_wants" in vars(self) and wants != self._wants:
            raise AttributeError(f"signal {self.name}: what it needs of its trainer is fixed when it is built "
                                 f"({sorted(self._wants)}); it cannot become {sorted(wants)}")
        self._wants = wants

    @property
    def wants(self) -> frozenset:
        """What it needs of its trainer (registry.WANTS), fixed when it was built."""
        return self._wants

    @property
    def wants_features(self) -> bool:
        """The trainer fills Batch.features."""
        return "features" in self._wants

    @property
    def wants_feature_grad(self) -> bool:
        """The trainer calls auxiliary_loss with features carrying gradients."""
        return "feature_grad" in self._wants

    @property
    def wants_next_obs(self) -> bool:
        """The trainer fills Batch.next_obs."""
        return "next_obs" in self._wants

    @property
    def wants_teacher(self) -> bool:
        """The trainer fills Batch.teacher_fn."""
        return "teacher" in self._wants

    def bind(self, ctx: SignalContext) -> None:
        self.ctx = ctx
        digest = hashlib.sha256(f"{self.name}:{ctx.seed}".encode()).digest()
        self.seed = int.from_bytes(digest[:8], "little") & (2**63 - 1)
        self.generator = torch.Generator().manual_seed(self.seed)

    @contextlib.contextmanager
    def own_rng(self):
        """Build networks from this signal's seed without touching the trainer's global RNG."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            yield

    def snapshot_iterations(self, k: int) -> list[int]:
        """k iterations evenly spaced from the first to the last, at which to keep a snapshot."""
        return snapshot_iterations(self.ctx.total_iterations, k)

    def encode_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """Actions as a (B, action_dim) float input: one-hot if discrete; (B, 0) when the
        trainer's steps have no separate action (an LLM turn: its hidden state says it all)."""
        if self.ctx.action_dim == 0:
            return actions.new_zeros((actions.numel(), 0), dtype=torch.float32)
        if self.ctx.discrete:
            return torch.nn.functional.one_hot(actions.reshape(-1).long(), self.ctx.action_dim).float()
        return actions.reshape(-1, self.ctx.action_dim).float()

    def reward_streams(self) -> list[RewardStream]:
        """The reward streams (each with its own value head) this signal, as bound, gives
        rewards for in every after_advantages; asked once, after bind."""
        return []

    def check_position(self, before: list[Signal], after: list[Signal]) -> None:
        """Refuse (UserError, one line) a run in which this signal lacks what it needs of the
        others written with it: `before` and `after` are the members written before and after
        it (empty for a lone signal). Called once, when the run's signals are built."""

    # the extrinsic advantage's weight in the policy's advantage while a reward stream is learnt
    extrinsic_coef = 1.0

    def shape_rewards(self, batch: Batch) -> torch.Tensor | None:
        return None

    def after_advantages(self, batch: Batch) -> SignalOutput | None:
        return None

    def auxiliary_loss(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor | None:
        return None

    def after_update(self, batch: Batch) -> None:
        return None

    def metrics(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
