"""GRPO vs GEAR vs divergence on a Qwen-class model through the TRL integration, on an accelerator:
completion tokens per second against TRL's own GRPOTrainer, and held-out accuracy over steps.

    # on a GPU machine whose HF cache holds the model (nothing is downloaded at run time there):
    python examples/experiments/llm_gpu.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --bf16 \\
        --task 'rg:chain_sum[min_terms=5;max_terms=8;max_digits=2;worked=true]' --steps 100 --json gpu.jsonl
    # add --vllm for TRL's vLLM generation (colocate mode; each entry then runs in its own process),
    # --gradient-checkpointing for memory
    # the same script on a CPU with the tiny model (a smoke run, not a measurement; tests/test_llm_recipes.py):
    python examples/experiments/llm_gpu.py --model DIR --device cpu --no-chat --steps 2 --eval-every 1 \\
        --eval-problems 8 --prompts 2 --group 4 --max-new-tokens 48

Entries (each from a fresh copy of the model, the same rows and seed):
- `grpo`: TRL's GRPOTrainer as is (the reference for tokens/s);
- `gear`: reflectrl.integrations.trl.GEARGRPOTrainer (seed 003's value head, default GEARConfig);
- `divergence`: reflectrl.integrations.trl.DivergenceGRPOTrainer (the GEAR paper's teacher segments;
  each row's reference is the task's worked solution, `task.reference(problem)`).
The reward is the task's verifier (reflectrl.integrations.rewards). Tokens/s = completion
tokens generated in training (TRL's logged mean completion length x completions per step,
summed) / training seconds; the ratio to grpo's is printed per entry. Accuracy: greedy, on a
held-out set, before training and every --eval-every steps. One JSON line per entry.

Precision: fp32 weights (the master copy) and, with --bf16, TRL's bf16 mixed precision
(autocast), generation and evaluation included; see examples/experiments/llm_qwen_common.py. With --vllm
(or --process-per-entry on) each entry runs in its own process: TRL's colocated vLLM engine
is never freed, and engines stacked on one GPU would skew the later entries' tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llm_qwen_common as common  # noqa: E402

ENTRIES = ("grpo", "gear", "divergence")
EVAL_SEED = 20261129
INSTRUCTION = "Work left to right, writing each partial result, then end with 'answer N'."


def held_out(spec: str, problems: int, chat: bool, tokenizer, instruction: str | None):
    from reflectrl.llm.tasks import make_task

    task, rng = make_task(spec), random.Random(EVAL_SEED)
    sample = [task.sample(rng) for _ in range(problems)]
    texts = [f"{instruction}\n{p.prompt}" if instruction else p.prompt for p in sample]
    if chat:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in texts]
    return task, sample, texts


def accuracy(model, tokenizer, task, sample, texts, max_new_tokens: int, device: str, bf16: bool = False) -> float:
    import torch

    correct = 0
    was_training = model.training
    model.eval()
    for start in range(0, len(texts), 32):
        batch = tokenizer(texts[start:start + 32], return_tensors="pt", padding=True).to(device)
        with torch.no_grad(), common.autocast(device, bf16):
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        for p, ids in zip(sample[start:start + 32], out[:, batch["input_ids"].shape[1]:]):
            correct += task.score(p, [tokenizer.decode(ids, skip_special_tokens=True).strip()]) >= 1.0
    model.train(was_training)
    return correct / len(texts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local model directory or a Hugging Face name (cached)")
    ap.add_argument("--task", default="rg:chain_sum[min_terms=5;max_terms=8;max_digits=2;worked=true]")
    ap.add_argument("--entries", default=",".join(ENTRIES), help=f"of {', '.join(ENTRIES)}")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--prompts", type=int, default=16, help="prompts per step")
    ap.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--eval-problems", type=int, default=256)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast on fp32 weights (TRL's bf16 mixed precision)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--vllm", action="store_true", help="generate with vLLM (TRL's use_vllm, colocate mode)")
    ap.add_argument("--process-per-entry", choices=("auto", "on", "off"), default="auto",
                    help="each entry in its own process (auto: with --vllm)")
    ap.add_argument("--no-chat", action="store_true", help="raw prompts (a model without a chat template)")
    ap.add_argument("--instruction", default=INSTRUCTION, help="a sentence before each prompt ('' for none)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="bench/results/llm-gpu")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    entries = a.entries.split(",")
    bad = [e for e in entries if e not in ENTRIES]
    if bad:
        common.fail("llm_gpu.py", f"--entries: unknown {bad}; use {', '.join(ENTRIES)}")
    from reflectrl.errors import UserError

    try:
        if common.want_process_per_entry(a.process_per_entry, a.vllm, entries):
            results = add_ratios(common.run_per_process(__file__, sys.argv[1:], entries))
        else:
            results = run(a, entries)
    except UserError as err:
        common.fail("llm_gpu.py", str(err).splitlines()[0])
    if a.json:
        Path(a.json).write_text("".join(json.dumps(r) + "\n" for r in results))


def add_ratios(rows: list[dict]) -> list[dict]:
    """Each row's tokens/s over grpo's (None without a grpo row)."""
    base = next((r["tokens_per_second"] for r in rows if r["entry"] == "grpo"), None)
    for r in rows:
        r["vs_trl_grpo"] = round(r["tokens_per_second"] / base, 3) if base else None
    return rows


def run(a, entries: list[str]) -> list[dict]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.integrations.rewards import task_dataset, task_rewards
    from reflectrl.integrations.trl import DivergenceGRPOTrainer, GEARGRPOTrainer

    device = common.resolve_device(a.device)
    if a.bf16 and (why := common.check_bf16(device)):
        common.fail("llm_gpu.py", why)
    chat = not a.no_chat
    instruction = a.instruction or None
    classes = {name: common.with_autocast_generation(cls) for name, cls in
               (("grpo", GRPOTrainer), ("gear", GEARGRPOTrainer), ("divergence", DivergenceGRPOTrainer))}
    n = a.steps * a.prompts
    rows = task_dataset(a.task, n, seed=a.seed, chat="raw" if chat else False, reference="solution",
                        instruction=instruction)
    results, base_rate = [], None

    class EvalEvery(TrainerCallback):
        def __init__(self, evaluate):
            self.evaluate, self.curve = evaluate, []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % a.eval_every == 0 or state.global_step == state.max_steps:
                self.curve.append((state.global_step, self.evaluate(model)))

    for entry in entries:
        model, tokenizer = common.load_policy(a.model, device)
        task, sample, texts = held_out(a.task, a.eval_problems, chat, tokenizer, instruction)
        evaluate = lambda m: accuracy(m, tokenizer, task, sample, texts, a.max_new_tokens, device, a.bf16)  # noqa: B023
        start_acc = evaluate(model)
        before = [p.detach().clone() for p in model.parameters()]
        args = GRPOConfig(
            output_dir=str(Path(a.out) / entry), use_cpu=device == "cpu", seed=a.seed, **common.precision_args(a.bf16),
            gradient_checkpointing=a.gradient_checkpointing, max_steps=a.steps,
            per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
            max_completion_length=a.max_new_tokens, learning_rate=a.lr, beta=0.0, temperature=1.0,
            use_vllm=a.vllm, **({"vllm_mode": "colocate"} if a.vllm else {}),
            logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True)
        trainer = classes[entry](model=model, processing_class=tokenizer, args=args,
                                 train_dataset=Dataset.from_list(rows), reward_funcs=task_rewards(a.task, n=n,
                                                                                                  seed=a.seed))
        callback = EvalEvery(evaluate)
        trainer.add_callback(callback)
        t0 = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - t0
        logs = [r for r in trainer.state.log_history if "completions/mean_length" in r]
        tokens = sum(r["completions/mean_length"] for r in logs) * a.prompts * a.group
        rate = tokens / seconds
        base_rate = rate if entry == "grpo" else base_rate
        row = {"entry": entry, "model": a.model, "task": a.task, "device": device, "bf16": a.bf16, "vllm": a.vllm,
               "process": os.getpid(), "weights_changed": round(common.changed_share(before, trainer.model), 6),
               "steps": a.steps, "train_seconds": round(seconds, 1), "tokens_per_second": round(rate, 1),
               "vs_trl_grpo": round(rate / base_rate, 3) if base_rate else None,
               "accuracy_start": start_acc, "accuracy_curve": callback.curve,
               "mean_completion_length": sum(r["completions/mean_length"] for r in logs) / max(len(logs), 1)}
        for key in ("divergence/segments_per_completion", "divergence/departure_token_share",
                    "divergence/teacher_seconds", "gear/weights_std"):
            values = [r[key] for r in trainer.state.log_history if key in r]
            if values:
                row[key] = sum(values) / len(values)
        print(json.dumps(row), flush=True)
        results.append(row)
        del trainer, model, before
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return results


if __name__ == "__main__":
    main()
