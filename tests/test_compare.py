"""`reflectrl compare` and `reflectrl report`: runs, resume, Ray, bad input, the rendered report."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reflectrl.experiments.spec import parse_algos

TINY = ["--env", "reflectrl/GridWorld-v0", "--seeds", "2", "--total-steps", "1024",
        "--set", "env.size=5", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1"]


def assert_one_line_error(code, err, needle):
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("reflectrl: error: ") and needle in lines[0], err


def test_parse_algos_entries_and_ablations():
    entries = parse_algos("ppo, ppo[ent_coef=0;num_envs=8],ppo[checkpoint_every=100]")
    assert [e.label for e in entries] == ["ppo", "ppo[ent_coef=0;num_envs=8]", "ppo[checkpoint_every=100]"]
    assert entries[1].overrides == ("ent_coef=0", "num_envs=8")


def test_the_closing_line_counts_resumed_runs_apart_from_trained_ones(tmp_path):
    """Issue 57 item 8: `compare` said "4 trained" when 2 of the 4 had been resumed from checkpoints."""
    from reflectrl.experiments.spec import ExperimentSpec
    from reflectrl.experiments.state import ExperimentResult, runs_to_train

    done, interrupted, new, killed = ExperimentSpec(envs=["CartPole-v1"], algos=["ppo"], seeds=4,
                                                    total_steps=512).runs(tmp_path)
    done.path.mkdir(parents=True)
    (done.path / "run.json").write_text(json.dumps({"status": "finished"}))
    for run in (interrupted, killed):
        run.path.mkdir(parents=True)
        (run.path / "config.json").write_text("{}")
        (run.path / "checkpoint.pt").write_bytes(b"")
    result = ExperimentResult()
    todo = runs_to_train([done, interrupted, new, killed], result)
    assert [state for _, state in todo] == ["resume", "fresh", "resume"]
    result.finished += [interrupted, new]
    result.failed.append((killed, "why"))
    assert result.summary() == ("runs: 2 trained, 1 already finished, 1 failed "
                                "(1 of the trained resumed from a checkpoint)")


@pytest.mark.parametrize("algos, needle", [
    ("ppo,nosuch", "unknown algo 'nosuch'"),
    ("ppo,ppo", "more than once"),
    ("ppo[ent_coef=0", "unbalanced"),
    ("ppo[ent_coef]", "not key=value"),
    ("ppo[bogus_knob=1]", "unknown --set key 'bogus_knob'"),
])
def test_bad_algos(cli, tmp_path, algos, needle):
    out = tmp_path / "exp"
    code, _, err = cli("compare", "--algos", algos, "--out", out, "--no-progress", *TINY)
    assert_one_line_error(code, err, needle)
    assert not out.exists()


def test_bad_env_and_seeds(cli, tmp_path):
    out = tmp_path / "exp"
    code, _, err = cli("compare", "--env", "CartPol-v1", "--algos", "ppo", "--total-steps", "512", "--out", out)
    assert_one_line_error(code, err, "unknown env id")
    code, _, err = cli("compare", "--env", "CartPole-v1", "--algos", "ppo", "--seeds", "0", "--total-steps", "512",
                       "--out", out)
    assert_one_line_error(code, err, "--seeds 0")
    assert not out.exists()


@pytest.mark.slow
def test_compare_runs_reports_and_skips_finished(cli, tmp_path):
    out = tmp_path / "exp"
    code, stdout, err = cli("compare", "--algos", "ppo,ppo[ent_coef=0]", "--out", out, "--no-progress", *TINY)
    assert code == 0, err
    assert "4 trained" in stdout and "report:" in stdout
    # no signal entry: every claim needs one, so none is tabled and each is named once as untestable
    summary = stdout[stdout.index("summary:"):].splitlines()[1:]
    assert summary[0].startswith("reflectrl/GridWorld-v0: ") and "reached by" in summary[0]  # which entries solve it
    claims = stdout[stdout.index("no claim"):].splitlines()
    assert claims[0] == "no claim can be tested by this experiment"
    assert claims[1].startswith("not testable here (entries missing): ") and claims[1].endswith(
        "GEAR beats the baseline (needs gear)") and "not tested" not in stdout
    runs = sorted(p.relative_to(out).as_posix() for p in out.glob("runs/*/*/seed*") if p.is_dir())
    assert runs == ["runs/reflectrl_GridWorld-v0/ppo/seed1", "runs/reflectrl_GridWorld-v0/ppo/seed2",
                    "runs/reflectrl_GridWorld-v0/ppo_ent_coef=0/seed1",
                    "runs/reflectrl_GridWorld-v0/ppo_ent_coef=0/seed2"]
    config = json.loads((out / "runs/reflectrl_GridWorld-v0/ppo_ent_coef=0/seed2/config.json").read_text())
    assert config["ppo"]["ent_coef"] == 0.0 and config["seed"] == 2 and config["env"]["size"] == 5
    for name in ("index.html", "report.md", "stats.json", "curves_reflectrl_GridWorld_v0.png"):
        assert (out / "report" / name).is_file()
    def no_constants(name):
        raise AssertionError(f"stats.json holds {name}, which is not JSON")

    table = json.loads((out / "report/stats.json").read_text(), parse_constant=no_constants)["table"]
    assert {r["algo"] for r in table} == {"ppo", "ppo[ent_coef=0]"} and all(r["seeds"] == 2 for r in table)

    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/seed*/checkpoint.pt")}
    code, stdout, _ = cli("compare", "--algos", "ppo,ppo[ent_coef=0]", "--out", out, "--no-progress", *TINY)
    assert code == 0 and "runs: 0 trained, 4 already finished, 0 failed\n" in stdout
    assert before == {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/seed*/checkpoint.pt")}

    code, _, err = cli("compare", "--algos", "ppo", "--out", out, "--no-progress", *TINY)
    assert_one_line_error(code, err,
                          "holds a different experiment (this command leaves out its algo entry ppo[ent_coef=0])")

    code, stdout, _ = cli("report", out, "--reps", "200")
    assert code == 0 and "report:" in stdout


@pytest.mark.parametrize("gear, ppo, verdict", [
    ([10.0, 9.0, 9.5, 9.8, 9.2], [0.0, 1.0, 0.5, 0.2, 0.8], "supported"),
    ([0.0, 1.0, 0.5, 0.2, 0.8], [10.0, 9.0, 9.5, 9.8, 9.2], "not supported"),
    ([0.0, 10.0, 0.0, 10.0, 5.0], [10.0, 0.0, 10.0, 0.0, 5.0], "inconclusive"),
])
def test_report_prints_the_verdict_the_data_gives(cli, tmp_path, monkeypatch, gear, ppo, verdict):
    """`reflectrl report` on a fake ppo-vs-gear experiment (5 seeds each, final returns as given):
    the GEAR claim's verdict, printed and in report.md, is the one its numbers give. (Made-up returns
    up to 10 on a grid world that pays at most 1: normalised by the observed range, as an env with no
    fixed reference.)"""
    from test_report_claims import make_experiment

    from reflectrl.report import references

    monkeypatch.setattr(references, "REFERENCES", ())

    root = make_experiment(tmp_path / "exp", {"ppo": ppo, "gear": gear})
    code, stdout, err = cli("report", root, "--reps", "200")
    assert code == 0, err
    claims = stdout[stdout.index("claim "):].splitlines()  # after the paths and which entries solve the env
    assert "no solved score" in stdout[:stdout.index("claim ")]  # which entries solve the env, before the claims
    assert claims[0].split() == ["claim", "verdict"]
    assert claims[1].startswith("GEAR beats the baseline  ") and claims[1].split("  ")[-1].strip() == verdict
    assert len(claims) == 3 and claims[2].startswith("not testable here (entries missing): RefGRPO")
    md = (root / "report/report.md").read_text()
    (row,) = [x for x in md.splitlines() if x.startswith("| GEAR beats the baseline |")]
    assert row.split(" | ")[1] == f"**{verdict}**"
    diff, lo, hi = (float(x) for x in re.search(r"gear - ppo: (\S+) \[(\S+), (\S+)\]", row).groups())
    assert {"supported": lo > 0, "not supported": hi <= 0, "inconclusive": lo <= 0 < hi}[verdict]
    assert (diff > 0.5) if verdict == "supported" else (diff < -0.5) if verdict == "not supported" else abs(diff) < 0.5


@pytest.mark.slow
def test_compare_extends_an_experiment_with_algos_and_seeds(cli, tmp_path):
    out = tmp_path / "exp"
    assert cli("compare", "--algos", "ppo", "--out", out, "--no-progress", "--no-report", *TINY)[0] == 0
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/ppo/seed*/checkpoint.pt")}
    assert len(before) == 2

    code, stdout, err = cli("compare", "--algos", "ppo,ppo[ent_coef=0]", "--out", out, "--no-progress", *TINY,
                            "--seeds", "3")
    assert code == 0, err
    assert "extending" in err and "algo entry ppo[ent_coef=0]" in err and "seeds 3-3" in err
    assert "runs: 4 trained, 2 already finished, 0 failed\n" in stdout  # ppo seed 3 and the new entry's three seeds
    assert before == {p: p.stat().st_mtime_ns for p in before}
    spec = json.loads((out / "experiment.json").read_text())
    assert spec["algos"] == ["ppo", "ppo[ent_coef=0]"] and spec["seeds"] == 3
    table = json.loads((out / "report/stats.json").read_text())["table"]
    assert {(r["algo"], r["seeds"]) for r in table} == {("ppo", 3), ("ppo[ent_coef=0]", 3)}

    for extra, needle in ((["--total-steps", "2048"], "differs in: total_steps"),
                          (["--seeds", "2"], "--seeds 2 is fewer than its 3")):
        code, _, err = cli("compare", "--algos", "ppo,ppo[ent_coef=0]", "--out", out, "--no-progress", *TINY, *extra)
        assert_one_line_error(code, err, needle)
    assert json.loads((out / "experiment.json").read_text()) == spec


@pytest.mark.slow
def test_a_second_compare_on_a_running_experiment_stops(cli, tmp_path):
    fcntl = pytest.importorskip("fcntl")
    out = tmp_path / "exp"
    assert cli("compare", "--algos", "ppo", "--out", out, "--no-progress", "--no-report", *TINY)[0] == 0
    fd = os.open(out, os.O_RDONLY)  # what a running compare holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, _, err = cli("compare", "--algos", "ppo", "--out", out, "--no-progress", "--no-report", *TINY)
        assert_one_line_error(code, err, "another 'reflectrl compare' is running on")
    finally:
        os.close(fd)
    code, stdout, err = cli("compare", "--algos", "ppo", "--out", out, "--no-progress", "--no-report", *TINY)
    assert code == 0 and "runs: 0 trained, 2 already finished, 0 failed\n" in stdout, err


def _seed_steps(path: Path) -> int:
    try:
        return len((path / "metrics.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def _compare_running(args, out: Path, logged: int):
    """Start `compare` on CartPole (2 seeds) in its own session; return once both runs have
    logged `logged` iterations, with the experiment still running."""
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl", "compare", *args, "--out", str(out), "--no-progress",
                             "--no-report"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    seed_dirs = [out / "runs/CartPole-v1/ppo/seed1", out / "runs/CartPole-v1/ppo/seed2"]
    deadline = time.time() + 120
    while min(_seed_steps(d) for d in seed_dirs) < logged and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the experiment ended before it could be stopped"
    return proc, seed_dirs


@pytest.mark.slow
def test_killed_experiment_resumes_to_identical_weights(cli, tmp_path):
    args = ["--env", "CartPole-v1", "--algos", "ppo", "--seeds", "2", "--total-steps", "16384", "--workers", "2",
            "--set", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=2", "checkpoint_every=1000"]
    out = tmp_path / "exp"
    proc, seed_dirs = _compare_running(args, out, logged=40)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and both training processes
    proc.wait()
    assert all(json.loads((d / "run.json").read_text())["status"] == "running" for d in seed_dirs)

    code, stdout, err = cli("compare", *args, "--out", out, "--no-progress", "--no-report")
    assert code == 0, err
    # both had checkpoints
    assert "runs: 2 trained, 0 already finished, 0 failed (2 of the trained resumed from a checkpoint)" in stdout

    reference = tmp_path / "reference"
    assert cli("train", "--env", "CartPole-v1", "--seed", "2", "--total-steps", "16384", "--out", reference,
               "--no-progress", "--set", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=2",
               "checkpoint_every=1000")[0] == 0
    sha = lambda d: json.loads((d / "run.json").read_text())["params_sha256"]  # noqa: E731
    assert sha(seed_dirs[1]) == sha(reference)


@pytest.mark.slow
def test_sigterm_to_the_driver_stops_its_runs(tmp_path):
    """`kill PID` on compare must not leave training processes writing into the experiment."""
    out = tmp_path / "exp"
    args = ["--env", "CartPole-v1", "--algos", "ppo", "--seeds", "2", "--total-steps", "1000000", "--workers", "2",
            "--set", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1"]
    proc, _ = _compare_running(args, out, logged=1)
    proc.send_signal(signal.SIGTERM)  # the driver only, as `kill PID` does
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            survivors = True
        except ProcessLookupError:
            survivors = False
    assert proc.returncode == 143 and "terminated; continue with: reflectrl compare" in err.decode(), err  # as train
    assert not survivors, "training processes outlived the driver"


@pytest.mark.slow
def test_run_killed_before_first_checkpoint_restarts(cli, tmp_path):
    out = tmp_path / "exp"
    assert cli("compare", "--algos", "ppo", "--out", out, "--no-progress", "--no-report", *TINY)[0] == 0
    run = out / "runs/reflectrl_GridWorld-v0/ppo/seed1"
    sha = json.loads((run / "run.json").read_text())["params_sha256"]
    shutil.rmtree(run)
    run.mkdir()
    (run / "config.json").write_text("{}")  # debris of a run killed while starting
    code, stdout, err = cli("compare", "--algos", "ppo", "--out", out, "--no-progress", "--no-report", *TINY)
    assert code == 0 and "runs: 1 trained, 1 already finished, 0 failed\n" in stdout, err
    assert json.loads((run / "run.json").read_text())["params_sha256"] == sha


@pytest.mark.slow
def test_ray_backend_on_a_local_instance(cli, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "exp"
    code, stdout, err = cli("compare", "--algos", "ppo", "--out", out, "--no-progress", "--backend", "ray",
                            "--workers", "2", "--no-report", *TINY)
    assert code == 0, err
    assert "2 trained" in stdout
    local = tmp_path / "local"
    assert cli("compare", "--algos", "ppo", "--out", local, "--no-progress", "--no-report", *TINY)[0] == 0
    for seed in (1, 2):
        ray_run = json.loads((out / f"runs/reflectrl_GridWorld-v0/ppo/seed{seed}/run.json").read_text())
        local_run = json.loads((local / f"runs/reflectrl_GridWorld-v0/ppo/seed{seed}/run.json").read_text())
        assert ray_run["status"] == "finished"
        assert ray_run["params_sha256"] == local_run["params_sha256"]  # same work, wherever it ran
    assert "$ reflectrl train" in (out / "runs/reflectrl_GridWorld-v0/ppo/seed1.log").read_text()


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.mark.slow
def test_report_renders_in_headless_chromium(cli, tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing on CI: scripts/install_system_deps.sh should have installed it")
        pytest.skip("chromium not installed (scripts/install_system_deps.sh installs it)")
    out = tmp_path / "exp"
    assert cli("compare", "--algos", "ppo,ppo[ent_coef=0]", "--out", out, "--no-progress", *TINY)[0] == 0
    page = (out / "report/index.html").read_text()
    assert "<script" not in page and "http" not in page  # self-contained, opens offline
    # a copy with a probe that counts the images the browser actually decoded
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", "<script>window.addEventListener('load',()=>{const i=[...document.images];"
                                  "document.body.setAttribute('data-probe',i.length+':'+i.filter(x=>x.complete&&x.naturalWidth>100).length)})"
                                  "</script></body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync", "--no-first-run",
                          f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000", "--dump-dom",
                          probe.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-probe="4:4"' in dom  # curves, final-return intervals, diagnostics and exploration of the one env
    assert "Claims" in dom and "ppo[ent_coef=0]" in dom


def test_set_routing_to_algo_entries(tmp_path):
    from reflectrl.experiments.spec import ExperimentSpec

    spec = ExperimentSpec(envs=["CartPole-v1"], algos=["ppo", "refgrpo", "refgrpo[alpha=0]"], seeds=1,
                          total_steps=1000, sets=["refgrpo.alpha=0.2", "num_envs=2", "refgrpo.calibration.clip=none"])
    sets = {r.entry.label: list(r.argv[r.argv.index("--set") + 1:]) for r in spec.runs(tmp_path)}
    assert sets["ppo"] == ["num_envs=2"]
    assert sets["refgrpo"] == ["calibration.alpha=0.2", "num_envs=2", "calibration.clip=none"]
    assert sets["refgrpo[alpha=0]"][-1] == "calibration.alpha=0"  # the entry's own override wins


# ----------------------------------------------------------------------------- --preset

def test_compare_needs_env_algos_and_steps_without_a_preset(cli, tmp_path):
    out = tmp_path / "exp"
    code, _, err = cli("compare", "--algos", "ppo", "--out", out)
    assert_one_line_error(code, err, "compare needs --env, --total-steps (or a --preset that gives them)")
    code, _, err = cli("compare", "--preset", "atari57", "--out", out)
    assert_one_line_error(code, err, "--preset 'atari57': no such preset; use one of hard-exploration, maze15, "
                          "hppo-maze15, hppo-rooms16, hppo-rooms9, hppo-maze15-ablations, safety-grid8, safety-grid12, "
                          "safety-hopper, mappo-spread")
    assert not out.exists()


def test_every_preset_is_a_valid_experiment_and_gives_compare_its_wrapper(cli, tmp_path, monkeypatch):
    """Each preset's envs, entries, --set items and wrapper pass compare's checks (every entry's knobs, before any
    env is built), and compare hands the preset's wrapper to the experiment unless --wrapper replaces it."""
    from reflectrl.experiments import runner
    from reflectrl.experiments.presets import PRESETS
    from reflectrl.experiments.spec import ExperimentSpec

    for name, preset in PRESETS.items():
        assert preset.summary and preset.envs and preset.algos and preset.seeds >= 1, name
        ExperimentSpec(envs=list(preset.envs), algos=list(preset.algos), seeds=preset.seeds,
                       total_steps=preset.total_steps, wrapper=preset.wrapper, sets=list(preset.sets)).validate()
    given = []

    class Result:
        failed = []

        def summary(self):
            return "done"

    def fake_run_experiment(root, spec, **_):
        given.append(spec)
        return Result()

    monkeypatch.setattr(runner, "run_experiment", fake_run_experiment)
    for extra, wrapper in (([], "velocity-cost"), (["--wrapper", "sparse"], "sparse")):
        code, _, err = cli("compare", "--preset", "safety-hopper", *extra, "--out", tmp_path / "x", "--no-report")
        assert code == 0, err
        assert given[-1].wrapper == wrapper and given[-1].sets == ["cost_limit=25"]
        assert given[-1].algos == ["ppo", "ppo_lag", "ppo+shaping[safety_beta=1]"]


@pytest.mark.slow
def test_a_preset_fills_the_experiment_and_flags_replace_its_values(cli, tmp_path):
    from reflectrl.experiments.presets import PRESETS

    out = tmp_path / "exp"
    # the preset's env and --set items; its algos, seeds and budget replaced by the flags, a --set added
    code, _, err = cli("compare", "--preset", "maze15", "--algos", "ppo", "--seeds", "1", "--total-steps", "256",
                       "--set", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1",
                       "--out", out, "--no-progress", "--no-report")
    assert code == 0, err
    spec = json.loads((out / "experiment.json").read_text())
    assert spec["envs"] == list(PRESETS["maze15"].envs) and spec["algos"] == ["ppo"]
    assert spec["seeds"] == 1 and spec["total_steps"] == 256
    assert spec["sets"] == ["env.size=15", "env.layout=maze", "num_envs=2", "num_steps=64", "num_minibatches=2",
                            "update_epochs=1"]
    config = json.loads((out / "runs" / "reflectrl_GridWorld-v0" / "ppo" / "seed1" / "config.json").read_text())
    assert config["env"] == {"size": 15, "layout": "maze"}


def test_the_presets_are_what_the_docs_ran():
    """The maze preset is `make demo`'s experiment, and every preset's entries parse."""
    from reflectrl.experiments.presets import PRESETS

    makefile = (Path(__file__).parents[1] / "Makefile").read_text()
    demo_algos = re.search(r"^DEMO_ALGOS \?= (.+)$", makefile, re.M).group(1)
    maze = PRESETS["maze15"]
    assert demo_algos == ",".join(maze.algos)
    demo = makefile[makefile.index("demo: setup"):]
    assert f"--seeds {maze.seeds}" in demo and f"--total-steps {maze.total_steps}" in demo
    assert "--set " + " ".join(maze.sets) in demo
    hard = PRESETS["hard-exploration"]
    assert hard.sets == ("backend=envpool",) and len(hard.envs) == 4 and hard.seeds >= 3
    for preset in PRESETS.values():
        assert [e.label for e in parse_algos(",".join(preset.algos))] == list(preset.algos)


def test_first_seed_numbers_the_runs_and_is_part_of_what_an_experiment_is(tmp_path):
    from reflectrl.errors import UserError
    from reflectrl.experiments.spec import ExperimentSpec, load_or_create, read_spec

    spec = ExperimentSpec(envs=["CartPole-v1"], algos=["ppo"], seeds=2, total_steps=1000, first_seed=11)
    assert [r.seed for r in spec.runs(tmp_path)] == [11, 12] and spec.runs(tmp_path)[0].path.name == "seed11"
    load_or_create(tmp_path / "a", spec)
    assert read_spec(tmp_path / "a").seed_numbers == range(11, 13)
    with pytest.raises(UserError, match="differs in: first_seed"):
        load_or_create(tmp_path / "a", ExperimentSpec(envs=["CartPole-v1"], algos=["ppo"], seeds=2, total_steps=1000))
    # more seeds extend it past its last one
    assert load_or_create(tmp_path / "a", ExperimentSpec(envs=["CartPole-v1"], algos=["ppo"], seeds=3,
                                                         total_steps=1000, first_seed=11)) == ["seeds 13-13"]
    # an experiment.json written before the field existed reads as seeds from 1, and is written unchanged
    plain = ExperimentSpec(envs=["CartPole-v1"], algos=["ppo"], seeds=2, total_steps=1000)
    assert "first_seed" not in plain.to_dict() and list(plain.seed_numbers) == [1, 2]
    with pytest.raises(UserError, match="--first-seed 0"):
        ExperimentSpec(envs=["CartPole-v1"], algos=["ppo"], seeds=2, total_steps=1000, first_seed=0).validate()
