"""One GRPO step, reflectrl's LLM GRPO trainer vs TRL's GRPOTrainer: completion tokens per second,
seconds per step and peak resident memory, side by side.

The same model, the same task (arith, exact match), the same batch (`--prompts` prompts x
`--group` completions, at most `--max-new-tokens` new tokens, sampled at temperature 1 with no
top-k/top-p), beta=0, num_iterations=1, loss_type=grpo, scale_rewards=group, the same learning
rate and gradient clip; ours with log_kl=False and eval_every=0 (TRL computes no KL at beta=0).
A step is sampling + rewards + advantages + the update (TRL: from its `on_step_begin` to its
`on_step_end`, so TRL's logging is not counted, nor is ours). Tokens are counted alike:
completion tokens generated, up to and including eos. Each side runs in its own subprocess, so
the peak resident memory it reports (getrusage's ru_maxrss at its end) is its own; each does
`--warmup` untimed steps, then `--steps` timed ones; the sides run `--repeats` times,
interleaved, and each one's best run counts (the machine may be shared, so the least-disturbed
run is the fairest). Generation and update seconds are split out: ours from its logged row,
TRL's by timing its `_generate_and_score_completions`.

Two models:
- default: the tiny model (`init_tiny`, then a short SFT on arith so that completions end with
  eos instead of running to the limit); GEAR rows: the same step with GEAR's per-token weights
  (ours: `--algo gear`; TRL: reflectrl's GEARGRPOTrainer), i.e. what GEAR costs inside each trainer.
- `--model DIR`: any HF model directory (e.g. SmolLM2-135M-Instruct), 4 prompts x 8 completions of
  128 tokens by default, every completion run to exactly `--max-new-tokens` on both sides
  (min_new_tokens: eos is suppressed until then; `--natural-length` to let eos end them), no GEAR
  rows unless `--gear`. `--lora RANK`, `--gradient-checkpointing` and `--precision bf16` apply to both
  sides (TRL: peft_config, gradient_checkpointing, bf16 autocast); `--logprob-chunk` is ours only.

    OMP_NUM_THREADS=1 python bench/llm_vs_trl.py [--steps 20] [--repeats 3] [--threads 1] [--json FILE]
    python bench/llm_vs_trl.py --model DIR --threads 2 [--lora 16] [--gradient-checkpointing] [--precision bf16]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


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


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def run_ours(path: Path, a, gear: bool) -> list[dict]:
    """Each timed step's seconds, completion tokens, generation and update seconds."""
    from reflectrl.llm.model import load_model
    from reflectrl.signals.gear import GEARConfig
    from reflectrl.trainers.grpo.config import GRPOConfig, LLMRunConfig
    from reflectrl.trainers.grpo.trainer import GRPOTrainer

    model, tokenizer = load_model(str(path))
    if a.full_length:
        model.generation_config.min_new_tokens = a.max_new_tokens
    cfg = LLMRunConfig(
        algo="gear" if gear else "grpo", task="arith", model=str(path), steps=a.warmup + a.steps, seed=a.seed,
        torch_threads=a.threads, sections={"gear": GEARConfig()} if gear else {}, precision=a.precision,
        gradient_checkpointing=a.gradient_checkpointing, lora_rank=a.lora, lora_targets=LORA_TARGETS,
        grpo=GRPOConfig(prompts_per_step=a.prompts, group_size=a.group, learning_rate=a.lr,
                        max_new_tokens=a.max_new_tokens, beta=0.0, num_iterations=1, minibatches=1, loss_type="grpo",
                        scale_rewards="group", temperature=1.0, top_p=1.0, max_grad_norm=1.0, log_kl=False,
                        eval_every=0))
    if a.logprob_chunk is not None:
        cfg.logprob_chunk = a.logprob_chunk
    trainer = GRPOTrainer(cfg, model, tokenizer)
    out = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        row = trainer.train_step()
        seconds = time.perf_counter() - t0
        if i >= a.warmup:
            out.append(dict(seconds=seconds, tokens=round(row["completion_length"] * a.prompts * a.group),
                            generation=row["generation_seconds"], update=row["update_seconds"]))
    return out


def run_trl(path: Path, a, gear: bool, workdir: Path) -> list[dict]:
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from reflectrl.integrations.rewards import task_dataset, task_rewards
    from reflectrl.llm import chat
    from reflectrl.llm.model import load_model

    # the prompts ours sends: a chat model's tokenizer gets the task's instruction as a user turn (TRL applies
    # the same chat template with its generation prompt), the tiny model the raw prompt; scored as ours scores
    in_chat = chat.has_chat(AutoTokenizer.from_pretrained(str(path)))
    n = a.prompts * (a.warmup + a.steps)
    dataset = Dataset.from_list(task_dataset("arith", n, seed=a.seed, chat=in_chat))
    exact_match = task_rewards("arith", n=n, seed=a.seed, chat=in_chat)[0]

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.seconds, self.tokens, self.generation = [], [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:  # logging_steps=1: one per step
                self.tokens.append(round(logs["completions/mean_length"] * a.prompts * a.group))

    timer = StepTimer()
    base = GRPOTrainer
    if gear:
        from reflectrl.integrations.trl import GEARGRPOTrainer

        base = GEARGRPOTrainer

    class Timed(base):
        def _generate_and_score_completions(self, *args, **kwargs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(*args, **kwargs)
            timer.generation.append(time.perf_counter() - t0)
            return out

    model, tokenizer = load_model(str(path))
    args = GRPOConfig(
        output_dir=str(workdir / ("trl-gear" if gear else "trl")), use_cpu=True, seed=a.seed,
        max_steps=a.warmup + a.steps, per_device_train_batch_size=a.prompts * a.group, gradient_accumulation_steps=1,
        num_generations=a.group, max_completion_length=a.max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, loss_type="grpo", scale_rewards="group", learning_rate=a.lr, max_grad_norm=1.0,
        weight_decay=0.0, logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True,
        bf16=a.precision == "bf16", gradient_checkpointing=a.gradient_checkpointing,
        generation_kwargs={"min_new_tokens": a.max_new_tokens} if a.full_length else None)
    kwargs = dict(model=model, reward_funcs=exact_match, args=args, train_dataset=dataset, processing_class=tokenizer,
                  callbacks=[timer])
    if a.lora:
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=a.lora, lora_alpha=16.0, lora_dropout=0.0,
                                           target_modules=LORA_TARGETS.split(","), bias="none", task_type="CAUSAL_LM")
    trainer = Timed(**kwargs)
    trainer.remove_callback(PrinterCallback)  # the per-step log dicts
    trainer.train()
    torch.set_num_threads(a.threads)  # in case the trainer changed it
    rows = [dict(seconds=s, tokens=t, generation=g, update=s - g)
            for s, t, g in zip(timer.seconds, timer.tokens, timer.generation)]
    return rows[a.warmup:]


def summarise(name: str, steps: list[dict], peak: float) -> dict:
    seconds, tokens = sum(s["seconds"] for s in steps), sum(s["tokens"] for s in steps)

    def median(key):
        return round(statistics.median(s[key] for s in steps), 3)

    return dict(trainer=name, steps=len(steps), tokens=tokens, seconds=round(seconds, 3),
                tokens_per_second=round(tokens / seconds, 1), median_step_seconds=median("seconds"),
                median_generation_seconds=median("generation"), median_update_seconds=median("update"),
                peak_memory_gb=round(peak, 2))


def worker(a) -> None:
    """One side in this process: its summary, with this process's peak memory, to `--result`."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames, on every TRL step
    torch.set_num_threads(a.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    path, gear = Path(a.path), a.side.endswith("-gear")
    if a.side.startswith("ours"):
        steps = run_ours(path, a, gear)
    else:
        steps = run_trl(path, a, gear, Path(a.result).parent)
    Path(a.result).write_text(json.dumps(dict(steps=steps, peak_gb=peak_gb())))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="an HF model directory (default: the tiny model, SFT'd)")
    parser.add_argument("--steps", type=int, default=None, help="timed GRPO steps per trainer and run (20; --model: 2)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (2; --model: 1)")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each side, interleaved; the best counts "
                        "(3; --model: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per step (8; --model: 4)")
    parser.add_argument("--group", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="(8; --model: 128)")
    parser.add_argument("--natural-length", action="store_true", help="--model: let eos end a completion early")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--lora", type=int, default=0, help="LoRA rank on both sides (0: full fine-tuning)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="on both sides")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"), help="bf16: autocast, both sides")
    parser.add_argument("--logprob-chunk", type=int, default=None, help="ours: logprob_chunk (default: its default)")
    parser.add_argument("--sft-steps", type=int, default=300, help="SFT warm start of the tiny model (0: random)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-gear", action="store_true", help="skip the GEAR rows (the default with --model)")
    parser.add_argument("--gear", action="store_true", help="--model: the GEAR rows too")
    parser.add_argument("--only", choices=("ours", "trl"), default=None, help="run one side only")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--side", default=None, help=argparse.SUPPRESS)    # a worker subprocess: which side
    parser.add_argument("--path", default=None, help=argparse.SUPPRESS)    # its model directory
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)  # where it writes its summary
    a = parser.parse_args()
    big = a.model is not None
    for name, tiny, model in (("steps", 20, 2), ("warmup", 2, 1), ("repeats", 3, 1), ("prompts", 8, 4),
                              ("max_new_tokens", 8, 128)):
        if getattr(a, name) is None:
            setattr(a, name, model if big else tiny)
    a.full_length = big and not a.natural_length
    with_gear = a.gear if big else not a.no_gear
    if a.side:
        return worker(a)

    torch.set_num_threads(a.threads)
    import transformers
    import trl

    print(f"torch {torch.__version__} threads={torch.get_num_threads()} (OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, {os.cpu_count()} cpus), "
          f"transformers {transformers.__version__}, "
          f"trl {trl.__version__}, {platform.platform()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    print(f"model: {a.model or 'tiny (init_tiny + SFT)'}; batch: {a.prompts} prompts x {a.group} completions, "
          f"{'exactly' if a.full_length else '<='} {a.max_new_tokens} new tokens; {a.precision}"
          f"{f', LoRA rank {a.lora}' if a.lora else ', full fine-tuning'}"
          f"{', gradient checkpointing' if a.gradient_checkpointing else ''}; "
          f"{a.warmup} warm-up + {a.steps} timed steps each", flush=True)
    sides = [("reflectrl grpo", "ours"), ("trl grpo", "trl")]
    if with_gear:
        sides += [("reflectrl gear", "ours-gear"), ("trl + GEARGRPOTrainer", "trl-gear")]
    if a.only:
        sides = [(name, side) for name, side in sides if side.startswith(a.only)]
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        path = Path(a.model) if big else make_model(workdir, a.sft_steps, a.seed)
        for repeat in range(a.repeats):
            for name, side in sides:
                result = workdir / f"{side}.json"
                argv = [sys.executable, __file__, *sys.argv[1:], "--side", side, "--path", str(path),
                        "--result", str(result)]
                subprocess.run(argv, check=True)
                out = json.loads(result.read_text())
                r = summarise(name, out["steps"], out["peak_gb"])
                print(f"  run {repeat + 1}: {name:24s} {r['tokens_per_second']:9.1f} tokens/s, "
                      f"{r['median_step_seconds']:.2f} s/step, peak {r['peak_memory_gb']:.2f} GB "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
                if name not in best or r["tokens_per_second"] > best[name]["tokens_per_second"]:
                    best[name] = r
    results = [best[name] for name, _ in sides]
    by = {r["trainer"]: r for r in results}

    print(f"\n{'trainer':24s} {'steps':>5s} {'tokens':>7s} {'tokens/s':>9s} {'step s':>7s} {'gen s':>7s} "
          f"{'update s':>8s} {'peak GB':>7s}")
    for r in results:
        print(f"{r['trainer']:24s} {r['steps']:5d} {r['tokens']:7d} {r['tokens_per_second']:9.1f} "
              f"{r['median_step_seconds']:7.2f} {r['median_generation_seconds']:7.2f} "
              f"{r['median_update_seconds']:8.2f} {r['peak_memory_gb']:7.2f}")
    ratios = {}
    pairs = [("grpo", "reflectrl grpo", "trl grpo"), ("gear", "reflectrl gear", "trl + GEARGRPOTrainer")]
    for label, ours, theirs in pairs:
        if ours in by and theirs in by:
            ratios[f"ours/trl ({label}) tokens/s"] = by[ours]["tokens_per_second"] / by[theirs]["tokens_per_second"]
            ratios[f"trl/ours ({label}) peak memory"] = by[theirs]["peak_memory_gb"] / by[ours]["peak_memory_gb"]
    if with_gear and len(by) == 4:
        ratios["trl+gear / trl (GEAR overhead in TRL)"] = (by["trl + GEARGRPOTrainer"]["tokens_per_second"]
                                                           / by["trl grpo"]["tokens_per_second"])
        ratios["ours gear / ours grpo"] = (by["reflectrl gear"]["tokens_per_second"]
                                           / by["reflectrl grpo"]["tokens_per_second"])
    print()
    for name, value in ratios.items():
        print(f"{name:40s} {value:6.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": platform.platform(), "torch": torch.__version__, "threads": a.threads,
                       "args": vars(a), "results": results, "ratios": {k: round(v, 3) for k, v in ratios.items()}},
                      f, indent=2)


if __name__ == "__main__":
    main()
