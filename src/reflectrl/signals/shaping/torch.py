"""Self-distilled reward shaping, SDRS (seed 002; SPEC section 2).

1. Interaction: each transition gets f = F_target(s, a, s') and the trainer learns from
   r + w * f, w being the curriculum weight (0 for `warmup_steps`, then a linear ramp to 1
   over `ramp_steps`).
2. After every `update_every`-th policy update, soft labels: GAE advantages recomputed with
   the *updated* critic over a distillation buffer of the last `buffer_rollouts` rollouts,
   normalised to mean 0 / std 1, times `scale`; F is fit to them by MSE for `epochs` epochs
   at `lr_multiplier` x the policy's learning rate; after each of its gradient steps the
   target follows: F_target <- tau F + (1-tau) F_target.
3. Output: `mode="direct"`: f = eta * tanh(F_raw(s, a, s')) (optionally hard-clipped to
   +-`hard_clip`); `mode="potential"`: f = gamma * Phi(s') - Phi(s), with Phi(terminal) = 0
   and Phi = eta * tanh(Phi_raw(s)), which leaves optimal policies unchanged (Ng et al. 1999);
   the same labels are fit through that difference. `mode="off"`: F = 0 with everything
   else identical (the ablation); the run equals plain PPO bit for bit.
   Two loop-proof modes (issue 16; both potential-based, so optimal policies are unchanged):
   * `mode="bootstrap"`: Bootstrapped Reward Shaping (Adamczyk et al., AAAI 2025): the
     potential is the agent's own current value estimate, Phi = `value_scale` x V, so
     f = value_scale (gamma V(s') (1 - terminal) - V(s)); nothing is distilled.
   * `mode="advice"`: dynamic potential-based advice (Harutyunyan et al. 2015): F is
     distilled as in `direct`, and a potential Phi(s) learns the value of -F under the
     current policy (after every update, fit by MSE to TD(lambda) returns of -F over the
     distillation buffer, bootstrapped with Phi itself, the trainer's GAE doing the
     recursion); the reward term is gamma Phi(s') (1 - terminal) - Phi(s), whose expected
     sum along the policy's path is F's. DECISION: a state potential Phi(s), not the
     paper's state-action Phi(s, a) (that needs the next action, which a rollout's
     reward hook does not have); potential-based all the same.
   `distill` (issue 42) says whose advantages the labels are: `extrinsic` (the default) the
   trainer's reward under its critic, as above (count's bonus is a term of that reward, so
   ppo+count+shaping already distils it); `total` adds each reward stream's advantage (RND's
   intrinsic one, weighted as the policy weighs it: coef_s / extrinsic_coef) as the policy used
   it for that rollout (DECISION: the stream's part is not recomputed after the update), so that
   an exploration drive with a value head of its own becomes a potential-based term too.
4. Prior: `prior="module:function"`, a heuristic h(s, a, s') -> (B,) tensor, is fit by F
   before the first update (on the first rollout's transitions, `prior_epochs` epochs), and
   F_target starts from it.

Images (seed 002 section 3.2: s' goes through "the same encoder, or a small CNN of its own"),
chosen by `encoder`:
* `policy` (the default): on images read by the policy's CNN (Atari), F reads the policy's
  features of s and s' in place of the pixels, computed with the encoder as it is whenever F
  is applied or fit (F's fit does not train the policy's encoder); elsewhere the observation.
* `cnn` (under a CNN policy): F has a CNN trunk of its own, of the policy's kind (the Nature
  CNN on pixels, the small CNN on MiniGrid's view), one trunk for s and s', trained with F by
  the distillation and followed by F_target's Polyak average; the policy's encoder is left
  alone.
Either way the buffer keeps the observations, which the critic's labels need anyway.

On a replay trainer (DQN, SAC: trainers/replay/base.py) the hooks run at every gradient step on
the sampled minibatch: f comes from F_target as it is then and joins the sampled rewards in the
TD target (never stored in the buffer), the distillation buffer holds the last
`buffer_rollouts` minibatches, and the labels are the trainer's TD errors under its networks
after the step, r + gamma max_a' Q_target(s', a') - Q(s, a) for DQN (seed 002 section 4.3) and
the soft TD error for SAC; `update_every` counts gradient steps.

Safety (seed 002 section 6.3: f = f_performance + beta f_safety): with `safety_beta` > 0 (on an
env with a cost channel, info["cost"]: envs/cost.py) a constraint critic V_c (cost_critic.py)
learns the cost-to-go after every update (TD(lambda) returns of the rollout's costs, bootstrapped
with itself), and a second shaper F_safety of the same mode is distilled, on the same cadence and
buffer as F, from the *negated* cost advantages under V_c (normalised, times `scale`), with its own
target network; the reward term becomes w (f + safety_beta f_safety). DECISION: the safety term
has no multiplier of its own that tracks the limit (that is the Lagrangian's job, `ppo_lag`):
beta is fixed, so the term steers towards low-cost behaviour in proportion to how costly the
agent's own experience says an action is. Modes direct and potential only (bootstrap and advice
distil no F to pair it with).

Imagination (seed 002 section 6.2): with `imagined_fraction` > 0 (vector observations), a world
model (world_model.py: an ensemble of MLPs predicting s' - s, r and termination) is fit on the
run's real transitions before each distillation, `imagined_horizon`-step rollouts branched from
real states of the buffer under the current policy are valued by the critic, and their GAE
advantages join the real ones as soft labels (normalised together), so that a share
`imagined_fraction` of the distillation set is imagined. Logged: `model_error` and
`model_reward_error` (the ensemble's error on each new rollout before it is fit on it),
`imagined_share` (of the rows, after rollouts that ended early are cut) and, for every
shaping run, `label_r2_heldout`: F's R^2 on the newest rollout's labels before F is fit on
them (compare it between runs with and without imagination).

The logged and evaluated return stays the env's true return; the trainer's `rewards` here
are what it learns from before shaping.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import nn

from reflectrl.errors import UserError
from reflectrl.nets import ImageEncoder, cnn_fits, relu_mlp, update_target
from reflectrl.signals._cost_critic import CostCritic
from reflectrl.signals.base import Batch, Signal, SignalContext
from reflectrl.signals.fit import HeadFitter, predict_in_chunks
from reflectrl.signals.shaping import SPEC, ShapingConfig, load_prior
from reflectrl.signals.shaping._world_model import WorldModel, imagined_advantages


def curriculum(step: int, warmup: int, ramp: int) -> float:
    """The shaping weight at an env step: 0 during warm-up, then a linear ramp to 1."""
    if step < warmup:
        return 0.0
    if ramp == 0:
        return 1.0
    return min(1.0, (step - warmup) / ramp)


def polyak(target: nn.Module, source: nn.Module, tau: float) -> None:
    """target <- tau * source + (1 - tau) * target: the shared update in the shaper's
    arithmetic (a multiply then an add, at tau=1 too)."""
    update_target(target, source, tau, arithmetic="mul_add", copy_at_one=False)


class RewardShaper(nn.Module):
    """F(s, a, s') = eta * tanh(MLP), or gamma * Phi(s') (1 - terminal) - Phi(s); with an
    `encoder` (a module), the MLP reads encoder(s) and encoder(s') in place of s and s'."""

    def __init__(self, obs_dim, action_dim, hidden_sizes, mode, eta, gamma, hard_clip, encoder: nn.Module = None):
        super().__init__()
        self.mode, self.eta, self.gamma, self.hard_clip, self.action_dim = mode, eta, gamma, hard_clip, action_dim
        self.encoder = encoder
        if encoder is not None:
            obs_dim = encoder.out_dim
        self.net = relu_mlp(obs_dim if mode == "potential" else 2 * obs_dim + action_dim, hidden_sizes)

    def _read(self, obs: torch.Tensor) -> torch.Tensor:
        return obs if self.encoder is None else self.encoder(obs)

    def potential(self, obs: torch.Tensor) -> torch.Tensor:
        return self.eta * torch.tanh(self.net(self._read(obs)).squeeze(-1))

    def forward(self, obs, actions, next_obs, terminations) -> torch.Tensor:
        if self.mode == "potential":
            return self.gamma * self.potential(next_obs) * (1.0 - terminations.float()) - self.potential(obs)
        x = torch.cat([self._read(obs), actions, self._read(next_obs)], -1)
        f = self.eta * torch.tanh(self.net(x).squeeze(-1))
        return f.clamp(-self.hard_clip, self.hard_clip) if math.isfinite(self.hard_clip) else f


class SelfDistilledShaping(Signal):
    name = "shaping"

    def __init__(self, cfg: ShapingConfig):
        self.built_from(cfg, SPEC)
        self.cfg = cfg
        self.prior = load_prior(cfg.prior) if cfg.prior else None
        self.buffer: list[dict] = []
        self.updates = 0
        self.prior_fitted = False
        self._last: dict = {}
        self.warned = False

    def bind(self, ctx: SignalContext) -> None:
        super().bind(ctx)
        self.own_encoder = self.cfg.encoder == "cnn"
        if self.own_encoder and not (ctx.image_obs and cnn_fits(ctx.obs_shape)):
            raise UserError(f"shaping.encoder=cnn: the policy reads observations of shape {ctx.obs_shape}, not images; "
                            "it needs a CNN policy on images (Atari, or MiniGrid with --set encoder=cnn), "
                            "or use shaping.encoder=policy")
        with self.own_rng():
            encoder = ImageEncoder(ctx.obs_shape) if self.own_encoder else None
            in_dim = ctx.feature_dim if ctx.image_obs else ctx.obs_dim  # pixels: F reads the policy's features
            shaper_mode = "direct" if self.cfg.mode in ("advice", "bootstrap") else self.cfg.mode
            self.shaper = RewardShaper(in_dim, ctx.action_dim, self.cfg.hidden_sizes, shaper_mode,
                                       self.cfg.eta, ctx.gamma, self.cfg.hard_clip, encoder=encoder)
            # mode=advice: the potential whose differences carry F (near-zero output: no shaping at first)
            self.advice = relu_mlp(in_dim, self.cfg.hidden_sizes) if self.cfg.mode == "advice" else None
        # F's forward (a tanh, or a difference of potentials) is fit through autograd
        self.fitter = HeadFitter(self.shaper, lr=self.cfg.lr_multiplier * ctx.learning_rate, forward=self.shaper)
        self.target = copy.deepcopy(self.shaper).requires_grad_(False)
        if self.advice is not None:
            self.advice_fitter = HeadFitter(self.advice, lr=self.cfg.lr_multiplier * ctx.learning_rate)
        self.snapshot_at = self.snapshot_iterations(self.cfg.snapshots)
        self.snapshots: list[dict] = []  # F_target's weights at a few points, for the reward map
        self.model = None
        if self.cfg.imagined_fraction > 0:
            if ctx.image_obs or len(ctx.obs_shape) > 1:
                raise UserError(f"shaping.imagined_fraction: the world model reads vector observations; this run's "
                                f"are of shape {ctx.obs_shape}; use shaping.imagined_fraction=0")
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + 2)
                self.model = WorldModel(ctx.obs_dim, ctx.action_dim,  # the width of encode_actions: one-hot or raw
                                        ensemble=self.cfg.model_ensemble, hidden_sizes=self.cfg.model_hidden_sizes,
                                        lr=self.cfg.model_lr, buffer=self.cfg.model_buffer)
        self.safety = None
        if self.cfg.safety_beta > 0:  # F_safety and the constraint critic it is distilled from
            lr = self.cfg.lr_multiplier * ctx.learning_rate
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed + 1)
                self.safety = RewardShaper(in_dim, ctx.action_dim, self.cfg.hidden_sizes, self.cfg.mode,
                                           self.cfg.eta, ctx.gamma, self.cfg.hard_clip)
                self.cost_critic = CostCritic(in_dim, self.cfg.hidden_sizes, lr)
            self.safety_fitter = HeadFitter(self.safety, lr=lr, forward=self.safety)
            self.safety_target = copy.deepcopy(self.safety).requires_grad_(False)

    def _transitions(self, batch: Batch) -> dict:
        n = batch.values.numel()
        return {"obs": batch.obs.reshape(n, -1), "actions": self.encode_actions(batch.actions),
                "next_obs": batch.next_obs.reshape(n, -1), "terminations": batch.terminations.reshape(-1)}

    # ----------------------------------------------------------------------------- hooks

    def shape_rewards(self, batch: Batch) -> torch.Tensor | None:
        if self.cfg.mode == "off":
            return None
        tr = self._transitions(batch)
        fit_prior = self.prior is not None and not self.prior_fitted
        prior_loss = self._fit_prior(tr, batch.features_fn) if fit_prior else None
        weight = curriculum(batch.global_step, self.cfg.warmup_steps, self.cfg.ramp_steps)
        if (batch.iteration in self.snapshot_at and self.cfg.mode != "bootstrap"  # bootstrap has no F to draw
                and not (self.snapshots and self.snapshots[-1]["iteration"] == batch.iteration)):
            self.snapshots.append({"iteration": batch.iteration, "global_step": batch.global_step,
                                   "weight": curriculum(batch.global_step, self.cfg.warmup_steps, self.cfg.ramp_steps),
                                   "state": {k: v.clone() for k, v in self.target.state_dict().items()}})
        if self.cfg.mode == "bootstrap":  # the critic's own values as the potential
            alive = 1.0 - batch.terminations.float()
            f = self.cfg.value_scale * (self.ctx.gamma * batch.next_values * alive - batch.values)
        else:
            obs, next_obs = self._encoded(tr["obs"], tr["next_obs"], batch.features_fn)
            with torch.no_grad():  # in chunks: with its own CNN, F's activations over a big rollout are large
                if self.cfg.mode == "advice":
                    f = self._advice_shaping(obs, next_obs, tr["terminations"])
                else:
                    f = predict_in_chunks(lambda p: self.target(*p),
                                          (obs, tr["actions"], next_obs, tr["terminations"]))
                if self.safety is not None:
                    f_safety = predict_in_chunks(lambda p: self.safety_target(*p),
                                                 (obs, tr["actions"], next_obs, tr["terminations"]))
                    f = f + self.cfg.safety_beta * f_safety
            f = f.reshape(batch.values.shape)
        shaping = weight * f
        r = batch.rewards
        mean_abs_r = r.abs().mean().item()
        ratio = shaping.abs().mean().item() / mean_abs_r if mean_abs_r > 0 else None
        self._last = {
            "shaping_weight": weight, "shaping_mean": shaping.mean().item(), "shaping_std": shaping.std().item(),
            "shaping_min": shaping.min().item(), "shaping_max": shaping.max().item(),
            "reward_mean": r.mean().item(), "reward_std": r.std().item(), "reward_min": r.min().item(),
            "reward_max": r.max().item(), "shaping_to_reward": ratio,
            "shaping_warning": int(ratio is not None and ratio > self.cfg.warn_ratio),
        }
        if prior_loss is not None:
            self._last["prior_loss"] = prior_loss
        if self.safety is not None:
            self._last["safety_shaping_mean"] = weight * self.cfg.safety_beta * f_safety.mean().item()
        if self._last["shaping_warning"] and not self.warned:
            self.warned = True
            warnings.warn(f"mean |shaping| is {ratio:.0%} of mean |reward| at step {batch.global_step} (above "
                          "shaping.warn_ratio): the shaping may dominate the task")
        return shaping

    def after_update(self, batch: Batch) -> None:
        if self.cfg.mode in ("off", "bootstrap"):
            return
        team = self.cfg.labels == "team" or (self.cfg.labels == "auto" and batch.team_rewards is not None)
        self.buffer.append({**self._transitions(batch), "rewards": batch.team_rewards if team else batch.rewards,
                            "shape": batch.values.shape,
                            "truncations": batch.truncations, "raw_terminations": batch.terminations,
                            "raw_actions": batch.actions.reshape(batch.values.numel(), *batch.actions.shape[2:]),
                            **({"costs": batch.costs} if self.safety is not None else {}),
                            **({"stream_advantage": self._stream_advantage(batch)} if self.cfg.distill == "total"
                               else {})})
        self.buffer = self.buffer[-self.cfg.buffer_rollouts:]
        self.updates += 1
        if self.model is not None:  # its error on the new rollout, then the rollout joins its data
            item = self.buffer[-1]
            err, reward_err = self.model.heldout_error(item["obs"], item["actions"], item["next_obs"],
                                                       item["rewards"])
            if math.isfinite(err):  # not before the model's first fit
                self._last.update(model_error=err, model_reward_error=reward_err)
            self.model.add(item["obs"], item["actions"], item["next_obs"], item["rewards"], item["terminations"])
        if self.safety is not None:  # the constraint critic follows the policy after every update
            item = self.buffer[-1]
            obs, next_obs = self._encoded(item["obs"], item["next_obs"], batch.features_fn)
            _, returns = self.cost_critic.estimate(batch.gae, item["costs"], obs, next_obs, item["raw_terminations"],
                                                   item["truncations"])
            self._last["cost_value_loss"] = self.cost_critic.fit(obs, returns, epochs=self.cfg.epochs,
                                                                 minibatch_size=self.cfg.minibatch_size,
                                                                 generator=self.generator)
        if self.updates % self.cfg.update_every == 0:
            extra = self._imagine(batch) if self.model is not None else None
            value_fn = batch.team_value_fn if team else batch.value_fn
            obs, actions, next_obs, terms, labels = self.distillation_set(value_fn, batch.gae, batch.td_error_fn,
                                                                          extra=extra)
            obs, next_obs = self._encoded(obs, next_obs, batch.features_fn)
            # F's R^2 on the newest real rollout's labels, which it has not been fit on yet
            n_real = len(labels) - (0 if extra is None else len(extra[-1]))
            rows = slice(n_real - batch.values.numel(), n_real)
            if n_real - batch.values.numel() >= 0 and batch.values.numel() > 1:
                held = labels[rows]
                with torch.no_grad():
                    pred = predict_in_chunks(lambda p: self.shaper(*p), (obs[rows], actions[rows], next_obs[rows],
                                                                         terms[rows]))
                heldout_mse = float((pred - held).square().mean())
                self._last["label_r2_heldout"] = 1.0 - heldout_mse / (held.var().item() + 1e-12)
            loss = self._fit(obs, actions, next_obs, terms, labels, self.cfg.epochs, track_target=True)
            # The labels have variance scale^2, so this is the share of it F explains (0: F has
            # learned nothing yet, seed 002 section 4.2's failure; near 1: F reproduces the advantages).
            self._last.update(label_loss=loss,
                              label_r2=1.0 - loss / labels.var().item() if len(labels) > 1 else None)
            if self.safety is not None:
                self._last.update(self._fit_safety(batch.gae, batch.features_fn))
        if self.cfg.mode == "advice":
            self._last["advice_loss"] = self._fit_advice(batch.gae, batch.features_fn)

    @staticmethod
    def _stream_advantage(batch: Batch) -> torch.Tensor | None:
        """distill=total: sum_s weight_s A_s, the reward streams' part of the policy's advantage
        (relative to the extrinsic one's), as the policy used it; None without streams."""
        if not batch.stream_weights or not batch.stream_advantages:
            return None
        total = None
        for name, weight in batch.stream_weights.items():
            part = weight * batch.stream_advantages[name].reshape(batch.values.shape)
            total = part if total is None else total + part
        return total

    def _imagine(self, batch: Batch):
        """Fit the world model, then imagine from real states of the buffer: (obs, actions, next_obs,
        terminations, advantages) of the imagined steps before each rollout's predicted end."""
        self._last["model_loss"] = self.model.fit(self.cfg.model_steps, self.cfg.minibatch_size, self.generator)
        real = sum(item["obs"].shape[0] for item in self.buffer)
        wanted = round(real * self.cfg.imagined_fraction / (1 - self.cfg.imagined_fraction))
        starts = max(1, -(-wanted // self.cfg.imagined_horizon))
        pool = torch.cat([item["obs"] for item in self.buffer])
        start = pool[torch.randint(len(pool), (starts,), generator=self.generator)]
        rollout = self.model.imagine(start, batch.act_fn, self.encode_actions, self.cfg.imagined_horizon,
                                     self.generator)
        adv, alive = imagined_advantages(rollout, batch.value_fn, batch.gae)
        keep = alive.reshape(-1)
        flat = lambda key: rollout[key].reshape(keep.numel(), -1)[keep]  # noqa: E731
        self._last["imagined_share"] = int(keep.sum()) / (int(keep.sum()) + real)
        return (flat("obs"), flat("actions"), flat("next_obs"), rollout["terminations"].reshape(-1)[keep].float(),
                adv.reshape(-1)[keep])

    def _fit_safety(self, gae, features_fn) -> dict:
        """Distil F_safety from the negated cost advantages under V_c over the buffer (normalised,
        times `scale`); its target follows it after every step."""
        rows, labels = [], []
        with torch.no_grad():
            for item in self.buffer:
                obs, next_obs = self._encoded(item["obs"], item["next_obs"], features_fn)
                adv, _ = self.cost_critic.estimate(gae, item["costs"], obs, next_obs, item["raw_terminations"],
                                                   item["truncations"])
                rows.append((obs, item["actions"], next_obs, item["terminations"]))
                labels.append(-adv.reshape(-1))
        x = tuple(torch.cat(parts) for parts in zip(*rows))
        labels = torch.cat(labels)
        labels = self.cfg.scale * (labels - labels.mean()) / (labels.std() + 1e-8)
        follow = lambda: polyak(self.safety_target, self.safety, self.cfg.tau)  # noqa: E731
        loss = self.safety_fitter.fit(x, labels, epochs=self.cfg.epochs, minibatch_size=self.cfg.minibatch_size,
                                      generator=self.generator, shuffle="always", after_step=follow,
                                      loss_after=True).loss_after
        return {"safety_label_loss": loss,
                "safety_label_r2": 1.0 - loss / labels.var().item() if len(labels) > 1 else None}

    def _phi(self, obs) -> torch.Tensor:
        """The advice potential Phi of each row, flat (in chunks)."""
        return predict_in_chunks(lambda p: self.advice(p[0]).squeeze(-1), (obs,))

    def _advice_shaping(self, obs, next_obs, terminations) -> torch.Tensor:
        """gamma Phi(s') (1 - terminal) - Phi(s), flat."""
        return self.ctx.gamma * self._phi(next_obs) * (1.0 - terminations.float()) - self._phi(obs)

    def _fit_advice(self, gae, features_fn) -> float:
        """One fit of Phi to the TD(lambda) returns of -F_target over the buffer, bootstrapped
        with Phi as it is (the trainer's GAE makes the returns); returns the loss after it."""
        obs_all, targets = [], []
        with torch.no_grad():
            for item in self.buffer:
                shape = item["shape"]
                obs, next_obs = self._encoded(item["obs"], item["next_obs"], features_fn)
                advice_reward = -predict_in_chunks(lambda p: self.target(*p),
                                                   (obs, item["actions"], next_obs, item["terminations"]))
                values, next_values = self._phi(obs).reshape(shape), self._phi(next_obs).reshape(shape)
                _, returns = gae(advice_reward.reshape(shape), values, next_values, item["raw_terminations"],
                                 item["truncations"])
                obs_all.append(obs), targets.append(returns.reshape(-1))
        return self.advice_fitter.fit(torch.cat(obs_all), torch.cat(targets), epochs=self.cfg.epochs,
                                      minibatch_size=self.cfg.minibatch_size, generator=self.generator,
                                      shuffle="always", loss_after=True).loss_after

    def distillation_set(self, value_fn, gae, td_error_fn=None, extra=None):
        """The buffer's transitions and their soft labels: GAE under the critic `value_fn`, or
        on a replay trainer its TD errors (`td_error_fn`: seed 002 section 4.3's labels for
        DQN), normalised to mean 0 / std 1, times `scale`. `extra`: (obs, actions, next_obs,
        terminations, advantages) rows appended (imagined ones), their labels normalised on their own:
        DECISION: each source is centred and scaled by itself, so a bias of the imagined advantages
        (a model's reward error, the critic off its states) cannot shift the real labels' mean (a
        shared normalisation did: F turned positive on real steps and the agent learnt to prolong
        episodes, docs/imagination.md)."""
        obs, actions, next_obs, terms, labels = [], [], [], [], []
        with torch.no_grad():
            for item in self.buffer:
                shape = item["shape"]
                if td_error_fn is not None:
                    adv = td_error_fn(item["obs"], item["raw_actions"], item["rewards"].reshape(-1),
                                      item["next_obs"], item["raw_terminations"].reshape(-1).float())
                else:
                    values = value_fn(item["obs"]).reshape(shape)
                    next_values = value_fn(item["next_obs"]).reshape(shape)
                    adv, _ = gae(item["rewards"], values, next_values, item["raw_terminations"], item["truncations"])
                    if item.get("stream_advantage") is not None:  # distill=total
                        adv = adv + item["stream_advantage"]
                obs.append(item["obs"]), actions.append(item["actions"]), next_obs.append(item["next_obs"])
                terms.append(item["terminations"]), labels.append(adv.reshape(-1))
        norm = lambda x: self.cfg.scale * (x - x.mean()) / (x.std() + 1e-8)  # noqa: E731
        labels = [norm(torch.cat(labels))]
        if extra is not None:
            for parts, rows in zip((obs, actions, next_obs, terms), extra[:4]):
                parts.append(rows.to(parts[0].dtype))
            if len(extra[4]) > 1:
                labels.append(norm(extra[4].to(labels[0].dtype)))
            else:
                labels.append(torch.zeros_like(extra[4], dtype=labels[0].dtype))
        obs, actions, next_obs, terms, labels = map(torch.cat, (obs, actions, next_obs, terms, labels))
        return obs, actions, next_obs, terms, labels

    def _encoded(self, obs, next_obs, features_fn, chunk: int = 1024):
        """What F is given for s and s': the observations, or on CNN-read images the policy's
        features (with its own CNN, the observations: F encodes them itself)."""
        if not self.ctx.image_obs or self.own_encoder:
            return obs, next_obs
        with torch.no_grad():  # in chunks: a CNN's activations over several rollouts at once are large
            return tuple(torch.cat([features_fn(x[i:i + chunk]) for i in range(0, len(x), chunk)])
                         for x in (obs, next_obs))

    def _fit(self, obs, actions, next_obs, terms, labels, epochs, track_target=False) -> float:
        """Fit F to the labels; returns its loss on them after the fit. With `track_target`,
        F_target follows F after every step."""
        follow = (lambda: polyak(self.target, self.shaper, self.cfg.tau)) if track_target else None
        return self.fitter.fit((obs, actions, next_obs, terms), labels, epochs=epochs,
                               minibatch_size=self.cfg.minibatch_size, generator=self.generator, shuffle="always",
                               after_step=follow, loss_after=True).loss_after

    def _fit_prior(self, tr: dict, features_fn=None) -> float:
        with torch.no_grad():
            target = torch.as_tensor(self.prior(tr["obs"], tr["actions"], tr["next_obs"]), dtype=torch.float32)
            target = target.reshape(-1)
        obs, next_obs = self._encoded(tr["obs"], tr["next_obs"], features_fn)
        loss = self._fit(obs, tr["actions"], next_obs, tr["terminations"], target, self.cfg.prior_epochs)
        update_target(self.target, self.shaper)  # F_target starts from the prior's fit
        self.prior_fitted = True
        return loss

    def metrics(self) -> dict:
        return dict(self._last)

    def state_dict(self) -> dict:
        state = {**super().state_dict(), **self.fitter.state_dict(head_key="shaper"),
                 "target": self.target.state_dict(), "buffer": self.buffer, "updates": self.updates,
                 "prior_fitted": self.prior_fitted, "snapshots": self.snapshots}
        if self.advice is not None:
            state["advice"] = self.advice_fitter.state_dict(head_key="net")
        if self.safety is not None:
            state["safety"] = {**self.safety_fitter.state_dict(head_key="shaper"),
                               "target": self.safety_target.state_dict(), "critic": self.cost_critic.state_dict()}
        if self.model is not None:
            state["model"] = self.model.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.fitter.load_state_dict(state, head_key="shaper")
        self.target.load_state_dict(state["target"])
        self.buffer, self.updates, self.prior_fitted = state["buffer"], state["updates"], state["prior_fitted"]
        self.snapshots = state["snapshots"]
        if self.advice is not None:
            self.advice_fitter.load_state_dict(state["advice"], head_key="net")
        if self.safety is not None:
            self.safety_fitter.load_state_dict(state["safety"], head_key="shaper")
            self.safety_target.load_state_dict(state["safety"]["target"])
            self.cost_critic.load_state_dict(state["safety"]["critic"])
        if self.model is not None:
            self.model.load_state_dict(state["model"])
