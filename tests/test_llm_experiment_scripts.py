"""examples/experiments/llm_untrained.py and llm_pretrained.py's protocol pieces, on the tiny model."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from experiment_scripts import EXPERIMENTS, experiment_module  # noqa: E402

from reflectrl.llm.model import init_tiny  # noqa: E402


def test_wilson_interval_matches_scipy():
    binomtest = pytest.importorskip("scipy.stats").binomtest
    wilson = experiment_module("llm_untrained").wilson
    for k, n in [(5, 10), (0, 64), (64, 64), (21, 64), (47, 128)]:
        ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert wilson(k, n) == pytest.approx((ci.low, ci.high), abs=2e-5)


@pytest.mark.slow
def test_untrained_script_writes_what_llm_eval_says(tmp_path):
    model = init_tiny(tmp_path / "tiny", hidden_size=32, layers=1, heads=2, intermediate_size=64, vocab_size=384)
    out = tmp_path / "out"
    argv = [sys.executable, str(EXPERIMENTS / "llm_untrained.py"), "--model", str(model), "--tasks",
            "arith[max_operand=9]", "--problems", "4", "--sample-seeds", "2", "--out", str(out)]
    subprocess.run(argv, check=True, capture_output=True, text=True)
    folder = out / "arith[max_operand=9]"
    assert sorted(p.name for p in folder.iterdir()) == ["greedy.json", "sampled-seed0.json", "sampled-seed1.json"]
    greedy = json.loads((folder / "greedy.json").read_text())
    direct = subprocess.run([sys.executable, "-m", "reflectrl", "llm", "eval", "--model", str(model), "--task",
                             "arith[max_operand=9]", "--problems", "4", "--json"], check=True, capture_output=True,
                            text=True)
    assert greedy["accuracy"] == json.loads(direct.stdout.strip().splitlines()[-1])["accuracy"]
    rows = (out / "runs.csv").read_text().splitlines()
    assert rows[0] == "task,mode,seed,problems,accuracy" and len(rows) == 4
    assert (out / "summary.md").read_text().count("| `arith[max_operand=9]` |") == 1
    assert json.loads((out / "provenance.json").read_text())["command"].startswith("python examples/experiments/")
    # a finished evaluation is not run again
    (folder / "greedy.json").write_text(json.dumps({**greedy, "accuracy": 0.5}))
    subprocess.run(argv, check=True, capture_output=True, text=True)
    assert "| 0.500 [" in (out / "summary.md").read_text()


def test_bad_arguments_are_one_line():
    done = subprocess.run([sys.executable, str(EXPERIMENTS / "llm_untrained.py"), "--problems", "0"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "at least 1" in done.stderr and "Traceback" not in done.stderr


def test_learning_experiment_evaluates_at_the_ends_only():
    pretrained = experiment_module("llm_pretrained")
    ends = pretrained.knobs(pretrained.EXPERIMENTS["learning"], 20)
    assert "eval_every=20" in ends and "eval_every=5" not in ends and "eval_samples=2" in ends
    assert pretrained.knobs(pretrained.EXPERIMENTS["credit"], 20) == pretrained.COMMON


def test_a_runs_repeated_step_0_evaluation_counts_once(tmp_path):
    """A run resumed from its step-0 checkpoint by an older reflectrl logged step 0's evaluation twice:
    the summary reads one row per step, so the area under the curve is not pulled toward step 0."""
    pretrained = experiment_module("llm_pretrained")
    ev0 = {"global_step": 0, "step": 0, "eval_accuracy": 0.25, "eval_sampled_accuracy": 0.125}
    train = {"global_step": 1, "step": 1, "reward": 1.0, "accuracy": 1.0, "completion_length": 10.0,
             "step_seconds": 2.0}
    ev1 = {**train, "eval_accuracy": 0.75, "eval_sampled_accuracy": 0.5}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (ev0, ev0, ev1)))
    out = pretrained.load(tmp_path)
    assert out["eval_steps"] == [0, 1] and out["auc"] == 0.5
    assert (out["initial"], out["final"], out["sampled_initial"], out["sampled_final"]) == (0.25, 0.75, 0.125, 0.5)
