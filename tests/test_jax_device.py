"""examples/experiments/jax_device.py's plan: the suite sized to its device window from the probes' timings, with
start-up and compilation paid per entry, the probes' own time spent, and tasks dropped (not the
window overrun) where the rest cannot fit."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "experiments" / "jax_device.py"


@pytest.fixture(scope="module")
def jd():
    spec = importlib.util.spec_from_file_location("jax_device", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["jax_device"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def probes(jd, fixed=30.0, rate=1e6, tasks=("doorkey16", "blockedunlock", "lockedroom", "craftax")):
    steps, seeds = 98_304, 16
    return [jd.Probe(t, steps, seeds, fixed + steps * seeds / rate, rate) for t in tasks]


def test_a_probe_splits_its_time_into_fixed_and_per_step(jd):
    (p,) = probes(jd, fixed=25.0, rate=2e5, tasks=("doorkey16",))
    assert p.fixed == pytest.approx(25.0)
    assert jd.task_seconds(p, 9, 16, 0, 4) == pytest.approx(jd.REPORT_SECONDS + 3 * 25.0)  # 3 waves of 4
    assert jd.task_seconds(p, 9, 16, 10_000, 4) - jd.task_seconds(p, 9, 16, 0, 4) == pytest.approx(
        9 * jd.SIGNAL_COST * 16 * 10_000 / 2e5)


def test_the_plan_fits_the_budget_dropping_tasks_from_the_end(jd):
    ps = probes(jd)
    plan = jd.plan(ps, entries=9, seeds=16, budget=540.0, workers=4, max_steps=10_000_000, min_steps=1_000_000,
                   batch=32_768)
    # four tasks' fixed costs alone (report + 3 waves of compilation each) overrun the budget's share
    assert sum(jd.task_seconds(p, 9, 16, 0, 4) for p in ps) > jd.SAFETY * 540
    assert plan.tasks == ["doorkey16"] and plan.dropped == ["blockedunlock", "lockedroom", "craftax"]
    assert plan.steps >= 1_000_000 and plan.steps % 32_768 == 0
    assert sum(plan.seconds.values()) <= jd.SAFETY * 540
    # one batch more would not have fitted
    assert jd.task_seconds(ps[0], 9, 16, plan.steps + 32_768, 4) > jd.SAFETY * 540


def test_the_plan_keeps_every_task_and_caps_at_the_steps_asked_where_they_fit(jd):
    ps = probes(jd, fixed=5.0, rate=1e9)
    plan = jd.plan(ps, entries=9, seeds=16, budget=540.0, workers=4, max_steps=10_000_000, min_steps=1_000_000,
                   batch=32_768)
    assert plan.tasks == [p.task for p in ps] and plan.dropped == [] and plan.steps == 10_000_000


def test_nothing_runs_where_no_task_fits(jd):
    plan = jd.plan(probes(jd, fixed=200.0), entries=9, seeds=16, budget=540.0, workers=4, max_steps=10_000_000,
                   min_steps=1_000_000, batch=32_768)
    assert plan.tasks == [] and plan.steps == 0 and len(plan.dropped) == 4


def test_the_steady_rate_leaves_out_the_first_call(jd, tmp_path):
    for seed, rates in ((1, [10.0, 10.0, 400.0, 420.0]), (2, [10.0, 10.0, 380.0, 400.0])):
        folder = tmp_path / "runs" / "env" / "ppo+count" / f"seed{seed}"
        folder.mkdir(parents=True)
        rows = [{"global_step": i, "steps_per_second": r} for i, r in enumerate(rates)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert jd.steady_rate(tmp_path, seeds=2) == pytest.approx(2 * 400.0)  # median of 400, 420, 380, 400
    assert jd.steady_rate(tmp_path / "nothing", seeds=2) is None


def test_an_unknown_task_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--tasks", "doorkey16,mars", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unknown task mars" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_a_task_that_cannot_be_solved_is_one_line(tmp_path):
    """navix's KeyCorridor, once in the suite, is refused before any probe spends the window."""
    argv = [sys.executable, str(SCRIPT), "--tasks", "doorkey16,keycorridor", "--out", str(tmp_path / "x")]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 2 and "keycorridor: navix's KeyCorridorS3R3 cannot be solved" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()
