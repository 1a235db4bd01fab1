"""GEAR advantage reweighting inside TRL's `GRPOTrainer` (`pip install 'reflectrl[trl]'`).

    from trl import GRPOConfig
    from reflectrl.integrations.trl import GEARGRPOTrainer
    from reflectrl.signals.gear import GEARConfig

    trainer = GEARGRPOTrainer(model, reward_funcs=reward, args=GRPOConfig(...), train_dataset=dataset,
                              gear_config=GEARConfig(temperature=2.0))
    trainer.train()

TRL's GRPO is used as is (generation, rewards, advantages, loss, vLLM, accumulation); GEAR
only turns its per-sequence advantages (B,) into per-token ones (B, T), at two points:

- `_generate_and_score_completions` (TRL's batch: completions, rewards, advantages): after
  TRL's, one no-grad forward of the policy gives the last hidden state *from which* each
  completion token was sampled. reflectrl's token `Batch` is built from it exactly as
  reflectrl's own GRPO trainer builds it (`reflectrl.trainers.grpo.trainer.token_batch`: time-major, mask =
  TRL's loss mask, groups = the prompt, the outcome reward on the last completion token,
  V_orig = the group's mean reward). `GEARReweighting.after_advantages` gives weights from
  the head frozen at the previous distillation (all 1 until then; called through
  `reflectrl.signals.apply.apply_signals`, as every trainer of reflectrl calls it), and `advantages` becomes
  `advantages[:, None] * weights` (B, T). TRL's `_compute_loss` unsqueezes only 1-D
  advantages, so every loss type takes the per-token ones unchanged.
- after the optimizer step that uses up the batch (a callback's `on_step_end`, i.e. every
  `steps_per_generation * num_iterations` micro-steps): `GEARReweighting.after_update`
  distills the head on the batch's top completions and refreshes the frozen copy.

Rewards are TRL's, combined as TRL combines them (`reward_weights`,
`multi_objective_aggregation`; completions no reward function could score get the baseline,
so they teach the head nothing new); `scale_rewards` only rescales TRL's advantages, which
the weights multiply. The head's learning rate is `gear_config.lr_multiplier *
args.learning_rate`, as for reflectrl's trainers. Metrics go to TRL's log as `gear/...`.
The head lives on the CPU (features are copied there). Across several processes each one
distills its own head on its own rows; the heads are not synchronised. Text-only models.
"""

from __future__ import annotations

import contextlib
import inspect
import os

import torch
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.trainer.utils import nanstd

from reflectrl.llm.model import hidden_size
from reflectrl.llm.tasks.base import REFERENCE_TEMPLATE
from reflectrl.signals.apply import apply_signals
from reflectrl.signals.base import Batch, SignalContext
from reflectrl.signals.divergence.torch import DivergenceConfig, segment_stats, segment_weights, token_divergence
from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting
from reflectrl.trainers.grpo.trainer import token_batch

try:
    from trl.models.utils import disable_gradient_checkpointing
except ImportError:  # older TRL: calling the model without it only warns when checkpointing is on
    def disable_gradient_checkpointing(model, kwargs=None):
        return contextlib.nullcontext()

__all__ = ["DivergenceGRPOTrainer", "GEARGRPOTrainer"]

GEAR_STATE_FILE = "gear_state.pt"
WEIGHT_METRICS = ("weights_mean", "weights_std", "weights_min", "weights_max", "weights_clipped_frac")


def _loss_takes_token_advantages() -> bool:
    """Whether this TRL's `GRPOTrainer._compute_loss` keeps (B, T) advantages (it unsqueezes
    only 1-D ones since the MiniLLM trainer; before that it unsqueezed unconditionally)."""
    try:
        source = inspect.getsource(GRPOTrainer._compute_loss)
    except (OSError, TypeError):  # no source to read: assume a current TRL
        return True
    return "advantages.dim() == 1" in source or "advantages.unsqueeze(1)" not in source


class _DistillAfterUpdate(TrainerCallback):
    """Distills GEAR's head once the optimizer steps that use a generation batch are done."""

    def __init__(self, trainer: GEARGRPOTrainer):
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        t = self.trainer
        if t._step % (args.steps_per_generation * t.num_iterations) == 0:
            t._gear_distill()

    def on_train_end(self, args, state, control, **kwargs):
        self.trainer._gear_distill()


class GEARGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with GEAR's per-token advantage weights (see the module docstring).

    Takes every argument of `trl.GRPOTrainer`, plus `gear_config` (a
    `reflectrl.signals.gear.GEARConfig`) and `gear_gamma`, the per-token discount of
    the returns the head is distilled on (reflectrl's LLM GRPO default, 0.99)."""

    def __init__(self, *args, gear_config: GEARConfig | None = None, gear_gamma: float = 0.99, **kwargs):
        if not _loss_takes_token_advantages():
            raise RuntimeError("GEARGRPOTrainer needs a TRL whose GRPOTrainer loss accepts per-token (B, T) "
                               "advantages (TRL releases with the MiniLLM trainer or later); upgrade trl")
        gear_config = GEARConfig() if gear_config is None else gear_config
        if gear_config.inputs == "obs":
            raise ValueError("gear_config.inputs: the value head reads the LM's hidden states; leave inputs='features'")
        super().__init__(*args, **kwargs)
        self.signal = GEARReweighting(gear_config)
        width = hidden_size(self.accelerator.unwrap_model(self.model))
        self.signal.bind(SignalContext(
            obs_dim=width, action_dim=0, discrete=False, feature_dim=width, learning_rate=self.args.learning_rate,
            gamma=gear_gamma, gae_lambda=1.0, seed=self.args.seed, total_iterations=max(self.args.max_steps, 1)))
        self._gear_rewards_per_func: torch.Tensor | None = None
        self._gear_pending: Batch | None = None  # the last generation batch, until the head is distilled on it
        self.add_callback(_DistillAfterUpdate(self))

    # ------------------------------------------------------------------ the batch

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._gear_rewards_per_func = rewards_per_func  # all processes' rows, as TRL normalises them
        return rewards_per_func

    def _gear_outcomes(self, rewards_per_func: torch.Tensor, mode: str, n_local: int):
        """(outcome reward, baseline) of this process's rows, combined as TRL combines them."""
        g = self.num_generations if mode == "train" else self.num_generations_eval
        rpf = rewards_per_func.float()
        weights = self.reward_weights.to(rpf.device)
        unscorable = torch.isnan(rpf).all(dim=1)
        if self.multi_objective_aggregation == "normalize_then_sum":
            grouped = rpf.view(-1, g, rpf.shape[1])
            mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
            std_k = nanstd(grouped, dim=1, keepdim=True) if g > 1 else torch.zeros_like(mean_k)
            rewards = (((grouped - mean_k) / (std_k + 1e-4)).view(-1, rpf.shape[1]) * weights).nansum(dim=1)
            rewards[unscorable] = torch.nan
            baseline = torch.nanmean(rewards).expand_as(rewards)
        else:  # sum_then_normalize
            rewards = (rpf * weights).nansum(dim=1)
            rewards[unscorable] = torch.nan
            baseline = torch.nanmean(rewards.view(-1, g), dim=1).repeat_interleave(g)
        baseline = torch.nan_to_num(baseline, nan=0.0)
        rewards = torch.where(torch.isnan(rewards), baseline, rewards)
        start = self.accelerator.process_index * n_local
        groups = torch.arange(start, start + n_local) // g
        return rewards[start:start + n_local].cpu(), baseline[start:start + n_local].cpu(), groups, g

    @torch.no_grad()
    def _gear_features(self, output: dict, batch_size: int) -> torch.Tensor:
        """(B, C+1, H): the last hidden state at the last prompt position and at every
        completion position; column t is the state completion token t was sampled from."""
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        start = output["prompt_ids"].shape[1] - 1
        chunks = []
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for s in range(0, ids.shape[0], batch_size):
                kwargs = dict(input_ids=ids[s:s + batch_size], attention_mask=attention[s:s + batch_size],
                              output_hidden_states=True, use_cache=False)
                with self.accelerator.autocast():
                    try:  # no logits needed but the (one) last
                        out = self.model(**kwargs, logits_to_keep=1)
                    except TypeError:
                        out = self.model(**kwargs)
                chunks.append(out.hidden_states[-1][:, start:].float().cpu())
        return torch.cat(chunks)

    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            self._gear_distill()  # a batch still pending (a schedule whose updates end mid-batch)
        output = super()._generate_and_score_completions(inputs)
        if "pixel_values" in output or "num_images" in output:
            raise NotImplementedError("GEARGRPOTrainer supports text-only models")
        rewards_per_func, self._gear_rewards_per_func = self._gear_rewards_per_func, None
        advantages = output["advantages"]
        mask = output["completion_mask"].bool()
        if "tool_mask" in output:
            mask = mask & output["tool_mask"].bool()
        n, c = mask.shape
        rewards, baseline, groups, g = self._gear_outcomes(rewards_per_func, mode, n)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        features = self._gear_features(output, batch_size)
        agent = torch.cat([mask.new_zeros(n, 1), mask], dim=1).cpu()
        ids = torch.cat([output["prompt_ids"][:, -1:], output["completion_ids"]], dim=1).cpu()
        batch = token_batch(agent, rewards, baseline, advantages.detach().float().cpu(), features, ids, g)
        batch.groups = groups[None, :].expand(c, n).contiguous()  # global prompt index (several processes)
        batch.iteration = batch.global_step = self.state.global_step
        weights = torch.ones(n, c)
        if mask.any():  # the hooks as reflectrl's own GRPO runs them (a token's advantage is its sequence's)
            result = apply_signals(self.signal, batch, lambda rewards: (batch.advantages, batch.returns),
                                   reward_terms=False)
            if result.weights is not None:
                weights = result.weights.T
            for name in WEIGHT_METRICS:
                self._metrics[mode][f"gear/{name}"].append(self.signal.metrics()[name])
            if mode == "train":
                self._gear_pending = batch
        output["advantages"] = advantages[:, None] * weights.to(advantages.device, advantages.dtype)
        return output

    # ------------------------------------------------------------------ after the update

    def _gear_distill(self) -> None:
        batch, self._gear_pending = self._gear_pending, None
        if batch is None:
            return
        self.signal.after_update(batch)
        self._metrics["train"]["gear/value_head_loss"].append(self.signal.metrics()["value_head_loss"])

    # ------------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial),
                                  f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            torch.save(self.signal.state_dict(), os.path.join(folder, GEAR_STATE_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = None if checkpoint is None else os.path.join(checkpoint, GEAR_STATE_FILE)
        if path is not None and os.path.exists(path):
            self.signal.load_state_dict(torch.load(path, weights_only=True))


# ---------------------------------------------------------------------------- divergence

class DivergenceGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the divergence signal's per-token weights (the GEAR paper's
    teacher segments; reflectrl/signals/divergence/torch.py).

        trainer = DivergenceGRPOTrainer(model, reward_funcs=reward, args=GRPOConfig(...),
                                        train_dataset=dataset,  # with a "reference" column
                                        divergence_config=DivergenceConfig(), reference_column="reference")

    After TRL scores a generation batch, two no-grad forwards of the policy (in chunks of the
    per-device batch size, on its device, under TRL's autocast): the student on prompt +
    completion, and the teacher on prompt + "Reference:\n{row's reference}\nSolve:\n" +
    completion (the layout reflectrl's own trainer and `llm sft --reference-share` use). The
    per-token divergence is computed there, chunk by chunk (no (B, T, V) tensor is kept); the
    weights come from `segment_weights` and multiply TRL's advantages into (B, T) ones.
    The teacher is the current policy (`teacher_refresh` > 0 is reflectrl-trainer only).
    Metrics go to TRL's log as `divergence/...`, with the teacher pass's seconds."""

    def __init__(self, *args, divergence_config: DivergenceConfig | None = None,
                 reference_column: str = "reference", **kwargs):
        if not _loss_takes_token_advantages():
            raise RuntimeError("DivergenceGRPOTrainer needs a TRL whose GRPOTrainer loss accepts per-token (B, T) "
                               "advantages (TRL releases with the MiniLLM trainer or later); upgrade trl")
        self.divergence_config = DivergenceConfig() if divergence_config is None else divergence_config
        self.divergence_config.validate()
        if self.divergence_config.refresh_interval():
            raise ValueError("divergence_config.teacher_refresh / teacher_schedule: DivergenceGRPOTrainer's teacher "
                             "is the current policy; leave teacher_refresh=0 and teacher_schedule=every")
        self.reference_column = reference_column
        super().__init__(*args, **kwargs)

    def _generate_and_score_completions(self, inputs):
        import time

        mode = "train" if self.model.training else "eval"
        missing = [i for i, row in enumerate(inputs) if self.reference_column not in row]
        if missing:
            raise ValueError(f"DivergenceGRPOTrainer: dataset rows need a '{self.reference_column}' column (the "
                             "ground truth the teacher reads); set reference_column=")
        references = [str(row[self.reference_column]) for row in inputs]
        output = super()._generate_and_score_completions(inputs)
        if "pixel_values" in output or "num_images" in output:
            raise NotImplementedError("DivergenceGRPOTrainer supports text-only models")
        start = time.perf_counter()
        mask = output["completion_mask"].bool()
        if "tool_mask" in output:
            mask = mask & output["tool_mask"].bool()
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        div, entropy = self._divergence(output, references, batch_size)
        weights, segments = segment_weights(div, mask.cpu(), self.divergence_config, entropy)
        seconds = time.perf_counter() - start
        stats = segment_stats(segments, mask.cpu())
        real = mask.cpu()
        stats.update(divergence_mean=div[real].mean().item() if real.any() else 0.0,
                     weights_mean=weights[real].mean().item() if real.any() else 1.0,
                     weights_std=weights[real].std().item() if real.sum() > 1 else 0.0, teacher_seconds=seconds)
        for name, value in stats.items():
            self._metrics[mode][f"divergence/{name}"].append(value)
        advantages = output["advantages"]
        output["advantages"] = advantages[:, None] * weights.to(advantages.device, advantages.dtype)
        return output

    @torch.no_grad()
    def _divergence(self, output: dict, references: list[str], batch_size: int):
        """(divergence, student entropy), each (B, C) on the CPU."""
        tok = self.processing_class
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        device = prompt_ids.device
        # the teacher's prompt: the prompt's real tokens, then the reference; left-padded
        rows = []
        for i, ref in enumerate(references):
            hint = tok.encode(REFERENCE_TEMPLATE.format(ref), add_special_tokens=False)
            rows.append(prompt_ids[i][prompt_mask[i].bool()].tolist() + hint)
        width = max(len(r) for r in rows)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        t_prompt = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        t_mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for i, r in enumerate(rows):
            t_prompt[i, width - len(r):] = torch.tensor(r, device=device)
            t_mask[i, width - len(r):] = 1
        c = completion_ids.shape[1]
        temperature = self.temperature if hasattr(self, "temperature") else self.args.temperature
        div, ent = [], []
        with disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            for s in range(0, completion_ids.shape[0], batch_size):
                sl = slice(s, s + batch_size)
                logps = []
                for ids, attn in ((prompt_ids[sl], prompt_mask[sl]), (t_prompt[sl], t_mask[sl])):
                    full = torch.cat([ids, completion_ids[sl]], 1)
                    full_mask = torch.cat([attn, completion_mask[sl]], 1)
                    with self.accelerator.autocast():
                        logits = self.model(input_ids=full, attention_mask=full_mask, use_cache=False).logits
                    p = ids.shape[1]
                    logps.append(torch.log_softmax(logits[:, p - 1:p - 1 + c].float() / temperature, -1))
                d, e = token_divergence(logps[0], logps[1], completion_ids[sl], self.divergence_config.measure)
                div.append(d.cpu())
                ent.append(e.cpu())
        return torch.cat(div), torch.cat(ent)
