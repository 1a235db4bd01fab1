"""LoRA sampling through merged weights against sampling through the adapters (lora_merged_sampling),
interleaved in one process so both see the same machine: seconds to generate one GRPO step's
completions (prompts x group, exactly --max-new-tokens each).

    python bench/llm_lora_sampling.py [--model smollm2-135m] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from reflectrl.errors import UserError
from reflectrl.llm.model import load_model
from reflectrl.trainers.grpo.config import GRPOConfig, LLMRunConfig
from reflectrl.trainers.grpo.trainer import GRPOTrainer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="a model directory or a packaged model's name")
    ap.add_argument("--lora", type=int, default=16, help="LoRA rank")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tokenizer = load_model(a.model)
    model.generation_config.min_new_tokens = a.max_new_tokens  # every completion the full length
    cfg = LLMRunConfig(algo="grpo", task="arith", model=a.model, steps=1, seed=1, torch_threads=a.threads,
                       lora_rank=a.lora, grpo=GRPOConfig(prompts_per_step=a.prompts, group_size=a.group,
                                                         max_new_tokens=a.max_new_tokens, eval_every=0, log_kl=False))
    trainer = GRPOTrainer(cfg, model, tokenizer)
    seconds = {True: [], False: []}
    for _ in range(a.repeats):
        for merged in (True, False):
            trainer.cfg.lora_merged_sampling = merged
            start = time.perf_counter()
            episodes = trainer.generate()
            seconds[merged].append(time.perf_counter() - start)
            print(f"lora_merged_sampling={str(merged).lower():5s} {seconds[merged][-1]:7.1f} s "
                  f"({int(episodes.agent.sum())} tokens; load {os.getloadavg()[0]:.1f})", flush=True)
    ratio = statistics.median(seconds[False]) / statistics.median(seconds[True])
    print(f"merged sampling: {ratio:.2f}x the speed of sampling through the adapters (medians)")


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        raise SystemExit(f"llm_lora_sampling.py: {str(err).splitlines()[0]}") from None
