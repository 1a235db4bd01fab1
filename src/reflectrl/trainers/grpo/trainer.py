"""GRPO for language-model agents, with a signal (GEAR weights, a turn-level calibration bonus).

One step:
1. sample `prompts_per_step` problems and `group_size` episodes of each; an episode is one
   or more agent turns, with the task's tool output between turns (tokens that are in the
   context but masked out of the loss);
2. score each episode with the task's verifier; group-normalised advantages
   A_i = (r_i - mean_group) / (std + 1e-4) (`scale_rewards` = group | batch | none),
   broadcast over the episode's agent tokens;
3. the signal sees the batch and returns per-token weights (GEAR) or a reward term on the
   agent turns (the calibration bonus, credit then recomputed by GAE over turns);
4. clipped token-level objective, aggregated as `loss_type` = grpo (mean over each
   sequence's tokens, then over sequences), dr_grpo (sum over tokens / (sequences x
   longest completion)) or dapo (mean over all tokens of the batch), plus `beta` x the
   k3 estimate of KL to the frozen reference.

Features a signal sees: the LM's last hidden state. For tokens, the state *from which* the
token was sampled (position t-1); for turns, the state at the turn's last token, which has
read the whole turn. With one update per batch (`num_iterations=1, minibatches=1`) they
come from the update's own forward pass, so a signal costs no extra forward; otherwise a
no-grad pass before the update gives the old log-probabilities and the features.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from reflectrl.errors import NonFiniteError, UserError
from reflectrl.estimators import compute_gae
from reflectrl.llm import chat, decode, malloc, packing
from reflectrl.llm.calibration import calibration_metrics, relevance_metrics, scalar_metrics
from reflectrl.llm.losses import aggregate
from reflectrl.llm.model import hidden_size
from reflectrl.llm.tasks import make_task
from reflectrl.llm.tasks.base import Problem, Task, reference_hint
from reflectrl.llm.tasks.reflect import Reflection
from reflectrl.registry import parse_algo, signal_spec, step_kind
from reflectrl.runs import MetricsLogger, RunDir
from reflectrl.signals import Batch, Signal, SignalContext, make_signal
from reflectrl.trainers.base import Stopwatch, apply_signals, crossed, train_loop
from reflectrl.trainers.grpo.config import LLMRunConfig, lora_targets

CHECKPOINT_FORMAT = 1
EVAL_SEED = 20261129  # one held-out problem set for every run, so curves compare across seeds and algos
# Steps in a row that gave training nothing to act on (no reflection in the task's format, or every
# episode scored 0) before the run says so: a few, so a model that was never taught the task is
# named before it spends its budget, and not one, as a fine model can miss on a single batch.
SILENT_STEPS = 5
# A vocabulary of SMALL_VOCAB or fewer keeps its log-probabilities unchunked (logprob_chunk is not applied) and
# samples with transformers' generate (decoder=auto): the whole batch's logits are a few MB, and the tiny models'
# pinned runs (tests/test_params_hash.py) keep their bits.


# ---------------------------------------------------------------------------- rollouts

@dataclass
class Episodes:
    """N episodes as right-padded token tensors (N, L)."""

    ids: torch.Tensor            # prompt, agent turns (each ending in eos), tool output
    attention: torch.Tensor      # 1 on real tokens
    agent: torch.Tensor          # bool: tokens the agent wrote (the loss's tokens)
    turn: torch.Tensor           # the agent turn a token belongs to, -1 elsewhere
    turn_ends: list[list[int]]   # position of each turn's last token, per episode
    turns: list[list[str]]       # decoded agent turns
    problems: list[Problem]
    reflections: list[list[list]] | None = None  # per episode and turn, the Reflections stated there

    def final_reflections(self, task: Task) -> list:
        """Each episode's reflection on its answer (None where the task asks for none)."""
        return [final_reflection(task, r) for r in (self.reflections or [[] for _ in self.problems])]

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.agent.sum(1)


def _left_pad(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s)
        attn[i, width - len(s):] = 1
    return ids, attn


@torch.no_grad()
def rollout(model, tokenizer, task: Task, problems: list[Problem], *, max_new_tokens: int,
            temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False, decoder: str = "auto") -> Episodes:
    """Play one episode per problem with the model, turn by turn (sampling from torch's RNG), in
    the tokenizer's chat format where it has one (llm/chat.py; the task then reads its instruct form).
    `decoder`: transformers' generate or llm/decode.py's loop (auto: the loop above SMALL_VOCAB tokens)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    n = len(problems)
    chat.speak(task, tokenizer)
    seqs = [chat.prompt_ids(tokenizer, task, p) for p in problems]
    agent = [[False] * len(s) for s in seqs]
    turn_of = [[-1] * len(s) for s in seqs]
    turn_ends: list[list[int]] = [[] for _ in range(n)]
    turns: list[list[str]] = [[] for _ in range(n)]
    active = list(range(n))
    sample = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    lean = decode.use_lean_decoder(model, decoder)
    for k in range(task.max_turns):
        ids, attn = _left_pad([seqs[i] for i in active], pad)
        if lean:
            out = decode.sample(model, ids, attn, max_new_tokens=max_new_tokens, eos=eos, pad=pad,
                                temperature=temperature, top_p=top_p, greedy=greedy,
                                min_new_tokens=model.generation_config.min_new_tokens or 0)
        else:
            out = model.generate(input_ids=ids.to(model.device), attention_mask=attn.to(model.device),
                                 max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, **sample)
        new = out[:, ids.shape[1]:].tolist()
        still = []
        for j, i in enumerate(active):
            toks = new[j]
            if eos in toks:
                toks = toks[:toks.index(eos) + 1]  # the eos is the agent's choice to stop: it is learned too
            seqs[i] += toks
            agent[i] += [True] * len(toks)
            turn_of[i] += [k] * len(toks)
            turn_ends[i].append(len(seqs[i]) - 1)
            turns[i].append(tokenizer.decode([t for t in toks if t != eos], skip_special_tokens=True))
        # the environment's replies, as a batch (the code task's feedback runs its sandboxes in parallel)
        replies = (task.respond_batch([problems[i] for i in active], [turns[i] for i in active])
                   if k + 1 < task.max_turns else [None] * len(active))
        for i, reply in zip(active, replies):
            if reply is not None:
                reply_ids = chat.reply_ids(tokenizer, reply, seqs[i])
                seqs[i] += reply_ids
                agent[i] += [False] * len(reply_ids)
                turn_of[i] += [-1] * len(reply_ids)
                still.append(i)
        active = still
        if not active:
            break
    width = max(len(s) for s in seqs)
    ids = torch.full((n, width), pad, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    agent_t = torch.zeros((n, width), dtype=torch.bool)
    turn_t = torch.full((n, width), -1, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        attention[i, :len(s)] = 1
        agent_t[i, :len(s)] = torch.tensor(agent[i])
        turn_t[i, :len(s)] = torch.tensor(turn_of[i])
    reflections = [task.reflections(p, t) for p, t in zip(problems, turns)]
    return Episodes(ids, attention, agent_t, turn_t, turn_ends, turns, problems, reflections)


def final_reflection(task: Task, reflections: list[list]):
    """The reflection on the answer in an episode's last turn; a missing one where it is asked for."""
    if task.reflect == "none":
        return None
    last = reflections[-1] if reflections else []
    return next((r for r in reversed(last) if r.final), Reflection())


@dataclass
class Scored:
    """The rewards of a batch of episodes and GRPO's advantages, each (N,)."""

    rewards: torch.Tensor   # what is trained on: the verifier's, or the pseudo-reward
    advantages: torch.Tensor
    baseline: torch.Tensor  # the group's mean reward
    scale: torch.Tensor     # what the advantages were divided by
    scores: torch.Tensor    # the verifier's, whether trained on or withheld (pseudo_reward)


# ---------------------------------------------------------------------------- advantages

def group_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str = "group",
                     eps: float = 1e-4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GRPO's advantages of rewards laid out group after group: (advantages, baseline, scale),
    each (N,). The baseline is the group's mean; the scale its std (`group`), the whole
    batch's std (`batch`) or 1 (`none`). A group whose rewards are all equal has advantage 0."""
    grouped = rewards.view(-1, group_size)
    baseline = grouped.mean(1, keepdim=True).expand_as(grouped).reshape(-1)
    if scale_rewards == "group":
        scale = grouped.std(1, keepdim=True).expand_as(grouped).reshape(-1) + eps
    elif scale_rewards == "batch":
        scale = torch.full_like(rewards, rewards.std().item() + eps)
    else:
        scale = torch.ones_like(rewards)
    return (rewards - baseline) / scale, baseline, scale


def token_logprobs(model, ids: torch.Tensor, attention: torch.Tensor, *, temperature: float = 1.0,
                   with_logits: bool = False, chunk: int = 0, start: int = 0, prompt_lengths=None):
    """(log p(token t | tokens < t) for t >= 1, last hidden state), shapes (N, L-1) and (N, L, H);
    with `with_logits`, also the log-softmax distributions (N, L-1, V), detached.

    Logits are divided by the sampling temperature, so log-probabilities are those of the
    distribution the tokens were drawn from. Inputs move to the model's device.

    With `chunk` > 0 (and no `with_logits`) the (N, L-1, V) logits never sit in memory at once,
    neither in the forward nor in the backward pass: the decoder's last hidden state is computed
    once, then the LM head, temperature, log-softmax and gather run `chunk` positions at a time
    under activation checkpointing (the backward pass recomputes each chunk's logits), from step
    `start` on (the step that predicts the batch's first completion token); the earlier steps
    predict prompt tokens, which are never in the loss, and their log-probabilities are left 0.
    With `prompt_lengths` (N,) too (each row's first agent token), rows that share a prompt are
    packed into one row for the decoder (llm/packing.py): each prompt is computed once."""
    ids, attention = ids.to(model.device), attention.to(model.device)
    if with_logits or chunk <= 0 or not _has_plain_head(model):
        out = model(input_ids=ids, attention_mask=attention, output_hidden_states=True, use_cache=False)
        logits = out.logits[:, :-1].float() / temperature
        full = torch.log_softmax(logits, -1)
        logp = full.gather(-1, ids[:, 1:, None]).squeeze(-1)
        if with_logits:
            return logp, out.hidden_states[-1], full.detach()
        return logp, out.hidden_states[-1]
    packed = None if prompt_lengths is None else packing.plan(model, ids, attention, prompt_lengths)
    if packed is not None:
        hidden = packed.unpack(model.get_decoder()(input_ids=packed.ids, attention_mask=packed.attention_mask(model),
                                                   position_ids=packed.positions, use_cache=False).last_hidden_state)
    else:
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    head, targets = model.get_output_embeddings(), ids[:, 1:]
    steps = targets.shape[1]
    start = min(max(start, 0), steps)
    pieces = [torch.zeros(ids.shape[0], start, device=ids.device)]
    for s in range(start, steps, chunk):
        end = min(s + chunk, steps)  # step t is read from position t and predicts token t+1
        args = (head, hidden[:, s:end], targets[:, s:end], temperature)
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(*args))
    return torch.cat(pieces, 1), hidden


def _chunk_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(target) at each of a chunk's positions: (N, C)."""
    # a chunk of positions is a strided view; a frozen head (LoRA, or a no-grad model) would run on it
    # as a batched matmul against its weight broadcast per row, about 1.6x slower than one matmul on a copy
    logits = head(hidden.contiguous()).float() / temperature
    return logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)


def _has_plain_head(model) -> bool:
    """Whether the model's logits are its output embedding applied to its decoder's last hidden state
    (Llama, Qwen and most causal LMs; not those that cap or scale their logits after the head)."""
    config = model.config.get_text_config()
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return False
    try:
        return model.get_decoder() is not None and model.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def teacher_inputs(tokenizer, task: Task, episodes: Episodes, kind: str = "solution"):
    """The episodes with the task's reference (tasks/base.py's `reference_hint`) between each
    prompt and its completion (in chat form inside the prompt's user turn, llm/chat.py): (ids,
    attention) right-padded, and per episode the prompt's length and the hint's (how much longer
    the hinted prompt is), (N,) each. Token t >= prompt length of an episode sits at t + hint
    length in the teacher's sequence."""
    n = episodes.ids.shape[0]
    lengths = episodes.attention.sum(1).tolist()
    prompt_len = episodes.agent.long().argmax(1)  # the first agent token
    seqs, hint_len = [], []
    for i in range(n):
        # the prompt re-rendered with the hint after it (in chat form, inside the user turn)
        problem = episodes.problems[i]
        hinted = chat.prompt_ids(tokenizer, task, problem, hint=reference_hint(task, problem, kind))
        p, row = int(prompt_len[i]), episodes.ids[i, :lengths[i]].tolist()
        seqs.append(hinted + row[p:])
        hint_len.append(len(hinted) - p)
    width = max(len(q) for q in seqs)
    ids = torch.full((n, width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    for i, q in enumerate(seqs):
        ids[i, :len(q)] = torch.tensor(q)
        attention[i, :len(q)] = 1
    return ids, attention, prompt_len, torch.tensor(hint_len)


@torch.no_grad()
def teacher_logprobs(teacher, tokenizer, task: Task, episodes: Episodes, *, steps: int, kind: str = "solution",
                     temperature: float = 1.0) -> torch.Tensor:
    """(N, steps, V) log-softmax of the teacher (a model reading the reference) at each token step
    of the episodes (step t predicts token t+1), aligned with `token_logprobs`'s; at the prompt's
    steps, where nothing is sampled, the teacher's are those of its own prompt positions.
    Evaluated in eval mode without touching the global RNG (a no-op for the trainer's stream)."""
    ids, attention, prompt_len, hint_len = teacher_inputs(tokenizer, task, episodes, kind)
    was_training = teacher.training
    teacher.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            logits = teacher(input_ids=ids.to(teacher.device), attention_mask=attention.to(teacher.device),
                             use_cache=False).logits
    finally:
        teacher.train(was_training)
    t = torch.arange(steps)[None, :]
    shifted = t >= (prompt_len[:, None] - 1)  # steps that predict a completion (or tool) token
    pos = torch.where(shifted, t + hint_len[:, None], t).clamp(max=logits.shape[1] - 1).to(logits.device)
    picked = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
    return torch.log_softmax(picked.float() / temperature, -1)


def clipped_objective(logp, old_logp, advantages, clip_eps: float, clip_eps_high: float):
    """Per-token PPO-clip loss and whether each token was clipped."""
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps_high) * advantages
    return -torch.min(unclipped, clipped), (unclipped != clipped)


# ---------------------------------------------------------------------------- signal batches

def token_batch(ep_agent: torch.Tensor, rewards: torch.Tensor, baseline: torch.Tensor,
                advantages: torch.Tensor, features: torch.Tensor, ids: torch.Tensor,
                group_size: int) -> Batch:
    """The (L-1, N) time-major Batch of an episode batch's tokens (shifted: step t is token t+1,
    sampled from the state at position t). Each sequence is one trajectory whose outcome
    reward sits on its last agent token; V_orig is the group's mean reward."""
    mask = ep_agent[:, 1:]
    n, steps = mask.shape
    last = steps - 1 - torch.flip(mask, [1]).long().argmax(1)  # the last agent token of each sequence
    r = torch.zeros(n, steps)
    r[torch.arange(n), last] = rewards
    terminations = torch.zeros(n, steps, dtype=torch.bool)
    terminations[:, -1] = True  # one trajectory per sequence: the padding after it is masked out
    groups = (torch.arange(n) // group_size)[:, None].expand(n, steps)
    values = baseline[:, None].expand(n, steps)
    feats = features[:, :-1]
    return Batch(obs=feats.transpose(0, 1), actions=ids[:, 1:].T, rewards=r.T, terminations=terminations.T,
                 truncations=torch.zeros_like(terminations.T), values=values.T.contiguous(),
                 next_values=torch.zeros(steps, n), advantages=(advantages[:, None] * mask).T,
                 features=feats.transpose(0, 1), mask=mask.T.contiguous(), groups=groups.T.contiguous())


def turn_batch(episodes: Episodes, rewards: torch.Tensor, baseline: torch.Tensor, scale: torch.Tensor,
               hidden: torch.Tensor, group_size: int, gamma: float, gae_lambda: float,
               extra: torch.Tensor | None = None, outcomes: torch.Tensor | None = None) -> Batch:
    """The (K, N) Batch of agent turns: features = the hidden state at each turn's last token,
    reward = the outcome on the last turn (plus `extra`, a (K, N) reward term, on each turn),
    V = the group's mean reward on every turn; the advantages are GAE over turns divided by
    GRPO's scale, so with one turn they are GRPO's. `reflections` and `outcomes` carry what the
    agent stated and whether it solved the task."""
    n = len(episodes.turn_ends)
    k = max(len(e) for e in episodes.turn_ends)
    feats = torch.zeros(k, n, hidden.shape[-1])
    mask = torch.zeros(k, n, dtype=torch.bool)
    r = torch.zeros(k, n)
    values = torch.zeros(k, n)
    next_values = torch.zeros(k, n)
    terminations = torch.ones(k, n, dtype=torch.bool)
    for i, ends in enumerate(episodes.turn_ends):
        for j, pos in enumerate(ends):
            feats[j, i] = hidden[i, pos]
            mask[j, i] = True
            values[j, i] = baseline[i]
            terminations[j, i] = j == len(ends) - 1
            next_values[j, i] = 0.0 if j == len(ends) - 1 else baseline[i]
        r[len(ends) - 1, i] = rewards[i]
    if extra is not None:
        r = r + extra
    outcomes = (rewards >= 1.0).float() if outcomes is None else outcomes
    truncations = torch.zeros_like(terminations)

    def estimate(total_rewards: torch.Tensor):
        adv, ret = compute_gae(total_rewards, values, next_values, terminations, truncations, gamma, gae_lambda)
        return adv / scale[None, :] * mask, ret

    advantages, returns = estimate(r)
    groups = (torch.arange(n) // group_size)[None, :].expand(k, n)
    return Batch(obs=feats, actions=torch.zeros(k, n), rewards=r, terminations=terminations,
                 truncations=truncations, values=values, next_values=next_values, advantages=advantages,
                 returns=returns, features=feats, mask=mask, groups=groups.contiguous(), estimate=estimate,
                 reflections=episodes.reflections, outcomes=(outcomes[None, :] * mask).float())


def return_to_go_advantages(turns: Batch, scale: torch.Tensor) -> torch.Tensor:
    """(sum of a turn's rewards from it on - V) / scale: GAE over turns with gamma = lambda = 1.
    With reward terms that are all zero it is GRPO's advantage on every turn, bit for bit."""
    adv, _ = compute_gae(turns.rewards, turns.values, turns.next_values, turns.terminations, turns.truncations,
                         1.0, 1.0)
    return adv / scale[None, :] * turns.mask


def resolve_device(device: str, precision: str) -> tuple[torch.device, bool]:
    """(the device to train on, whether to autocast to bf16) for `device` = auto | cpu | cuda[:N]
    and `precision` = auto (bf16 on a CUDA device that supports it, else fp32) | fp32 | bf16 (on a
    CUDA device that supports it, or on the CPU: autocast there too, the weights staying fp32).
    auto stays fp32 on the CPU: see docs/benchmarks.md for what bf16 gains there."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {device}: CUDA is not available here (torch {torch.__version__}); "
                        "use --device cpu, or auto")
    supported = dev.type == "cuda" and torch.cuda.is_bf16_supported()
    if precision == "bf16" and not (supported or dev.type == "cpu"):
        raise UserError(f"precision=bf16: not supported on {dev} here; use precision=fp32 (or auto)")
    return dev, precision == "bf16" or (precision == "auto" and supported)


def add_lora(model, cfg: LLMRunConfig):
    """The model with LoRA adapters (peft) of rank `lora_rank` on `lora_targets`, its own weights frozen."""
    from peft import LoraConfig, get_peft_model

    targets = lora_targets(cfg)
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(name == t or name.endswith("." + t) for name in names)]
    if missing:
        raise UserError(f"lora_targets: the model has no module named {', '.join(missing)}; its linear layers "
                        f"are {', '.join(sorted(linear_names(model)))}")
    lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):  # the adapters' initial draws: from the seed, aside from the run's
        torch.manual_seed(cfg.seed)
        return get_peft_model(model, lora)


def linear_names(model) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def lora_deltas(model) -> dict:
    """{name: (LoRA layer, its weight's update scale B A)} of a peft model's adapted layers (call under no_grad)."""
    from peft.tuners.lora import LoraLayer

    return {name: (module, module.get_delta_weight(module.active_adapters[0]))
            for name, module in model.get_base_model().named_modules() if isinstance(module, LoraLayer)}


def merged_state_dict(model) -> dict:
    """The policy's weights under the plain model's names. With LoRA, each adapted weight is
    W + (lora_alpha / lora_rank) B A, computed aside: merging into the model and back would not
    give the same floats."""
    if not hasattr(model, "peft_config"):
        return model.state_dict()
    base = model.get_base_model()
    with torch.no_grad():
        deltas = {name: delta for name, (_, delta) in lora_deltas(model).items()}
        merged = {}
        for key, value in base.state_dict().items():
            if ".lora_" in key:
                continue
            owner, _, leaf = key.rpartition(".base_layer.")  # an adapted module's own weight or bias
            if owner and leaf == "weight":
                value = value + deltas[owner]
            merged[f"{owner}.{leaf}" if owner else key] = value
    return merged


@contextlib.contextmanager
def merged_for_sampling(model):
    """Sample through merged LoRA weights: each adapted layer's weight replaced by W + scale B A (a new
    tensor) and the adapters switched off, then the original weight objects put back, so the weights
    the update trains and the checkpoint saves are untouched, bit for bit. Without adapters, nothing."""
    if not hasattr(model, "peft_config"):
        yield
        return
    saved = []
    try:
        with torch.no_grad():
            for module, delta in lora_deltas(model).values():
                layer = module.base_layer
                saved.append((layer, layer.weight))
                layer.weight = torch.nn.Parameter(layer.weight + delta.to(layer.weight.dtype), requires_grad=False)
        with model.disable_adapter():
            yield
    finally:
        for layer, weight in saved:
            layer.weight = weight


def peak_memory(device: torch.device) -> dict:
    """The process's peak resident memory in GB so far (and the CUDA allocator's peak, on a GPU)."""
    import resource

    row = {"peak_memory_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}
    if device.type == "cuda":
        row["peak_cuda_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return row


def make_llm_signal(cfg: LLMRunConfig) -> Signal | None:
    return make_signal(cfg, family="llm")


# ---------------------------------------------------------------------------- trainer

class GRPOTrainer:
    def __init__(self, cfg: LLMRunConfig, model, tokenizer, run: RunDir | None = None,
                 signal: Signal | None = None):
        if cfg.torch_threads is not None:
            torch.set_num_threads(cfg.torch_threads)
        if cfg.release_memory:
            malloc.map_large_blocks()
        self.cfg, self.run, self.tokenizer = cfg, run, tokenizer
        self.device, self.bf16 = resolve_device(cfg.device, cfg.precision)
        self.model = model = model.to(self.device)
        if cfg.gradient_checkpointing:
            # transformers 5 renamed it activation checkpointing (the old name warns, and goes in v6)
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora_rank:
            self.model = model = add_lora(model, cfg)
        vocab = decode.vocab_size(model) if _has_plain_head(model) else 0
        self.logprob_chunk = cfg.logprob_chunk if vocab > decode.SMALL_VOCAB else 0
        g = cfg.grpo
        self.task = make_task(cfg.task)
        chat.speak(self.task, tokenizer)  # a chat model's instruct form and budget, before max_new_tokens is read
        self.max_new_tokens = g.max_new_tokens or self.task.max_new_tokens
        torch.manual_seed(cfg.seed)
        self.rng = random.Random(cfg.seed)  # the problems drawn; generation draws from torch's RNG
        trained = [p for p in model.parameters() if p.requires_grad]  # with LoRA, the adapters only
        self.optimizer = torch.optim.AdamW(trained, lr=g.learning_rate, weight_decay=g.weight_decay)
        # the reference policy (for beta > 0, and the logged KL): with LoRA the base model, its adapters
        # switched off for the pass (no copy); otherwise a frozen copy of the starting model
        self.wants_reference = g.beta > 0 or g.log_kl
        self.reference = None
        if self.wants_reference and not cfg.lora_rank:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.signal = signal if signal is not None else make_llm_signal(cfg)
        # each signal works on the step kind it declares: agent turns or tokens
        self.members = [] if self.signal is None else list(getattr(self.signal, "members", [self.signal]))
        self.kinds = [step_kind(m.name, "grpo") for m in self.members]
        self.wants_teacher = self.signal is not None and self.signal.wants_teacher
        self.frozen_teacher, self.teacher_step, self.teacher_seconds = None, 0, 0.0
        if self.signal is not None:
            width = hidden_size(model)
            self.signal.bind(SignalContext(
                obs_dim=width, action_dim=0, discrete=False, feature_dim=width, learning_rate=g.learning_rate,
                gamma=g.gamma, gae_lambda=g.gae_lambda, seed=cfg.seed, total_iterations=cfg.steps))
        eval_rng = random.Random(EVAL_SEED)
        self.eval_set = [self.task.sample(eval_rng) for _ in range(g.eval_problems)] if g.eval_every else []
        self.step = 0
        self.logger: MetricsLogger | None = None
        self.last_eval = None  # (correct, final reflections) of the last evaluation, where reflections are stated
        self.silent_steps = {"format": 0, "reward": 0}  # steps in a row with nothing to act on, by cause
        self.silence_warned = False

    @property
    def global_step(self) -> int:
        return self.step

    def precision(self):
        """bf16 autocast on an accelerator that supports it (precision=bf16, or auto there); fp32 otherwise."""
        if self.bf16:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def sampling(self):
        """The rollout's context: the precision, and with LoRA the adapters merged (lora_merged_sampling)."""
        with self.precision(), (merged_for_sampling(self.model) if self.cfg.lora_merged_sampling
                                else contextlib.nullcontext()):
            yield

    # ------------------------------------------------------------------ one step

    def _signal_output(self, episodes: Episodes, scored: Scored, logp_hidden, student_logp=None):
        """Per-token advantages (N, L-1) after the signals, and each signal's batch (for after_update).

        Turn-level signals (the calibration bonus) act first: their reward terms are credited
        over turns by GAE and their advantage terms add, per turn; every agent token carries
        its turn's advantage. Token-level signals (GEAR) then act on those per-token
        advantages: weights multiply, advantage terms add."""
        g = self.cfg.grpo
        rewards, advantages, baseline, scale = scored.rewards, scored.advantages, scored.baseline, scored.scale
        token_adv = advantages[:, None] * episodes.agent[:, 1:]
        if not self.members:
            return token_adv, []
        hidden = logp_hidden.detach().float().cpu()
        batches = []
        turns = None
        if "turn" in self.kinds:
            outcomes = (scored.scores >= 1.0).float()
            turns = turn_batch(episodes, rewards, baseline, scale, hidden, g.group_size, g.gamma, g.gae_lambda,
                               outcomes=outcomes)
            turns.global_step = self.step  # what a signal's schedule counts (gear.warmup_steps)
            # reward terms on the turns (the stated-reflection signals) join the outcome before GRPO's
            # group normalisation, and each turn is credited with the terms from it on
            extra = None
            for member, kind in zip(self.members, self.kinds):
                term = member.shape_rewards(turns) if kind == "turn" else None
                if term is not None:
                    extra = term if extra is None else extra + term
            if extra is not None:
                _, baseline, scale = group_advantages(rewards + extra.sum(0), g.group_size, g.scale_rewards)
                turns = turn_batch(episodes, rewards, baseline, scale, hidden, g.group_size, g.gamma,
                                   g.gae_lambda, extra=extra, outcomes=outcomes)
                turns.global_step = self.step
                turns.advantages = return_to_go_advantages(turns, scale)
            turn_adv, turn_rewards, turn_term = turns.advantages, turns.rewards, None
            for member, kind in zip(self.members, self.kinds):
                if kind != "turn":
                    continue
                out = member.after_advantages(turns)
                if out is not None and out.reward is not None:
                    turn_rewards = turn_rewards + out.reward
                    if out.recompute:
                        turn_adv, _ = turns.estimate(turn_rewards)
                        turn_adv = turn_adv if turn_term is None else turn_adv + turn_term
                if out is not None and out.advantage is not None:
                    turn_term = out.advantage if turn_term is None else turn_term + out.advantage
                    turn_adv = turn_adv + out.advantage
            gathered = turn_adv.T.gather(1, episodes.turn[:, 1:].clamp(min=0))
            token_adv = gathered * episodes.agent[:, 1:]
        tokens = None
        if "token" in self.kinds:
            tokens = token_batch(episodes.agent, rewards, baseline, advantages, hidden, episodes.ids, g.group_size)
            tokens.global_step = self.step
            if self.wants_teacher:
                tokens.teacher_fn = self._teacher_fn(episodes, student_logp)
            if turns is not None:
                tokens.advantages = token_adv.T
            for member, kind in zip(self.members, self.kinds):
                if kind != "token":
                    continue
                # a token's advantage is its sequence's (or its turn's): nothing to re-estimate
                result = apply_signals(member, tokens, lambda r: (tokens.advantages, tokens.returns),
                                       reward_terms=False)
                if result.weights is not None:
                    token_adv = token_adv * result.weights.T
                if result.advantage_term is not None:
                    token_adv = token_adv + result.advantage_term.T
        batches = [turns if kind == "turn" else tokens for kind in self.kinds]
        return token_adv, batches

    def _teacher_fn(self, episodes: Episodes, student_logp: torch.Tensor):
        """Batch.teacher_fn for the divergence signal: (student, teacher) log-softmax, time-major."""
        def teacher_fn(refresh: int, reference: str):
            start = time.perf_counter()
            if refresh == 0:
                teacher = self.model
            else:  # a copy frozen every `refresh` steps
                if self.frozen_teacher is None:
                    self.frozen_teacher = copy.deepcopy(self.model).requires_grad_(False)
                    self.teacher_step = self.step
                elif self.step - self.teacher_step >= refresh:
                    self.frozen_teacher.load_state_dict(self.model.state_dict())
                    self.teacher_step = self.step
                teacher = self.frozen_teacher
            with self.precision():
                lt = teacher_logprobs(teacher, self.tokenizer, self.task, episodes, steps=student_logp.shape[1],
                                      kind=reference, temperature=self.cfg.grpo.temperature)
            self.teacher_seconds += time.perf_counter() - start
            return student_logp.transpose(0, 1), lt.transpose(0, 1)

        return teacher_fn

    def train_step(self) -> dict:
        """One GRPO step in named phases: generate, score, update (the signals' batches are built
        inside it, from the update's own forward where that is the old policy), metrics."""
        start = time.perf_counter()
        watch = Stopwatch()  # the signals' share of the step
        episodes = self.generate()
        generation_seconds = time.perf_counter() - start
        scored = self.score(episodes)
        stats = self.update(episodes, scored, watch)
        self.step += 1
        return self.metrics(episodes, scored, stats, watch, time.perf_counter() - start, generation_seconds)

    # ------------------------------------------------------------------ phases

    def generate(self) -> Episodes:
        """`prompts_per_step` problems, `group_size` episodes each, laid out group after group."""
        g = self.cfg.grpo
        problems = [self.task.sample(self.rng) for _ in range(g.prompts_per_step)]
        problems = [p for p in problems for _ in range(g.group_size)]
        self.model.eval()
        try:
            with self.sampling():
                return rollout(self.model, self.tokenizer, self.task, problems, max_new_tokens=self.max_new_tokens,
                               temperature=g.temperature, top_p=g.top_p, decoder=self.cfg.decoder)
        except RuntimeError as err:  # torch.multinomial on a NaN distribution: the weights are broken
            if "inf" in str(err) or "nan" in str(err):
                raise NonFiniteError("sampling probabilities", self.step) from None
            raise

    def score(self, episodes: Episodes) -> Scored:
        """The verifier's rewards (or, with pseudo_reward=verdict, the model's own final verdict:
        1 where it says "solved", the verifier's score then withheld from training and only
        logged) and GRPO's group-normalised advantages."""
        g = self.cfg.grpo
        scores = torch.tensor(self.task.score_batch(episodes.problems, episodes.turns), dtype=torch.float32)
        rewards = scores
        if g.pseudo_reward == "verdict":
            rewards = torch.tensor([float(r.stated_verdict is True) for r in episodes.final_reflections(self.task)])
        advantages, baseline, scale = group_advantages(rewards, g.group_size, g.scale_rewards)
        return Scored(rewards, advantages, baseline, scale, scores)

    def update(self, episodes: Episodes, scored: Scored, watch: Stopwatch) -> dict:
        """`num_iterations` passes of `minibatches` clipped-objective steps; the signals act on
        the first forward's features and fit after the update."""
        g = self.cfg.grpo
        start_time = time.perf_counter()
        ids, attention = episodes.ids, episodes.attention
        mask = episodes.agent[:, 1:].to(self.device)
        # log-probabilities in chunks of positions, from the step that predicts the batch's first agent token
        chunked = dict(chunk=self.logprob_chunk, start=int(episodes.agent.any(0).long().argmax()) - 1)
        # each row's first agent token: rows that share a prompt compute it once (llm/packing.py)
        prompts = episodes.agent.long().argmax(1) if self.cfg.share_prompts else None
        self.teacher_seconds = 0.0
        n = ids.shape[0]
        ref_logp = None
        if self.wants_reference:
            with torch.no_grad(), self.precision(), self.reference_policy() as reference:
                ref_logp, _ = token_logprobs(reference, ids, attention, temperature=g.temperature,
                                             prompt_lengths=prompts, **chunked)
        self.model.train()
        prepass = g.num_iterations > 1 or g.minibatches > 1
        old_logp = token_adv = signal_batches = None
        want_logits = self.wants_teacher
        if prepass:  # old log-probabilities (and the signals' features) before any update
            with torch.no_grad(), self.precision():
                old_logp, hidden, *full = token_logprobs(self.model, ids, attention, temperature=g.temperature,
                                                         with_logits=want_logits, prompt_lengths=prompts, **chunked)
            with watch:
                token_adv, signal_batches = self._signal_output(episodes, scored, hidden, *full)
            token_adv = token_adv.to(self.device)
        eps_high = g.clip_eps if g.clip_eps_high is None else g.clip_eps_high
        size = n // g.minibatches
        losses, clipfracs, grad_norms = [], [], []
        for _ in range(g.num_iterations):
            order = torch.randperm(n) if g.minibatches > 1 else torch.arange(n)
            for s in range(0, n, size):
                idx = order[s:s + size]
                with self.precision():
                    logp, hidden, *full = token_logprobs(self.model, ids[idx], attention[idx],
                                                         temperature=g.temperature,
                                                         with_logits=want_logits and not prepass,
                                                         prompt_lengths=None if prompts is None else prompts[idx],
                                                         **chunked)
                if not prepass:  # the update's own forward is the old policy: features come free
                    old_logp = logp.detach()
                    with watch:
                        token_adv, signal_batches = self._signal_output(episodes, scored, hidden, *full)
                    token_adv = token_adv.to(self.device)
                per_token, was_clipped = clipped_objective(logp, old_logp[idx], token_adv[idx], g.clip_eps, eps_high)
                if g.beta > 0:
                    delta = ref_logp[idx] - logp
                    per_token = per_token + g.beta * (torch.exp(delta) - delta - 1)
                loss = aggregate(per_token, mask[idx], g.loss_type)
                if not torch.isfinite(loss):
                    raise NonFiniteError("loss", self.step)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self.optimizer.param_groups[0]["params"],
                                                           g.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    raise NonFiniteError("gradient", self.step)
                self.optimizer.step()
                losses.append(loss.item())
                grad_norms.append(grad_norm.item())
                clipfracs.append((was_clipped & mask[idx]).sum().item() / max(mask[idx].sum().item(), 1))
        if self.members:
            with watch:
                for member, batch in zip(self.members, signal_batches):
                    member.after_update(batch)
        stats = {"loss": float(np.mean(losses)), "clipfrac": float(np.mean(clipfracs)),
                 "grad_norm": float(np.mean(grad_norms))}
        if ref_logp is not None:
            # k3 estimate of KL(policy || reference) on the batch's agent tokens, before the update
            with torch.no_grad():
                delta = ref_logp - (old_logp if old_logp is not None else ref_logp)
                stats["kl"] = aggregate(torch.exp(delta) - delta - 1, mask, "dapo").item()
        stats["update_seconds"] = time.perf_counter() - start_time
        return stats

    @contextlib.contextmanager
    def reference_policy(self):
        """The frozen reference policy for one no-grad pass: the starting model's copy, or with LoRA
        the base model with its adapters disabled (in eval mode for the pass: no adapter dropout)."""
        if self.reference is not None:
            yield self.reference
            return
        self.model.eval()
        with self.model.disable_adapter():
            yield self.model

    def metrics(self, episodes: Episodes, scored: Scored, stats: dict, watch: Stopwatch, seconds: float,
                generation_seconds: float) -> dict:
        g = self.cfg.grpo
        rewards = scored.rewards
        lengths = episodes.completion_lengths.float()
        correct = scored.scores >= 1.0
        row = {
            "step": self.step,
            "reward": rewards.mean().item(),
            "accuracy": correct.float().mean().item(),  # the verifier's, also where it is withheld
            "reward_std": rewards.std().item(),
            "solved_groups": (rewards.view(-1, g.group_size) >= 1).any(1).float().mean().item(),
            "loss": stats["loss"],
            "clipfrac": stats["clipfrac"],
            "clip_ratio": stats["clipfrac"],  # deprecated name of clipfrac (the PPO trainer's), kept for old scripts
            "grad_norm": stats["grad_norm"],
            "completion_length": lengths.mean().item(),
            "turns": float(np.mean([len(t) for t in episodes.turns])),
        }
        if "kl" in stats:
            row["kl"] = stats["kl"]
        if self.task.reflect != "none":  # how well the stated reflections match the outcomes
            finals = episodes.final_reflections(self.task)
            row.update(scalar_metrics(calibration_metrics(correct.tolist(), finals)))
            row.update(relevance_metrics(self.task, episodes.problems, episodes.turns, episodes.reflections))
            row.pop("mean_confidence", None)
        if g.pseudo_reward != "none":
            row["pseudo_solved_rate"] = row.get("solved_rate", 0.0)
            row["pseudo_true_accuracy"] = row["accuracy"]
        if self.signal is not None:
            row.update(self.signal.metrics())
            row["signal_time_fraction"] = watch.seconds / seconds
        if self.wants_teacher:  # the teacher pass's share of the step (inside the signal's)
            row["teacher_time_fraction"] = self.teacher_seconds / seconds
        row["step_seconds"] = seconds
        row["generation_seconds"] = generation_seconds
        row["update_seconds"] = stats["update_seconds"]
        row["tokens_per_second"] = lengths.sum().item() / seconds
        row.update(peak_memory(self.device))
        return row

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Greedy accuracy on the held-out problems (the same for every run of the task); with
        eval_samples, the success rate of that many sampled completions per problem too."""
        self.model.eval()
        state = torch.get_rng_state()
        with self.sampling():
            episodes = rollout(self.model, self.tokenizer, self.task, self.eval_set,
                               max_new_tokens=self.max_new_tokens, greedy=True, decoder=self.cfg.decoder)
        torch.set_rng_state(state)
        rewards = torch.tensor(self.task.score_batch(self.eval_set, episodes.turns))
        out = {"eval_reward": rewards.mean().item(), "eval_accuracy": (rewards >= 1.0).float().mean().item()}
        g = self.cfg.grpo
        if g.eval_samples:  # sampled success on the same problems, its draws seeded by the step
            problems = [p for p in self.eval_set for _ in range(g.eval_samples)]
            torch.manual_seed(EVAL_SEED + self.step)
            with self.sampling():
                sampled = rollout(self.model, self.tokenizer, self.task, problems, max_new_tokens=self.max_new_tokens,
                                  temperature=g.temperature, top_p=g.top_p, decoder=self.cfg.decoder)
            torch.set_rng_state(state)
            scores = torch.tensor(self.task.score_batch(problems, sampled.turns))
            out["eval_sampled_accuracy"] = (scores >= 1.0).float().mean().item()
        if self.task.reflect != "none":
            self.last_eval = ((rewards >= 1.0).tolist(), episodes.final_reflections(self.task))
            metrics = calibration_metrics(*self.last_eval)
            metrics.update(relevance_metrics(self.task, self.eval_set, episodes.turns, episodes.reflections))
            out.update(scalar_metrics(metrics, "eval_"))
        return out

    # ------------------------------------------------------------------ loop

    # what the shared loop (trainers/base.py) needs
    unit = "steps"
    discrete_entropy = False

    def total_units(self) -> int:
        return self.cfg.steps

    def units_done(self) -> int:
        return self.step

    def finished(self) -> bool:
        return self.step >= self.cfg.steps

    def checkpoint_due(self, before: int) -> bool:
        return crossed(before, self.step, self.cfg.checkpoint_every)

    def on_start(self, logger) -> None:
        if self.step == 0 and self.cfg.grpo.eval_every and logger is not None:
            logger.log({"global_step": 0, "step": 0, **self.evaluate()})

    def run_iteration(self) -> dict:
        g = self.cfg.grpo
        row = self.train_step()
        self.warn_if_silent(row)
        if g.eval_every and (self.step % g.eval_every == 0 or self.step == self.cfg.steps):
            row.update(self.evaluate())
        return {"global_step": self.step, **row}

    def warn_if_silent(self, row: dict) -> None:
        """Once per run, one warning (on stderr, and in run.json's `warnings` for a later reader) when
        SILENT_STEPS steps in a row gave training nothing to act on, with the cause and the fix: no
        sampled answer stated its reflection in the task's format (a model never taught it: the
        verdict bonus is then 0, the pseudo-reward 0 on every episode), or every episode scored 0
        (the task's reward then moves no advantage). Rewards are in [0, 1]: a mean of 0 is every one 0."""
        if self.silence_warned:
            return
        unformatted = self.task.reflect != "none" and row.get("reflection_format_rate") == 0
        for cause, silent in (("format", unformatted), ("reward", row["reward"] == 0)):
            self.silent_steps[cause] = self.silent_steps[cause] + 1 if silent else 0
        window = min(SILENT_STEPS, self.cfg.steps)
        cause = next((c for c in ("format", "reward") if self.silent_steps[c] >= window), None)
        if cause is None:
            return
        self.silence_warned = True
        message = self._silence_message(cause, window)
        warnings.warn(message, stacklevel=2)
        if self.run is not None:
            self.run.add_warning(message)

    def _silence_message(self, cause: str, steps: int) -> str:
        cfg = self.cfg
        sft = (f"reflectrl llm sft --model {cfg.model} --task '{cfg.task}' --steps 300 --out DIR, "
               "then train from --model DIR")
        pseudo = cfg.grpo.pseudo_reward != "none"
        if cause == "format":
            users = [f"signal '{name}'" for name in parse_algo(cfg.algo, "llm").signals
                     if "reflect" in signal_spec(name).task_options]
            if pseudo:
                what = f"pseudo_reward={cfg.grpo.pseudo_reward} is 0 on every episode and nothing is learnt"
            elif users:
                what = f"{' and '.join(users)} {'has' if len(users) == 1 else 'have'} nothing to reward"
            else:
                what = "the reflection metrics measure nothing"
            return (f"for {steps} steps no sampled answer stated its reflection in the format of task "
                    f"'{cfg.task}' (reflection_format_rate 0), so {what}: the model has not learnt the format. "
                    f"SFT it on the task first: {sft}")
        if pseudo:  # the verdict is stated but never "solved": its calibration is what is missing
            fix = (f"the model never says 'solved'. Calibrate its verdict first (reflectrl llm train --algo "
                   f"grpo+verdict --task '{cfg.task}' --model {cfg.model} ...) and self-improve from that run's model")
        else:
            fix = f"the model solves none of its problems. SFT it on the task first ({sft}), or choose an easier task"
        return (f"for {steps} steps every sampled episode's reward was 0 on task '{cfg.task}', so the task gives "
                f"GRPO nothing to learn from (every group's rewards are equal): {fix}")

    def postfix(self, row: dict) -> str:
        post = f"reward={row['reward']:.3f}"
        if "eval_accuracy" in row:
            post += f" eval_acc={row['eval_accuracy']:.3f}"
        return post

    def train(self, progress: bool = True) -> None:
        train_loop(self, progress)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        return {
            "format": CHECKPOINT_FORMAT,
            "config": self.cfg.to_dict(),
            "step": self.step,
            "global_step": self.step,
            # the policy under the plain model's names (what `--model RUN` reads from an unfinished run)
            "model": merged_state_dict(self.model),
            # with LoRA, what resuming loads onto the base model: the adapters
            "adapters": None if not self.cfg.lora_rank else {
                name: p.detach().clone() for name, p in self.model.named_parameters() if p.requires_grad},
            "optimizer": self.optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": self.rng.getstate(),
            "signal": None if self.signal is None else self.signal.state_dict(),
            # the divergence signal's frozen teacher (teacher_refresh=K), where there is one
            "teacher": None if self.frozen_teacher is None else self.frozen_teacher.state_dict(),
            "teacher_step": self.teacher_step,
        }

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]
        if state.get("adapters") is not None:  # LoRA: the base is the starting model, unchanged
            unexpected = self.model.load_state_dict(state["adapters"], strict=False).unexpected_keys
            if unexpected:
                raise UserError(f"the checkpoint's LoRA adapters do not fit this model (no {unexpected[0]}); "
                                "was the model directory or lora_targets changed since the run started?")
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        self.rng.setstate(state["python_rng"])
        if self.signal is not None:
            self.signal.load_state_dict(state["signal"])
        if state.get("teacher") is not None:
            self.frozen_teacher = copy.deepcopy(self.model).requires_grad_(False)
            self.frozen_teacher.load_state_dict(state["teacher"])
            self.teacher_step = state["teacher_step"]

    def save_checkpoint(self) -> None:
        assert self.run is not None
        self.run.save_checkpoint(self.state_dict())

    def save_model(self, path) -> None:
        """The policy as an ordinary HF model directory (loadable with --model); with LoRA, the adapters
        merged into the weights (the trainer's model keeps them apart)."""
        if hasattr(self.model, "peft_config"):
            self.model.get_base_model().save_pretrained(path, state_dict=merged_state_dict(self.model))
        else:
            self.model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
