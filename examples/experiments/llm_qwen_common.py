"""What the Qwen-class TRL recipes share (examples/experiments/llm_qwen_calibration.py, examples/experiments/llm_gpu.py,
examples/experiments/llm_qwen_feedback.py): precision, one process per entry, multi-turn episodes in TRL.

Precision (issue 41): the policy is always loaded in fp32 and `--bf16` sets TRL's
`GRPOConfig(bf16=True)`, which in this TRL (>= 1.x, via transformers' Trainer and accelerate)
is *mixed* precision: the forward and backward passes run under `torch.autocast(bfloat16)`
while the weights and AdamW's states stay fp32 (the master copy). Loading the weights in bf16
instead (what the recipes did) makes AdamW step the bf16 weights themselves: at lr 1e-6 an
update is far below a bf16 weight's spacing (2^-8 of its magnitude) and rounds away, so almost
no weight moves (tests/test_llm_recipes.py measures both). TRL's generation is not under
autocast in this TRL, so `with_autocast_generation` puts it there (bf16 speed for sampling,
fp32 weights kept); the recipes' greedy evaluations use `autocast(device, bf16)`.

One process per entry: TRL's `use_vllm` colocate mode builds a vLLM engine inside each
GRPOTrainer and never frees it, so entries run in one process stack engines on one GPU.
`run_per_process` runs each entry in a child process of the same script (the engine, the
model and the CUDA context die with it) and gathers the children's JSON lines; the recipes do
this by default with `--vllm` (`--process-per-entry`).

Multi-turn tasks (a task that answers a turn, e.g. code[...;reflect_after=feedback] shows the
test results before the verdict): TRL's GRPOTrainer generates one completion per prompt, so
`EpisodeGRPOTrainer` gives it a `rollout_func` that plays the episode as reflectrl's protocol
does (llm/tasks/base.py: the model writes a turn, the task answers it, until it ends or
`max_turns`), the task's replies masked out of the loss (TRL's `env_mask`), and
`episode_rewards` score the whole episode (the verifier, and the verdict / confidence terms of
signals/verdict/torch.py and signals/confidence/torch.py, as integrations/rewards.py does for one turn).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

FEEDBACK_INSTRUCTIONS = {
    "verdict": "Write your answer. You will be shown how it did; then reply with only 'solved' or 'not solved'.",
    "confidence": "Write your answer. You will be shown how it did; then reply with only the probability from "
                  "0 to 1 that it is right, e.g. '0.7'.",
    "both": "Write your answer. You will be shown how it did; then reply with only 'solved' or 'not solved' "
            "and the probability from 0 to 1 that it is right, e.g. 'solved 0.8'.",
}


def fail(script: str, message: str, code: int = 2):
    """Exit with one line on stderr."""
    print(f"{script}: {message}", file=sys.stderr)
    sys.exit(code)


def run_and_write(script: str, run, json_path: str | None) -> list[dict]:
    """`run()`'s rows, a UserError as one line and exit 2, the rows as JSON lines where asked."""
    from reflectrl.errors import UserError

    try:
        rows = run()
    except UserError as err:
        fail(script, str(err).splitlines()[0])
    if json_path:
        Path(json_path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def resolve_device(name: str) -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name


def check_bf16(device: str) -> str | None:
    """Why bf16 autocast cannot run on `device` (None: it can)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        return f"--bf16: {torch.cuda.get_device_name()} has no bf16 support; leave --bf16 out (fp32)"
    return None


def load_policy(name: str, device: str):
    """(model, tokenizer): fp32 weights on `device` (the master copy; --bf16 is autocast, see above)."""
    import torch

    from reflectrl.llm.model import load_model

    model, tokenizer = load_model(name, dtype=torch.float32)
    return model.to(device), tokenizer


def precision_args(bf16: bool) -> dict:
    """GRPOConfig's precision keywords: TRL's `bf16` is mixed precision on fp32 weights. Both are
    given explicitly (TRL defaults bf16 to True when fp16 is not set)."""
    return {"bf16": bool(bf16), "fp16": False}


def autocast(device: str, bf16: bool):
    """bf16 autocast for the recipes' own forward passes (greedy evaluations, episodes)."""
    import torch

    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)


def with_autocast_generation(cls):
    """`cls` (a GRPOTrainer) whose own generation runs under the trainer's autocast (TRL's
    regular generation path does not; the weights stay fp32)."""

    class AutocastGeneration(cls):
        def _generate_single_turn(self, *args, **kwargs):
            with self.accelerator.autocast():
                return super()._generate_single_turn(*args, **kwargs)

    AutocastGeneration.__name__ = cls.__name__
    return AutocastGeneration


def changed_share(before: list, model) -> float:
    """The share of parameter elements of `model` that differ from the `before` snapshot."""
    import torch

    changed = total = 0
    for b, p in zip(before, model.parameters()):
        changed += int(torch.ne(b, p.detach().to(b.device)).sum())
        total += b.numel()
    return changed / max(total, 1)


# ---------------------------------------------------------------------------- one process per entry

def run_per_process(script: str, argv: list[str], entries: list[str], first_extra=(), rest_extra=()) -> list[dict]:
    """Run `script` once per entry (`argv` + `--entries ENTRY --process-per-entry off --json F`),
    each in its own process (its output goes straight to ours); returns the children's JSON rows
    in order. The first child also gets `first_extra`, the others `rest_extra`. A child that
    fails ends the run with one line naming the entry (its own error is above it)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="reflectrl-entry-") as tmp:
        for i, entry in enumerate(entries):
            out = Path(tmp) / f"{i}.jsonl"
            cmd = [sys.executable, script, *argv, "--entries", entry, "--process-per-entry", "off",
                   "--json", str(out), *(first_extra if i == 0 else rest_extra)]
            code = subprocess.run(cmd).returncode
            if code != 0:
                fail(Path(script).name, f"entry {entry} failed in its own process (exit status {code}); its error "
                                        "is above")
            rows += [json.loads(line) for line in out.read_text().splitlines()]
    return rows


def want_process_per_entry(option: str, vllm: bool, entries: list[str]) -> bool:
    return (option == "on" or (option == "auto" and vllm)) and len(entries) > 0


# ---------------------------------------------------------------------------- prompts

def instruction_for(task) -> str | None:
    """The sentence that tells an instruct model the reflection format (None: the task states none)."""
    from reflectrl.integrations.rewards import INSTRUCTIONS

    mode = getattr(task, "reflect", "none")
    if mode == "none":
        return None
    if getattr(task, "own_turn", False):  # reflect_after=feedback on code: the reflection is a turn of its own
        return FEEDBACK_INSTRUCTIONS[mode]
    return INSTRUCTIONS[mode]


def prompt_text(prompt: str, instruction: str | None, chat: bool, tokenizer) -> str:
    text = f"{instruction}\n{prompt}" if instruction else prompt
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def episode_rows(task, n: int, seed: int, instruction: str | None, chat: bool) -> tuple[list[dict], list]:
    """(rows {"prompt", "problem"}, the problems): `n` problems of the task drawn as
    rewards.task_dataset draws them; the `problem` column is the index into the problems."""
    rng = random.Random(seed)
    problems = [task.sample(rng) for _ in range(n)]
    rows = []
    for i, problem in enumerate(problems):
        p = f"{instruction}\n{problem.prompt}" if instruction else problem.prompt
        rows.append({"prompt": [{"role": "user", "content": p}] if chat else p, "problem": i})
    return rows, problems


# ---------------------------------------------------------------------------- episodes

def _reply_ids(tokenizer, chat: bool, messages: list[dict], turn: str, reply: str, ended: bool) -> list[int]:
    """The tokens between the model's turn (its eos included when `ended`) and its next turn."""
    eos = tokenizer.eos_token
    if not chat:  # reflectrl's protocol: turn + eos + reply
        text = reply if ended else eos + reply
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    after = messages + [{"role": "assistant", "content": turn}]
    a = tokenizer.apply_chat_template(after, tokenize=False)
    b = tokenizer.apply_chat_template(after + [{"role": "user", "content": reply}], tokenize=False,
                                      add_generation_prompt=True)
    cut = a.rfind(eos)
    tail = a[cut + len(eos):] if cut >= 0 else ""
    text = (tail if ended else eos + tail) + b[len(a):] if b.startswith(a) else (eos if not ended else "") + reply
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def play(model, tokenizer, task, problems: list, prompts: list, *, chat: bool, max_new_tokens: int,
         sample: bool, temperature: float = 1.0, batch: int = 32) -> list[dict]:
    """Play one episode per problem (prompts: the text or the chat messages of each), turn by turn
    in batches. Each episode: prompt_ids, completion_ids (the model's turns and the task's
    replies), env_mask (1: the model's tokens), logprobs (the sampled tokens', 0 for replies),
    turns (the model's turns as text)."""
    import torch

    from reflectrl.trainers.grpo.trainer import _left_pad as left_pad

    device = next(model.parameters()).device
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    eps = []
    for problem, prompt in zip(problems, prompts):
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
        text = (tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) if chat
                else (prompt if isinstance(prompt, str) else prompt[-1]["content"]))
        eps.append({"problem": problem, "messages": list(messages), "prompt_ids": tokenizer(text)["input_ids"],
                    "completion_ids": [], "env_mask": [], "logprobs": [], "turns": [], "done": False})
    for _ in range(max(task.max_turns, 1)):
        active = [e for e in eps if not e["done"]]
        if not active:
            break
        for start in range(0, len(active), batch):
            chunk = active[start:start + batch]
            ids, attn = left_pad([e["prompt_ids"] + e["completion_ids"] for e in chunk], pad_id)
            kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_id,
                          return_dict_in_generate=True, output_scores=sample)
            kwargs.update(dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sample
                          else dict(do_sample=False, temperature=None, top_k=None, top_p=None))
            with torch.no_grad():
                out = model.generate(input_ids=ids.to(device), attention_mask=attn.to(device), **kwargs)
            new = out.sequences[:, ids.shape[1]:]
            if sample:  # the sampled tokens' log-probabilities under the processed (temperature) logits
                logps = torch.stack([torch.log_softmax(s.float(), -1).gather(1, new[:, t:t + 1]).squeeze(1)
                                     for t, s in enumerate(out.scores)], 1).cpu()
            new = new.cpu()
            for i, e in enumerate(chunk):
                row = new[i].tolist()
                row = row[:row.index(eos_id) + 1] if eos_id in row else row
                turn = tokenizer.decode(row, skip_special_tokens=True).strip()
                e["completion_ids"] += row
                e["env_mask"] += [1] * len(row)
                e["logprobs"] += (logps[i, :len(row)].tolist() if sample
                                  else [0.0] * len(row))
                e["turns"].append(turn)
            replies = (task.respond_batch([e["problem"] for e in chunk], [e["turns"] for e in chunk])
                       if hasattr(task, "respond_batch") else [task.respond(e["problem"], e["turns"]) for e in chunk])
            for e, reply in zip(chunk, replies):
                turn, ended = e["turns"][-1], bool(e["completion_ids"]) and e["completion_ids"][-1] == eos_id
                if reply is None or len(e["turns"]) >= task.max_turns:
                    e["done"] = True
                    continue
                extra = _reply_ids(tokenizer, chat, e["messages"], turn, reply, ended)
                e["messages"] += [{"role": "assistant", "content": turn}, {"role": "user", "content": reply}]
                e["completion_ids"] += extra
                e["env_mask"] += [0] * len(extra)
                e["logprobs"] += [0.0] * len(extra)
    return eps


def episode_rewards(task, problems: list, signals=(), configs: dict | None = None) -> list:
    """[outcome, then verdict / confidence] reward functions over whole episodes: they read the
    `problem` column (an index into `problems`) and the `turns` that the rollout passes along
    (TRL's extra fields)."""
    from reflectrl.signals.base import scheduled
    from reflectrl.signals.confidence.torch import ConfidenceConfig, confidence_terms
    from reflectrl.signals.verdict.torch import VerdictConfig, verdict_terms

    configs = dict(configs or {})
    for name in signals:
        configs.setdefault(name, VerdictConfig() if name == "verdict" else ConfidenceConfig())
        configs[name].validate()
    cache: dict = {}

    def judge(turns, i):
        key = (int(i), tuple(turns))
        if key not in cache:
            if len(cache) > 4096:
                cache.clear()
            p = problems[int(i)]
            cache[key] = (task.score(p, list(turns)), task.reflections(p, list(turns)))
        return cache[key]

    def coef(config, state):
        step, total = (0, 1) if state is None else (state.global_step, state.max_steps)
        return scheduled(config.coef, config.schedule, config.until, step, total)

    def outcome(prompts, completions, problem=None, turns=None, **kwargs):
        return [judge(t, i)[0] for t, i in zip(turns, problem)]

    def verdict(prompts, completions, problem=None, turns=None, trainer_state=None, **kwargs):
        c = coef(configs["verdict"], trainer_state)
        return [sum(verdict_terms(r, float(s >= 1.0), c)[0]) for s, r in (judge(t, i) for t, i in zip(turns, problem))]

    def confidence(prompts, completions, problem=None, turns=None, trainer_state=None, **kwargs):
        cfg = configs["confidence"]
        c = coef(cfg, trainer_state)
        return [sum(confidence_terms(r, float(s >= 1.0), c, cfg)[0])
                for s, r in (judge(t, i) for t, i in zip(turns, problem))]

    chosen = {"verdict": verdict, "confidence": confidence}
    return [outcome] + [chosen[name] for name in signals]


def episode_trainer(task, problems: list, *, chat: bool, max_new_tokens: int, temperature: float, bf16: bool):
    """(a GRPOTrainer subclass, its rollout_func) that train on whole episodes of `task`;
    `problems[i]` is row i's problem."""
    from trl import GRPOTrainer
    from trl.models.utils import unwrap_model_for_generation

    base = with_autocast_generation(GRPOTrainer)

    class EpisodeGRPOTrainer(base):
        def _generate_and_score_completions(self, inputs):
            self._episode_inputs = inputs  # the rows of this batch, aligned with the prompts rollout_func gets
            return super()._generate_and_score_completions(inputs)

    def rollout(prompts, trainer):
        rows = trainer._episode_inputs
        if len(rows) != len(prompts):
            raise RuntimeError(f"episode rollout: {len(prompts)} prompts for {len(rows)} rows")
        device = str(trainer.accelerator.device)
        with (unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator,
                                          gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
              as model, autocast(device, bf16)):
            eps = play(model, trainer.processing_class, task, [problems[int(r["problem"])] for r in rows], prompts,
                       chat=chat, max_new_tokens=max_new_tokens, sample=True, temperature=temperature)
        return {"prompt_ids": [e["prompt_ids"] for e in eps], "completion_ids": [e["completion_ids"] for e in eps],
                "logprobs": [e["logprobs"] for e in eps], "env_mask": [e["env_mask"] for e in eps],
                "turns": [e["turns"] for e in eps]}

    return EpisodeGRPOTrainer, rollout
