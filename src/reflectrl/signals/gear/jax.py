"""GEAR advantage reweighting on the JAX side (torch: signals/gear/torch.py; its docstring states the method).

After advantages: w_t = clip(exp((V_d(s_t) - V_orig(s_t)) / temperature), w_min, w_max) from the
head frozen after the previous distillation (w = 1 until the first; `diff_scale` standardises the
difference by default), optionally renormalised to mean 1 per trajectory, with the warm-up and
temperature ramp. After the update: the winners, the top `top_frac` of the batch's trajectories
by outcome (trajectories split at episode ends env by env; ties to the shorter, then the earlier),
their per-step returns (discounted reward-to-go bootstrapped where a trajectory stops without
terminating, or the trajectory's outcome), the head fit on them (`distill_on`), then the frozen
copy refreshed (a copy the first time, then a `target_ema` step).

The head reads the actor's features (`inputs` auto or features: what the torch signal reads on a
PPO run, whose trainer gives features) or the observation (`inputs=obs`). `history` > 0 and
`rank_groups` are torch-only. The torch trainer's `global_step` counts the rollout's steps
(the JAX Batch's does not): the schedule reads global_step + T x N, as torch does.

`advantage` and `select` (issue 42; torch reward_parts): per step, the extrinsic part is the
trainer's reward r, its critic's V and V' (today's); the intrinsic part the reward stream
(RND's), weighted k_s = coef / extrinsic_coef: k r_s, k V_s, k V'_s (the Batch's intrinsic_*,
V'_s by the stream's episodic rule); total, their sums. `advantage` picks the part whose returns
the head distils (one gamma, the trainer's) and whose V is V_orig in the weights; `select` the
part whose trajectory sums rank the winners. Without a stream total == extrinsic; intrinsic
is refused (trainers/ppo_jax/resolve.py, and here at trace time).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from reflectrl.errors import UserError
from reflectrl.estimators_jax import discounted
from reflectrl.nets_jax import adam, head, polyak, torch_default_mlp
from reflectrl.signals._jax import fit_rows, masked_mean, std
from reflectrl.signals.gear import GEARConfig
from reflectrl.signals.jax_base import Batch, Output, Signal


def trajectory_ids(terminations, truncations):
    """(T, N) int32 id of each step's trajectory, numbered env by env (torch trajectory_ids)."""
    done = ((terminations > 0) | (truncations > 0)).astype(jnp.int32)
    starts = jnp.concatenate([jnp.ones_like(done[:1]), done[:-1]], 0)
    return (jnp.cumsum(starts.T.reshape(-1)) - 1).reshape(starts.shape[1], starts.shape[0]).T


def winners_count_table(top_frac: float, slots: int) -> np.ndarray:
    """k(n) = max(1, ceil(top_frac * n)) for n = 0..slots, computed in Python's float64 as torch does
    (a numpy constant: a signal may be initialised inside a trace)."""
    return np.array([max(1, math.ceil(top_frac * n)) for n in range(slots + 1)], np.int32)


def select_winners(outcomes, lengths, n, k_table):
    """(slots,) bool: of the first n trajectory slots, the top k(n) by outcome, ties to the shorter
    trajectory, then the earlier (torch select_winners)."""
    slots = outcomes.shape[0]
    index = jnp.arange(slots)
    invalid = index >= n
    order = jnp.lexsort((index, lengths, -outcomes, invalid))  # the last key sorts first
    rank = jnp.zeros((slots,), jnp.int32).at[order].set(jnp.arange(slots, dtype=jnp.int32))
    return (rank < jnp.asarray(k_table)[n]) & ~invalid


def returns_to_go(rewards, ids, gamma: float, bootstrap=None):
    """Discounted reward-to-go within each trajectory (torch returns_to_go)."""
    same = jnp.concatenate([(ids[1:] == ids[:-1]), jnp.zeros_like(ids[:1], bool)], 0).astype(rewards.dtype)
    x = rewards if bootstrap is None else rewards + gamma * ((1.0 - same) * bootstrap)
    return discounted(x, gamma * same)


def reweight(v_distill, v_orig, temperature, w_min: float, w_max: float, ids=None, renormalize: bool = False):
    """GEAR weights and the mask of clipped ones (torch reweight); `temperature` may be traced (inf: w = 1)."""
    raw = jnp.exp((v_distill - v_orig) / temperature)
    clipped = (raw < w_min) | (raw > w_max)
    w = jnp.clip(raw, w_min, w_max)
    if renormalize:
        flat_ids, flat = ids.reshape(-1), w.reshape(-1)
        slots = flat.shape[0]
        sums = jax.ops.segment_sum(flat, flat_ids, slots)
        counts = jax.ops.segment_sum(jnp.ones_like(flat), flat_ids, slots)
        w = (flat / (sums / jnp.maximum(counts, 1.0))[flat_ids]).reshape(w.shape)
    return w, clipped


def scheduled_temperature(step, cfg: GEARConfig):
    """The temperature at a (traced) env step (torch scheduled_temperature)."""
    step = jnp.asarray(step, jnp.float32)
    if cfg.temperature_steps == 0:
        after = jnp.asarray(cfg.temperature, jnp.float32)
    else:
        progress = jnp.minimum(1.0, (step - cfg.warmup_steps) / cfg.temperature_steps)
        inverse = (1 - progress) / cfg.temperature_start + progress / cfg.temperature
        after = jnp.where(inverse == 0, jnp.inf, 1.0 / jnp.where(inverse == 0, 1.0, inverse))
    return jnp.where(step < cfg.warmup_steps, jnp.inf, after)


def gear_weights(frozen, x, values, ids, temperature, cfg: GEARConfig):
    """(weights (T, N), clipped (T, N)) from the frozen head's parameters on inputs x (T*N, width)."""
    v_d = head(frozen, x).reshape(values.shape)
    v_orig = values
    if cfg.diff_scale == "standardize":
        diff = v_d - values
        v_d, v_orig = (diff - diff.mean()) / (std(diff) + 1e-8), jnp.zeros_like(diff)
    elif cfg.diff_scale == "value_std":
        temperature = temperature * (std(values) + 1e-8)
    return reweight(v_d, v_orig, temperature, cfg.w_min, cfg.w_max, ids, cfg.renormalize)


NEEDS_STREAM = ("gear.advantage=intrinsic needs a reward stream with its own value head: rnd, written before gear, "
                "e.g. ppo+rnd+gear[advantage=intrinsic]")


def reward_parts(batch: Batch, kind: str):
    """(rewards, values, bootstrap) of one kind of reward, (T, N) each (torch reward_parts): `bootstrap`
    the value of the state each step reached (0 past a termination for the extrinsic part; the stream's
    by its own episodic rule). `total` without a stream is `extrinsic`."""
    alive = 1.0 - batch.terminations
    extrinsic = (batch.rewards, batch.values, batch.next_values * alive)
    if kind == "extrinsic" or (kind == "total" and batch.intrinsic_values is None):
        return extrinsic
    if batch.intrinsic_values is None:
        raise UserError(NEEDS_STREAM)
    rewards = batch.intrinsic_rewards if batch.intrinsic_rewards is not None else jnp.zeros_like(batch.rewards)
    intrinsic = (rewards, batch.intrinsic_values, batch.intrinsic_next_values)
    if kind == "intrinsic":
        return intrinsic
    return tuple(a + b for a, b in zip(extrinsic, intrinsic, strict=True))


class Gear(Signal):
    name = "gear"
    config = GEARConfig
    vector_knobs = ("temperature",)

    def term_kinds(self):
        return ("weight",)

    def __init__(self, cfg: GEARConfig):
        super().__init__(cfg)
        self.wants_features = cfg.inputs != "obs"
        self.scheduled = cfg.warmup_steps > 0 or cfg.temperature_steps > 0

    def init(self, key, ctx):
        super().init(key, ctx)
        width = ctx.feature_dim if self.wants_features else ctx.obs_dim
        hidden = () if self.cfg.head == "linear" else tuple(self.cfg.hidden_sizes)
        params = torch_default_mlp(key, [width, *hidden, 1], near_zero_output=False)
        self.opt = adam(self.cfg.lr_multiplier * ctx.learning_rate)
        self.k_table = winners_count_table(self.cfg.top_frac, ctx.num_steps * ctx.num_envs)
        return {"head": params, "opt": self.opt.init(params), "frozen": params, "distilled": jnp.asarray(False)}

    def _x(self, batch: Batch):
        x = batch.features if self.wants_features else batch.obs
        return x.reshape(batch.values.size, -1).astype(jnp.float32)

    def after_advantages(self, state, batch: Batch, key, estimate):
        cfg = self.seed_cfg(batch)
        varies = cfg is not self.cfg  # the temperature is this seed's (traced): no shortcut for inf
        ones = {"weights_mean": 1.0, "weights_std": 0.0, "weights_min": 1.0, "weights_max": 1.0,
                "weights_clipped_frac": 0.0}
        if not varies and math.isinf(cfg.temperature) and not self.scheduled:  # w = 1 exactly: PPO bit for bit
            return state, Output(), {k: jnp.asarray(v, jnp.float32) for k, v in ones.items()}
        step = batch.global_step + batch.values.size  # torch's global_step counts this rollout's steps
        temperature = scheduled_temperature(step, cfg) if self.scheduled else jnp.asarray(cfg.temperature)
        ids = trajectory_ids(batch.terminations, batch.truncations)
        v_orig = batch.values if cfg.advantage == "extrinsic" else reward_parts(batch, cfg.advantage)[1]
        w, clipped = gear_weights(state["frozen"], self._x(batch), v_orig, ids, temperature, cfg)
        off = ~state["distilled"] | jnp.isinf(temperature)
        w = jnp.where(off, 1.0, w)
        metrics = {"weights_mean": w.mean(), "weights_std": std(w), "weights_min": w.min(), "weights_max": w.max(),
                   "weights_clipped_frac": jnp.where(off, 0.0, clipped.astype(jnp.float32).mean())}
        if self.scheduled or varies:
            metrics["gear_temperature"] = temperature.astype(jnp.float32)
        return state, Output(weights=w), metrics

    def winners(self, batch: Batch):
        """(ids (T, N), winners (slots,), outcomes (slots,), number of trajectories): ranked by the
        trajectory sums of `select`'s reward."""
        ids = trajectory_ids(batch.terminations, batch.truncations)
        flat_ids = ids.reshape(-1)
        slots = flat_ids.shape[0]
        n = flat_ids.max() + 1
        rewards = batch.rewards if self.cfg.select == "extrinsic" else reward_parts(batch, self.cfg.select)[0]
        outcomes = jax.ops.segment_sum(rewards.reshape(-1), flat_ids, slots)
        lengths = jax.ops.segment_sum(jnp.ones_like(flat_ids), flat_ids, slots)
        return ids, select_winners(outcomes, lengths, n, self.k_table), outcomes, n

    def targets(self, batch: Batch, ids, outcomes):
        """The head's per-step targets from `advantage`'s reward: its discounted returns-to-go, or its
        trajectory's sum (the ranking's `outcomes` where advantage and select name the same reward)."""
        cfg = self.cfg
        if cfg.advantage == "extrinsic":
            rewards, bootstrap = batch.rewards, batch.next_values * (1.0 - batch.terminations)
        else:
            rewards, _, bootstrap = reward_parts(batch, cfg.advantage)
        if cfg.return_kind == "discounted":
            return returns_to_go(rewards, ids, self.ctx.gamma, bootstrap).reshape(-1)
        flat_ids = ids.reshape(-1)
        if cfg.advantage != cfg.select:
            outcomes = jax.ops.segment_sum(rewards.reshape(-1), flat_ids, flat_ids.shape[0])
        return outcomes[flat_ids]

    def after_update(self, state, batch: Batch, key, value_fn, estimate):
        cfg = self.cfg
        ids, winners, outcomes, n = self.winners(batch)
        y = self.targets(batch, ids, outcomes)
        keep = winners[ids.reshape(-1)] if cfg.distill_on == "winners" else jnp.ones_like(y, bool)
        x = self._x(batch)
        err = lambda p, xs, ys: (head(p, xs) - ys) ** 2  # noqa: E731
        heldout = jnp.where(state["distilled"], masked_mean(err(state["frozen"], x, y), keep), jnp.nan)
        params, opt_state, _ = fit_rows(err, state["head"], state["opt"], self.opt, (x, y), key, epochs=cfg.epochs,
                                        minibatch_size=cfg.minibatch_size, mask=keep)
        tau = jnp.where(state["distilled"], cfg.target_ema, 1.0)
        frozen = jax.tree_util.tree_map(lambda t, s: jnp.where(state["distilled"], t, s),
                                        polyak(state["frozen"], params, tau), params)  # first: a copy
        metrics = {"value_head_heldout_loss": heldout, "value_head_loss": masked_mean(err(params, x, y), keep),
                   "winners": winners.sum().astype(jnp.float32), "trajectories": n.astype(jnp.float32)}
        return {"head": params, "opt": opt_state, "frozen": frozen, "distilled": jnp.asarray(True)}, metrics
