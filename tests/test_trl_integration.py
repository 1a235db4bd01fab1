"""GEARGRPOTrainer: GEAR's per-token advantages inside TRL's GRPOTrainer, on a tiny local model (CPU)."""

import math
import random

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from reflectrl.integrations.trl import GEARGRPOTrainer
from reflectrl.llm.model import init_tiny, load_model
from reflectrl.llm.tasks import make_task
from reflectrl.signals.gear import GEARConfig


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return init_tiny(tmp_path_factory.mktemp("trl") / "tiny", hidden_size=32, layers=1, heads=2,
                     intermediate_size=64, vocab_size=384)


@pytest.fixture(scope="module")
def dataset():
    task, rng = make_task("arith"), random.Random(0)
    return Dataset.from_list([{"prompt": p.prompt, "answer": p.answer} for p in (task.sample(rng) for _ in range(16))])


def exact_match(completions, answer, **kwargs):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def digits(completions, **kwargs):
    """A small format reward, so that a random model's groups are not all tied at 0 (zero advantages)."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def recording(cls):
    class Recording(cls):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.recorded.append({k: out[k].detach().clone()
                                  for k in ("advantages", "completion_ids", "completion_mask")})
            return out

    return Recording


def make_trainer(cls, tiny_dir, dataset, out, steps=2, **kwargs):
    model, tokenizer = load_model(str(tiny_dir))
    args = GRPOConfig(output_dir=str(out), use_cpu=True, max_steps=steps, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=8, learning_rate=1e-3, beta=0.0, seed=0,
                      report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = recording(cls)(model=model, reward_funcs=[exact_match, digits], args=args, train_dataset=dataset,
                             processing_class=tokenizer, **kwargs)
    trainer.recorded = []
    return trainer


def test_gear_grpo_trainer_per_token_advantages(tiny_dir, dataset, tmp_path):
    trainer = make_trainer(GEARGRPOTrainer, tiny_dir, dataset, tmp_path / "gear")
    assert not trainer.signal.distilled
    trainer.train()
    assert len(trainer.recorded) == 2
    for rec in trainer.recorded:
        assert rec["advantages"].dim() == 2
        assert rec["advantages"].shape == rec["completion_ids"].shape
    assert trainer.signal.distilled  # after step 1's update, and used for step 2's weights
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logs) == 2
    assert all(math.isfinite(row["loss"]) for row in logs)
    first, second = logs
    assert first["gear/weights_min"] == first["gear/weights_max"] == 1.0  # no head distilled yet
    assert second["gear/weights_min"] < second["gear/weights_max"]  # the distilled head reweights tokens
    assert second["gear/weights_std"] > 0
    assert all(math.isfinite(row["gear/value_head_loss"]) for row in logs)
    # step 1's advantages are TRL's, broadcast; step 2's vary along a sequence where the advantage is not 0
    a1, a2, m2 = (trainer.recorded[0]["advantages"], trainer.recorded[1]["advantages"],
                  trainer.recorded[1]["completion_mask"])
    assert torch.equal(a1, a1[:, :1].expand_as(a1))
    varies = [a[m.bool()].unique().numel() > 1 for a, m in zip(a2, m2) if a[m.bool()].abs().sum() > 0]
    assert any(varies)


def test_infinite_temperature_gives_trl_advantages(tiny_dir, dataset, tmp_path):
    plain = make_trainer(GRPOTrainer, tiny_dir, dataset, tmp_path / "plain", steps=1)
    plain.train()
    gear = make_trainer(GEARGRPOTrainer, tiny_dir, dataset, tmp_path / "gear", steps=1,
                        gear_config=GEARConfig(temperature=float("inf")))
    gear.train()
    (p,), (g,) = plain.recorded, gear.recorded
    assert torch.equal(p["completion_ids"], g["completion_ids"])  # the same samples: GEAR draws no global randomness
    assert p["advantages"].dim() == 1 and g["advantages"].dim() == 2
    assert torch.equal(g["advantages"], p["advantages"][:, None].expand_as(g["advantages"]))
    assert p["advantages"].abs().sum() > 0
    loss_p, loss_g = (next(r["loss"] for r in t.state.log_history if "loss" in r) for t in (plain, gear))
    assert loss_g == pytest.approx(loss_p, rel=1e-6, abs=1e-9)
    assert gear.signal.distilled


def test_import_reflectrl_does_not_import_trl():
    import subprocess
    import sys

    code = "import sys, reflectrl, reflectrl.integrations, reflectrl.signals; assert 'trl' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_reflection_reward_functions_train_in_trl(tmp_path):
    """The verdict and confidence signals as TRL reward functions: TRL logs each, sums them, trains."""
    from reflectrl.integrations.rewards import task_dataset, task_rewards
    from reflectrl.llm.sft import sft

    spec = "arith[max_operand=9;reflect=both]"
    base = init_tiny(tmp_path / "tiny", hidden_size=32, layers=1, heads=2, intermediate_size=64, vocab_size=384)
    model, tokenizer = load_model(str(base))
    sft(model, tokenizer, make_task(spec), steps=300, out=tmp_path / "sft", learning_rate=3e-3, progress=False)
    model, tokenizer = load_model(str(tmp_path / "sft"))
    start = [p.detach().clone() for p in model.parameters()]
    args = GRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=2, per_device_train_batch_size=16,
                      num_generations=4, max_completion_length=16, learning_rate=1e-3, beta=0.0, seed=0,
                      report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                          train_dataset=Dataset.from_list(task_dataset(spec, 32)),
                          reward_funcs=task_rewards(spec, ["verdict", "confidence"], n=32))
    trainer.train()
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"rewards/outcome/mean", "rewards/verdict/mean", "rewards/confidence/mean"} <= logged
    assert any(not torch.equal(a, b) for a, b in zip(start, trainer.model.parameters()))


def test_divergence_grpo_trainer_per_token_advantages(tiny_dir, tmp_path):
    from reflectrl.integrations.trl import DivergenceGRPOTrainer
    from reflectrl.signals.divergence import DivergenceConfig

    task, rng = make_task("arith"), random.Random(0)
    problems = [task.sample(rng) for _ in range(16)]
    rows = [{"prompt": p.prompt, "answer": p.answer, "reference": p.answer} for p in problems]
    trainer = make_trainer(DivergenceGRPOTrainer, tiny_dir, Dataset.from_list(rows), tmp_path / "div",
                           divergence_config=DivergenceConfig(floor=0.0))
    trainer.train()
    assert all(rec["advantages"].dim() == 2 for rec in trainer.recorded)
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert all(math.isfinite(row["loss"]) for row in logs)
    assert all(row["divergence/divergence_mean"] > 0 for row in logs)  # the reference changes the teacher
    assert any(row["divergence/weights_std"] > 0 for row in logs)
    # strength 0: TRL's own advantages, broadcast
    neutral = make_trainer(DivergenceGRPOTrainer, tiny_dir, Dataset.from_list(rows), tmp_path / "n",
                           divergence_config=DivergenceConfig(strength=0), steps=1)
    neutral.train()
    rec = neutral.recorded[0]
    assert torch.equal(rec["advantages"], rec["advantages"][:, :1].expand_as(rec["advantages"]))
    with pytest.raises(ValueError, match="reference"):
        bad = make_trainer(DivergenceGRPOTrainer, tiny_dir, Dataset.from_list([{k: v for k, v in r.items()
                                                                                 if k != "reference"} for r in rows]),
                           tmp_path / "bad", steps=1)
        bad.train()


def test_the_llm_gpu_recipe_runs_every_entry_on_the_cpu(tiny_dir, tmp_path):
    """examples/experiments/llm_gpu.py (the accelerator recipe) end to end on the tiny model: a smoke run, not a
    measurement."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "examples" / "experiments" / "llm_gpu.py"
    out = tmp_path / "gpu.jsonl"
    subprocess.run([sys.executable, str(script), "--model", str(tiny_dir), "--device", "cpu", "--no-chat",
                    "--instruction", "", "--task", "rg:chain_sum[min_terms=3;max_terms=3;max_digits=1;worked=true]",
                    "--steps", "2", "--eval-every", "1", "--eval-problems", "4", "--prompts", "2", "--group", "4",
                    "--max-new-tokens", "16", "--out", str(tmp_path / "o"), "--json", str(out)],
                   check=True, capture_output=True, text=True)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["entry"] for r in rows] == ["grpo", "gear", "divergence"]
    assert rows[0]["vs_trl_grpo"] == 1.0 and all(r["tokens_per_second"] > 0 for r in rows)
    assert all(len(r["accuracy_curve"]) == 2 for r in rows)
    assert "divergence/segments_per_completion" in rows[2]
