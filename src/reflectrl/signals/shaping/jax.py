"""Self-distilled reward shaping, SDRS, on the JAX side (torch: signals/shaping/torch.py; its docstring
states the method). Modes `direct` (f = eta tanh(F(s, a, s')), hard-clipped where `hard_clip` is
finite), `potential` (f = gamma Phi(s') (1 - terminated) - Phi(s), Phi = eta tanh(Phi_raw(s)):
only a termination zeroes Phi(s'), a truncated step keeps gamma Phi(final obs), as torch) and
`off` (no term, nothing fit) on vector observations.

Before advantages: the term w f from the target shaper F_target, w the curriculum weight
(`warmup_steps`, `ramp_steps`, on torch's global_step: the env steps including this rollout's).
After every update the rollout joins a ring buffer of the last `buffer_rollouts` rollouts (a
count of the filled slots masks the rest); after every `update_every`-th, the soft labels (GAE
under the updated critic `value_fn` over the buffer, normalised over its filled rows, times
`scale`) are distilled into F for `epochs` epochs, F_target following F by Polyak after every
step. The buffer's rewards are the batch's (what the advantages were estimated from, as the
torch trainer's batch.rewards after shape_rewards).

`distill=total` (issue 42): each buffered rollout also keeps its reward stream's part of the
policy's advantage, k_s A_s as the policy used it (the Batch's intrinsic_advantages, not
recomputed after the update; zeros in a run without a stream, where total == extrinsic),
added to the rollout's GAE advantages before they are normalised.

Torch-only: modes bootstrap and advice, `prior`, `safety_beta`, `imagined_fraction`,
`encoder=cnn`, `labels=team`; the reward-map snapshots are not kept.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from reflectrl.estimators_jax import gae
from reflectrl.nets_jax import adam, head, polyak, torch_default_mlp
from reflectrl.signals._jax import encode_actions, fit_rows, masked_mean, std, var
from reflectrl.signals.jax_base import Batch, Signal
from reflectrl.signals.shaping import ShapingConfig


def shaper_forward(params, obs, actions, next_obs, terminations, mode: str, eta: float, gamma: float,
                   hard_clip: float = math.inf):
    """F(s, a, s') per row (torch RewardShaper.forward): rows are flat (B, ...), actions encoded."""
    if mode == "potential":
        phi = lambda s: eta * jnp.tanh(head(params, s))  # noqa: E731
        return gamma * phi(next_obs) * (1.0 - terminations) - phi(obs)
    f = eta * jnp.tanh(head(params, jnp.concatenate([obs, actions, next_obs], -1)))
    return jnp.clip(f, -hard_clip, hard_clip) if math.isfinite(hard_clip) else f


def curriculum(step, warmup: int, ramp: int):
    """The shaping weight at a (traced) env step: 0 during warm-up, then a linear ramp to 1."""
    step = jnp.asarray(step, jnp.float32)
    after = 1.0 if ramp == 0 else jnp.minimum(1.0, (step - warmup) / ramp)
    return jnp.where(step < warmup, 0.0, after).astype(jnp.float32)


def normalised_labels(advantages, mask, scale: float):
    """scale (A - mean) / (std + 1e-8) over the rows where mask (torch distillation_set's norm)."""
    mean = masked_mean(advantages, mask)
    return scale * (advantages - mean) / (std(advantages, mask) + 1e-8)


class Shaping(Signal):
    name = "shaping"
    config = ShapingConfig
    vector_knobs = ("eta",)
    reads = ("next_obs",)

    def forward(self, params, obs, actions, next_obs, terminations, eta):
        """F on flat rows; `eta`: this seed's (seed_cfg(batch).eta: it may differ between a program's seeds)."""
        return shaper_forward(params, obs, actions, next_obs, terminations, self.cfg.mode, eta, self.ctx.gamma,
                              self.cfg.hard_clip)

    def init(self, key, ctx):
        super().init(key, ctx)
        if self.cfg.mode == "off":
            return {}
        in_dim = ctx.obs_dim if self.cfg.mode == "potential" else 2 * ctx.obs_dim + ctx.action_dim
        params = torch_default_mlp(key, [in_dim, *self.cfg.hidden_sizes, 1])
        self.opt = adam(self.cfg.lr_multiplier * ctx.learning_rate)
        B, T, N = self.cfg.buffer_rollouts, ctx.num_steps, ctx.num_envs
        z = lambda *shape: jnp.zeros((B, T, N, *shape), jnp.float32)  # noqa: E731
        buffer = {"obs": z(ctx.obs_dim), "actions": z(ctx.action_dim), "next_obs": z(ctx.obs_dim),
                  "rewards": z(), "terminations": z(), "truncations": z()}
        if self.cfg.distill == "total":
            buffer["stream_advantages"] = z()
        return {"shaper": params, "target": params, "opt": self.opt.init(params), "buffer": buffer,
                "filled": jnp.asarray(0, jnp.int32), "updates": jnp.asarray(0, jnp.int32)}

    def _rows(self, batch: Batch):
        n = batch.values.size
        return (batch.obs.reshape(n, -1).astype(jnp.float32), encode_actions(batch.actions, self.ctx),
                batch.next_obs.reshape(n, -1).astype(jnp.float32), batch.terminations.reshape(-1).astype(jnp.float32))

    def shape_rewards(self, state, batch: Batch, key):
        if self.cfg.mode == "off":
            return state, None, {}
        cfg = self.seed_cfg(batch)
        weight = curriculum(batch.global_step + batch.values.size, cfg.warmup_steps, cfg.ramp_steps)
        f = self.forward(state["target"], *self._rows(batch), eta=cfg.eta).reshape(batch.values.shape)
        shaping = weight * f
        r = batch.rewards
        mean_abs_r = jnp.abs(r).mean()
        ratio = jnp.where(mean_abs_r > 0, jnp.abs(shaping).mean() / jnp.where(mean_abs_r > 0, mean_abs_r, 1.0),
                          jnp.nan)
        metrics = {"shaping_weight": weight, "shaping_mean": shaping.mean(), "shaping_std": std(shaping),
                   "shaping_min": shaping.min(), "shaping_max": shaping.max(), "reward_mean": r.mean(),
                   "reward_std": std(r), "reward_min": r.min(), "reward_max": r.max(), "shaping_to_reward": ratio,
                   "shaping_warning": (ratio > cfg.warn_ratio).astype(jnp.int32)}
        return state, shaping, metrics

    def labels(self, buffer, filled, value_fn):
        """(B, T, N) soft labels over the buffer (normalised over the filled slots) and the filled mask."""
        obs_dim = buffer["obs"].shape[-1]

        def advantages(item):
            shape = item["rewards"].shape
            values = value_fn(item["obs"].reshape(-1, obs_dim)).reshape(shape)
            next_values = value_fn(item["next_obs"].reshape(-1, obs_dim)).reshape(shape)
            adv, _ = gae(item["rewards"], values, next_values, item["terminations"], item["truncations"],
                         self.ctx.gamma, self.ctx.gae_lambda)
            if "stream_advantages" in item:  # distill=total: + sum_s k_s A_s as the policy used it
                adv = adv + item["stream_advantages"]
            return adv

        adv = jax.vmap(advantages)(buffer)
        mask = jnp.broadcast_to((jnp.arange(adv.shape[0]) < filled)[:, None, None], adv.shape)
        return normalised_labels(adv, mask, self.cfg.scale), mask

    def after_update(self, state, batch: Batch, key, value_fn, estimate):
        if self.cfg.mode == "off":
            return state, {}
        cfg = self.seed_cfg(batch)
        B = cfg.buffer_rollouts
        slot = state["updates"] % B
        obs, actions, next_obs, terms = self._rows(batch)
        shape = batch.values.shape
        item = {"obs": obs.reshape(*shape, -1), "actions": actions.reshape(*shape, -1),
                "next_obs": next_obs.reshape(*shape, -1), "rewards": batch.rewards.astype(jnp.float32),
                "terminations": batch.terminations.astype(jnp.float32),
                "truncations": batch.truncations.astype(jnp.float32)}
        if "stream_advantages" in state["buffer"]:
            item["stream_advantages"] = (jnp.zeros(shape, jnp.float32) if batch.intrinsic_advantages is None
                                         else batch.intrinsic_advantages.astype(jnp.float32))
        buffer = jax.tree_util.tree_map(lambda buf, x: buf.at[slot].set(x), state["buffer"], item)
        updates = state["updates"] + 1
        filled = jnp.minimum(state["filled"] + 1, B)
        state = {**state, "buffer": buffer, "updates": updates, "filled": filled}
        nan = jnp.asarray(jnp.nan, jnp.float32)

        def distil(state):
            labels, mask = self.labels(state["buffer"], state["filled"], value_fn)
            # F's R^2 on the newest rollout's labels, which it has not been fit on yet
            held = labels[slot].reshape(-1)
            pred = self.forward(state["shaper"], obs, actions, next_obs, terms, eta=cfg.eta)
            r2_heldout = 1.0 - jnp.mean((pred - held) ** 2) / (var(held) + 1e-12)
            rows = tuple(state["buffer"][k].reshape(-1, state["buffer"][k].shape[-1])
                         for k in ("obs", "actions", "next_obs"))
            data = (*rows, state["buffer"]["terminations"].reshape(-1), labels.reshape(-1))
            err = lambda p, o, a, o2, t, y: (self.forward(p, o, a, o2, t, eta=cfg.eta) - y) ** 2  # noqa: E731
            follow = lambda p, target: polyak(target, p, cfg.tau)  # noqa: E731
            params, opt_state, target = fit_rows(err, state["shaper"], state["opt"], self.opt, data, key,
                                                 epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                                                 mask=mask.reshape(-1), aux=state["target"], after_step=follow)
            loss = masked_mean(err(params, *data), mask.reshape(-1))
            r2 = 1.0 - loss / var(labels.reshape(-1), mask.reshape(-1))
            metrics = {"label_r2_heldout": r2_heldout, "label_loss": loss, "label_r2": r2}
            return {**state, "shaper": params, "opt": opt_state, "target": target}, metrics

        def skip(state):
            return state, {"label_r2_heldout": nan, "label_loss": nan, "label_r2": nan}

        if cfg.update_every == 1:
            return distil(state)
        return jax.lax.cond(updates % cfg.update_every == 0, distil, skip, state)
