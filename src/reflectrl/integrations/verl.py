"""reflectrl's advantage reweightings as verl advantage estimators (`pip install 'reflectrl[verl]'`).

Importing this module registers two estimators in verl's registry
(`verl.trainer.ppo.core_algos.register_adv_est`), so `algorithm.adv_estimator=NAME` selects them:

- `"reflectrl_gear"`: GRPO's outcome advantage, grouped by verl's `uid` (verl's
  `compute_grpo_outcome_advantage` bit for bit: the same group mean and unbiased std, a
  singleton group against mean 0 and std 1, `epsilon=1e-6`, `norm_adv_by_std_in_grpo` read
  from the algorithm config), broadcast over the response mask and multiplied by per-token
  GEAR weights `token_weights` (B, R). verl gives an estimator no hidden states, so GEAR's
  value head cannot run inside it: `GEARTokenWeights` runs reflectrl's `GEARReweighting` on
  the actor's last hidden states (B, R, H) where they exist (the actor worker) and gives the
  weights (all 1 until its head is distilled once: verl's GRPO exactly). Without `token_weights`
  it refuses rather than train as plain GRPO.
- `"reflectrl_divergence"`: the GEAR paper's teacher-divergence weights with the `logp_gap`
  measure, from `old_log_probs` (the student) and `teacher_log_prob` (B, R): the log-probs
  of the same response tokens under a teacher pass that reads the reference answer after
  the prompt (computed like verl's ref log-prob pass). d_t = max(0, old_log_probs -
  teacher_log_prob), as `reflectrl.signals.divergence.torch.token_divergence` defines `logp_gap`;
  the weights are `divergence_weights(d, mask, cfg)`. `measure="kl"` is refused: verl's
  batch carries gathered log-probs, not the distributions a KL needs. Its settings are a
  `DivergenceConfig` (`divergence_config=`) or the algorithm config's `reflectrl_divergence`
  mapping (`+algorithm.reflectrl_divergence.threshold=2.0`), `measure` defaulting to `logp_gap`.

How the extra tensors reach the estimator. verl calls a registered estimator with fixed keyword
arguments only (`token_level_rewards`, `response_mask`, `config`, `index` = the uids,
`reward_baselines`), never other batch fields, on both of its trainer paths (verl 0.9.1):

- legacy `RayPPOTrainer` (`trainer.use_v1=false`): `ray_trainer.compute_advantage`
  (verl/trainer/ppo/ray_trainer.py:187) on the whole DataProto;
- v1 `PPOTrainer` (`trainer.use_v1=true`, verl 0.9's default): `PPOTrainer._compute_advantage`
  (verl/trainer/ppo/v1/trainer_base.py:1743) fetches a fixed field list (uid, response_mask,
  rm_scores, rollout_log_probs, old_log_probs, ref_log_prob, values) from its TransferQueue and
  calls `compute_advantage_for_multi_trajectories` (verl/trainer/ppo/v1/utils.py:148), which
  gives every estimator but GRPO to the `compute_advantage` it imported (utils.py:22), and applies
  its multi-turn session handling (the final output of each `{uid}_{session}` in the group
  statistics, its advantage broadcast over the session's outputs) to verl's own GRPO only.

So the estimators refuse, in one line naming the fix, when verl calls them without their fields
(plain GRPO would be trained silently), and `patch_verl()` makes both paths pass them:
`ray_trainer.compute_advantage` routes the two names through `compute_advantage` here (the
batch's `token_weights`, `old_log_probs`, `teacher_log_prob`, `entropys`); on v1 it wraps
`PPOTrainer._compute_advantage` and replaces the `compute_advantage_for_multi_trajectories` it
calls, so the two names fetch `token_weights` / `teacher_log_prob` / `entropy` from the
TransferQueue beside verl's fields and get verl's own v1 GRPO (session handling included) times
their per-token weights (`compute_advantage_v1`). Every other estimator runs verl's code
unchanged. `unpatch_verl()` undoes it. Call `patch_verl()` in the process where the trainer runs
(verl's `TaskRunner` / `TaskRunnerV1` Ray actor): `+ray_kwargs.ray_init.runtime_env.
worker_process_setup_hook=reflectrl.integrations.verl.patch_verl` on verl's command line runs it
in every Ray worker process.

Wiring, legacy `RayPPOTrainer` (`trainer.use_v1=false algorithm.adv_estimator=reflectrl_gear`):

    import reflectrl.integrations.verl as rv       # registers both estimators
    from reflectrl.signals.gear import GEARConfig
    rv.patch_verl()                                # in the trainer's process
    gear = rv.GEARTokenWeights(GEARConfig(temperature=2.0), hidden_size=model.config.hidden_size,
                               learning_rate=actor_lr)
    # per batch `data`, where the actor's model is at hand and the batch has its rewards
    # (token_level_rewards or token_level_scores, uid, response_mask):
    hidden = rv.response_hidden_states(model, data.batch["input_ids"], data.batch["attention_mask"],
                                       data.batch["responses"].shape[1], data.batch["position_ids"])
    data.batch["token_weights"] = gear.weights_for(data, hidden)
    # ... the trainer's compute_advantage -> reflectrl_gear -> advantages * token_weights ...
    gear.update()                                  # after the actor's update: distil the head

v1 `PPOTrainer` (the default): the same patch, and the weights (B, R), padded as verl pads its
response fields, put into the TransferQueue for the step's `KVBatchMeta` before the advantage
step (e.g. in a `PPOTrainerSync` subclass's `_compute_advantage`, before `super()`'s, registered
with verl's `register_trainer` and selected by `trainer.v1.trainer_mode`):
`rv.put_response_fields(batch, token_weights=w)`.

`reflectrl_divergence` instead: a teacher pass like verl's ref log-prob pass, over the prompt
with the reference answer appended and then the same response, gives `teacher_log_prob` (B, R):
`data.batch["teacher_log_prob"]` (legacy) or `put_response_fields(batch, teacher_log_prob=...)`
(v1); then `algorithm.adv_estimator=reflectrl_divergence` (settings:
`+algorithm.reflectrl_divergence.threshold=2.0`, ...), with the same patch.

Returns are the advantages, as verl's GRPO returns them.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from collections.abc import Mapping
from enum import Enum
from typing import Any

import numpy as np
import torch

try:
    from verl.trainer.ppo import core_algos
except ImportError as err:  # verl is an optional extra
    raise ImportError(f"reflectrl.integrations.verl needs verl: pip install 'reflectrl[verl]' ({err})") from err

from reflectrl.errors import UserError
from reflectrl.signals.base import Batch, SignalContext
from reflectrl.signals.divergence.torch import DivergenceConfig, divergence_weights
from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting
from reflectrl.trainers.grpo.trainer import token_batch

__all__ = ["GEAR_ESTIMATOR", "DIVERGENCE_ESTIMATOR", "ESTIMATORS", "TOKEN_WEIGHTS_KEY", "TEACHER_LOG_PROB_KEY",
           "compute_gear_advantage", "compute_divergence_advantage", "grpo_outcome", "group_ids",
           "teacher_divergence_weights", "divergence_config", "GEARTokenWeights", "response_hidden_states",
           "compute_advantage", "compute_advantage_v1", "put_response_fields", "patch_verl", "unpatch_verl",
           "patch_verl_compute_advantage"]

GEAR_ESTIMATOR = "reflectrl_gear"
DIVERGENCE_ESTIMATOR = "reflectrl_divergence"
ESTIMATORS = (GEAR_ESTIMATOR, DIVERGENCE_ESTIMATOR)
TOKEN_WEIGHTS_KEY = "token_weights"        # data.batch key of the GEAR weights (B, R)
TEACHER_LOG_PROB_KEY = "teacher_log_prob"  # data.batch key of the teacher's log-probs (B, R)
EPSILON = 1e-6                             # verl's GRPO epsilon
V1_ENTROPY_KEY = "entropy"                 # v1's name of the actor's entropy field (legacy: "entropys")
PATCH_HINT = ("call reflectrl.integrations.verl.patch_verl() in verl's trainer process (e.g. "
              "+ray_kwargs.ray_init.runtime_env.worker_process_setup_hook=reflectrl.integrations.verl.patch_verl)")


def _name(estimator) -> str:
    return estimator.value if isinstance(estimator, Enum) else str(estimator)


def _norm_flag(norm_adv_by_std_in_grpo: bool | None, config) -> bool:
    if norm_adv_by_std_in_grpo is not None:
        return bool(norm_adv_by_std_in_grpo)
    if config is not None and hasattr(config, "get"):
        return bool(config.get("norm_adv_by_std_in_grpo", True))
    return True


# ---------------------------------------------------------------------------- GRPO by uid

def group_ids(index) -> torch.Tensor:
    """(B,) long: the group of each row, numbered by first appearance of its uid."""
    seen: dict = {}
    return torch.tensor([seen.setdefault(u, len(seen)) for u in np.asarray(index, dtype=object).tolist()],
                        dtype=torch.long)


def grpo_outcome(scores: torch.Tensor, index, epsilon: float = EPSILON,
                 norm_adv_by_std_in_grpo: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages, baseline, scale), each (B,), of outcome scores (B,) grouped by `index`,
    as verl's `compute_grpo_outcome_advantage` computes them: baseline = the group's mean and
    scale = its unbiased std + epsilon (1 without `norm_adv_by_std_in_grpo`); a group of one
    has mean 0 and std 1."""
    groups = group_ids(index).to(scores.device)
    with torch.no_grad():
        baseline, std = torch.empty_like(scores), torch.empty_like(scores)
        for g in range(int(groups.max()) + 1 if groups.numel() else 0):
            members = (groups == g).nonzero().squeeze(-1)
            s = scores[members]
            if members.numel() == 1:
                mean, dev = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, dev = torch.mean(s), torch.std(s)
            baseline[members], std[members] = mean.to(scores.dtype), dev.to(scores.dtype)
        if norm_adv_by_std_in_grpo:
            scale = std + epsilon
            advantages = (scores - baseline) / scale
        else:
            scale = torch.ones_like(scores)
            advantages = scores - baseline
    return advantages, baseline, scale


# ---------------------------------------------------------------------------- the estimators

def _check_shape(name: str, t: torch.Tensor, like: torch.Tensor) -> None:
    if tuple(t.shape) != tuple(like.shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; the response mask's is {tuple(like.shape)}")


def compute_gear_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None,
                           epsilon: float = EPSILON, norm_adv_by_std_in_grpo: bool | None = None, config=None,
                           token_weights: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each (B, R): GRPO's outcome advantage per uid group, broadcast
    over `response_mask`, times `token_weights` (B, R). `norm_adv_by_std_in_grpo` None reads the
    algorithm config's (verl passes a custom estimator only the config). Without `token_weights`
    (what verl's own compute_advantage passes) it refuses rather than train as plain GRPO."""
    if token_weights is None:
        raise UserError(f"{GEAR_ESTIMATOR} got no {TOKEN_WEIGHTS_KEY}: verl's own compute_advantage passes an "
                        f"estimator none of the batch's fields, so this would train as plain GRPO; {PATCH_HINT}")
    if index is None:
        raise ValueError(f"{GEAR_ESTIMATOR} groups responses by prompt: it needs index "
                         "(verl passes non_tensor_batch['uid'])")
    scores = token_level_rewards.sum(dim=-1)
    advantages, _, _ = grpo_outcome(scores, index, epsilon, _norm_flag(norm_adv_by_std_in_grpo, config))
    with torch.no_grad():
        token_adv = advantages.unsqueeze(-1) * response_mask
        _check_shape(TOKEN_WEIGHTS_KEY, token_weights, response_mask)
        token_adv = token_adv * token_weights.to(token_adv.device, token_adv.dtype)
    return token_adv, token_adv


def divergence_config(value: DivergenceConfig | Mapping | None = None, config=None) -> DivergenceConfig:
    """The DivergenceConfig to use: `value`, else the algorithm config's `reflectrl_divergence`
    mapping; `measure` defaults to logp_gap (the only one verl's batch allows)."""
    if value is None and config is not None and hasattr(config, "get"):
        value = config.get("reflectrl_divergence", None)
    if isinstance(value, DivergenceConfig):
        cfg = value
    else:
        fields = {str(k): v for k, v in dict(value or {}).items()}
        fields.setdefault("measure", "logp_gap")
        known = {f.name for f in dataclasses.fields(DivergenceConfig)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"reflectrl_divergence: unknown setting(s) {', '.join(unknown)}; "
                             f"use {', '.join(sorted(known))}")
        cfg = DivergenceConfig(**fields)
    if cfg.measure != "logp_gap":
        raise ValueError(f"{DIVERGENCE_ESTIMATOR}: measure='{cfg.measure}' needs the student's and the teacher's "
                         "full next-token distributions, and verl's batch carries gathered per-token log-probs "
                         "only (old_log_probs, teacher_log_prob); use measure='logp_gap'")
    cfg.validate()
    return cfg


def teacher_divergence_weights(old_log_probs: torch.Tensor, teacher_log_prob: torch.Tensor,
                               response_mask: torch.Tensor, cfg: DivergenceConfig,
                               entropy: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (B, R), departure (B,), -1 where none) from the logp_gap
    d_t = max(0, old_log_probs - teacher_log_prob) on the response tokens."""
    _check_shape("old_log_probs", old_log_probs, response_mask)
    _check_shape("teacher_log_prob", teacher_log_prob, response_mask)
    with torch.no_grad():
        div = (old_log_probs.float() - teacher_log_prob.float()).clamp(min=0.0).cpu()
        mask = response_mask.bool().cpu()
        ent = None if entropy is None else entropy.float().cpu()
        weights, departure = divergence_weights(div, mask, cfg, ent)
    return weights.to(response_mask.device), departure


def compute_divergence_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index=None,
                                 epsilon: float = EPSILON, norm_adv_by_std_in_grpo: bool | None = None, config=None,
                                 old_log_probs: torch.Tensor | None = None,
                                 teacher_log_prob: torch.Tensor | None = None,
                                 divergence_config: DivergenceConfig | Mapping | None = None,
                                 entropy: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), each (B, R): GRPO's (as `reflectrl_gear`) times the teacher-divergence
    weights of `old_log_probs` against `teacher_log_prob` (B, R)."""
    cfg = _divergence_config(divergence_config, config)
    if old_log_probs is None or teacher_log_prob is None:
        raise UserError(f"{DIVERGENCE_ESTIMATOR} got no old_log_probs / {TEACHER_LOG_PROB_KEY}: verl's own "
                        f"compute_advantage passes an estimator none of the batch's fields; {PATCH_HINT}")
    weights, _ = teacher_divergence_weights(old_log_probs, teacher_log_prob, response_mask, cfg, entropy)
    return compute_gear_advantage(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo,
                                  config, token_weights=weights)


_divergence_config = divergence_config  # the estimator's argument of that name shadows it


def _register(name: str, fn) -> None:
    """register_adv_est, idempotent for this module's own functions (a reload replaces them);
    another function under the name still makes verl raise."""
    registry = core_algos.ADV_ESTIMATOR_REGISTRY
    old = registry.get(name)
    if old is not None and old is not fn and (getattr(old, "__module__", None), getattr(old, "__qualname__", None)) \
            == (fn.__module__, fn.__qualname__):
        del registry[name]
    core_algos.register_adv_est(name)(fn)


_register(GEAR_ESTIMATOR, compute_gear_advantage)
_register(DIVERGENCE_ESTIMATOR, compute_divergence_advantage)


# ---------------------------------------------------------------------------- GEAR's weights from hidden states

@torch.no_grad()
def response_hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
                           position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, R, H): the last hidden state *from which* each response token was sampled (position
    t-1 for token t), from one no-grad forward of a Hugging Face causal LM over verl's
    prompt + response `input_ids` (B, P + R), like verl's log-prob slice `logits[:, -R-1:-1]`."""
    kwargs = {} if position_ids is None else {"position_ids": position_ids}
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False,
                **kwargs)
    return out.hidden_states[-1][:, -response_length - 1:-1]


class GEARTokenWeights:
    """reflectrl's `GEARReweighting` on verl batches: per-token weights from the actor's hidden
    states, and the head's distillation after the update.

    `weights(hidden, response_mask, token_level_rewards, index)` builds reflectrl's token `Batch`
    as `reflectrl.trainers.grpo.trainer.token_batch` does for reflectrl's GRPO trainer (the hidden state from
    which each response token was sampled, the outcome reward on the last response token, V_orig
    = the group's mean reward, verl's GRPO advantages), groups = the uid groups, and returns
    `GEARReweighting.after_advantages`' weights (B, R) (all 1 until the head is distilled once);
    `update()` calls `after_update` on that batch. `gamma` discounts the returns the head is fit
    to (reflectrl's LLM GRPO default, 0.99); the head's learning rate is
    `cfg.lr_multiplier * learning_rate`. The head runs on the CPU."""

    def __init__(self, cfg: GEARConfig | None = None, *, hidden_size: int, learning_rate: float,
                 gamma: float = 0.99, seed: int = 0, total_steps: int = 1, epsilon: float = EPSILON,
                 norm_adv_by_std_in_grpo: bool = True):
        cfg = GEARConfig() if cfg is None else cfg
        if cfg.inputs == "obs":
            raise ValueError("gear inputs: the value head reads the LM's hidden states; leave inputs='features'")
        if cfg.rank_groups:
            raise ValueError("gear rank_groups=true replaces GRPO's advantages, which reflectrl_gear computes "
                             "itself from the rewards; it is not supported with verl")
        self.signal = GEARReweighting(cfg)
        self.signal.bind(SignalContext(obs_dim=hidden_size, action_dim=0, discrete=False, feature_dim=hidden_size,
                                       learning_rate=learning_rate, gamma=gamma, gae_lambda=1.0, seed=seed,
                                       total_iterations=max(total_steps, 1)))
        self.epsilon, self.norm = epsilon, norm_adv_by_std_in_grpo
        self.step = 0  # optimisation steps: what gear.warmup_steps counts
        self.pending: Batch | None = None

    def token_batch(self, hidden: torch.Tensor, response_mask: torch.Tensor, token_level_rewards: torch.Tensor,
                    index, responses: torch.Tensor | None = None) -> Batch:
        """reflectrl's (R, B) token Batch of a verl batch; `token_level_rewards` (B, R) or outcome rewards (B,)."""
        mask = response_mask.bool().cpu()
        n, length = mask.shape
        if hidden.shape[:2] != (n, length):
            raise ValueError(f"hidden has shape {tuple(hidden.shape)}; need (B, R, H) = ({n}, {length}, H)")
        rewards = token_level_rewards.detach().float().cpu()
        rewards = rewards.sum(-1) if rewards.dim() == 2 else rewards
        advantages, baseline, _ = grpo_outcome(rewards, index, self.epsilon, self.norm)
        feats = hidden.detach().float().cpu()
        # token_batch shifts by one (step t = token t+1, read from the state at t): prepend a column
        agent = torch.cat([torch.zeros(n, 1, dtype=torch.bool), mask], 1)
        features = torch.cat([feats, feats.new_zeros(n, 1, feats.shape[-1])], 1)
        tokens = torch.zeros(n, length, dtype=torch.long) if responses is None else responses.detach().long().cpu()
        ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), tokens], 1)
        batch = token_batch(agent, rewards, baseline, advantages, features, ids, 1)
        batch.groups = group_ids(index)[None, :].expand(length, n).contiguous()
        batch.iteration = batch.global_step = self.step
        return batch

    def weights(self, hidden: torch.Tensor, response_mask: torch.Tensor, token_level_rewards: torch.Tensor,
                index, responses: torch.Tensor | None = None) -> torch.Tensor:
        """GEAR's per-token weights (B, R) on the response mask's device; keeps the batch for update()."""
        batch = self.token_batch(hidden, response_mask, token_level_rewards, index, responses)
        n, length = response_mask.shape
        weights = torch.ones(n, length)
        if batch.mask.any():
            out = self.signal.after_advantages(batch)
            if out is not None and out.weights is not None:
                weights = out.weights.T.contiguous()
            self.pending = batch
        return weights.to(response_mask.device)

    def weights_for(self, data, hidden: torch.Tensor) -> torch.Tensor:
        """weights() of a verl DataProto: its response_mask, token_level_rewards (else
        token_level_scores, else v1's rm_scores), responses and uid."""
        b = data.batch
        keys = set(b.keys())
        rewards = b[next((k for k in ("token_level_rewards", "token_level_scores", "rm_scores") if k in keys),
                         "token_level_rewards")]
        return self.weights(hidden, b["response_mask"], rewards, data.non_tensor_batch["uid"],
                            b["responses"] if "responses" in b.keys() else None)

    def update(self) -> None:
        """After the actor's update on the batch: distil the head on its best responses."""
        batch, self.pending = self.pending, None
        if batch is not None:
            self.signal.after_update(batch)
        self.step += 1

    def metrics(self) -> dict:
        return {f"gear/{k}": v for k, v in self.signal.metrics().items()}

    def state_dict(self) -> dict:
        return {"signal": self.signal.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.signal.load_state_dict(state["signal"])
        self.step = state["step"]


# ---------------------------------------------------------------------------- verl's compute_advantage

def _missing(name: str, key: str) -> UserError:
    return UserError(f"{name}: the batch has no '{key}' (B, R); put it there before the advantage step "
                     f"(legacy trainer: data.batch['{key}']; v1 trainer: "
                     f"reflectrl.integrations.verl.put_response_fields(batch, {key}=...))")


def _token_weights(name: str, batch, response_mask: torch.Tensor, config=None,
                   divergence_config: DivergenceConfig | Mapping | None = None) -> torch.Tensor:
    """The per-token weights (B, R) of estimator `name` from a batch's fields: `token_weights`
    (reflectrl_gear), or the teacher-divergence weights of `old_log_probs` against
    `teacher_log_prob` (reflectrl_divergence; the actor's entropy from `entropys` or `entropy`)."""
    keys = set(batch.keys())
    if name == GEAR_ESTIMATOR:
        if TOKEN_WEIGHTS_KEY not in keys:
            raise _missing(name, TOKEN_WEIGHTS_KEY)
        weights = batch[TOKEN_WEIGHTS_KEY]
        _check_shape(TOKEN_WEIGHTS_KEY, weights, response_mask)
        return weights.to(response_mask.device)
    for key in ("old_log_probs", TEACHER_LOG_PROB_KEY):
        if key not in keys:
            raise _missing(name, key)
    entropy = next((batch[k] for k in ("entropys", V1_ENTROPY_KEY) if k in keys), None)
    cfg = _divergence_config(divergence_config, config)
    weights, _ = teacher_divergence_weights(batch["old_log_probs"], batch[TEACHER_LOG_PROB_KEY], response_mask,
                                            cfg, entropy)
    return weights


def compute_advantage(data, adv_estimator, *, config=None, norm_adv_by_std_in_grpo: bool | None = None,
                      divergence_config: DivergenceConfig | Mapping | None = None, epsilon: float = EPSILON,
                      **_ignored: Any):
    """verl's legacy `compute_advantage` for the reflectrl estimators: calls the estimator with
    verl's arguments plus the batch's `token_weights` (reflectrl_gear) or its teacher-divergence
    weights (reflectrl_divergence), and sets `data.batch["advantages"]` and `["returns"]`."""
    name = _name(adv_estimator)
    if name not in ESTIMATORS:
        raise ValueError(f"{name}: not a reflectrl estimator ({', '.join(ESTIMATORS)})")
    b = data.batch
    if "response_mask" not in b.keys():
        from verl.trainer.ppo.ray_trainer import compute_response_mask
        b["response_mask"] = compute_response_mask(data)
    if "uid" not in data.non_tensor_batch:
        raise UserError(f"{name} groups responses by prompt: the batch needs non_tensor_batch['uid']")
    weights = _token_weights(name, b, b["response_mask"], config, divergence_config)
    advantages, returns = core_algos.get_adv_estimator_fn(GEAR_ESTIMATOR)(
        token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"],
        index=data.non_tensor_batch["uid"], epsilon=epsilon, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        config=config, token_weights=weights)
    b["advantages"] = advantages
    b["returns"] = returns
    return data



# ---------------------------------------------------------------------------- verl's v1 trainer

_V1_BATCH: contextvars.ContextVar = contextvars.ContextVar("reflectrl_verl_v1_batch", default=None)
_V1_FIELDS = {GEAR_ESTIMATOR: (TOKEN_WEIGHTS_KEY,), DIVERGENCE_ESTIMATOR: (TEACHER_LOG_PROB_KEY, V1_ENTROPY_KEY)}


def _v1():
    """verl's v1 trainer modules (trainer_base, utils); ImportError where verl's v1 cannot load
    (it needs TransferQueue: pip install TransferQueue)."""
    from verl.trainer.ppo.v1 import trainer_base, utils
    return trainer_base, utils


def _original(fn):
    while getattr(fn, "_reflectrl_patched", False):
        fn = fn.__wrapped__
    return fn


def compute_advantage_v1(data, batch_keys, adv_estimator, gamma: float = 1.0, lam: float = 1.0, num_repeat: int = 1,
                         norm_adv_by_std_in_grpo: bool = True, config=None,
                         divergence_config: DivergenceConfig | Mapping | None = None):
    """verl v1's `compute_advantage_for_multi_trajectories` for the reflectrl estimators: verl's own
    v1 GRPO on `data` (each `{uid}_{session}`'s final output in its uid group's statistics, that
    advantage broadcast over the session's outputs), times each row's per-token weights from
    `data.batch` (`token_weights`, or `old_log_probs` / `teacher_log_prob`). Sets and returns
    `data.batch["advantages"]` and `["returns"]` (equal, as verl's GRPO sets them)."""
    name = _name(adv_estimator)
    if name not in ESTIMATORS:
        raise ValueError(f"{name}: not a reflectrl estimator ({', '.join(ESTIMATORS)})")
    weights = _token_weights(name, data.batch, data.batch["response_mask"], config, divergence_config)
    _, utils = _v1()
    data = _original(utils.compute_advantage_for_multi_trajectories)(
        data, batch_keys=batch_keys, adv_estimator=core_algos.AdvantageEstimator.GRPO, gamma=gamma, lam=lam,
        num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
    advantages = data.batch["advantages"] * weights.to(data.batch["advantages"].dtype)
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages
    return data


def _fetch_v1_fields(name: str, meta, data) -> None:
    """Put the estimator's extra fields for the KVBatchMeta `meta` from verl's TransferQueue into
    `data.batch`, padded as verl pads its own; fields the queue lacks stay absent."""
    trainer_base, _ = _v1()
    fields = [k for k in _V1_FIELDS[name] if k not in data.batch.keys()]
    if not fields:
        return
    got = trainer_base.tq.kv_batch_get(keys=meta.keys, partition_id=meta.partition_id,
                                       select_fields=fields).to_padded_tensor()
    width = data.batch["response_mask"].shape
    for key in fields:
        if key in got.keys():
            value = got[key]
            if tuple(value.shape) != tuple(width):
                raise UserError(f"{name}: '{key}' from the TransferQueue pads to {tuple(value.shape)}, the response "
                                f"mask to {tuple(width)}; put it with reflectrl.integrations.verl.put_response_fields")
            data.batch[key] = value.to(data.batch["response_mask"].device)


def put_response_fields(batch, **fields: torch.Tensor):
    """Put per-token response tensors (B, R) for the v1 trainer's `KVBatchMeta` `batch` into verl's
    TransferQueue, nested by each response's length as verl stores its own (old_log_probs, ...):
    `put_response_fields(batch, token_weights=w)`. Rows follow `batch.keys`; R is the longest
    response (verl's padded width). Returns verl's KVBatchMeta."""
    from tensordict import TensorDict
    from verl.workers.utils.padding import response_to_nested
    trainer_base, _ = _v1()
    tq = trainer_base.tq
    mask = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                           select_fields=["response_mask"])["response_mask"]
    lengths = mask.offsets().diff()
    nested = {}
    for key, value in fields.items():
        if value.dim() != 2 or value.shape[0] != len(batch.keys) or value.shape[1] < int(lengths.max()):
            raise UserError(f"put_response_fields: {key} has shape {tuple(value.shape)}; need (B, R) = "
                            f"({len(batch.keys)}, >= {int(lengths.max())}), one row per key")
        nested[key] = response_to_nested(value, mask)
    return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                           fields=TensorDict(nested, batch_size=len(batch.keys)))


# ---------------------------------------------------------------------------- the patch

def _patch_legacy() -> None:
    from verl.trainer.ppo import ray_trainer

    original = ray_trainer.compute_advantage
    if getattr(original, "_reflectrl_patched", False):
        return

    @functools.wraps(original)
    def patched(data, adv_estimator, gamma: float = 1.0, lam: float = 1.0, num_repeat: int = 1,
                norm_adv_by_std_in_grpo: bool = True, config=None):
        if _name(adv_estimator) in ESTIMATORS:
            return compute_advantage(data, adv_estimator, config=config,
                                     norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
        return original(data, adv_estimator, gamma=gamma, lam=lam, num_repeat=num_repeat,
                        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)

    patched._reflectrl_patched = True
    ray_trainer.compute_advantage = patched


def _patch_v1() -> bool:
    try:
        trainer_base, _ = _v1()
    except ImportError:  # verl's v1 trainer cannot load here (no TransferQueue), so it cannot run either
        return False
    method = trainer_base.PPOTrainer._compute_advantage
    if not getattr(method, "_reflectrl_patched", False):
        @functools.wraps(method)
        def _compute_advantage(self, batch, metrics):
            token = _V1_BATCH.set(batch)
            try:
                return method(self, batch, metrics)
            finally:
                _V1_BATCH.reset(token)

        _compute_advantage._reflectrl_patched = True
        trainer_base.PPOTrainer._compute_advantage = _compute_advantage
    multi = trainer_base.compute_advantage_for_multi_trajectories
    if not getattr(multi, "_reflectrl_patched", False):
        @functools.wraps(multi)
        def compute_advantage_for_multi_trajectories(data, batch_keys, adv_estimator, gamma: float = 1.0,
                                                     lam: float = 1.0, num_repeat: int = 1,
                                                     norm_adv_by_std_in_grpo: bool = True, config=None):
            name = _name(adv_estimator)
            if name not in ESTIMATORS:
                return multi(data, batch_keys=batch_keys, adv_estimator=adv_estimator, gamma=gamma, lam=lam,
                             num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
            meta = _V1_BATCH.get()
            if meta is not None:
                _fetch_v1_fields(name, meta, data)
            return compute_advantage_v1(data, batch_keys, name, gamma, lam, num_repeat, norm_adv_by_std_in_grpo,
                                        config)

        compute_advantage_for_multi_trajectories._reflectrl_patched = True
        trainer_base.compute_advantage_for_multi_trajectories = compute_advantage_for_multi_trajectories
    return True


def patch_verl() -> None:
    """Make both of verl's trainer paths pass the reflectrl estimators their fields: the legacy
    `ray_trainer.compute_advantage` and, where verl's v1 trainer loads, `PPOTrainer._compute_advantage`
    with the `compute_advantage_for_multi_trajectories` it calls. Every other estimator runs verl's
    own code. Idempotent; call it in the trainer's process (a Ray worker_process_setup_hook)."""
    _patch_legacy()
    _patch_v1()


patch_verl_compute_advantage = patch_verl  # the name of earlier releases


def unpatch_verl() -> None:
    """Undo patch_verl (verl's functions as they were)."""
    from verl.trainer.ppo import ray_trainer
    ray_trainer.compute_advantage = _original(ray_trainer.compute_advantage)
    try:
        trainer_base, _ = _v1()
    except ImportError:
        return
    trainer_base.PPOTrainer._compute_advantage = _original(trainer_base.PPOTrainer._compute_advantage)
    trainer_base.compute_advantage_for_multi_trajectories = _original(
        trainer_base.compute_advantage_for_multi_trajectories)
