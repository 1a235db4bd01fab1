"""TRL's GRPO (`trl.GRPOTrainer`) with reflectrl's GEAR weights: every line that is reflectrl's ends in
`# reflectrl`; delete them and this is a plain TRL GRPO script.

    python examples/trl_grpo_gear.py --steps 20 --gear-temperature 2.0
    python examples/trl_grpo_gear.py --model HuggingFaceTB/SmolLM2-135M-Instruct --steps 200  # a real model

GEAR turns TRL's per-sequence advantages into per-token ones: a value head, distilled on each batch's best
completions, says which tokens moved the outcome, and each token's advantage is multiplied by its weight
(reflectrl/integrations/trl.py; the signal runs through the same hooks as under `reflectrl llm train`).
By default the model is a tiny random one made here (no download): a few steps run in seconds on a CPU,
which shows the wiring, not learning. At --gear-temperature inf the weights are 1 and the run is TRL's own,
bit for bit (the printed params_sha256 equals --no-gear's: tests/test_standalone_torch.py checks it).
"""

import argparse
import hashlib
import random
import tempfile

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from reflectrl.integrations.trl import GEARGRPOTrainer  # reflectrl
from reflectrl.llm.model import init_tiny, load_model
from reflectrl.llm.tasks import make_task
from reflectrl.signals.gear import GEARConfig  # reflectrl


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a local or Hub model; default: a tiny random model made here")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--gear-temperature", type=float, default=2.0, help="inf: weights of 1 (TRL's GRPO)")  # reflectrl
    p.add_argument("--no-gear", action="store_true", help="TRL's GRPOTrainer as it is")  # reflectrl
    return p.parse_args(argv)


def exact_match(completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def digits(completions, **kwargs):
    """A small format reward, so that a random model's groups are not all tied at 0 (zero advantages)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def main(argv=None):
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model or str(init_tiny(f"{tmp}/tiny", hidden_size=32, layers=1, heads=2, intermediate_size=64,
                                           vocab_size=384))
        model, tokenizer = load_model(path)
        task, rng = make_task("arith"), random.Random(args.seed)
        problems = [task.sample(rng) for _ in range(64)]
        dataset = Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in problems])
        config = GRPOConfig(output_dir=f"{tmp}/out", use_cpu=not torch.cuda.is_available(), max_steps=args.steps,
                            per_device_train_batch_size=8, num_generations=4, max_completion_length=8,
                            learning_rate=args.learning_rate, beta=0.0, seed=args.seed, report_to=[],
                            save_strategy="no", logging_steps=1, disable_tqdm=True)
        trainer_class, gear = GRPOTrainer, {}
        if not args.no_gear:  # reflectrl
            trainer_class = GEARGRPOTrainer  # reflectrl
            gear = {"gear_config": GEARConfig(temperature=args.gear_temperature)}  # reflectrl
        trainer = trainer_class(model=model, reward_funcs=[exact_match, digits], args=config, train_dataset=dataset,
                                processing_class=tokenizer, **gear)
        trainer.train()
    for row in trainer.state.log_history:
        if "loss" in row:
            weights = {k: round(v, 3) for k, v in row.items() if k.startswith("gear/")}  # reflectrl
            print(f"step={row['step']} loss={row['loss']:.4f} reward={row.get('reward', float('nan')):.3f} {weights}")
    flat = torch.cat([p.detach().float().cpu().reshape(-1) for p in trainer.model.parameters()])
    print(f"params_sha256={hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
