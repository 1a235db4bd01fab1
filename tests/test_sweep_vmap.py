"""`reflectrl sweep --vmap-trials N` (backend=jax, issue 39): a batch of trials trained as one
compiled program, each run reading its own PPO and signal knobs; and the one-line refusals."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("jax")
pytest.importorskip("gymnax")
pytest.importorskip("optuna")

from reflectrl.runs.rundir import read_metrics  # noqa: E402

TINY = ["backend=jax", "num_envs=2", "num_steps=16", "num_minibatches=2", "update_epochs=2", "hidden_sizes=8,8"]


def sweep_argv(out, space, *extra, sets=TINY):
    return ["sweep", "--env", "gymnax:CartPole-v1", "--algo", "ppo", "--trials", "3", "--seeds", "2",
            "--total-steps", "1024", "--rerun-seeds", "0", "--out", str(out), "--space", *space, *extra,
            "--set", *sets]


@pytest.mark.parametrize("space, extra, sets, says", [
    (["ent_coef=uniform(0,0.05)"], ["--vmap-trials", "3"], TINY[1:], "add --set backend=jax"),
    (["gamma=uniform(0.9,0.99)"], ["--vmap-trials", "3"], TINY, "the space also tunes gamma"),
    (["count.beta=uniform(0.001,0.1)"], ["--vmap-trials", "3", "--algo", "ppo+gear"], TINY,
     "--algo ppo+gear does not run the 'count' signal"),
    (["gear.top_frac=uniform(0.1,0.5)"], ["--vmap-trials", "3", "--algo", "ppo+gear"], TINY,
     "the space also tunes gear.top_frac"),
    (["rnd.int_coef=uniform(0,1)"], ["--vmap-trials", "3", "--algo", "ppo+rnd"], TINY,
     "at rnd.int_coef=0 the signal has no reward stream"),
    (["learning_rate=loguniform(1e-4,1e-2)"], ["--vmap-trials", "3", "--algo", "ppo+calibration"], TINY,
     "calibration fit their networks at lr_multiplier"),
    (["ent_coef=uniform(0,0.05)"], ["--vmap-trials", "0"], TINY, "--vmap-trials 0: must be >= 1"),
    (["ent_coef=uniform(0,0.05)"], ["--vmap-trials", "2", "--backend", "ray"], TINY, "drop --backend ray"),
])
def test_refusals_are_one_line_and_write_nothing(cli, tmp_path, space, extra, sets, says):
    out = tmp_path / "sweep"
    code, _, err = cli(*sweep_argv(out, space, *extra, sets=sets))
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and says in lines[0], err
    assert not out.exists()


@pytest.mark.slow
def test_a_batch_of_trials_trains_as_one_program_each_run_with_its_knobs(cli, tmp_path):
    out = tmp_path / "sweep"
    code, stdout, err = cli(*sweep_argv(out, ["ent_coef=uniform(0,0.05)", "learning_rate=loguniform(1e-4,1e-2)",
                                              "count.beta=loguniform(1e-3,0.1)"], "--vmap-trials", "3",
                                        "--algo", "ppo+count"))
    assert code == 0, err
    assert stdout.count("-> auc ") == 3
    # one program: one train-group process whose JSON lists the 3 trials x 2 seeds
    groups = list(out.rglob(".group-*.json"))
    assert len(groups) == 1 and len(json.loads(groups[0].read_text())) == 6
    for trial in range(3):
        sets = json.loads((out / "trials" / f"{trial:04d}" / "experiment.json").read_text())["sets"]
        knobs = dict(item.split("=", 1) for item in sets)
        for seed in (1, 2):
            run = out / "trials" / f"{trial:04d}" / "runs" / "gymnax_CartPole-v1" / "ppo+count" / f"seed{seed}"
            status = json.loads((run / "run.json").read_text())
            assert status["status"] == "finished"
            first = read_metrics(run)[0]
            # the run's own learning rate (annealed from it: the first iteration's is the knob itself)
            assert first["learning_rate"] == pytest.approx(float(knobs["learning_rate"]), rel=1e-6)
            assert first["count_beta"] == pytest.approx(float(knobs["count.beta"]), rel=1e-6)  # the signal's own
    best = json.loads((out / "best.json").read_text())
    assert best["trial"] in (0, 1, 2)
