"""The calibrated-agent recipe on a real small instruct model through TRL's GRPOTrainer:
grpo vs grpo+verdict vs grpo+confidence, held-out accuracy and calibration before and after.

    # on an accelerator (a Qwen2.5-0.5B/1.5B-class model must be in the local HF cache or downloadable):
    python bench/llm_qwen_calibration.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --bf16 \
        --task 'arith[max_operand=999;ops=+-*;reflect=both]' --steps 200 --entries grpo,verdict,confidence
    # the same script on a CPU with the tiny model (what the tests run):
    python bench/llm_qwen_calibration.py --model DIR --no-chat --steps 2 --eval-problems 8 --entries verdict

For each entry: a fresh copy of the model, TRL's GRPOTrainer with reflectrl's reward
functions (reflectrl/integrations/rewards.py: the task's verifier, plus the paper's verdict
bonus or RLCR's Brier score, summed and group-normalised by TRL), then a greedy evaluation on
held-out problems with reflectrl's calibration metrics (llm/calibration.py: accuracy,
reflection accuracy, under/over-confidence, ECE, Brier, AUROC, selective AUC). The prompts
carry one sentence describing the reflection format (an instruct model was never SFT'd on
it) and go through the model's chat template unless --no-chat. Prints one JSON line per
entry (and the base model's) and writes them to --json.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

ENTRIES = {"grpo": [], "verdict": ["verdict"], "confidence": ["confidence"]}
EVAL_SEED = 20261129


def evaluate(model, tokenizer, spec: str, problems: int, chat: bool, max_new_tokens: int, device: str,
             instruct: bool = True) -> dict:
    import torch

    from reflectrl.integrations.rewards import INSTRUCTIONS
    from reflectrl.llm.calibration import calibration_metrics, scalar_metrics
    from reflectrl.llm.tasks import make_task

    task, rng = make_task(spec), random.Random(EVAL_SEED)
    sample = [task.sample(rng) for _ in range(problems)]
    texts = [f"{INSTRUCTIONS[task.reflect]}\n{p.prompt}" if instruct else p.prompt for p in sample]
    if chat:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in texts]
    correct, reflections = [], []
    model.eval()
    for start in range(0, len(texts), 32):
        batch = tokenizer(texts[start:start + 32], return_tensors="pt", padding=True).to(device)
        with torch.no_grad():
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for p, ids in zip(sample[start:start + 32], out[:, batch["input_ids"].shape[1]:]):
            turn = tokenizer.decode(ids, skip_special_tokens=True).strip()
            correct.append(task.score(p, [turn]) >= 1.0)
            reflections.append(task.reflections(p, [turn])[-1][-1])
    return scalar_metrics(calibration_metrics(correct, reflections))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model directory or a Hugging Face name")
    ap.add_argument("--task", default="arith[max_operand=999;ops=+-*;reflect=both]")
    ap.add_argument("--entries", default="grpo,verdict,confidence", help=f"of {', '.join(ENTRIES)}")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--eval-problems", type=int, default=256)
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--vllm", action="store_true", help="generate with vLLM (TRL's use_vllm, colocate mode)")
    ap.add_argument("--no-chat", action="store_true", help="raw prompts (a model without a chat template)")
    ap.add_argument("--no-instruct", action="store_true",
                    help="no format sentence in the prompts (a model SFT'd on the format by reflectrl llm sft)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench/results/llm-qwen")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.integrations.rewards import task_dataset, task_rewards
    from reflectrl.llm.model import load_model

    device = ("cuda" if torch.cuda.is_available() else "cpu") if a.device == "auto" else a.device
    chat = not a.no_chat
    dtype = torch.bfloat16 if a.bf16 else None
    results = []

    def fresh():
        model, tokenizer = load_model(a.model, **({"dtype": dtype} if dtype is not None else {}))
        return model.to(device), tokenizer

    model, tokenizer = fresh()
    base = {"entry": "base", "model": a.model, "task": a.task, "device": device,
            **evaluate(model, tokenizer, a.task, a.eval_problems, chat, a.max_new_tokens, device, not a.no_instruct)}
    print(json.dumps(base), flush=True)
    results.append(base)
    n = a.steps * a.prompts
    rows = task_dataset(a.task, n, seed=a.seed, instruct=not a.no_instruct, chat=chat)
    for entry in a.entries.split(","):
        model, tokenizer = fresh()
        args = GRPOConfig(
            output_dir=str(Path(a.out) / entry), use_cpu=device == "cpu", seed=a.seed, bf16=a.bf16,
            max_steps=a.steps, per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
            max_completion_length=a.max_new_tokens, learning_rate=a.lr, beta=0.0, temperature=1.0,
            use_vllm=a.vllm, **({"vllm_mode": "colocate"} if a.vllm else {}),
            logging_steps=10, report_to=[], save_strategy="no", disable_tqdm=True)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                              train_dataset=Dataset.from_list(rows),
                              reward_funcs=task_rewards(a.task, ENTRIES[entry], n=n, seed=a.seed))
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        row = {"entry": entry, "model": a.model, "task": a.task, "device": device, "steps": a.steps,
               "train_seconds": round(seconds, 1),
               **evaluate(trainer.model, tokenizer, a.task, a.eval_problems, chat, a.max_new_tokens, device,
                          not a.no_instruct)}
        print(json.dumps(row), flush=True)
        results.append(row)
    if a.json:
        Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in results))


if __name__ == "__main__":
    main()
