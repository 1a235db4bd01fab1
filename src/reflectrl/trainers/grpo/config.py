"""Configuration of an LLM run: `reflectrl llm train --algo grpo|gear|refgrpo ...`.

GRPO knobs carry TRL's names where TRL has one (`num_generations` is our `group_size`,
`epsilon` our `clip_eps`): `loss_type` (grpo | dr_grpo | dapo), `scale_rewards`
(group | batch | none), `beta` (KL to the frozen reference, default 0), `temperature`,
`top_p`, `num_iterations` (policy updates per batch). `--set` takes a GRPO knob by its bare
name and a signal's knob as `gear.NAME=...` or `calibration.NAME=...`, as for `train`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from reflectrl import overrides
from reflectrl.config import (
    check_budget,
    check_saved_config,
    check_seed,
    sections_from_dict,
    split_algo,
    validate_sections,
)
from reflectrl.errors import UserError
from reflectrl.llm.tasks.reflect import require_reflect
from reflectrl.registry import aliases, parse_algo, section_types, signal_spec


def __getattr__(name: str):
    # the lists the project started with, now read from the registry
    if name == "LOSS_TYPES":
        return loss_types()
    if name == "LLM_ALGOS":
        return tuple(aliases("llm"))
    if name == "LLM_ALGO_SECTIONS":
        return {a: comp.split("+")[1] for a, comp in aliases("llm").items() if "+" in comp}
    raise AttributeError(name)

def loss_types() -> tuple[str, ...]:
    """The registered loss aggregations (llm/losses.py: imported when a config is checked, not
    when the CLI is built)."""
    from reflectrl.llm.losses import LOSS_AGGREGATIONS

    return tuple(LOSS_AGGREGATIONS)


SCALE_REWARDS = ("group", "batch", "none")
# the attention and MLP projections of Llama- and Qwen-style decoders
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
PSEUDO_REWARDS = ("none", "verdict")


@dataclass
class GRPOConfig:
    prompts_per_step: int = 8
    """prompts per GRPO step"""
    group_size: int = 8
    """samples per prompt (TRL's num_generations)"""
    learning_rate: float = 1e-4
    """AdamW step size"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip"""
    num_iterations: int = 1
    """policy updates per batch of samples"""
    minibatches: int = 1
    """minibatches per update"""
    clip_eps: float = 0.2
    """clip range of the ratio (TRL's epsilon)"""
    clip_eps_high: float | None = None      # DAPO's asymmetric upper clip; None: the same as clip_eps
    """DAPO's upper clip (none: clip_eps)"""
    loss_type: str = "grpo"
    """grpo, dr_grpo or dapo"""
    scale_rewards: str = "group"
    """group, batch or none: what advantages are divided by"""
    beta: float = 0.0
    """KL penalty to the frozen reference (0: none)"""
    temperature: float = 1.0
    """sampling temperature"""
    top_p: float = 1.0
    """nucleus sampling"""
    max_new_tokens: int | None = None       # per agent turn; None: the task's default
    """tokens per agent turn (none: the task's default)"""
    gamma: float = 0.99                     # per-token (GEAR returns) and per-turn (refgrpo credit) discount
    """discount per token (GEAR returns) and per turn (refgrpo credit)"""
    gae_lambda: float = 0.95
    """GAE's lambda over turns (refgrpo)"""
    log_kl: bool = True                     # log KL to the reference even when beta = 0 (one more forward)
    """log the KL to the reference even when beta = 0 (one more no-grad forward a step; the reference is a frozen
    copy of the starting model, or with LoRA the base with its adapters off, which costs no memory)"""
    eval_every: int = 10                    # greedy accuracy on a fixed held-out set every N steps (0: never)
    """greedy held-out accuracy every N steps (0: never)"""
    eval_problems: int = 64
    """size of the held-out set"""
    eval_samples: int = 0
    """also sample this many completions per held-out problem at the training temperature and log their success
    rate (eval_sampled_accuracy; the draws seeded per evaluation, the training RNG untouched; 0: greedy only)"""
    pseudo_reward: str = "none"
    """none, or verdict: train on the model's own final verdict ('solved': 1) instead of the withheld label"""


@dataclass
class LLMRunConfig:
    algo: str = "grpo"
    """grpo, gear or refgrpo (--algo)"""
    task: str = "arith"
    """arith, rg:NAME, code, tools or rag, with options in brackets such as [reflect=both] (--task)"""
    model: str = ""
    """model directory or Hugging Face name (--model)"""
    steps: int = 100
    """GRPO steps (--steps)"""
    seed: int = 1
    """random seed (--seed)"""
    checkpoint_every: int = 10
    """GRPO steps between checkpoints"""
    torch_threads: int | None = None
    """torch's intra-op threads (none: torch's default)"""
    device: str = "auto"
    """auto (cuda where available), cpu, cuda or cuda:N (--device)"""
    precision: str = "auto"
    """auto (bf16 autocast on a CUDA device that supports it, else fp32), fp32 or bf16 (autocast, fp32 weights)"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, ~30% more time)"""
    logprob_chunk: int = 16
    """sequence positions whose full-vocabulary logits are computed at once (0: every position at once)"""
    release_memory: bool = True
    """glibc: large blocks mapped apart, so that freed memory returns to the system (llm/malloc.py: about half
    the peak resident memory of a SmolLM2 step)"""
    share_prompts: bool = True
    """with logprob_chunk: the update's forward passes compute each group's shared prompt once (the group packed
    into one row under a 4D attention mask, llm/packing.py); the same numbers up to float rounding"""
    decoder: str = "auto"
    """sampling: generate (transformers'), reflectrl (llm/decode.py: shared prompt prefill, buffered KV cache,
    inverse-CDF draws) or auto (reflectrl above 4096 vocabulary entries, generate below)"""
    lora_rank: int = 0
    """LoRA adapters of this rank on lora_targets, the base model frozen (0: train every weight)"""
    lora_alpha: float = 16.0
    """LoRA's scale numerator: the adapters' update is scaled by lora_alpha / lora_rank"""
    lora_dropout: float = 0.0
    """dropout on the adapters' input"""
    lora_targets: str = LORA_TARGETS
    """the modules that get adapters, by name, comma-separated"""
    lora_merged_sampling: bool = True
    """with LoRA, sample (and evaluate) through the weights with the adapters merged in, W + scale B A, set
    aside for the rollout and the original weights put back after it (exactly); false: through the
    unmerged adapters (the same policy up to float rounding, and slower: two more products per layer per token)"""
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    """the GRPO knobs"""
    sections: dict[str, Any] = field(default_factory=dict)
    """the signals' knobs, by section"""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LLMRunConfig:
        check_saved_config(d, cls, ("algo", "task", "model"), "reflectrl llm train")
        d = dict(d)
        unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise UserError(f"config has unknown keys {sorted(unknown)}; is it a language-model run written by "
                            "this reflectrl?")
        grpo = overrides.from_dict(GRPOConfig, d.pop("grpo", {}))
        sections = sections_from_dict(d.pop("sections", {}))  # popped before `**d` is unpacked
        return cls(**d, grpo=grpo, sections=sections)


RUN_KNOBS = ("checkpoint_every", "torch_threads", "device", "precision", "gradient_checkpointing", "logprob_chunk",
             "release_memory", "share_prompts", "decoder", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets",
             "lora_merged_sampling")
PRECISIONS = ("auto", "fp32", "bf16")
DECODERS = ("auto", "generate", "reflectrl")


def apply_llm_overrides(cfg: LLMRunConfig, items: list[str]) -> LLMRunConfig:
    """Apply `--set key=value` strings: bare GRPO and run knobs, SECTION.KNOB for a signal."""
    _apply(cfg, items)
    return cfg


def _apply(cfg: LLMRunConfig, items: list[str]) -> list[tuple[Any, str]]:
    """apply_llm_overrides, saying what each item set (overrides.apply)."""
    types = section_types()
    sections = {name: (lambda name=name: cfg.sections.setdefault(name, types[name]())) for name in types}
    return overrides.apply(items, bare=[("GRPO", cfg.grpo, None), ("run", cfg, RUN_KNOBS)], prefixed=sections,
                           example="group_size=8")


def new_llm_config(*, algo: str | None = None, task: str | None = None, model: str | None = None,
                   steps: int | None = None, seed: int | None = None, device: str | None = None,
                   sets: list[str] | None = None) -> LLMRunConfig:
    """An `llm train` run's config from its command line (None: the default), validated. The --algo may
    carry knobs in brackets (`grpo+gear[top_frac=0.5]`, read as config.split_algo reads them): they apply
    first, then --set; a knob given both ways with different values is refused."""
    text = algo or LLMRunConfig.algo
    algo, from_algo = split_algo(text, "llm", RUN_KNOBS)
    given = dict(task=task, model=model, steps=steps, seed=seed, device=device)
    cfg = LLMRunConfig(algo=algo, **{k: v for k, v in given.items() if v is not None})
    overrides.apply_after_algo(lambda items: _apply(cfg, items), list(from_algo), list(sets or []), text)
    validate_llm(cfg)
    return cfg


def check_device(device: str) -> None:
    """--device of llm train and llm sft: auto, cpu, cuda or cuda:N."""
    if device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", device):
        raise UserError(f"--device {device}: use auto, cpu, cuda or cuda:N")


def check_memory_knobs(cfg: LLMRunConfig) -> None:
    """logprob_chunk and the LoRA knobs."""
    if cfg.logprob_chunk < 0:
        raise UserError(f"logprob_chunk={cfg.logprob_chunk}: must be >= 0 positions (0: every position at once)")
    if cfg.decoder not in DECODERS:
        raise UserError(f"decoder={cfg.decoder}: use one of {', '.join(DECODERS)}")
    if cfg.lora_rank < 0:
        raise UserError(f"lora_rank={cfg.lora_rank}: must be >= 0 (0: no LoRA, every weight trains)")
    if not math.isfinite(cfg.lora_alpha) or cfg.lora_alpha <= 0:
        raise UserError(f"lora_alpha={cfg.lora_alpha}: must be a finite number > 0")
    if not 0 <= cfg.lora_dropout < 1:
        raise UserError(f"lora_dropout={cfg.lora_dropout}: must be in [0, 1)")
    if not lora_targets(cfg):
        raise UserError(f"lora_targets='{cfg.lora_targets}': name the modules that get adapters, comma-separated "
                        f"(default {LORA_TARGETS})")


def lora_targets(cfg: LLMRunConfig) -> list[str]:
    return [name.strip() for name in cfg.lora_targets.split(",") if name.strip()]


def validate_llm(cfg: LLMRunConfig) -> None:
    g = cfg.grpo
    algo = parse_algo(cfg.algo, "llm")
    if not cfg.model:
        raise UserError("llm train needs --model DIR (make a tiny one with 'reflectrl llm init-tiny --out DIR')")
    check_budget(cfg.steps, "--steps", "GRPO steps")
    check_seed(cfg.seed)
    if cfg.checkpoint_every < 1:
        raise UserError(f"checkpoint_every={cfg.checkpoint_every}: must be a positive number of steps")
    if cfg.torch_threads is not None and cfg.torch_threads < 1:
        raise UserError(f"torch_threads={cfg.torch_threads}: must be >= 1")
    check_device(cfg.device)
    if cfg.precision not in PRECISIONS:
        raise UserError(f"precision={cfg.precision}: use one of {', '.join(PRECISIONS)}")
    check_memory_knobs(cfg)
    for name in ("prompts_per_step", "num_iterations", "minibatches", "eval_problems"):
        if getattr(g, name) < 1:
            raise UserError(f"{name}={getattr(g, name)}: must be a positive integer")
    if g.group_size < 2:
        raise UserError(f"group_size={g.group_size}: GRPO compares samples within a group; use 2 or more")
    if g.eval_samples < 0:
        raise UserError(f"eval_samples={g.eval_samples}: must be >= 0 (0: greedy evaluation only)")
    if g.eval_every < 0:
        raise UserError(f"eval_every={g.eval_every}: must be >= 0 (0 turns evaluation off)")
    if (g.prompts_per_step * g.group_size) % g.minibatches:
        raise UserError(f"prompts_per_step*group_size={g.prompts_per_step * g.group_size} does not divide into "
                        f"minibatches={g.minibatches}; pick a divisor")
    if g.max_new_tokens is not None and g.max_new_tokens < 1:
        raise UserError(f"max_new_tokens={g.max_new_tokens}: must be a positive integer")
    for name in ("learning_rate", "weight_decay", "max_grad_norm", "clip_eps", "beta", "temperature", "top_p",
                 "gamma", "gae_lambda"):
        value = getattr(g, name)
        if not math.isfinite(value) or value < 0:
            raise UserError(f"{name}={value}: must be a finite number >= 0")
    for name in ("learning_rate", "max_grad_norm", "clip_eps", "temperature"):
        if getattr(g, name) == 0:
            raise UserError(f"{name}=0: must be > 0")
    if g.clip_eps_high is not None and (not math.isfinite(g.clip_eps_high) or g.clip_eps_high < g.clip_eps):
        raise UserError(f"clip_eps_high={g.clip_eps_high}: must be >= clip_eps ({g.clip_eps}), or none")
    if not 0 < g.top_p <= 1:
        raise UserError(f"top_p={g.top_p}: must be in (0, 1]")
    if not 0 < g.gamma <= 1 or g.gae_lambda > 1:
        raise UserError(f"gamma={g.gamma}, gae_lambda={g.gae_lambda}: need 0 < gamma <= 1 and 0 <= gae_lambda <= 1")
    if g.scale_rewards not in SCALE_REWARDS:
        raise UserError(f"scale_rewards='{g.scale_rewards}': use one of {', '.join(SCALE_REWARDS)}")
    if g.pseudo_reward not in PSEUDO_REWARDS:
        raise UserError(f"pseudo_reward='{g.pseudo_reward}': use one of {', '.join(PSEUDO_REWARDS)}")
    validate_sections(cfg.algo, algo, cfg.sections, run=cfg)
    if g.loss_type not in loss_types():  # last: the registered losses' module imports torch
        raise UserError(f"loss_type='{g.loss_type}': use one of {', '.join(loss_types())}")
    for name in algo.signals:
        cfg.sections.setdefault(name, signal_spec(name).config())
    # what the signals (and a pseudo-reward) need the task to state: switched on in its spec
    needs = {f"signal '{n}'": signal_spec(n).task_options["reflect"] for n in algo.signals
             if "reflect" in signal_spec(n).task_options}
    if g.pseudo_reward == "verdict" and needs:
        raise UserError(f"pseudo_reward=verdict withholds the labels that {', '.join(needs)} judge(s) the "
                        "reflections against; drop the signal, or train it first and self-improve from its model")
    if g.pseudo_reward == "verdict":
        needs["pseudo_reward=verdict"] = "verdict"
    cfg.task = require_reflect(cfg.task, needs)
