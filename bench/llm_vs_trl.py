"""Completion tokens per second of one GRPO step: reflectrl's LLM GRPO trainer vs TRL's GRPOTrainer.

The same tiny model (`init_tiny`, then a short SFT on arith so that completions end with
eos instead of running to the limit), the same task (arith, exact match), the same batch
(`--prompts` prompts x `--group` completions, at most `--max-new-tokens` new tokens, sampled
at temperature 1 with no top-k/top-p), beta=0, num_iterations=1, loss_type=grpo,
scale_rewards=group, the same learning rate and gradient clip; ours with log_kl=False and
eval_every=0. A step is sampling + rewards + advantages + the update (TRL: from its
`on_step_begin` to its `on_step_end`, so TRL's logging is not counted, nor is ours).
Tokens are counted alike: completion tokens generated, up to and including eos. Each
trainer does `--warmup` untimed steps, then `--steps` timed ones; the trainers run
`--repeats` times, interleaved, and each one's best run counts (the machine may be shared,
so the least-disturbed run is the fairest). GEAR rows: the same
step with GEAR's per-token weights (ours: `--algo gear`; TRL: reflectrl's GEARGRPOTrainer),
i.e. what GEAR costs inside each trainer.

    OMP_NUM_THREADS=1 python bench/llm_vs_trl.py [--steps 20] [--repeats 3] [--threads 1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch


def make_model(workdir: Path, sft_steps: int, seed: int) -> Path:
    from reflectrl.llm.model import init_tiny, load_model
    from reflectrl.llm.sft import sft
    from reflectrl.llm.tasks import make_task

    path = init_tiny(workdir / "tiny", seed=seed)
    if sft_steps <= 0:
        return path
    model, tokenizer = load_model(str(path))
    t0 = time.perf_counter()
    info = sft(model, tokenizer, make_task("arith"), steps=sft_steps, out=workdir / "sft", seed=seed, progress=False)
    print(f"SFT: {sft_steps} steps in {time.perf_counter() - t0:.1f}s, final loss {info['final_loss']:.3f}", flush=True)
    return workdir / "sft"


def run_ours(path: Path, a, gear: bool) -> list[tuple[float, int]]:
    """(seconds, completion tokens) of each timed step."""
    from reflectrl.llm.model import load_model
    from reflectrl.signals.gear import GEARConfig
    from reflectrl.trainers.grpo.config import GRPOConfig, LLMRunConfig
    from reflectrl.trainers.grpo.trainer import GRPOTrainer

    model, tokenizer = load_model(str(path))
    cfg = LLMRunConfig(
        algo="gear" if gear else "grpo", task="arith", model=str(path), steps=a.warmup + a.steps, seed=a.seed,
        torch_threads=a.threads, sections={"gear": GEARConfig()} if gear else {},
        grpo=GRPOConfig(prompts_per_step=a.prompts, group_size=a.group, learning_rate=a.lr,
                        max_new_tokens=a.max_new_tokens, beta=0.0, num_iterations=1, minibatches=1, loss_type="grpo",
                        scale_rewards="group", temperature=1.0, top_p=1.0, max_grad_norm=1.0, log_kl=False,
                        eval_every=0))
    trainer = GRPOTrainer(cfg, model, tokenizer)
    out = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        row = trainer.train_step()
        seconds = time.perf_counter() - t0
        if i >= a.warmup:
            out.append((seconds, round(row["completion_length"] * a.prompts * a.group)))
    return out


def run_trl(path: Path, a, gear: bool, workdir: Path) -> list[tuple[float, int]]:
    from datasets import Dataset
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.llm.model import load_model
    from reflectrl.llm.tasks import make_task

    task, rng = make_task("arith"), random.Random(a.seed)
    dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer}
                                 for p in (task.sample(rng) for _ in range(a.prompts * (a.warmup + a.steps)))])

    def exact_match(completions, answer, **kwargs):
        return [float(c.strip() == x) for c, x in zip(completions, answer)]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds, self.tokens = [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:  # logging_steps=1: one per step
                self.tokens.append(round(logs["completions/mean_length"] * a.prompts * a.group))

    model, tokenizer = load_model(str(path))
    args = GRPOConfig(
        output_dir=str(workdir / ("trl-gear" if gear else "trl")), use_cpu=True, seed=a.seed,
        max_steps=a.warmup + a.steps, per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1,
        num_generations=a.group, max_completion_length=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, loss_type="grpo", scale_rewards="group", learning_rate=a.lr, max_grad_norm=1.0,
        weight_decay=0.0, logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True)
    timer = StepTimer()
    kwargs = dict(model=model, reward_funcs=exact_match, args=args, train_dataset=dataset, processing_class=tokenizer,
                  callbacks=[timer])
    if gear:
        from reflectrl.integrations.trl import GEARGRPOTrainer

        trainer = GEARGRPOTrainer(**kwargs)
    else:
        trainer = GRPOTrainer(**kwargs)
    trainer.remove_callback(PrinterCallback)  # the per-step log dicts
    trainer.train()
    torch.set_num_threads(a.threads)  # in case the trainer changed it
    return list(zip(timer.seconds, timer.tokens))[a.warmup:]


def summarise(name: str, steps: list[tuple[float, int]]) -> dict:
    seconds, tokens = sum(s for s, _ in steps), sum(t for _, t in steps)
    return dict(trainer=name, steps=len(steps), tokens=tokens, seconds=round(seconds, 3),
                tokens_per_second=round(tokens / seconds, 1),
                median_step_seconds=round(statistics.median(s for s, _ in steps), 4))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed GRPO steps per trainer and run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each trainer, interleaved; the best counts")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--sft-steps", type=int, default=300, help="SFT warm start of the tiny model (0: random)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-gear", action="store_true", help="skip the GEAR rows")
    parser.add_argument("--json", default=None, help="also write the results here")
    a = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames, on every TRL step
    torch.set_num_threads(a.threads)
    import transformers
    import trl

    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__} threads={torch.get_num_threads()} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} cpus), "
          f"transformers {transformers.__version__}, "
          f"trl {trl.__version__}, {platform.platform()}", flush=True)
    print(f"batch: {a.prompts} prompts x {a.group} completions, <= {a.max_new_tokens} new tokens; "
          f"{a.warmup} warm-up + {a.steps} timed steps each", flush=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = make_model(workdir, a.sft_steps, a.seed)
        runs = [("reflectrl grpo", lambda: run_ours(path, a, gear=False)),
                ("trl grpo", lambda: run_trl(path, a, gear=False, workdir=workdir))]
        if not a.no_gear:
            runs += [("reflectrl gear", lambda: run_ours(path, a, gear=True)),
                     ("trl + GEARGRPOTrainer", lambda: run_trl(path, a, gear=True, workdir=workdir))]
        best: dict[str, dict] = {}
        for repeat in range(a.repeats):
            for name, run in runs:
                r = summarise(name, run())
                print(f"  run {repeat + 1}: {name:24s} {r['tokens_per_second']:9.1f} tokens/s", flush=True)
                if name not in best or r["tokens_per_second"] > best[name]["tokens_per_second"]:
                    best[name] = r
    results = [best[name] for name, _ in runs]
    by = {r["trainer"]: r for r in results}

    print(f"\n{'trainer':24s} {'steps':>5s} {'tokens':>7s} {'seconds':>8s} {'tokens/s':>9s} {'median step s':>13s}")
    for r in results:
        print(f"{r['trainer']:24s} {r['steps']:5d} {r['tokens']:7d} {r['seconds']:8.2f} {r['tokens_per_second']:9.1f} "
              f"{r['median_step_seconds']:13.3f}")
    ratios = {"ours/trl (grpo)": by["reflectrl grpo"]["tokens_per_second"] / by["trl grpo"]["tokens_per_second"]}
    if not a.no_gear:
        ratios["ours/trl (gear)"] = (by["reflectrl gear"]["tokens_per_second"]
                                     / by["trl + GEARGRPOTrainer"]["tokens_per_second"])
        ratios["trl+gear / trl (GEAR overhead in TRL)"] = (by["trl + GEARGRPOTrainer"]["tokens_per_second"]
                                                           / by["trl grpo"]["tokens_per_second"])
        ratios["ours gear / ours grpo"] = (by["reflectrl gear"]["tokens_per_second"]
                                           / by["reflectrl grpo"]["tokens_per_second"])
    print()
    for name, value in ratios.items():
        print(f"{name:40s} {value:6.2f}x  (tokens/s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": platform.platform(), "torch": torch.__version__, "threads": a.threads,
                       "args": vars(a), "results": results, "ratios": {k: round(v, 3) for k, v in ratios.items()}},
                      f, indent=2)


if __name__ == "__main__":
    main()
