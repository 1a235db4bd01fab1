"""Supervised warm start on a task's demonstrations, so that RL has something to improve.

Each example is tokenised piece by piece exactly as an RL episode is laid out (prompt,
then each agent turn followed by eos, then the tool's reply; in chat form, for a model with a
chat template, as user and assistant turns: llm/chat.py), and the loss is the
cross-entropy of the agent's tokens only: the model learns to act, not to predict the
prompt or the tool. With a reflection after feedback (`code[reflect=...;reflect_after=feedback]`,
tasks/reflect.py) a demonstration is the body, the visible tests' output (context), then the
reflection turn; a negative one's wrong body is context too, so only its judgement is learned.

`reference_share` > 0 puts the task's reference (tasks/base.py's `reference_hint`) between
the prompt and the demonstration in that share of the examples, in context and not learned:
the model then learns to use a ground truth it is shown, as a pretrained model can. That is
what the divergence signal's teacher (the policy reading the reference) needs of a model
trained from scratch.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch

from reflectrl.errors import NonFiniteError, UserError
from reflectrl.llm import chat
from reflectrl.llm.tasks.base import Task, reference_hint, turn_pieces, turn_text
from reflectrl.runs.jsonfile import dumps
from reflectrl.runs.rundir import atomic_dir


def demonstration_tokens(tokenizer, task: Task, problem, hint: str | None = None) -> tuple[list[int], list[bool]]:
    """(token ids, agent mask) of a correct episode of `problem` (with `hint`, a reference the
    model reads after the prompt, in context only), laid out as the rollout lays out an episode
    (llm/chat.py: in chat form, the agent's turns are assistant turns and only they are learned)."""
    chat.speak(task, tokenizer)
    ids = chat.prompt_ids(tokenizer, task, problem, hint)
    agent = [False] * len(ids)
    turns: list[str] = []
    for turn in task.demonstration(problem):
        turns.append(turn_text(turn))
        for text, learned in turn_pieces(turn):  # a shown, unlearned wrong answer is context only
            piece = tokenizer.encode(text, add_special_tokens=False)
            ids += piece
            agent += [learned] * len(piece)
        ids.append(tokenizer.eos_token_id)
        agent.append(True)
        reply = task.respond(problem, turns)
        if reply is not None:
            reply_ids = chat.reply_ids(tokenizer, reply, ids)
            ids += reply_ids
            agent += [False] * len(reply_ids)
    return ids, agent


def sft(model, tokenizer, task: Task, *, steps: int, out: str | Path, batch_size: int = 32,
        learning_rate: float = 1e-3, seed: int = 0, progress: bool = True, reference_share: float = 0.0,
        reference: str = "solution", device: str = "cpu") -> dict:
    """Train on freshly sampled demonstrations for `steps` batches; write the model to `out`."""
    from reflectrl.runs.progress import progress_bar

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty; choose a new --out directory")
    if steps < 1 or batch_size < 1:
        raise UserError("--steps and --batch-size must be positive integers")
    if not (math.isfinite(learning_rate) and learning_rate > 0):
        raise UserError(f"--lr {learning_rate}: must be a finite number > 0")
    if not 0.0 <= reference_share <= 1.0:
        raise UserError(f"--reference-share {reference_share}: must be in [0, 1]")
    hints = random.Random(seed + 1)  # which examples read the reference; the problems' stream is unchanged
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / steps)
    model.train()
    log, start = [], time.perf_counter()
    bar = progress_bar(steps, "steps", enabled=progress)
    for step in range(steps):
        examples = []
        for _ in range(batch_size):
            problem = task.sample(rng)
            hint = (reference_hint(task, problem, reference)
                    if reference_share > 0 and hints.random() < reference_share else None)
            examples.append(demonstration_tokens(tokenizer, task, problem, hint))
        width = max(len(ids) for ids, _ in examples)
        ids = torch.full((batch_size, width), tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch_size, width), dtype=torch.long)
        labels = torch.full((batch_size, width), -100, dtype=torch.long)
        for i, (seq, agent) in enumerate(examples):
            ids[i, :len(seq)] = torch.tensor(seq)
            attention[i, :len(seq)] = 1
            labels[i, :len(seq)] = torch.where(torch.tensor(agent), torch.tensor(seq), -100)
        loss = model(input_ids=ids.to(device), attention_mask=attention.to(device), labels=labels.to(device),
                     use_cache=False).loss
        if not torch.isfinite(loss):
            raise NonFiniteError("loss", step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        log.append({"step": step + 1, "loss": loss.item()})
        bar.set_postfix_str(f"loss={loss.item():.3f}", refresh=False)
        bar.update(1)
    bar.close()
    with atomic_dir(out) as tmp:  # a crash leaves no half-written model at `out`
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "sft_log.jsonl").write_text("".join(dumps(row) + "\n" for row in log))  # strict: a NaN loss as "NaN"
    return {"steps": steps, "final_loss": log[-1]["loss"], "seconds": time.perf_counter() - start}
