"""The GRPO update alone, the chunked head's input as a strided view (the old path) against a
contiguous copy (today's), alternating on one batch of episodes in one process:

    python bench/llm_head_chunk.py --lora 16 --prompts 4 --threads 2 --repeats 4

With a frozen head (LoRA) torch runs the strided input as a batched product against the weight
broadcast per row; the copy makes it one product (docs/llm.md, "LoRA does not make the step faster
here"). Prints each update's seconds and the medians' ratio. Needs the packaged model
(`reflectrl llm model smollm2-135m`, or --model DIR)."""

import argparse
import statistics
import time

import torch

from reflectrl.llm.model import load_model
from reflectrl.trainers.base import Stopwatch
from reflectrl.trainers.grpo import trainer as T
from reflectrl.trainers.grpo.config import GRPOConfig, LLMRunConfig


def strided(head, hidden, targets, temperature):
    """_chunk_logprobs before the copy."""
    logits = head(hidden).float() / temperature
    return logits.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model directory or a packaged model's name")
    ap.add_argument("--lora", type=int, default=16, help="LoRA rank (0: full fine-tuning)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=4)
    a = ap.parse_args()
    model, tokenizer = load_model(a.model)
    cfg = LLMRunConfig(algo="grpo", task="arith", model=a.model, steps=1, seed=0, torch_threads=a.threads,
                       gradient_checkpointing=True, lora_rank=a.lora,
                       lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                       grpo=GRPOConfig(prompts_per_step=a.prompts, group_size=a.group, max_new_tokens=a.max_new_tokens,
                                       log_kl=False, eval_every=0))
    trainer = T.GRPOTrainer(cfg, model, tokenizer)
    model.generation_config.min_new_tokens = a.max_new_tokens
    episodes = trainer.generate()
    scored = trainer.score(episodes)
    print("batch", tuple(episodes.ids.shape), flush=True)
    ways = {"strided": strided, "contiguous": T._chunk_logprobs}
    seconds = {name: [] for name in ways}
    for r in range(a.repeats):
        for name in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            T._chunk_logprobs = ways[name]
            t = time.perf_counter()
            trainer.update(episodes, scored, Stopwatch())
            seconds[name].append(time.perf_counter() - t)
            print(f"{name:10s} {seconds[name][-1]:.2f} s", flush=True)
    old, new = (statistics.median(seconds[n]) for n in ways)
    print(f"lora {a.lora}: median update strided {old:.2f} s, contiguous {new:.2f} s, ratio {old / new:.3f}")


if __name__ == "__main__":
    main()
