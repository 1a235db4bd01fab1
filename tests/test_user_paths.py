"""What a new user trips on (issue 36): each test here failed before its fix.

Run files of the wrong shape, outputs that cannot be written, budgets, messages and help:
every such failure is one line on stderr, a non-zero exit, no traceback and no partial file.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_resume import _metrics_rows as _rows

# ---------------------------------------------------------------------------- helpers


def _one_line_error(code, err, *needles):
    assert code != 0
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    """A finished 2,048-step PPO run on CartPole, copied by the tests that damage it."""
    from reflectrl.cli import main

    out = tmp_path_factory.mktemp("runs") / "cartpole"
    assert main(["train", "--env", "CartPole-v1", "--total-steps", "2048", "--out", str(out), "--no-progress",
                 "--set", "num_envs=2", "num_steps=64"]) == 0
    return out


def _copy(run, tmp_path, name="copy"):
    import shutil

    dst = tmp_path / name
    shutil.copytree(run, dst)
    return dst


# ---------------------------------------------------------------------------- 1. LLM resume and eval

LLM_SETS = ["prompts_per_step=2", "group_size=4", "eval_every=0", "checkpoint_every=1", "log_kl=false",
            "torch_threads=1"]  # the same threads in every process: float sums in the same order


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "gear"])
def test_llm_sigkill_and_resume_gives_identical_weights(cli, sft_arith_model_dir, tmp_path, algo):
    from conftest import SFT_ARITH
    from safetensors.torch import load_file

    argv = ["llm", "train", "--algo", algo, "--task", SFT_ARITH, "--model", str(sft_arith_model_dir),
            "--steps", "40", "--seed", "3", "--no-progress", "--set", *LLM_SETS]
    reference = tmp_path / "reference"
    code, _, err = cli(*argv, "--out", reference)
    assert code == 0, err

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl", *argv, "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while _rows(killed) < 10 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; raise --steps"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "model").exists()

    # an unfinished run is evaluated from its last checkpoint, saying so
    code, out, err = cli("llm", "eval", "--model", killed, "--task", SFT_ARITH, "--problems", "4", "--json")
    assert code == 0, err
    assert "unfinished" in err and "last checkpoint" in err
    assert json.loads(out)["checkpoint_step"] >= 1

    code, _, err = cli("llm", "train", "--resume", killed, "--no-progress")
    assert code == 0, err
    a, b = load_file(reference / "model" / "model.safetensors"), load_file(killed / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))


def test_llm_config_round_trips_with_sections():
    from reflectrl.trainers.grpo.config import LLMRunConfig, apply_llm_overrides, validate_llm

    cfg = LLMRunConfig(algo="gear", model="m")
    apply_llm_overrides(cfg, ["gear.top_frac=0.5"])
    validate_llm(cfg)
    again = LLMRunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again.sections["gear"].top_frac == 0.5 and again.to_dict() == cfg.to_dict()


def test_llm_out_of_an_existing_run_names_the_llm_resume(cli, tiny_model_dir, tmp_path):
    from reflectrl.runs import RunDir

    out = tmp_path / "run"
    RunDir.create(out, {"algo": "grpo", "task": "arith", "model": "m", "steps": 2, "grpo": {}}).unlock()
    code, _, err = cli("llm", "train", "--model", tiny_model_dir, "--out", out)
    _one_line_error(code, err, f"reflectrl llm train --resume {out}")


# ---------------------------------------------------------------------------- 5. run files of the wrong shape

@pytest.mark.parametrize("name, content, command", [
    ("config.json", "[1, 2]", "eval"),
    ("config.json", "{}", "eval"),
    ("config.json", '{"algo": "ppo"}', "eval"),
    ("config.json", '"text"', "resume"),
    ("run.json", "[1]", "resume"),
    ("run.json", "\xff\xfe", "resume"),
    ("config.json", "ppo-is-int", "eval"),
])
def test_run_files_of_the_wrong_shape_are_one_line(cli, cartpole_run, tmp_path, name, content, command):
    run = _copy(cartpole_run, tmp_path)
    if content == "ppo-is-int":
        config = json.loads((run / "config.json").read_text())
        config["ppo"] = 5
        content = json.dumps(config)
    (run / "run.json").write_text(json.dumps({"status": "running"}))  # so that resume reads everything
    (run / name).write_bytes(content.encode("latin-1"))
    argv = ["eval", run, "--episodes", "1"] if command == "eval" else ["train", "--resume", run, "--no-progress"]
    code, out, err = cli(*argv)
    _one_line_error(code, err, str(run) if name == "run.json" or content.startswith(("[", '"')) else "config")
    assert "network" not in err  # `{}` used to be read as a default config whose shapes differ


def test_a_corrupt_experiment_spec_is_one_line(cli, tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment.json").write_text("[1]")
    code, _, err = cli("report", exp)
    _one_line_error(code, err, "experiment.json")


# ---------------------------------------------------------------------------- 7. the resume command named

def test_out_of_a_finished_run_says_how_to_read_it(cli, cartpole_run):
    code, _, err = cli("train", "--env", "CartPole-v1", "--out", cartpole_run)
    _one_line_error(code, err, f"reflectrl eval {cartpole_run}")


@pytest.mark.parametrize("argv", [["eval", "RUN", "--episodes", "1", "--video", "/proc/v.mp4"],
                                  ["plot", "state-map", "RUN", "--out", "/proc/maps"]])
def test_an_output_in_proc_is_refused_before_the_work(cli, cartpole_run, argv):
    """os.access says yes to root even in /proc, where no file can be made: the check before the work
    tries to make one (outputs.check_writable), so the refusal is its line, exit 2, not a failed write after."""
    code, _, err = cli(*[str(cartpole_run) if a == "RUN" else a for a in argv])
    _one_line_error(code, err, "/proc is not writable")
    assert code == 2


# ---------------------------------------------------------------------------- 2. refused IMPALA runs

IMPALA = ["train", "--algo", "impala", "--env", "CartPole-v1", "--total-steps", "800", "--no-progress",
          "--set", "unroll_length=25"]


def test_impala_with_an_unreachable_ray_address_leaves_no_run_dir(cli, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "r"
    started = time.time()
    code, _, err = cli(*IMPALA, "--out", out, "--ray-address", "127.0.0.1:1")
    _one_line_error(code, err, "--ray-address 127.0.0.1:1: cannot reach a Ray cluster")
    assert not out.exists()
    assert time.time() - started < 30  # refused by a probe, not after Ray's minute of retries


def test_impala_without_ray_leaves_no_run_dir(cli, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    out = tmp_path / "r"
    code, _, err = cli(*IMPALA, "--out", out)
    _one_line_error(code, err, "needs Ray: pip install 'reflectrl[ray]'")
    assert not out.exists()


@pytest.mark.slow
def test_impala_resume_overrides_a_stored_unreachable_address(cli, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "r"
    code, _, err = cli(*IMPALA[:6], "2000", *IMPALA[7:], "--out", out, "--set", "actors=inline", "checkpoint_every=100")
    assert code == 0, err
    # as if it had run on a cluster that is gone now, and was interrupted
    config = json.loads((out / "config.json").read_text())
    config["impala"].update(actors="ray", ray_address="127.0.0.1:1", synchronous=True)
    (out / "config.json").write_text(json.dumps(config))
    (out / "run.json").write_text(json.dumps({"status": "interrupted"}))
    code, _, err = cli("train", "--resume", out, "--no-progress")
    _one_line_error(code, err, "--ray-address local")
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"  # not marked running
    code, _, err = cli("train", "--resume", out, "--no-progress", "--ray-address", "local")
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["status"] == "finished"


# ---------------------------------------------------------------------------- 3. defaults resolve; refusals in words

def test_mappo_gear_runs_with_defaults(cli, tmp_path):
    pytest.importorskip("mpe2")
    out = tmp_path / "r"
    code, _, err = cli("train", "--algo", "mappo+gear", "--env", "pettingzoo:mpe2.simple_spread_v3", "--total-steps",
                       "512", "--out", out, "--no-progress", "--set", "num_steps=64")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["sections"]["gear"]["inputs"] == "obs"


def test_gear_auto_inputs_resolve_to_features_on_ppo():
    from reflectrl.trainers.resolve import new_run_config

    cfg = new_run_config(algo="gear", env_id="CartPole-v1", total_steps=1024)
    assert cfg.sections["gear"].inputs == "features"


@pytest.mark.parametrize("argv, needles", [
    (["train", "--algo", "mappo+rnd", "--env", "pettingzoo:mpe2.simple_spread_v3"],
     ["a value head of its own", "reflectrl train --algo ppo+rnd"]),
    (["train", "--algo", "mappo+count", "--env", "pettingzoo:mpe2.simple_spread_v3"],
     ["a key per visited state", "ppo+count"]),
    (["llm", "train", "--algo", "grpo+rnd", "--model", "m"],
     ["works on env steps", "generated tokens", "reflectrl train --algo ppo+rnd"]),
    (["train", "--algo", "grpo+gear"], ["algo of 'reflectrl llm train'", "reflectrl llm train --algo grpo+gear"]),
    (["llm", "train", "--algo", "ppo+gear", "--model", "m"], ["algo of 'reflectrl train'",
                                                              "reflectrl train --algo ppo+gear"]),
    (["train", "--algo", "mappo+gear", "--env", "pettingzoo:mpe2.simple_spread_v3", "--set", "gear.inputs=features"],
     ["the policy's hidden features", "change the knob", "ppo+gear"]),
])
def test_refusals_say_what_is_missing_in_words_and_where_it_runs(cli, tmp_path, argv, needles):
    out = tmp_path / "r"
    code, _, err = cli(*argv, "--out", out)
    _one_line_error(code, err, *needles)
    assert "did you mean refgrpo" not in err and "value_stream," not in err
    assert not out.exists()


# ---------------------------------------------------------------------------- 4. outputs that cannot be written

@pytest.fixture(scope="module")
def finished_experiment(tmp_path_factory):
    """A finished 2-entry experiment (refgrpo for the calibration plot), shared by the output tests."""
    from reflectrl.cli import main

    out = tmp_path_factory.mktemp("exp") / "exp"
    assert main(["compare", "--env", "CartPole-v1", "--algos", "ppo,refgrpo", "--seeds", "1", "--total-steps", "1024",
                 "--out", str(out), "--no-progress", "--no-report", "--workers", "1", "--set", "num_envs=2",
                 "num_steps=64"]) == 0
    return out


def _runs(exp):
    return exp / "runs" / "CartPole-v1" / "ppo" / "seed1", exp / "runs" / "CartPole-v1" / "refgrpo" / "seed1"


@pytest.mark.parametrize("what", ["video-missing-dir", "video-under-a-file", "calibration-under-a-file",
                                  "state-map-under-a-file", "report-is-a-file"])
def test_unwritable_outputs_are_refused_before_the_work(cli, finished_experiment, tmp_path, what):
    ppo, refgrpo = _runs(finished_experiment)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    argv = {
        "video-missing-dir": ["eval", ppo, "--video", tmp_path / "no" / "such" / "x.mp4"],
        "video-under-a-file": ["eval", ppo, "--video", a_file / "x.mp4"],
        "calibration-under-a-file": ["plot", "calibration", refgrpo, "--out", a_file / "c.png"],
        "state-map-under-a-file": ["plot", "state-map", ppo, "--out", a_file / "maps"],
        "report-is-a-file": ["report", tmp_path / "exp"],
    }[what]
    if what == "report-is-a-file":
        import shutil

        shutil.copytree(finished_experiment, tmp_path / "exp")
        (tmp_path / "exp" / "report").write_text("not a folder")
    code, out, err = cli(*argv)
    _one_line_error(code, err)
    assert code == 2


@pytest.mark.slow
def test_a_disk_that_fills_during_a_plot_leaves_no_partial_files(cli, finished_experiment, tmp_path, monkeypatch):
    import errno

    ppo, _ = _runs(finished_experiment)
    writes = {"n": 0}
    real_fsync = os.fsync

    def fsync(fd):
        writes["n"] += 1
        if writes["n"] == 3:  # the third file: two are written, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    out = tmp_path / "maps"
    code, _, err = cli("plot", "state-map", ppo, "--out", out)
    _one_line_error(code, err, "cannot write", "No space left on device", "free space")
    assert not out.exists()  # neither the two files written nor the folder


@pytest.mark.slow
def test_a_disk_that_fills_during_the_report_keeps_the_old_report(cli, finished_experiment, tmp_path, monkeypatch):
    import errno
    import shutil

    exp = tmp_path / "exp"
    shutil.copytree(finished_experiment, exp)
    assert cli("report", exp, "--reps", "200")[0] == 0
    before = {p.name: p.read_bytes() for p in (exp / "report").iterdir()}
    real_fsync, writes = os.fsync, {"n": 0}

    def fsync(fd):
        writes["n"] += 1
        if writes["n"] == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code, _, err = cli("report", exp, "--reps", "300")
    assert code == 1 and "No space left on device" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (exp / "report").iterdir()} == before
    assert not (exp / "report.partial").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_read_only_location_is_named(cli, finished_experiment, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        ppo, _ = _runs(finished_experiment)
        code, _, err = cli("eval", ppo, "--episodes", "1", "--video", ro / "v.mp4")
        _one_line_error(code, err, "read-only")
    finally:
        subprocess.run(["umount", str(ro)])


# ---------------------------------------------------------------------------- 6. LLM options checked

@pytest.mark.parametrize("argv, needle", [
    (["init-tiny", "--vocab-size", "10"], "at least 258"),
    (["init-tiny", "--layers", "0"], "--layers 0"),
    (["init-tiny", "--heads", "0"], "--heads 0"),
    (["sft", "--model", "TINY", "--task", "arith", "--steps", "2", "--lr", "-1"], "--lr -1"),
    (["sft", "--model", "TINY", "--task", "arith", "--steps", "2", "--lr", "nan"], "--lr nan"),
    (["sft", "--model", "TINY", "--task", "arith", "--steps", "2", "--device", "gpu"], "--device gpu"),
])
def test_llm_options_out_of_range_are_one_line(cli, tiny_model_dir, tmp_path, argv, needle):
    out = tmp_path / "out"
    argv = [str(tiny_model_dir) if a == "TINY" else a for a in argv]
    code, _, err = cli("llm", *argv, "--out", out)
    _one_line_error(code, err, needle)
    assert not out.exists()


# ---------------------------------------------------------------------------- 8. budgets

@pytest.mark.parametrize("argv, trained", [
    pytest.param(["--algo", "sac", "--env", "Pendulum-v1", "--total-steps", "700", "--set", "learning_starts=200",
                  "log_every=500", "batch_size=32"], 700, marks=pytest.mark.slow),
    (["--algo", "dqn", "--env", "CartPole-v1", "--total-steps", "1500", "--set", "learning_starts=500",
      "log_every=1000"], 1500),
])
def test_replay_trainers_train_exactly_the_budget(cli, tmp_path, argv, trained):
    out = tmp_path / "r"
    code, _, err = cli("train", *argv, "--out", out, "--no-progress")
    assert code == 0, err
    assert "note:" not in err
    assert json.loads((out / "run.json").read_text())["global_step"] == trained


def test_a_rounded_budget_is_said_at_the_start(cli, tmp_path):
    out = tmp_path / "r"
    code, _, err = cli("train", "--env", "CartPole-v1", "--total-steps", "1000", "--out", out, "--no-progress",
                       "--set", "num_envs=2", "num_steps=256")
    assert code == 0, err
    assert ("note: --total-steps 1,000 is not a multiple of one iteration's 512 env steps (num_envs x num_steps); "
            "training 1,024 env steps (2 iterations)") in err
    assert json.loads((out / "run.json").read_text())["global_step"] == 1024


def test_a_rounded_default_budget_says_it_is_the_default():
    """A user who gave no --total-steps is told that the budget rounded is the default one."""
    from types import SimpleNamespace

    from reflectrl.config import RunConfig
    from reflectrl.trainers.base import EnvStepTrainer

    def note(total_steps):
        trainer = SimpleNamespace(cfg=SimpleNamespace(total_steps=total_steps), num_iterations=196,
                                  iteration_knobs="num_envs x num_steps", total_units=lambda: 100_352)
        return EnvStepTrainer.budget_note(trainer)

    assert note(RunConfig().total_steps).startswith("--total-steps 100,000 (the default) is not a multiple")
    assert note(99_999).startswith("--total-steps 99,999 is not a multiple")


# ---------------------------------------------------------------------------- 9. messages

@pytest.mark.parametrize("argv", [
    ["train", "--env", "CartPole-v1", "--total-steps", "99999999999999999999"],
    ["compare", "--env", "CartPole-v1", "--algos", "ppo", "--total-steps", "99999999999999999999"],
    ["llm", "train", "--model", "m", "--steps", "10000000000000"],
])
def test_budgets_no_run_finishes_are_refused(cli, tmp_path, argv):
    out = tmp_path / "r"
    code, _, err = cli(*argv, "--out", out)
    _one_line_error(code, err, "above the limit of 10^12")
    assert not out.exists()


@pytest.mark.slow
def test_compare_terminated_exits_143_with_the_command_that_resumes_it(tmp_path):
    out = tmp_path / "exp"
    argv = [sys.executable, "-m", "reflectrl", "compare", "--env", "CartPole-v1", "--algos", "ppo", "--seeds", "1",
            "--total-steps", "400000", "--out", str(out), "--no-progress", "--workers", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = out / "runs" / "CartPole-v1" / "ppo" / "seed1"
    deadline = time.time() + 120
    while _rows(run) < 2 and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "terminated; continue with: reflectrl compare --env CartPole-v1 --algos ppo" in err


@pytest.mark.slow
def test_a_report_where_nothing_varies_names_no_threshold_and_says_why_seeds_are_0(cli, tmp_path):
    out = tmp_path / "exp"
    base = ["compare", "--env", "reflectrl/GridWorld-v0", "--seeds", "1", "--total-steps", "512", "--out", out,
            "--no-progress", "--workers", "1", "--no-report", "--set", "env.size=12", "env.layout=maze",
            "num_envs=2", "num_steps=128"]
    code, _, err = cli(*base, "--algos", "ppo,ppo[env.max_episode_steps=20]")
    assert code == 0, err
    from reflectrl.report.analysis import load_experiment, summary_table
    from reflectrl.report.render import _table_rows

    table = summary_table(load_experiment(out), reps=200)
    rows = {r["algo"]: r for r in table}
    assert rows["ppo"]["seeds"] == 0 and "no episode ended" in rows["ppo"]["why"]
    assert rows["ppo[env.max_episode_steps=20]"]["seeds"] == 1
    cells = {r[1]: r for r in _table_rows(table)}
    assert "no episode ended in its 1 finished run(s)" in cells["ppo"][2]
    assert cells["ppo[env.max_episode_steps=20]"][8] == "– (every return the same)"


def test_eval_says_when_episodes_were_cut_by_a_time_limit(cli, tmp_path):
    out = tmp_path / "r"
    assert cli("train", "--env", "reflectrl/GridWorld-v0", "--total-steps", "256", "--out", out, "--no-progress",
               "--set", "env.size=12", "env.max_episode_steps=15", "num_envs=2", "num_steps=128")[0] == 0
    code, text, err = cli("eval", out, "--episodes", "2")
    assert code == 0, err
    assert "episode(s) ran to the env's time limit" in text  # information: the env's own episode length
    code, text, _ = cli("eval", out, "--episodes", "2", "--json")
    assert json.loads(text)["truncated_episodes"] >= 1


def test_calibration_metrics_are_null_where_no_confidence_was_stated():
    from reflectrl.llm.calibration import CONFIDENCE_KEYS, calibration_metrics
    from reflectrl.llm.tasks.reflect import Reflection

    metrics = calibration_metrics([True, False], [Reflection(), Reflection()])
    assert metrics["reflection_missing_rate"] == 1.0
    assert all(metrics[k] is None for k in CONFIDENCE_KEYS)
    stated = calibration_metrics([True, False], [Reflection(confidence=0.9), Reflection()])
    assert stated["ece"] is not None and stated["mean_confidence"] == pytest.approx(0.7)


# ---------------------------------------------------------------------------- 11. noise

def test_state_map_snapshots_keeps_that_many(cli, tmp_path):
    from reflectrl.runs.state_samples import load_samples

    out = tmp_path / "r"
    assert cli("train", "--env", "CartPole-v1", "--total-steps", "2048", "--out", out, "--no-progress", "--set",
               "num_envs=2", "num_steps=64", "state_map_snapshots=5")[0] == 0
    assert sorted(load_samples(out / "state_samples.npz")) == [1, 4, 8, 12, 16]


@pytest.mark.slow
def test_impala_signals_raise_no_numpy_warning(tmp_path):
    pytest.importorskip("ray")
    # Ray hands the learner read-only arrays (its object store): torch warned on each
    done = subprocess.run([sys.executable, "-m", "reflectrl", "train", "--algo", "impala+shaping", "--env",
                           "CartPole-v1", "--total-steps", "1600", "--out", str(tmp_path / "r"), "--no-progress",
                           "--set", "unroll_length=25"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr


def test_mujoco_warnings_are_said_once(capfd, monkeypatch):
    pytest.importorskip("mujoco")
    from reflectrl import envs
    from reflectrl.envs import make_env

    monkeypatch.setattr(envs, "_MUJOCO_SEEN", set())  # as in a fresh process

    with pytest.warns(UserWarning, match="MuJoCo: compiler attribute 'settotalmass' is deprecated") as caught:
        for _ in range(2):
            make_env("HalfCheetah-v5", learning=False).close()
    assert sum("settotalmass" in str(w.message) for w in caught) == 1
    assert "settotalmass" not in capfd.readouterr().err  # not printed by MuJoCo itself


# ---------------------------------------------------------------------------- 12. help

def _actions(parser, path=("reflectrl",)):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, (*path, name))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield " ".join(path), action


def test_every_option_has_help_and_shows_its_default():
    from reflectrl.cli import build_parser

    missing, hidden = [], []
    for where, action in _actions(build_parser()):
        name = f"{where} {action.option_strings[0] if action.option_strings else action.dest}"
        if not action.help:
            missing.append(name)
        elif action.option_strings and action.default not in (None, False) and "default" not in action.help:
            hidden.append(f"{name} (default {action.default!r})")
    assert not missing, f"options without help: {missing}"
    assert not hidden, f"options whose help hides the default: {hidden}"


def test_help_names_every_env_family_and_every_knob_section(cli):
    from reflectrl.knobs import section_names, sections

    assert section_names() == list(sections())
    with pytest.raises(SystemExit):
        cli("train", "--help")
    from reflectrl.cli import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for family in ("MiniGrid", "ALE/", "pettingzoo:", "reflectrl/GridWorld-v0"):
        assert family in text, family
    knobs = build_parser()._subparsers._group_actions[0].choices["knobs"].format_help()
    assert all(name in knobs for name in section_names())


def test_sft_and_train_default_to_the_same_device():
    from reflectrl.cli import build_parser
    from reflectrl.trainers.grpo.config import LLMRunConfig

    llm = build_parser()._subparsers._group_actions[0].choices["llm"]
    sft = llm._subparsers._group_actions[0].choices["sft"].format_help()
    assert f"(default {LLMRunConfig.device}, as for llm train)" in " ".join(sft.split())


@pytest.mark.parametrize("argv", [["--help"], ["train", "--algo", "ppo+gear", "--resume", "NOPE"]])
def test_help_and_parsing_import_no_torch(argv):
    # the signals' registrations (signals/NAME/__init__.py: knobs, no torch) load with reflectrl; their forms do not
    code = ("import sys, atexit\n"
            "atexit.register(lambda: print('TORCH', 'torch' in sys.modules, 'SIGNALS', "
            "any(m.startswith('reflectrl.signals.') and m.endswith(('.torch', '.jax', '.base', '.jax_base'))"
            " for m in sys.modules)))\n"
            "from reflectrl.cli import build_parser\n"
            f"build_parser().parse_args({argv!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "TORCH False SIGNALS False" in done.stdout, done.stdout + done.stderr
