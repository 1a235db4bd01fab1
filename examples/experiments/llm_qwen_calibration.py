"""The calibrated-agent recipe on a real small instruct model through TRL's GRPOTrainer:
grpo vs grpo+verdict vs grpo+confidence, held-out accuracy and calibration before and after.

    # on an accelerator (a Qwen2.5-0.5B/1.5B-class model must be in the local HF cache or downloadable):
    python examples/experiments/llm_qwen_calibration.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --bf16 \\
        --task 'arith[max_operand=999;ops=+-*;reflect=both]' --steps 200 --entries grpo,verdict,confidence
    # the same script on a CPU with the tiny model (tests/test_llm_recipes.py runs it):
    python examples/experiments/llm_qwen_calibration.py --model DIR --device cpu --no-chat --steps 2 --eval-problems 8

For each entry: a fresh copy of the model, TRL's GRPOTrainer with reflectrl's reward
functions (reflectrl/integrations/rewards.py: the task's verifier, plus the paper's verdict
bonus or RLCR's Brier score, summed and group-normalised by TRL), then a greedy evaluation on
held-out problems with reflectrl's calibration metrics (llm/calibration.py: accuracy,
reflection accuracy, under/over-confidence, ECE, Brier, AUROC, selective AUC). The prompts
carry one sentence describing the reflection format (an instruct model was never SFT'd on
it) and go through the model's chat template unless --no-chat. A task whose environment
answers the agent (code, tools, rag; e.g. `code[reflect=verdict;reflect_after=feedback]`,
the reflection stated after the test results) is played as a whole episode per completion
(examples/experiments/llm_qwen_common.py: TRL's rollout_func, the task's replies masked out of the loss).
Prints one JSON line per entry (and the base model's) and writes them to --json.

Precision: fp32 weights (the master copy) and, with --bf16, TRL's bf16 mixed precision
(autocast); see examples/experiments/llm_qwen_common.py. --vllm runs each entry in its own process (TRL's
colocated vLLM engine is never freed), as does --process-per-entry on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_qwen_common as common  # noqa: E402

ENTRIES = {"grpo": [], "verdict": ["verdict"], "confidence": ["confidence"]}
EVAL_SEED = 20261129
SCRIPT = "llm_qwen_calibration.py"


def evaluate(model, tokenizer, task, problems: int, chat: bool, max_new_tokens: int, device: str,
             instruction: str | None, bf16: bool = False) -> dict:
    """Accuracy and calibration of greedy episodes on `problems` held-out problems."""
    import random

    from reflectrl.llm.calibration import calibration_metrics, scalar_metrics

    rng = random.Random(EVAL_SEED)
    sample = [task.sample(rng) for _ in range(problems)]
    prompts = [f"{instruction}\n{p.prompt}" if instruction else p.prompt for p in sample]
    was_training = model.training
    model.eval()
    with common.autocast(device, bf16):
        episodes = common.play(model, tokenizer, task, sample, prompts, chat=chat, max_new_tokens=max_new_tokens,
                               sample=False)
    model.train(was_training)
    correct, reflections = [], []
    for p, e in zip(sample, episodes):
        correct.append(task.score(p, e["turns"]) >= 1.0)
        stated = [r for turn in task.reflections(p, e["turns"]) for r in turn]
        reflections.append(stated[-1] if stated else None)
    return scalar_metrics(calibration_metrics(correct, reflections))


def build_parser(description: str, task: str, entries: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", required=True, help="a local model directory or a Hugging Face name")
    ap.add_argument("--task", default=task, help="a reflectrl task string with reflect=verdict|confidence|both")
    ap.add_argument("--entries", default=entries, help=f"of {', '.join(ENTRIES)}")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--max-new-tokens", type=int, default=32, help="per agent turn")
    ap.add_argument("--eval-problems", type=int, default=256)
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast on fp32 weights (TRL's bf16 mixed precision)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--vllm", action="store_true", help="generate with vLLM (TRL's use_vllm, colocate mode)")
    ap.add_argument("--process-per-entry", choices=("auto", "on", "off"), default="auto",
                    help="each entry in its own process (auto: with --vllm)")
    ap.add_argument("--no-base", action="store_true", help="skip the base model's evaluation")
    ap.add_argument("--no-chat", action="store_true", help="raw prompts (a model without a chat template)")
    ap.add_argument("--no-instruct", action="store_true",
                    help="no format sentence in the prompts (a model SFT'd on the format by reflectrl llm sft)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench/results/llm-qwen")
    ap.add_argument("--json", default=None)
    return ap


def check(a, script: str):
    """The task (made) and the entries, or one line and exit."""
    from reflectrl.errors import UserError
    from reflectrl.llm.tasks import make_task

    entries = a.entries.split(",")
    bad = [e for e in entries if e not in ENTRIES]
    if bad:
        common.fail(script, f"--entries: unknown {bad}; use {', '.join(ENTRIES)}")
    try:
        task = make_task(a.task)
    except UserError as err:
        common.fail(script, f"--task {a.task}: {err}")
    if task.reflect == "none":
        # DECISION: a clear line, not a default instruction: the recipe measures calibration,
        # which a task that states no reflection has none of
        common.fail(script, f"--task {a.task} states no reflection; this recipe measures calibration: "
                            "add reflect=verdict, confidence or both, e.g. 'arith[reflect=both]'")
    if a.vllm and task.max_turns > 1:
        common.fail(script, f"--vllm: {a.task} is multi-turn ({task.max_turns} turns, played by the recipe's own "
                            "rollout with the training model); leave --vllm out")
    for e in entries:
        for signal in ENTRIES[e]:
            from reflectrl.llm.tasks.reflect import wants

            if not wants(task.reflect)[0 if signal == "verdict" else 1]:
                common.fail(script, f"entry {e} needs the task to state a {signal}; use reflect=both in {a.task!r}")
    return task, entries


def run(a, script: str = SCRIPT, path: str = __file__) -> list[dict]:
    task, entries = check(a, script)
    if common.want_process_per_entry(a.process_per_entry, a.vllm, entries):
        argv = [x for x in sys.argv[1:]]
        return common.run_per_process(path, argv, entries, rest_extra=("--no-base",))

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.integrations.rewards import task_dataset, task_rewards

    device = common.resolve_device(a.device)
    if a.bf16 and (why := common.check_bf16(device)):
        common.fail(script, why)
    chat = not a.no_chat
    instruction = None if a.no_instruct else common.instruction_for(task)
    results = []

    def row(entry: str, model, tokenizer, **extra) -> dict:
        r = {"entry": entry, "model": a.model, "task": a.task, "device": device, "bf16": a.bf16, "vllm": a.vllm,
             "process": os.getpid(), **extra,
             **evaluate(model, tokenizer, task, a.eval_problems, chat, a.max_new_tokens, device, instruction, a.bf16)}
        print(json.dumps(r), flush=True)
        results.append(r)
        return r

    if not a.no_base:
        model, tokenizer = common.load_policy(a.model, device)
        row("base", model, tokenizer)
        del model
    n = a.steps * a.prompts
    episodes = task.max_turns > 1
    if episodes:
        rows, problems = common.episode_rows(task, n, a.seed, instruction, chat)
    else:
        rows = task_dataset(a.task, n, seed=a.seed, chat="raw" if chat else False, instruction=instruction)
    for entry in entries:
        model, tokenizer = common.load_policy(a.model, device)
        before = [p.detach().clone() for p in model.parameters()]
        args = GRPOConfig(
            output_dir=str(Path(a.out) / entry), use_cpu=device == "cpu", seed=a.seed, **common.precision_args(a.bf16),
            gradient_checkpointing=a.gradient_checkpointing,
            max_steps=a.steps, per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
            max_completion_length=a.max_new_tokens * task.max_turns + (64 if episodes else 0),
            learning_rate=a.lr, beta=0.0, temperature=1.0,
            use_vllm=a.vllm, **({"vllm_mode": "colocate"} if a.vllm else {}),
            logging_steps=10, report_to=[], save_strategy="no", disable_tqdm=True)
        if episodes:
            cls, rollout = common.episode_trainer(task, problems, chat=chat, max_new_tokens=a.max_new_tokens,
                                                  temperature=1.0, bf16=a.bf16)
            trainer = cls(model=model, processing_class=tokenizer, args=args, train_dataset=Dataset.from_list(rows),
                          reward_funcs=common.episode_rewards(task, problems, ENTRIES[entry]), rollout_func=rollout)
        else:
            trainer = common.with_autocast_generation(GRPOTrainer)(
                model=model, processing_class=tokenizer, args=args, train_dataset=Dataset.from_list(rows),
                reward_funcs=task_rewards(a.task, ENTRIES[entry], n=n, seed=a.seed))
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        row(entry, trainer.model, tokenizer, steps=a.steps, train_seconds=round(seconds, 1),
            weights_changed=round(common.changed_share(before, trainer.model), 6),
            weight_dtype=str(next(trainer.model.parameters()).dtype).replace("torch.", ""))
        del trainer, model, before
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return results


def main(argv=None) -> None:
    a = build_parser(__doc__.splitlines()[0], "arith[max_operand=999;ops=+-*;reflect=both]",
                     "grpo,verdict,confidence").parse_args(argv)
    common.run_and_write(SCRIPT, lambda: run(a), a.json)


if __name__ == "__main__":
    main()
