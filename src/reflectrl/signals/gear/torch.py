"""GEAR advantage reweighting (seed 003; SPEC section 3), as a signal for any trainer.

Each iteration:
1. winners: the top `top_frac` of the batch's trajectories by outcome. A trajectory is a
   run of steps of one env between episode ends (for an LLM batch: one sequence); its
   outcome is the sum of its rewards. Ties are broken by a fixed rule: the shorter
   trajectory first (the same outcome, reached sooner), then the earlier one in the batch;
   at least one winner is always taken.
2. per-step returns G_t: `return_kind="discounted"` is the discounted reward-to-go within
   the trajectory (for a terminal-only reward: gamma^(T-t) R), continued with the critic's
   value where the trajectory stops without terminating (a time limit, or the end of the
   rollout); `"trajectory"` gives every step the trajectory's outcome R.
3. weights, from the head *frozen after the previous distillation*:
   w_t = exp((V_d(s_t) - V_orig(s_t)) / temperature), V_orig being the baseline the
   advantage was measured against (PPO: the critic's value). DECISION: by default
   (`diff_scale="standardize"`) the difference d = V_d - V_orig is standardised over the
   batch before dividing by the temperature. Measured on LunarLander, the raw difference
   is dominated by one batch-wide offset (a head fit on the winners predicts more than the
   critic everywhere), so the seed's literal form (`diff_scale="none"`), or the temperature
   in units of the batch's value std (`"value_std"`), clips ~100% of the weights to w_max or
   w_min: a rescaled step size, not a per-step reweighting. Clipped to [w_min, w_max],
   optionally renormalised to mean 1 per trajectory; the policy loss uses w_t * A_t. Until
   the head has been distilled once, w = 1. `temperature=inf` gives w = 1 exactly.
   Remedies for GEAR lagging PPO early (issue 16): `warmup_steps` keeps w = 1 for the
   first steps (env steps; GRPO: its optimisation steps) while the head distils, and
   `temperature_steps` then ramps the inverse temperature linearly from
   1 / `temperature_start` (inf: 0, every w = 1) to 1 / `temperature`, so the weights
   grow from 1 as the head earns trust. `gear_temperature` logs the temperature in use.
4. after the policy update, the value head (linear or MLP on the features) is fit by MSE
   to G_t on the winners' steps (`distill_on="winners"`, the seed's choice) or on every
   step (`"all"`, the SPEC's DECISION to compare), for `epochs` epochs; then the frozen
   copy is refreshed: copied (`target_ema=1`), or moved towards the head by an exponential
   moving average, frozen <- (1 - target_ema) frozen + target_ema head (seed section 4.2's
   target network, slowed: section 5.2's remedy for a head that overfits recent winners).
   `history=K` (section 5.2's other remedy) keeps the winners' (features, target) pairs of
   the last K distillations and fits on them with the current batch's. Both are measured by
   `value_head_heldout_loss`: the frozen head's MSE on the current batch's winners before it
   is fit on them (how well what it learnt generalises to new winners).
5. Exploration forms (issue 42): `advantage` picks the reward whose returns the head distils
   and whose baseline V_orig the weights compare against: `extrinsic` (the trainer's reward and
   critic; count's bonus, a reward term, is in it), `intrinsic` (the reward streams, RND's, each
   weighted as the policy's advantage weighs it, coef_s / extrinsic_coef, with its own head's
   values) or `total` (both); `select` picks the reward whose trajectory sums rank the winners.
   DECISION: one discount, the trainer's gamma, for every part of the returns. The streams'
   rewards come from members written before gear (ppo+rnd+gear); a run without a stream has
   total == extrinsic and refuses intrinsic.
6. `rank_groups` (seed section 3.4; GRPO only): the completions of each prompt's group are
   re-ranked by their mean reweighted advantage s_i = mean_t(w_t A_i) over their tokens, and
   A_i is replaced by the group-standardised s_i (s_i - mean_g s) / (std_g s + 1e-4), times
   w_t per token. DECISION: standardised values, not bare ranks, so that the margins between
   completions survive; a group whose rewards are all equal keeps advantage 0 (s_i = 0).
   With binary rewards this orders completions of equal reward by their mean weight.
"""

from __future__ import annotations

import copy
import math

import torch

from reflectrl.errors import UserError
from reflectrl.estimators import discounted_returns
from reflectrl.nets import relu_mlp, update_target
from reflectrl.signals.base import Batch, Signal, SignalContext, SignalOutput
from reflectrl.signals.fit import HeadFitter
from reflectrl.signals.gear import SPEC, GEARConfig

# ------------------------------------------------------------------------ batch geometry

def trajectory_ids(terminations: torch.Tensor, truncations: torch.Tensor) -> torch.Tensor:
    """(T, N) integer id of the trajectory each step belongs to, numbered env by env."""
    done = (terminations | truncations).to(torch.long)
    T, N = done.shape
    # a new trajectory starts at t=0 of every env and after every episode end
    starts = torch.zeros_like(done)
    starts[0] = 1
    starts[1:] = done[:-1]
    flat = starts.T.reshape(-1)  # env-major order
    return (torch.cumsum(flat, 0) - 1).reshape(N, T).T


def select_winners(outcomes: torch.Tensor, lengths: torch.Tensor, top_frac: float) -> torch.Tensor:
    """Boolean mask over trajectories: the top ceil(top_frac * n) by outcome, ties to the
    shorter trajectory, then to the earlier one."""
    n = outcomes.shape[0]
    k = max(1, math.ceil(top_frac * n))
    order = sorted(range(n), key=lambda i: (-float(outcomes[i]), int(lengths[i]), i))
    mask = torch.zeros(n, dtype=torch.bool)
    mask[order[:k]] = True
    return mask


def returns_to_go(rewards: torch.Tensor, ids: torch.Tensor, gamma: float,
                  bootstrap: torch.Tensor | None = None) -> torch.Tensor:
    """Discounted reward-to-go within each trajectory, (T, N) (the recursion of
    reflectrl.estimators, shared with GAE).

    `bootstrap[t]` is added, discounted, where a trajectory stops at step t without having
    terminated: at a time limit (the value of the final observation) or at the end of the
    batch (the value of the next observation). Without it, a trajectory cut by the batch
    boundary would look as if nothing came after the cut, and the distilled value would be
    biased low wherever episodes outlast a rollout."""
    continues = torch.zeros(rewards.shape, dtype=torch.bool)
    continues[:-1] = ids[1:] == ids[:-1]  # step t+1 continues step t's trajectory
    return discounted_returns(rewards, gamma, continues, bootstrap)


def reweight(v_distill: torch.Tensor, v_orig: torch.Tensor, temperature: float, w_min: float, w_max: float,
             ids: torch.Tensor | None = None, renormalize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """GEAR weights and the mask of clipped ones."""
    if math.isinf(temperature):
        return torch.ones_like(v_orig), torch.zeros_like(v_orig, dtype=torch.bool)
    raw = torch.exp((v_distill - v_orig) / temperature)
    clipped = (raw < w_min) | (raw > w_max)
    w = raw.clamp(w_min, w_max)
    if renormalize:
        flat_ids = ids.reshape(-1)
        flat = w.reshape(-1)
        sums = torch.zeros(int(flat_ids.max()) + 1).index_add_(0, flat_ids, flat)
        counts = torch.zeros_like(sums).index_add_(0, flat_ids, torch.ones_like(flat))
        w = (flat / (sums / counts)[flat_ids]).reshape(w.shape)
    return w, clipped


def scheduled_temperature(step: int, cfg: GEARConfig) -> float:
    """The temperature at a step: inf (w = 1) during the warm-up, then 1/T moving linearly
    from 1/temperature_start to 1/temperature over temperature_steps, then temperature."""
    if step < cfg.warmup_steps:
        return math.inf
    if cfg.temperature_steps == 0:
        return cfg.temperature
    progress = min(1.0, (step - cfg.warmup_steps) / cfg.temperature_steps)
    inverse = (1 - progress) / cfg.temperature_start + progress / cfg.temperature
    return math.inf if inverse == 0 else 1.0 / inverse


def reward_parts(batch: Batch, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards, values, bootstrap) of one kind of reward, (T, N) each: `extrinsic` is the trainer's
    reward and critic (count's bonus, a reward term, is in it), `intrinsic` the reward streams
    weighted as the policy's advantage weighs them (weight_s = coef_s / extrinsic_coef) with their
    heads' values, `total` both. `bootstrap` is the value of the state each step reached, 0 past
    a termination for the extrinsic part and for an episodic stream (a non-episodic stream runs on)."""
    alive = 1.0 - batch.terminations.float()
    extrinsic = (batch.rewards, batch.values, batch.next_values * alive)
    if kind == "extrinsic" or (kind == "total" and not batch.stream_weights):
        return extrinsic
    if not batch.stream_weights:
        raise UserError("gear.advantage=intrinsic needs a reward stream with its own value head: rnd, written "
                        "before gear, e.g. ppo+rnd+gear[advantage=intrinsic]")
    given = batch.stream_rewards or {}
    missing = [name for name in batch.stream_weights if name not in given]
    if missing:
        raise UserError(f"gear.advantage/select={kind} reads the reward streams {missing} of signals written after "
                        "gear: write them before it, e.g. ppo+rnd+gear")
    values_of = batch.stream_values()
    rewards = torch.zeros_like(batch.rewards)
    values, bootstrap = torch.zeros_like(batch.values), torch.zeros_like(batch.values)
    for name, weight in batch.stream_weights.items():
        v, v_next, episodic = values_of[name]
        rewards = rewards + weight * given[name].reshape(rewards.shape).float()
        values = values + weight * v.reshape(values.shape)
        bootstrap = bootstrap + weight * v_next.reshape(values.shape) * (alive if episodic else 1.0)
    if kind == "intrinsic":
        return rewards, values, bootstrap
    return extrinsic[0] + rewards, extrinsic[1] + values, extrinsic[2] + bootstrap


class GEARReweighting(Signal):
    name = "gear"

    def __init__(self, cfg: GEARConfig):
        self.built_from(cfg, SPEC)  # the head reads features unless inputs=obs (see _wants)
        self.cfg = cfg
        self.distilled = False
        self.past: list[tuple[torch.Tensor, torch.Tensor]] = []  # (features, targets) of past winners (history)
        self._last: dict = {}

    def bind(self, ctx: SignalContext) -> None:
        super().bind(ctx)
        width = ctx.feature_dim if self.wants_features else ctx.obs_dim
        with self.own_rng():
            hidden = () if self.cfg.head == "linear" else self.cfg.hidden_sizes
            self.head = relu_mlp(width, hidden, near_zero_output=False)
        self.fitter = HeadFitter(self.head, lr=self.cfg.lr_multiplier * ctx.learning_rate)
        self.frozen = copy.deepcopy(self.head).requires_grad_(False)

    def check_position(self, before: list[Signal], after: list[Signal]) -> None:
        kinds = {self.cfg.advantage, self.cfg.select} - {"extrinsic"}
        if not kinds:
            return
        streams = lambda members: [m.name for m in members if m.reward_streams()]  # noqa: E731
        if streams(after):
            raise UserError(f"gear.advantage/select={'/'.join(sorted(kinds))} reads the reward streams of "
                            f"{', '.join(streams(after))}, written after gear: write them before it, e.g. ppo+rnd+gear")
        if "intrinsic" in kinds and not streams(before):
            raise UserError("gear.advantage=intrinsic needs a reward stream with its own value head: rnd, written "
                            "before gear, e.g. ppo+rnd+gear[advantage=intrinsic]")

    def _x(self, batch: Batch) -> torch.Tensor:
        x = batch.features if self.wants_features else batch.obs
        return x.reshape(batch.values.numel(), -1).detach()

    def after_advantages(self, batch: Batch) -> SignalOutput | None:
        cfg = self.cfg
        scheduled = cfg.warmup_steps > 0 or cfg.temperature_steps > 0
        temperature = scheduled_temperature(batch.global_step, cfg) if scheduled else cfg.temperature
        if not self.distilled or math.isinf(temperature):
            self._last = {"weights_mean": 1.0, "weights_std": 0.0, "weights_min": 1.0, "weights_max": 1.0,
                          "weights_clipped_frac": 0.0}
            if scheduled:
                self._last["gear_temperature"] = temperature
            return None
        with torch.no_grad():
            v_d = self.frozen(self._x(batch)).reshape(batch.values.shape)
        ids = trajectory_ids(batch.terminations, batch.truncations)
        valid = batch.mask if batch.mask is not None else torch.ones_like(batch.values, dtype=torch.bool)
        v_orig = batch.values if cfg.advantage == "extrinsic" else reward_parts(batch, cfg.advantage)[1]
        if cfg.diff_scale == "standardize":
            # compare V_d and V_orig up to the batch-wide offset between them: weights then
            # move credit between steps instead of scaling the whole batch's step size
            diff = v_d - v_orig
            real = diff[valid]
            v_d, v_orig = (diff - real.mean()) / (real.std() + 1e-8), torch.zeros_like(diff)
        elif cfg.diff_scale == "value_std":
            temperature = temperature * (v_orig[valid].std().item() + 1e-8)
        if batch.mask is not None:  # steps that are not real get weight 1 and no say in the renormalisation
            v_d, v_orig, ids = v_d.where(valid, 0.0), v_orig.where(valid, 0.0), ids.where(valid, ids.max() + 1)
        w, clipped = reweight(v_d, v_orig, temperature, cfg.w_min, cfg.w_max, ids, cfg.renormalize)
        w = w.where(valid, 1.0)
        w_real, clipped = w[valid], clipped[valid]
        self._last = {"weights_mean": w_real.mean().item(), "weights_std": w_real.std().item(),
                      "weights_min": w_real.min().item(), "weights_max": w_real.max().item(),
                      "weights_clipped_frac": clipped.float().mean().item()}
        if scheduled:
            self._last["gear_temperature"] = temperature
        if cfg.rank_groups:
            return SignalOutput(weights=w, advantage=self._ranked(batch, w, valid))
        return SignalOutput(weights=w)

    def _ranked(self, batch: Batch, w: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The advantage term that turns w_t A_i into w_t A'_i, A'_i being the group-standardised
        mean reweighted advantage (one column of a GRPO batch is one completion)."""
        real = valid.float()
        s = (w * batch.advantages * real).sum(0) / real.sum(0).clamp(min=1)  # (N,)
        group = batch.groups[0].long()
        ranked = torch.zeros_like(s)
        spread = []
        for g in group.unique():
            members = group == g
            mean, std = s[members].mean(), s[members].std(unbiased=True) if members.sum() > 1 else 0.0
            ranked[members] = (s[members] - mean) / (std + 1e-4)
            spread.append(float(std))
        per_seq = (batch.advantages * real).sum(0) / real.sum(0).clamp(min=1)  # A_i
        changed = (ranked.sign() != per_seq.sign()) & (per_seq != 0)
        self._last["rank_sign_flips"] = changed.float().mean().item()
        return (w * (ranked - per_seq)[None, :] * real)

    def after_update(self, batch: Batch) -> None:
        cfg = self.cfg
        ids = trajectory_ids(batch.terminations, batch.truncations)
        flat_ids = ids.reshape(-1)
        n = int(flat_ids.max()) + 1
        valid = (batch.mask.reshape(-1) if batch.mask is not None
                 else torch.ones_like(flat_ids, dtype=torch.bool))
        ranked = batch.rewards if cfg.select == "extrinsic" else reward_parts(batch, cfg.select)[0]
        rewards = ranked.reshape(-1) * valid
        outcomes = torch.zeros(n).index_add_(0, flat_ids, rewards)
        lengths = torch.zeros(n, dtype=torch.long).index_add_(0, flat_ids, valid.long())
        if batch.groups is None:
            winners = select_winners(outcomes, lengths, cfg.top_frac)
        else:  # GRPO: the top of each prompt's group, so every prompt teaches the head something
            group_of = torch.zeros(n, dtype=torch.long).index_copy_(0, flat_ids, batch.groups.reshape(-1).long())
            winners = torch.zeros(n, dtype=torch.bool)
            for g in group_of.unique():
                members = (group_of == g).nonzero().squeeze(-1)
                winners[members] = select_winners(outcomes[members], lengths[members], cfg.top_frac)
        if cfg.advantage == "extrinsic":
            # where a trajectory stops without terminating, continue it with the critic's value
            own_rewards, bootstrap = batch.rewards, batch.next_values * (1.0 - batch.terminations.float())
        else:
            own_rewards, _, bootstrap = reward_parts(batch, cfg.advantage)
        if cfg.return_kind == "discounted":
            targets = returns_to_go(own_rewards, ids, self.ctx.gamma, bootstrap).reshape(-1)
        elif cfg.advantage == cfg.select:
            targets = outcomes[flat_ids]
        else:  # every step's target is its trajectory's sum of the distilled kind of reward
            own = own_rewards.reshape(-1) * valid
            targets = torch.zeros(n).index_add_(0, flat_ids, own)[flat_ids]
        keep = valid & (winners[flat_ids] if cfg.distill_on == "winners" else True)
        x, y = self._x(batch)[keep], targets[keep]
        if x.shape[0] == 0:  # no real step to learn from (every winner fully masked): keep the head as it is
            self._last.update(winners=int(winners.sum()), trajectories=int((lengths > 0).sum()))
            return
        if self.distilled:  # what the head learnt so far, on winners it has not seen
            with torch.no_grad():
                self._last["value_head_heldout_loss"] = torch.mean((self.frozen(x).squeeze(-1) - y) ** 2).item()
        fit_x, fit_y = x, y
        if cfg.history:
            fit_x = torch.cat([x, *(h[0] for h in self.past)])
            fit_y = torch.cat([y, *(h[1] for h in self.past)])
            self.past = (self.past + [(x, y)])[-cfg.history:]
        fit = self.fitter.fit(fit_x, fit_y, epochs=cfg.epochs, minibatch_size=cfg.minibatch_size,
                              generator=self.generator, shuffle="always", loss_after=True)
        self._last["value_head_loss"] = fit.loss_after
        self._last["winners"] = int(winners.sum())
        self._last["trajectories"] = int((lengths > 0).sum())
        # the first distillation, or target_ema=1: a copy; else an EMA step (lerp)
        update_target(self.frozen, self.head, cfg.target_ema if self.distilled else 1.0)
        self.distilled = True

    def metrics(self) -> dict:
        return dict(self._last)

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.fitter.state_dict(head_key="head"), "frozen": self.frozen.state_dict(),
                "distilled": self.distilled, "past": list(self.past)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.fitter.load_state_dict(state, head_key="head")
        self.frozen.load_state_dict(state["frozen"])
        self.distilled = state["distilled"]
        self.past = list(state.get("past", []))
