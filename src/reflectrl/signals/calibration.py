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
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.nn import functional as F

from reflectrl.errors import UserError
from reflectrl.nets import relu_mlp
from reflectrl.registry import SignalSpec, register_signal
from reflectrl.signals.base import Batch, Signal, SignalContext, SignalOutput, checked_once
from reflectrl.signals.fit import HeadFitter, OneHotRows, mse, one_hot_rows
from reflectrl.signals.schedule import check_schedule, factor_at

MODES = ("miscalibration", "uncertainty")
ENSEMBLE_TARGETS = ("normalized", "raw")
INPUTS = ("obs_action", "obs_action_features", "features_action")
CLIPS = ("relative", "absolute", "none")
TARGETS = ("denormalized", "seed")


@checked_once
@dataclass
class CalibrationConfig:
    RENAMED: ClassVar[dict[str, str]] = {"reflection_epochs": "epochs"}  # old knob names still accepted, with a warning

    mode: str = "miscalibration"
    """miscalibration (the seed's bonus, -alpha x error^2) or uncertainty (+alpha x the disagreement of an
    ensemble of heads: acts before the first reward)"""
    alpha: float = 0.05
    """bonus strength (0: the run equals --algo ppo bit for bit)"""
    ensemble: int = 5
    """mode=uncertainty: the number of reflection heads, each its own initialisation and bootstrap mask"""
    bootstrap: float = 0.5
    """mode=uncertainty: each row's chance of being in a head's fit, drawn anew every iteration"""
    ensemble_target: str = "normalized"
    """mode=uncertainty: what the heads predict: normalized (the advantages at unit variance, as the seed's head) or
    raw (the advantages as they are: ~0 before the first reward, so the heads agree where the agent has been)"""
    schedule: str = "constant"
    """decay of alpha over the run: constant, linear or exponential (signals/schedule.py)"""
    schedule_steps: int = 0
    """the env step by which the decayed bonus is gone (exponential: 1% left); 0: the run's whole length"""
    beta: float = 1.0
    """weight of the clipped bonus in the reward"""
    hidden_sizes: tuple[int, ...] = (64, 64)
    """reflection net widths (ReLU, near-zero output init)"""
    inputs: str = "obs_action"
    """obs_action, obs_action_features or features_action (the actor's last hidden layer; on CNN-read images, always)"""
    shared_trunk: bool = False
    """also train the actor's trunk on the calibration loss (auxiliary loss)"""
    shared_trunk_coef: float = 0.5
    """weight of that auxiliary loss"""
    epochs: int = 5
    """epochs of the reflection net's fit per iteration"""
    minibatch_size: int = 512
    """minibatch size of that fit"""
    lr_multiplier: float = 4.0
    """the reflection net's learning rate, in multiples of the policy's"""
    clip: str = "relative"
    """relative (k x mean |r|), absolute (clip_value) or none"""
    clip_k: float = 3.0
    """k of the relative clip"""
    clip_value: float = 1.0
    """bound of the absolute clip"""
    max_ratio: float = float("inf")
    """bonus budget: scale the term so mean |beta b| <= this x mean |r| per batch (inf: none)"""
    adaptive: bool = False
    """scale alpha by the current calibration loss (1 = knows nothing), capped"""
    adaptive_max: float = 2.0
    """cap of that scale"""
    bonus_target: str = "denormalized"
    """denormalized (f de-normalised vs the raw advantage, SPEC DECISION) or seed (raw f, as the seed writes it)"""
    recompute_advantages: bool = True
    """recompute GAE on r + bonus; false: add the bonus to each step's advantage"""
    snapshots: int = 5
    """predicted-vs-actual samples kept for the calibration picture"""

    def validate(self) -> None:
        def bad(msg):
            raise UserError(f"calibration.{msg}")

        for name in ("alpha", "beta", "lr_multiplier", "clip_k", "clip_value", "adaptive_max", "shared_trunk_coef"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                bad(f"{name}={value}: must be a finite number >= 0")
        if math.isnan(self.max_ratio) or self.max_ratio <= 0:
            bad(f"max_ratio={self.max_ratio}: must be > 0 (inf for no budget)")
        if self.lr_multiplier == 0:
            bad("lr_multiplier=0: must be > 0 (the reflection net would never learn)")
        for name in ("epochs", "minibatch_size"):
            if getattr(self, name) < 1:
                bad(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.snapshots < 0:
            bad(f"snapshots={self.snapshots}: must be >= 0")
        if not self.hidden_sizes or any(h < 1 for h in self.hidden_sizes):
            bad(f"hidden_sizes={self.hidden_sizes}: give positive layer widths, e.g. 64,64")
        if self.ensemble < 2:
            bad(f"ensemble={self.ensemble}: needs at least 2 heads (their disagreement is the bonus)")
        if not 0.0 < self.bootstrap <= 1.0:
            bad(f"bootstrap={self.bootstrap}: must be in (0, 1] (1: every head fits every row)")
        check_schedule("calibration", self.schedule, self.schedule_steps)
        if self.mode == "uncertainty" and self.shared_trunk:
            bad("shared_trunk=true trains the actor's trunk on the seed's calibration loss; mode=uncertainty has "
                "no such loss: leave shared_trunk=false")
        for name, allowed in (("mode", MODES), ("inputs", INPUTS), ("clip", CLIPS), ("bonus_target", TARGETS),
                              ("ensemble_target", ENSEMBLE_TARGETS)):
            if getattr(self, name) not in allowed:
                bad(f"{name}='{getattr(self, name)}': use one of {', '.join(allowed)}")
        if self.shared_trunk and self.inputs == "obs_action":
            bad("shared_trunk=true needs the actor's features among the inputs: "
                "set calibration.inputs=features_action or obs_action_features")


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


def _check_on_grpo(cfg: CalibrationConfig) -> None:
    if cfg.inputs != "obs_action":
        raise UserError("calibration.inputs: an LLM turn's input is its hidden state; leave inputs=obs_action")


def _check_on_replay(cfg: CalibrationConfig) -> None:
    if not cfg.recompute_advantages:
        raise UserError("calibration.recompute_advantages=false adds the bonus to the policy's advantage, and a "
                        "replay trainer's loss has no advantage: leave it true (the bonus joins the TD target)")


def _wants(cfg: CalibrationConfig) -> set[str]:
    wants = {"features"} if cfg.inputs != "obs_action" else set()
    return wants | ({"feature_grad"} if cfg.shared_trunk else set())


SPEC = register_signal(SignalSpec(
    name="calibration", config=CalibrationConfig, factory=CalibrationBonus,
    step_kinds=("env_step", "turn", "transition"),
    summary="seed 000's calibration bonus (--algo refgrpo; the RefGRPO paper's own method is the verbal verdict, "
            "grpo+verdict): a reflection head fit to the advantages; its miscalibration is a reward",
    wants=_wants,
    aliases={"control": "refgrpo", "llm": "refgrpo"}, neutral="alpha=0",
    step_checks={"turn": _check_on_grpo, "transition": _check_on_replay},
    on_finish={"env_step": "reflectrl.report.calibration_plot:plot_at_finish"},
))
