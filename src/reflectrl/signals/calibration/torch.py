"""The calibration bonus of RefGRPO (seed 000, "Closing the Reflection Gap"; SPEC section 1).

Each iteration, after advantages are estimated:
1. A_n = (A_raw - mean) / (std + 1e-8) over the batch;
2. a reflection net f(s, a) (MLP, ReLU, near-zero output init) is fit by MSE to A_n for
   `epochs` epochs of minibatches of `minibatch_size` at `lr_multiplier` x the
   policy's learning rate (signals/fit.py); L_cal is that loss;
3. bonus b = -alpha * (prediction - A_raw)^2 where, by default, the prediction is f
   de-normalised (f * std + mean) so the bonus measures miscalibration at the reward's
   scale (DECISION in SPEC section 1; `bonus_target="seed"` compares raw f with A_raw as
   the seed literally does);
4. reward term beta * clip(b, -c, c), with c = clip_k * mean|r_step| (`clip="relative"`),
   a fixed `clip_value` (`clip="absolute"`) or no clip;
5. advantages are recomputed on r + beta * clip(b) (`recompute_advantages=true`, the
   default); with `false` the step-1 advantages are kept and the term is added to each
   step's advantage directly, with no temporal credit.
Option `max_ratio` (seed 000 section 5.2's first remedy, "keep the bonus small beside the
reward", made automatic; issue 16): after the clip, the term is scaled down so that its
mean |beta * b| is at most `max_ratio` x mean |r| over the batch (a batch with no reward
gets no bonus); `inf`, the default, sets no budget. `calibration_budget_scale` logs the
factor (1: within budget).
Option `adaptive`: alpha is scaled by the current L_cal (capped at `adaptive_max`); since
the target has unit variance, L_cal = 1 is a predictor that knows nothing, so the bonus
weighs in fully while the reflection net is uncalibrated and fades as it calibrates.

`mode="uncertainty"` (issue 42) turns the reflection onto exploration. The seed's bonus is 0
before the first reward (the relative clip is k x mean |r| = 0), so on a sparse task it cannot
act where exploration is the problem. Here an ensemble of `ensemble` reflection heads (each its
own initialisation, with default rather than near-zero output layers, and each fit on its own
bootstrap mask: every row in with probability `bootstrap`) predicts A_n; the bonus is
+alpha x std_k f_k(s, a), the heads' disagreement, taken before they are fit on the batch. Where
the agent has not learned what its actions are worth the heads disagree, from the first
iteration, reward or not. Its scale is absolute (no clip, budget, adaptive alpha or
bonus_target: those shape the seed's bonus), decayed by `schedule`. `ensemble_target` says what
the heads predict: the normalised advantages (as the seed's head) or the raw ones. Before the
first reward the normalised advantages are the critic's noise blown up to unit variance, which
the heads fit differently wherever the agent goes most, so their disagreement there is label
noise rather than ignorance (docs/exploration.md); the raw advantages are ~0 there, so the heads
agree where the agent has been and disagree where it has not. Logged: `ensemble_std`,
`bonus_mean`, `bonus_to_reward`, `calibration_alpha` (alpha x the schedule's factor).

On a replay trainer (DQN, SAC) the batch is a sampled minibatch and the advantage is
Q(s, a) - V(s) (V = max_a Q for DQN; E_pi[Q - alpha log pi], one sampled action, for SAC):
the bonus joins the sampled rewards in the TD target at learning time (trainers/replay/base.py).

Inputs: `obs_action` (observation and action, one-hot if discrete), `obs_action_features`
(plus the actor's last hidden layer) or `features_action`. On images read by a CNN encoder
(Atari) the head reads the CNN's features in place of the pixels, so both obs_* inputs mean
`features_action` there (issue 15: heads read the actor's features on pixels). `shared_trunk=true` makes the
actor's trunk share the calibration task: during the PPO update an auxiliary loss
`shared_trunk_coef * MSE(f(trunk features, a), A_n)` trains the trunk (the head itself is
fit only in step 2), so the policy's representation must support calibration.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from reflectrl.nets import relu_mlp
from reflectrl.signals.base import Batch, Signal, SignalContext, SignalOutput
from reflectrl.signals.calibration import SPEC, CalibrationConfig
from reflectrl.signals.fit import HeadFitter, OneHotRows, mse, one_hot_rows
from reflectrl.signals.schedule import factor_at


class CalibrationBonus(Signal):
    name = "calibration"

    def __init__(self, cfg: CalibrationConfig):
        self.built_from(cfg, SPEC)  # needs: features unless inputs=obs_action; feature_grad with shared_trunk
        self.cfg = cfg
        self.inputs = cfg.inputs  # as bound: features_action on images read by a CNN
        self._features_fn = False  # as bound: the features come from Batch.features_fn (see bind)
        self._last: dict = {}
        self.previous: tuple[torch.Tensor, torch.Tensor] | None = None
        self.snapshots: list[dict] = []
        self._aux_target: torch.Tensor | None = None
        self._aux_actions: torch.Tensor | None = None
        self._aux_obs: torch.Tensor | None = None
        self._previous_inputs = None  # self.previous[0] as the fitter takes it (not checkpointed)

    def bind(self, ctx: SignalContext) -> None:
        super().bind(ctx)
        if ctx.image_obs:  # an MLP head on raw pixels is no use: it reads the CNN's features
            self.inputs = "features_action"
            # with inputs=obs_action it asked for no features (what it needs is fixed by its knobs):
            # it reads them through the policy's features_fn, as the trainer computes Batch.features
            self._features_fn = not self.wants_features
        width = {"obs_action": ctx.obs_dim, "obs_action_features": ctx.obs_dim + ctx.feature_dim,
                 "features_action": ctx.feature_dim}[self.inputs] + ctx.action_dim
        self.heads: list[HeadFitter] = []
        with self.own_rng():
            if self.cfg.mode == "uncertainty":
                # the ensemble: default (not near-zero) output layers, so that the heads disagree where
                # they have not been fit; each drawn in turn from the signal's own stream
                self.heads = [HeadFitter(relu_mlp(width, self.cfg.hidden_sizes, near_zero_output=False),
                                         lr=self.cfg.lr_multiplier * ctx.learning_rate)
                              for _ in range(self.cfg.ensemble)]
                self.net = self.heads[0].head
            else:
                self.net = relu_mlp(width, self.cfg.hidden_sizes)  # near-zero output: no bonus until it has learned
        lr = self.cfg.lr_multiplier * ctx.learning_rate
        self.fitter = self.heads[0] if self.heads else HeadFitter(self.net, lr=lr)
        self.snapshot_at = self.snapshot_iterations(self.cfg.snapshots)

    # -------------------------------------------------------------------------- inputs

    def _inputs(self, obs, features, actions) -> torch.Tensor | OneHotRows:
        """The reflection net's input rows; with a one-hot (tabular) observation and a
        discrete action, as OneHotRows: the columns of their ones, never the dense matrix."""
        parts = {"obs_action": [obs], "obs_action_features": [obs, features],
                 "features_action": [features]}[self.inputs]
        discrete = self.ctx.discrete and self.ctx.action_dim > 0
        if discrete and self.inputs == "obs_action" and not obs.requires_grad:
            rows = one_hot_rows(obs)
            if rows is not None:
                return rows.append(actions, self.ctx.action_dim)
        if discrete and not any(p.requires_grad for p in parts):
            # the action's one-hot written in place: one_hot and cat cost more than the fit's
            # first layer on a small batch
            width = sum(p.shape[-1] for p in parts)
            x = torch.zeros(parts[0].shape[0], width + self.ctx.action_dim)
            torch.cat(parts, -1, out=x[:, :width])
            return x.scatter_(1, actions.reshape(-1, 1).long() + width, 1.0)
        return torch.cat([*parts, self.encode_actions(actions)], -1)

    def _features(self, batch: Batch, obs: torch.Tensor) -> torch.Tensor | None:
        """The policy's features of the batch's steps, (B, feature_dim): the trainer's, or on
        images read by a CNN with inputs=obs_action, the policy's features_fn of the steps."""
        if batch.features is not None or not self._features_fn:
            return batch.features.reshape(obs.shape[0], -1) if batch.features is not None else None
        if batch.features_fn is None:
            raise ValueError("calibration on images reads the policy's features, and this trainer gives no "
                             "Batch.features_fn; set calibration.inputs=features_action")
        with torch.no_grad():
            return batch.features_fn(obs).reshape(obs.shape[0], -1)

    # -------------------------------------------------------------------------- hooks

    def after_advantages(self, batch: Batch) -> SignalOutput:
        cfg = self.cfg
        shape = batch.advantages.shape
        # only real steps (an LLM batch pads turns) are fit, normalised over and get a bonus
        valid = batch.mask.reshape(-1) if batch.mask is not None else None
        adv = batch.advantages.reshape(-1)
        obs = batch.obs.reshape(adv.shape[0], -1)
        features = self._features(batch, obs)
        x = self._inputs(obs, features, batch.actions)
        x = x.detach() if isinstance(x, torch.Tensor) else x
        rewards = batch.rewards.reshape(-1)
        if valid is not None:
            adv, obs, x, rewards = adv[valid], obs[valid], x[valid], rewards[valid]
            features = features[valid] if features is not None else None
        mean, std = adv.mean(), adv.std()
        target = (adv - mean) / (std + 1e-8)
        if cfg.mode == "uncertainty":
            term = self._uncertainty(batch, x, target if cfg.ensemble_target == "normalized" else adv, rewards)
            return self._output(term, valid, shape)

        inputs = self.fitter.prepare(x)  # one-hot rows (a tabular obs, the action) are looked up, once
        heldout = self._fit(inputs, target)
        with torch.no_grad():
            pairs = [(inputs, x)]
            if self.previous is not None:
                if self._previous_inputs is None:
                    self._previous_inputs = self.fitter.prepare(self.previous[0])
                pairs.append((self._previous_inputs, self.previous[0]))
            f, *prev_f = self._predictions(pairs)
            train_loss = mse(f, target)
            prev_loss = mse(prev_f[0], self.previous[1]) if prev_f else None
            prediction = f * (std + 1e-8) + mean if cfg.bonus_target == "denormalized" else f
            alpha = cfg.alpha * (min(train_loss, cfg.adaptive_max) if cfg.adaptive else 1.0)
            if cfg.schedule != "constant":
                alpha = alpha * factor_at(cfg, batch, self.ctx.total_iterations)
            bonus = -alpha * (prediction - adv).square()
            mean_abs_r = rewards.abs().mean()
            if cfg.clip == "relative":
                c = cfg.clip_k * mean_abs_r
                bonus = torch.clamp(bonus, -c, c)
            elif cfg.clip == "absolute":
                c = torch.tensor(cfg.clip_value)
                bonus = torch.clamp(bonus, -c, c)
            else:
                c = torch.tensor(float("inf"))
            term = cfg.beta * bonus
            budget_scale = 1.0
            if math.isfinite(cfg.max_ratio):
                budget, mean_abs_term = cfg.max_ratio * mean_abs_r.item(), term.abs().mean().item()
                if mean_abs_term > budget:
                    budget_scale = budget / mean_abs_term
                    term = term * budget_scale

        self.previous = (x, target)  # both fresh tensors, never written to again
        self._previous_inputs = inputs
        if cfg.shared_trunk:
            actions = batch.actions.reshape(batch.advantages.numel(), -1)
            self._aux_obs, self._aux_actions, self._aux_target = obs, actions, target
        if batch.iteration in self.snapshot_at and not (self.snapshots and
                                                        self.snapshots[-1]["iteration"] == batch.iteration):
            pick = torch.randperm(target.shape[0], generator=self.generator)[:400]
            self.snapshots.append({"iteration": batch.iteration, "target": target[pick].tolist(),
                                   "prediction": f[pick].tolist()})
        lo, hi = torch.aminmax(term)
        self._last = {
            "calibration_loss": train_loss,
            "calibration_loss_heldout": heldout,
            "calibration_loss_prev_batch": prev_loss,
            "calibration_alpha": alpha,
            "calibration_clip": float(c),
            "calibration_budget_scale": budget_scale,
            "bonus_mean": term.mean().item(),
            "bonus_std": term.std().item(),
            "bonus_min": lo.item(),
            "bonus_max": hi.item(),
            "bonus_to_reward": (term.abs().mean() / mean_abs_r).item() if mean_abs_r.item() > 0 else None,
        }
        return self._output(term, valid, shape)

    def _output(self, term: torch.Tensor, valid: torch.Tensor | None, shape) -> SignalOutput:
        """The real steps' term in the batch's layout (0 on padding): a reward term re-estimated
        (recompute_advantages), or an advantage term."""
        if valid is not None:
            term = torch.zeros(valid.shape).masked_scatter_(valid, term)
        term = term.reshape(shape)
        if self.cfg.recompute_advantages:
            return SignalOutput(reward=term, recompute=True)
        return SignalOutput(advantage=term)

    def _uncertainty(self, batch: Batch, x, target: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
        """mode=uncertainty: the heads' disagreement on the batch's (s, a) before they are fit on
        it (as RND's error is taken before its predictor trains) is the bonus, +alpha x std; then
        each head is fit to the normalised advantages on the rows of its own bootstrap mask."""
        cfg = self.cfg
        inputs = self.heads[0].prepare(x)  # one-hot rows grouped once, for every head
        with torch.no_grad():
            predictions = torch.stack([head.predict(inputs) for head in self.heads])  # (K, B)
            spread = predictions.std(0, unbiased=False)
            losses = (predictions - target).square().mean(1)
        alpha = cfg.alpha * factor_at(cfg, batch, self.ctx.total_iterations)
        term = cfg.beta * alpha * spread
        n = target.shape[0]
        for head in self.heads:
            rows = (torch.rand(n, generator=self.generator) < cfg.bootstrap).nonzero().squeeze(-1)
            if rows.numel() == 0:  # a mask with no row: this head sits this iteration out
                continue
            head.fit(inputs[rows], target[rows], epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                     generator=self.generator, shuffle="always")
        if batch.iteration in self.snapshot_at and not (self.snapshots and
                                                        self.snapshots[-1]["iteration"] == batch.iteration):
            pick = torch.randperm(n, generator=self.generator)[:400]
            self.snapshots.append({"iteration": batch.iteration, "target": target[pick].tolist(),
                                   "prediction": predictions.mean(0)[pick].tolist()})
        mean_abs_r = rewards.abs().mean()
        lo, hi = torch.aminmax(term)
        self._last = {
            "calibration_loss": losses.mean().item(),
            "calibration_alpha": alpha,
            "ensemble_std": spread.mean().item(),
            "bonus_mean": term.mean().item(),
            "bonus_std": term.std().item() if n > 1 else 0.0,
            "bonus_min": lo.item(),
            "bonus_max": hi.item(),
            "bonus_to_reward": (term.abs().mean() / mean_abs_r).item() if mean_abs_r.item() > 0 else None,
        }
        return term

    def _fit(self, inputs, target: torch.Tensor) -> float:
        """Fit the reflection net to the batch; returns its loss on the batch before the fit
        (held out). That is the first step's loss when one minibatch holds the whole batch,
        which is then used in order (no permutation drawn)."""
        cfg = self.cfg
        return self.fitter.fit(inputs, target, epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                               generator=self.generator, shuffle="when_split", loss_before=True).loss_before

    def _predictions(self, pairs: list[tuple]) -> list[torch.Tensor]:
        """The reflection net's predictions on each (prepared inputs, inputs) pair."""
        if self.net is not self.fitter.head:  # a stand-in net (the tests') answers for itself
            return [self.net(x.to_dense() if isinstance(x, OneHotRows) else x).squeeze(-1) for _, x in pairs]
        return self.fitter.predict_many([inputs for inputs, _ in pairs])

    def auxiliary_loss(self, features: torch.Tensor, index: torch.Tensor) -> torch.Tensor | None:
        """Shared trunk: calibration through the actor's features, the head held fixed."""
        if not self.cfg.shared_trunk or self._aux_target is None:
            return None
        x = self._inputs(self._aux_obs[index], features, self._aux_actions[index])
        params = {k: v.detach() for k, v in self.net.named_parameters()}
        pred = torch.func.functional_call(self.net, params, (x,)).squeeze(-1)
        return self.cfg.shared_trunk_coef * F.mse_loss(pred, self._aux_target[index])

    def metrics(self) -> dict:
        return dict(self._last)

    def state_dict(self) -> dict:
        if self.heads:  # mode=uncertainty: every head of the ensemble
            return {**super().state_dict(), "snapshots": self.snapshots,
                    "ensemble": [head.state_dict(head_key="net") for head in self.heads]}
        return {
            **super().state_dict(),
            **self.fitter.state_dict(head_key="net"),
            "previous": None if self.previous is None else (
                self.previous[0].to_dense() if isinstance(self.previous[0], OneHotRows) else self.previous[0],
                self.previous[1]),
            "snapshots": self.snapshots,
        }

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if self.heads:
            for head, saved in zip(self.heads, state["ensemble"]):
                head.load_state_dict(saved, head_key="net")
            self.snapshots = state["snapshots"]
            return
        self.fitter.load_state_dict(state, head_key="net")
        self.previous = state["previous"]
        self._previous_inputs = None
        self.snapshots = state["snapshots"]
