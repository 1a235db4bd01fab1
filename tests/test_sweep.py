"""`reflectrl sweep`: the search space, its errors, the pruning statistic, the fresh-seed
re-run and the tuned baseline, and one tiny real sweep that is resumed."""

import csv
import json
import math
from pathlib import Path

import pytest

from reflectrl.errors import UserError
from reflectrl.experiments.spec import read_spec
from reflectrl.runs.rundir import METRICS
from reflectrl.sweep import (
    PruneCheck,
    SweepSpec,
    check_baseline,
    load_or_create_sweep,
    parse_knob,
    parse_space,
    rerun_spec,
)

GRID = "reflectrl/GridWorld-v0"
TINY_SETS = ["env.size=5", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1"]


def assert_one_line_error(code, err, needle):
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("reflectrl: error: ") and needle in lines[0], err


@pytest.mark.parametrize("text, dist, low, high, choices", [
    ("calibration.alpha=uniform(0,0.5)", "uniform", 0.0, 0.5, ()),
    ("learning_rate = loguniform(1e-4, 1e-3)", "loguniform", 1e-4, 1e-3, ()),
    ("num_minibatches=int(2,8)", "int", 2, 8, ()),
    ("shaping.mode=choice(direct, potential)", "choice", 0.0, 0.0, ("direct", "potential")),
])
def test_parse_each_distribution(text, dist, low, high, choices):
    knob = parse_knob(text)
    assert (knob.key, knob.dist, knob.low, knob.high, knob.choices) == (text.split("=")[0].strip(), dist, low, high,
                                                                        choices)
    assert parse_knob(knob.text) == knob  # what sweep.json stores reads back as the same knob


@pytest.mark.parametrize("text, needle", [
    ("calibration.alpha", "not KEY=DIST"),
    ("=uniform(0,1)", "not KEY=DIST"),
    ("ent_coef=0.01", "is not a distribution"),
    ("ent_coef=normal(0,1)", "unknown distribution 'normal'"),
    ("ent_coef=uniform(0)", "takes two bounds"),
    ("ent_coef=uniform(0,x)", "'x' is not a number"),
    ("ent_coef=uniform(0,inf)", "must be finite"),
    ("ent_coef=uniform(0.5,0.1)", "needs a < b"),
    ("ent_coef=uniform(0.1,0.1)", "needs a < b"),
    ("num_envs=int(1.5,4)", "'1.5' is not a whole number"),
    ("learning_rate=loguniform(0,1e-3)", "loguniform needs 0 < a"),
    ("shaping.mode=choice()", "choice() is empty"),
    ("shaping.mode=choice(direct,,potential)", "empty value"),
    ("shaping.mode=choice(direct,direct)", "a value twice"),
])
def test_bad_distributions(text, needle):
    with pytest.raises(UserError, match=None) as err:
        parse_knob(text)
    assert needle in str(err.value) and text.strip() in str(err.value)


def test_space_file_comments_and_duplicates(tmp_path):
    path = tmp_path / "space.txt"
    path.write_text("# the calibration bonus\ncalibration.alpha=loguniform(1e-3,1)  # strength\n\n"
                    "calibration.clip_k=uniform(1,5)\n")
    knobs = parse_space(["learning_rate=loguniform(1e-4,1e-3)"], str(path))
    assert [k.key for k in knobs] == ["learning_rate", "calibration.alpha", "calibration.clip_k"]
    path.write_text("calibration.alpha=uniform(1,0)\n")
    with pytest.raises(UserError, match=r"space.txt:1: calibration.alpha=uniform\(1,0\): needs a < b"):
        parse_space([], str(path))
    with pytest.raises(UserError, match="lists ent_coef more than once"):
        parse_space(["ent_coef=uniform(0,1)", "ent_coef=uniform(0,2)"])
    with pytest.raises(UserError, match="needs a search space"):
        parse_space([])
    with pytest.raises(UserError, match="cannot read it"):
        parse_space([], str(tmp_path / "missing.txt"))


def sweep_argv(out, *extra):
    return ["sweep", "--env", GRID, "--algo", "ppo", "--trials", "2", "--seeds", "1", "--total-steps", "2048",
            "--out", out, "--set", *TINY_SETS, *extra]


@pytest.mark.parametrize("extra, needle", [
    (["--space", "lr=loguniform(1e-4,1e-3)"], "--space lr=loguniform(0.0001,0.001): unknown --set key 'lr'"),
    (["--space", "calibration.alpha=uniform(0,1)"], "--algo ppo does not run the 'calibration' signal"),
    (["--space", "shaping.mode=choice(direct,nosuch)"], "--space shaping.mode=choice(direct,nosuch)"),
    (["--space", "num_envs=choice(2,4)"], "num_envs is both in --set and in the search space"),
    (["--space", "ent_coef=uniform(0.2,0.1)"], "needs a < b"),
    ([], "needs a search space"),
    (["--space", "ent_coef=uniform(0,0.1)", "--trials", "0"], "--trials 0: must be >= 1"),
    (["--space", "ent_coef=uniform(0,0.1)", "--rerun-seeds", "-1"], "--rerun-seeds -1"),
    (["--space", "ent_coef=uniform(0,0.1)", "--env", "CartPole-v1,Acrobot-v1"], "one env"),
    # an --algo's knobs in brackets are fixed knobs, as --set's (issue 57: one grammar for --algo everywhere)
    (["--space", "ent_coef=uniform(0,0.1)", "--algo", "ppo[ent_coef=0]"], "ent_coef is both in --set and in the"),
    (["--space", "ent_coef=uniform(0,0.1)", "--algo", "ppo[num_envs=4]"], "--algo ppo[num_envs=4] gives num_envs=4 "
                                                                          "and --set num_envs=2 another value"),
])
def test_bad_sweeps_stop_before_anything_is_written(cli, tmp_path, extra, needle):
    out = tmp_path / "sweep"
    argv = sweep_argv(out, *extra)
    if "shaping.mode" in " ".join(extra):
        argv[argv.index("ppo")] = "sdrs"
    code, _, err = cli(*argv)
    assert_one_line_error(code, err, needle)
    assert not out.exists()


def test_a_rerun_must_be_the_same_sweep(tmp_path):
    spec = SweepSpec(env=GRID, algo="ppo", space=["ent_coef=uniform(0.0,0.1)"], seeds=2, total_steps=2048)
    assert load_or_create_sweep(tmp_path / "s", spec) is False
    assert load_or_create_sweep(tmp_path / "s", spec) is True
    other = SweepSpec(env=GRID, algo="ppo", space=["ent_coef=uniform(0.0,0.2)"], seeds=2, total_steps=2048)
    with pytest.raises(UserError, match="holds a different sweep \\(differs in: space\\)"):
        load_or_create_sweep(tmp_path / "s", other)


class FakeTrial:
    """Records what PruneCheck reports."""

    def __init__(self):
        self.reports = []

    def report(self, value, step):
        self.reports.append((step, value))


def write_metrics(path: Path, rows: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_prune_check_reports_the_mean_return_so_far_once_every_seed_passed(tmp_path):
    a, b = tmp_path / "seed1", tmp_path / "seed2"
    write_metrics(a, [{"global_step": 100, "episodic_return": 1.0, "episodes": 1},
                      {"global_step": 200, "episodic_return": 3.0, "episodes": 3},
                      {"global_step": 500}])
    write_metrics(b, [{"global_step": 100}, {"global_step": 250, "episodic_return": 0.0, "episodes": 2}])
    trial, asked = FakeTrial(), []
    check = PruneCheck(trial, [a, b], total_steps=1000, decide=lambda step, value: asked.append(step) or value < 2)
    assert check() is False
    # seed2 has reached step 250: the tenths 100 and 200 are due; until 250 only seed1 has ended an episode
    assert trial.reports == [(100, 1.0), (200, 2.5)] and asked == [200]  # the rule sees the latest value
    assert check() is False and len(trial.reports) == 2  # nothing new is due: nothing reported twice
    with open(b / METRICS, "a") as f:
        f.write(json.dumps({"global_step": 400}) + "\n")
    assert check() is True and check.pruned_at == 400
    assert trial.reports[2:] == [(300, 1.25), (400, 1.25)]  # (2.5 + 0.0) / 2: both seeds have episodes


def test_the_rerun_uses_fresh_seeds_and_reads_back_as_an_experiment(tmp_path):
    spec = SweepSpec(env=GRID, algo="refgrpo", space=["calibration.alpha=loguniform(0.001,1.0)"], seeds=3,
                     total_steps=2048, sets=TINY_SETS)
    best = {"knobs": {"calibration.alpha": 0.02}, "set": ["calibration.alpha=0.02"], "trials": 4}
    rerun = rerun_spec(spec, best, rerun_seeds=2)
    root = tmp_path / "best"
    runs = rerun.runs(root)
    assert [r.seed for r in runs] == [4, 5] and runs[0].path.name == "seed4"
    assert runs[0].overrides == (*TINY_SETS, "calibration.alpha=0.02")
    root.mkdir()
    (root / "experiment.json").write_text(json.dumps(rerun.to_dict()))
    back = read_spec(root)  # what the report reads: seeds 4-5 only, none of the search's left "not started"
    assert (back.first_seed, back.seeds, list(back.seed_numbers)) == (4, 2, [4, 5])


def test_the_baseline_joins_the_rerun_tuned_and_with_the_same_budget(tmp_path):
    base_dir = tmp_path / "ppo"
    base = SweepSpec(env=GRID, algo="ppo", space=["ent_coef=uniform(0.0,0.1)"], seeds=3, total_steps=2048,
                     sets=TINY_SETS)
    load_or_create_sweep(base_dir, base)
    (base_dir / "best.json").write_text(json.dumps({"knobs": {"ent_coef": 0.05}, "set": ["ent_coef=0.05"],
                                                    "trials": 4}))
    method = SweepSpec(env=GRID, algo="refgrpo", space=["calibration.alpha=loguniform(0.001,1.0)"], seeds=3,
                       total_steps=2048, sets=TINY_SETS)
    check_baseline(method, 4, base_dir)
    with pytest.raises(UserError, match="had 4 trials and this sweep has 8"):
        check_baseline(method, 8, base_dir)
    with pytest.raises(UserError, match="this sweep is of ppo itself: drop --baseline here"):
        check_baseline(base, 4, base_dir)
    method_dir = tmp_path / "method"
    load_or_create_sweep(method_dir, method)
    (method_dir / "best.json").write_text(json.dumps({"knobs": {}, "set": [], "trials": 4}))
    with pytest.raises(UserError, match="is a sweep of --algo refgrpo, not of plain ppo"):
        check_baseline(method, 4, method_dir)
    rerun = rerun_spec(method, {"knobs": {"calibration.alpha": 0.02}, "set": ["calibration.alpha=0.02"], "trials": 4},
                       2, base_dir)
    runs = {r.entry.label: r for r in rerun.runs(tmp_path / "best") if r.seed == 4}
    assert rerun.algos == ["ppo", "refgrpo"]
    assert runs["ppo"].overrides == (*TINY_SETS, "ent_coef=0.05")
    assert runs["refgrpo"].overrides == (*TINY_SETS, "calibration.alpha=0.02")


def read_trials(out: Path) -> list[dict]:
    with open(out / "report" / "trials.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_tiny_sweep_writes_its_outputs_and_resumes_without_retraining(cli, tmp_path):
    pytest.importorskip("optuna")
    out = tmp_path / "sweep"
    argv = sweep_argv(out, "--space", "learning_rate=loguniform(1e-4,1e-2)", "shaping.mode=choice(direct,potential)",
                      "--rerun-seeds", "1", "--no-progress")
    argv[argv.index("ppo")] = "sdrs"
    code, stdout, err = cli(*argv)
    assert code == 0, err
    assert stdout.startswith("trial 0 (1/2): learning_rate=") and "trial 1 (2/2): " in stdout
    assert "best so far" in stdout and "runs: 1 trained" in stdout
    assert (out / "sweep.db").is_file() and (out / "trials" / "0001" / "experiment.json").is_file()
    rows = read_trials(out)
    assert [r["number"] for r in rows] == ["0", "1"] and {r["state"] for r in rows} == {"complete"}
    assert list(rows[0]) == ["number", "state", "learning_rate", "shaping.mode", "objective", "final", "auc"]
    assert all(r["objective"] == r["auc"] and math.isfinite(float(r["final"])) for r in rows)
    best = json.loads((out / "best.json").read_text())
    winner = max(rows, key=lambda r: float(r["objective"]))
    assert best["trial"] == int(winner["number"]) and best["value"] == float(winner["objective"])
    assert best["knobs"]["shaping.mode"] == winner["shaping.mode"] and best["trials"] == 2
    for name in ("sensitivity_learning_rate.png", "sensitivity_shaping_mode.png", "history.png"):
        assert (out / "report" / name).read_bytes()[:4] == b"\x89PNG"
    # the winner's curse: the re-run trains seed 2, which no trial used, and gets the ordinary report
    reruns = [p for p in (out / "best" / "runs").glob("*/*/seed*") if p.is_dir()]
    assert [p.name for p in reruns] == ["seed2"]
    assert json.loads((reruns[0] / "config.json").read_text())["seed"] == 2
    assert (out / "best" / "report" / "index.html").is_file()
    trial_metrics = sorted((out / "trials").glob("*/runs/*/*/seed1/metrics.jsonl"))
    assert len(trial_metrics) == 2
    stamps = [p.stat().st_mtime_ns for p in trial_metrics]

    code, stdout, err = cli(*argv)
    assert code == 0, err
    assert "sweep: 0 trial(s) run now, 2 in the study" in stdout
    assert "runs: 0 trained, 1 already finished" in stdout
    assert [p.stat().st_mtime_ns for p in trial_metrics] == stamps and read_trials(out) == rows


def test_the_median_rule_reads_the_current_value_after_the_startup_trials():
    optuna = pytest.importorskip("optuna")
    from reflectrl.sweep import PRUNE_STARTUP_TRIALS, below_median

    study = optuna.create_study(direction="maximize")
    for i in range(PRUNE_STARTUP_TRIALS):
        assert below_median(study, 0, 500, -100.0) is False  # too few completed trials to prune anything
        study.add_trial(optuna.trial.create_trial(value=float(i), intermediate_values={500: float(i)}))
    median = (PRUNE_STARTUP_TRIALS - 1) / 2
    assert below_median(study, 0, 500, median - 0.1) is True
    assert below_median(study, 0, 500, median) is False
    assert below_median(study, 600, 500, -100.0) is False  # still in the warm-up
    assert below_median(study, 0, 700, -100.0) is False  # no completed trial reported at that step
