"""RefGRPO's calibration bonus on the JAX side (torch: signals/calibration/torch.py; its docstring states
the method). After advantages: the reflection head f(s, a) (a ReLU MLP with a near-zero output)
is fit by MSE to the normalised advantages, `epochs` epochs of `minibatch_size` minibatches at
`lr_multiplier` x the policy's learning rate (the rows in order when one minibatch holds them
all, as the torch fitter's shuffle="when_split"); the bonus -alpha (prediction - A)^2 from the
fitted head, clipped, budgeted, times beta, is a reward term (advantages re-estimated) or with
`recompute_advantages=false` an advantage term.

`calibration_term(params, x, adv, rewards, cfg)` is the term from given weights (the fixture
tests copy a fitted torch head into it). `shared_trunk=true` (an auxiliary loss inside the PPO
update) is torch-only. The torch signal's calibration picture (`snapshots`) is not kept here.

`mode=uncertainty` (issue 42): `ensemble` heads (PyTorch's default init, not near-zero, each
its own key) as one stacked parameter pytree; the bonus +alpha x factor x std_k f_k(s, a)
(population std) from the heads before they are fit on the batch (`uncertainty_term`), a
reward term beta x bonus as above (no clip, budget, adaptive alpha or bonus_target); then
each head is fit to A_n on its own bootstrap mask (each row in with probability `bootstrap`,
drawn from the iteration's key; a head whose mask is empty takes no step), vmapped over
heads with fit_rows (shuffle="always", as the torch ensemble's fits). `schedule` multiplies
alpha in both modes (signals/schedule.py; `constant`: by nothing).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from reflectrl.nets_jax import adam, head, torch_default_mlp
from reflectrl.signals._jax import encode_actions, fit_rows, schedule_factor, std
from reflectrl.signals.calibration import CalibrationConfig
from reflectrl.signals.jax_base import Batch, Output, Signal, mean_abs_ratio


def calibration_inputs(inputs: str, obs, features, actions, ctx) -> jax.Array:
    """The head's (B, width) input rows: obs_action, obs_action_features or features_action."""
    B = actions.shape[0] * actions.shape[1]
    parts = {"obs_action": [obs], "obs_action_features": [obs, features], "features_action": [features]}[inputs]
    parts = [p.reshape(B, -1).astype(jnp.float32) for p in parts]
    return jnp.concatenate([*parts, encode_actions(actions, ctx)], -1)


def calibration_term(params, x, adv, rewards, cfg: CalibrationConfig, factor=None):
    """The reward (or advantage) term from the head `params`, flat (B,), and its statistics:
    (term, stats) with stats f (normalised predictions), target, train_loss, alpha, clip, budget_scale.
    `factor`: the schedule's (None: constant)."""
    mean, sd = adv.mean(), std(adv)
    target = (adv - mean) / (sd + 1e-8)
    f = head(params, x)
    train_loss = jnp.mean((f - target) ** 2)
    prediction = f * (sd + 1e-8) + mean if cfg.bonus_target == "denormalized" else f
    alpha = cfg.alpha * (jnp.minimum(train_loss, cfg.adaptive_max) if cfg.adaptive else 1.0)
    if factor is not None:
        alpha = alpha * factor
    bonus = -alpha * (prediction - adv) ** 2
    mean_abs_r = jnp.abs(rewards).mean()
    if cfg.clip == "relative":
        c = cfg.clip_k * mean_abs_r
        bonus = jnp.clip(bonus, -c, c)
    elif cfg.clip == "absolute":
        c = jnp.asarray(cfg.clip_value, jnp.float32)
        bonus = jnp.clip(bonus, -c, c)
    else:
        c = jnp.asarray(jnp.inf, jnp.float32)
    term = cfg.beta * bonus
    budget_scale = jnp.asarray(1.0, jnp.float32)
    if math.isfinite(cfg.max_ratio):
        budget, mean_abs_term = cfg.max_ratio * mean_abs_r, jnp.abs(term).mean()
        over = mean_abs_term > budget
        budget_scale = jnp.where(over, budget / jnp.where(over, mean_abs_term, 1.0), 1.0)
        term = jnp.where(over, term * budget_scale, term)
    stats = {"f": f, "target": target, "train_loss": train_loss, "alpha": jnp.asarray(alpha, jnp.float32),
             "clip": c, "budget_scale": budget_scale}
    return term, stats


def ensemble_predictions(heads, x):
    """(K, B) predictions of the stacked heads."""
    return jax.vmap(head, in_axes=(0, None))(heads, x)


def uncertainty_term(heads, x, target, rewards, cfg: CalibrationConfig, factor=None):
    """mode=uncertainty's term from the stacked heads as they are (before this batch's fit), flat (B,),
    and the metrics the torch signal logs."""
    predictions = ensemble_predictions(heads, x)
    spread = jnp.std(predictions, axis=0)  # population std over the heads (ddof 0)
    alpha = jnp.asarray(cfg.alpha if factor is None else cfg.alpha * factor, jnp.float32)
    term = cfg.beta * alpha * spread
    metrics = {"calibration_loss": ((predictions - target) ** 2).mean(1).mean(), "calibration_alpha": alpha,
               "ensemble_std": spread.mean(), "bonus_mean": term.mean(), "bonus_std": std(term),
               "bonus_min": term.min(), "bonus_max": term.max(), "bonus_to_reward": mean_abs_ratio(term, rewards)}
    return term, metrics


def bootstrap_masks(key, heads: int, rows: int, p: float):
    """(heads, rows) bool: each row in each head's fit with probability p."""
    return jax.random.uniform(key, (heads, rows)) < p


class Calibration(Signal):
    name = "calibration"
    vector_knobs = ("alpha", "beta")
    config = CalibrationConfig

    def term_kinds(self):
        return ("reward",) if self.cfg.recompute_advantages else ("advantage",)

    def __init__(self, cfg: CalibrationConfig):
        super().__init__(cfg)
        self.wants_features = cfg.inputs != "obs_action"

    def width(self, ctx) -> int:
        return {"obs_action": ctx.obs_dim, "obs_action_features": ctx.obs_dim + ctx.feature_dim,
                "features_action": ctx.feature_dim}[self.cfg.inputs] + ctx.action_dim

    def init(self, key, ctx):
        super().init(key, ctx)
        self.opt = adam(self.cfg.lr_multiplier * ctx.learning_rate)
        sizes = [self.width(ctx), *self.cfg.hidden_sizes, 1]
        if self.cfg.mode == "uncertainty":
            heads = jax.vmap(lambda k: torch_default_mlp(k, sizes, near_zero_output=False))(
                jax.random.split(key, self.cfg.ensemble))
            return {"heads": heads, "opt": jax.vmap(self.opt.init)(heads)}
        params = torch_default_mlp(key, sizes)
        B = ctx.num_steps * ctx.num_envs
        return {"params": params, "opt": self.opt.init(params),
                "prev_x": jnp.zeros((B, self.width(ctx)), jnp.float32), "prev_target": jnp.zeros((B,), jnp.float32),
                "has_prev": jnp.asarray(False)}

    def fit_ensemble(self, heads, opt_state, x, target, masks, key):
        """Each head fit to `target` on the rows of its mask (vmapped over the heads)."""
        cfg = self.cfg
        err = lambda p, xs, ys: (head(p, xs) - ys) ** 2  # noqa: E731

        def fit(params, opt, mask, k):
            params, opt, _ = fit_rows(err, params, opt, self.opt, (x, target), k, epochs=cfg.epochs,
                                      minibatch_size=cfg.minibatch_size, mask=mask, shuffle="always")
            return params, opt

        return jax.vmap(fit)(heads, opt_state, masks, jax.random.split(key, cfg.ensemble))

    def uncertainty(self, state, batch: Batch, key):
        cfg = self.seed_cfg(batch)
        adv = batch.advantages.reshape(-1)
        x = calibration_inputs(cfg.inputs, batch.obs, batch.features, batch.actions, self.ctx)
        target = (adv - adv.mean()) / (std(adv) + 1e-8) if cfg.ensemble_target == "normalized" else adv
        factor = schedule_factor(cfg, batch, self.ctx)
        term, metrics = uncertainty_term(state["heads"], x, target, batch.rewards.reshape(-1), cfg, factor)
        k_masks, k_fit = jax.random.split(key)
        masks = bootstrap_masks(k_masks, cfg.ensemble, x.shape[0], cfg.bootstrap)
        heads, opt_state = self.fit_ensemble(state["heads"], state["opt"], x, target, masks, k_fit)
        return {"heads": heads, "opt": opt_state}, term.reshape(batch.advantages.shape), metrics

    def after_advantages(self, state, batch: Batch, key, estimate):
        cfg = self.seed_cfg(batch)
        if cfg.mode == "uncertainty":
            state, term, metrics = self.uncertainty(state, batch, key)
            if cfg.recompute_advantages:
                return state, Output(reward=term, recompute=True), metrics
            return state, Output(advantage=term), metrics
        shape = batch.advantages.shape
        adv = batch.advantages.reshape(-1)
        rewards = batch.rewards.reshape(-1)
        x = calibration_inputs(cfg.inputs, batch.obs, batch.features, batch.actions, self.ctx)
        target = (adv - adv.mean()) / (std(adv) + 1e-8)
        err = lambda p, xs, ys: (head(p, xs) - ys) ** 2  # noqa: E731
        heldout = jnp.mean(err(state["params"], x, target))  # the loss before the fit (torch: loss_before)
        params, opt_state, _ = fit_rows(err, state["params"], state["opt"], self.opt, (x, target), key,
                                        epochs=cfg.epochs, minibatch_size=cfg.minibatch_size, shuffle="when_split")
        term, stats = calibration_term(params, x, adv, rewards, cfg, schedule_factor(cfg, batch, self.ctx))
        prev_loss = jnp.where(state["has_prev"], jnp.mean(err(params, state["prev_x"], state["prev_target"])),
                              jnp.nan)
        metrics = {
            "calibration_loss": stats["train_loss"],
            "calibration_loss_heldout": heldout,
            "calibration_loss_prev_batch": prev_loss,
            "calibration_alpha": stats["alpha"],
            "calibration_clip": stats["clip"],
            "calibration_budget_scale": stats["budget_scale"],
            "bonus_mean": term.mean(),
            "bonus_std": std(term),
            "bonus_min": term.min(),
            "bonus_max": term.max(),
            "bonus_to_reward": mean_abs_ratio(term, rewards),
        }
        state = {"params": params, "opt": opt_state, "prev_x": x, "prev_target": target,
                 "has_prev": jnp.asarray(True)}
        term = term.reshape(shape)
        if cfg.recompute_advantages:
            return state, Output(reward=term, recompute=True), metrics
        return state, Output(advantage=term), metrics
