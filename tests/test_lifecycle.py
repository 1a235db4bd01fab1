"""A run's life as a new user meets it (issue 13): one process per run directory, SIGTERM and
a full disk leave the run resumable and say so, eval cannot hang, bad input is one line, and
runs that go wrong while staying finite are warned about."""

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
from test_cli_errors import FAST, assert_one_line_error

CARTPOLE = ["--env", "CartPole-v1", *FAST]


def _spawn(*argv):
    return subprocess.Popen([sys.executable, "-m", "reflectrl", *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for_checkpoint(out, proc, timeout=60):
    deadline = time.time() + timeout
    while not (out / "checkpoint.pt").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "no checkpoint written"
        time.sleep(0.1)


# ---------------------------------------------------------------------------- 2. one process per run

@pytest.mark.slow
def test_a_run_being_trained_cannot_be_trained_twice(cli, tmp_path):
    out = tmp_path / "run"
    proc = _spawn("train", *CARTPOLE, "--total-steps", 2_000_000, "--out", out)
    try:
        _wait_for_checkpoint(out, proc)
        code, _, err = cli("train", "--resume", out)
        assert_one_line_error(code, err, "being trained by another process")
        code, _, err = cli("llm", "train", "--resume", out)
        assert code == 2 and "being trained" not in err  # refused for its kind before the lock is tried
    finally:
        proc.kill()  # SIGKILL: no chance to clean anything up
        proc.wait()
    # the killed process's lock died with it: a stale lock never blocks
    from reflectrl.runs import RunDir
    from reflectrl.runs.session import open_to_resume

    run = open_to_resume(str(out), [])
    assert isinstance(run, RunDir)
    run.unlock()


def test_lock_is_per_directory_and_released(tmp_path):
    from reflectrl.errors import UserError
    from reflectrl.runs import RunDir

    run = RunDir.create(tmp_path / "run", {"env_id": "x"})
    other = RunDir(tmp_path / "run")
    with pytest.raises(UserError, match="being trained by another process"):
        other.lock()
    run.unlock()
    other.lock()  # free again once the holder lets go
    other.unlock()


# ---------------------------------------------------------------------------- 3. SIGTERM

@pytest.mark.slow
def test_sigterm_checkpoints_marks_interrupted_and_resumes_identically(cli, tmp_path):
    steps = ["--total-steps", 40_000, "--set", "checkpoint_every=1000000"]
    assert cli("train", *CARTPOLE, *steps, "--out", tmp_path / "ref")[0] == 0
    reference = json.loads((tmp_path / "ref" / "run.json").read_text())["params_sha256"]

    out = tmp_path / "run"
    proc = _spawn("train", *CARTPOLE, *steps, "--out", out)
    _wait_for_checkpoint(out, proc)  # the step-0 checkpoint: training has started
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == 143, err
    assert "reflectrl: terminated at step " in err and ", checkpointed there; continue with: reflectrl train --resume" \
        in err and "Traceback" not in err
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "interrupted"
    # the checkpoint was written at the iteration where SIGTERM arrived, not only at step 0
    import torch

    saved = torch.load(out / "checkpoint.pt", weights_only=False)["global_step"]
    assert 0 < saved < 40_000
    assert status["global_step"] == saved
    code, _, err = cli("train", "--resume", out)
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["params_sha256"] == reference


def _checkpoint_step(out) -> int:
    import torch

    return torch.load(out / "checkpoint.pt", weights_only=False)["global_step"]


# 16 iterations of 64 env steps, a checkpoint every 4
CTRL_C_RUN = [*CARTPOLE, "--total-steps", 1024, "--set", "checkpoint_every=256"]


def test_ctrl_c_stops_at_the_iteration_end_with_a_checkpoint_there(cli, tmp_path, monkeypatch, ctrl_c_after_rows):
    """Ctrl-C once: the run stops where the iteration ends, checkpointed there, so run.json, the checkpoint and
    eval agree and nothing is trained twice; the resumed run ends with the weights of one never stopped."""
    assert cli("train", *CTRL_C_RUN, "--out", tmp_path / "ref")[0] == 0
    reference = json.loads((tmp_path / "ref" / "run.json").read_text())["params_sha256"]

    out = tmp_path / "run"
    ctrl_c_after_rows(5)  # step 320: between two cadence checkpoints (256, 512)
    code, _, err = cli("train", *CTRL_C_RUN, "--out", out)
    monkeypatch.undo()
    assert code == 130, err
    assert "stopping at the end of this iteration" in err and "Traceback" not in err
    assert "reflectrl: interrupted at step 320, checkpointed there; continue with: reflectrl train --resume" in err
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "interrupted" and status["global_step"] == _checkpoint_step(out) == 320
    code, stdout, _ = cli("eval", out, "--episodes", 1, "--json")
    assert code == 0 and json.loads(stdout)["global_step"] == 320
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back after training
    code, _, err = cli("train", "--resume", out)
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["params_sha256"] == reference


def test_ctrl_c_twice_stops_at_once_and_says_where_it_resumes(cli, tmp_path, monkeypatch, ctrl_c_after_rows):
    """Ctrl-C twice stops at once, between checkpoints: run.json records the step of the checkpoint it resumes
    from (what eval reads), and the closing line says how many steps are trained again."""
    assert cli("train", *CTRL_C_RUN, "--out", tmp_path / "ref")[0] == 0
    reference = json.loads((tmp_path / "ref" / "run.json").read_text())["params_sha256"]

    out = tmp_path / "run"
    ctrl_c_after_rows(7, times=2)  # step 448; the last checkpoint is 256's
    code, _, err = cli("train", *CTRL_C_RUN, "--out", out)
    monkeypatch.undo()
    assert code == 130, err
    assert ("reflectrl: interrupted at step 448; it resumes from its last checkpoint, step 256 (the 192 env steps "
            "after it are trained again); continue with: reflectrl train --resume") in err
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "interrupted" and status["global_step"] == _checkpoint_step(out) == 256
    code, _, err = cli("train", "--resume", out)
    assert code == 0, err
    assert json.loads((out / "run.json").read_text())["params_sha256"] == reference


# ---------------------------------------------------------------------------- 4. disk full

def test_disk_full_keeps_the_checkpoint_cleans_up_and_says_so(cli, tmp_path, monkeypatch):
    import reflectrl.runs.rundir as rundir

    out = tmp_path / "run"
    real_fsync = os.fsync
    calls = {"n": 0}

    def full_after_first_checkpoint(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".checkpoint.pt.tmp"):
            calls["n"] += 1
            if calls["n"] > 1:
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(rundir.os, "fsync", full_after_first_checkpoint)
    code, _, err = cli("train", *CARTPOLE, "--total-steps", 512, "--set", "checkpoint_every=128", "--out", out)
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("reflectrl: error")]
    assert len(lines) == 1 and "Traceback" not in err
    assert str(out) in lines[0] and "No space left on device" in lines[0] and "--resume" in lines[0]
    assert not (out / ".checkpoint.pt.tmp").exists()
    monkeypatch.setattr(rundir.os, "fsync", real_fsync)
    from reflectrl.runs import RunDir

    assert RunDir(out).load_checkpoint()["global_step"] == 0  # the last good one
    assert json.loads((out / "run.json").read_text())["status"] == "failed"


def test_disk_full_before_any_checkpoint_does_not_promise_one(cli, tmp_path, monkeypatch):
    import reflectrl.runs.rundir as rundir

    out = tmp_path / "run"
    real_fsync = os.fsync

    def always_full(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".checkpoint.pt.tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(rundir.os, "fsync", always_full)
    code, _, err = cli("train", *CARTPOLE, "--total-steps", 256, "--out", out)
    assert code == 1
    lines = [line for line in err.splitlines() if line.startswith("reflectrl: error")]
    assert len(lines) == 1 and "No space left on device" in lines[0]
    assert "no checkpoint was written yet" in lines[0] and "--resume" not in lines[0]
    assert not (out / "checkpoint.pt").exists() and not (out / ".checkpoint.pt.tmp").exists()


def test_atomic_write_removes_its_temporary_file_on_failure(tmp_path, monkeypatch):
    import reflectrl.runs.rundir as rundir

    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def fail(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir.os, "fsync", fail)
    with pytest.raises(OSError):
        rundir.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


# ---------------------------------------------------------------------------- 1. eval cannot hang

def test_eval_caps_episodes_of_an_env_without_time_limit(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("train", "--env", "CliffWalking-v1", *FAST, "--total-steps", 128, "--out", out)
    assert code == 0, err
    code, out_text, err = cli("eval", out, "--episodes", 2, "--deterministic", "--max-steps", 300, "--json")
    assert code == 0, err
    result = json.loads(out_text)
    assert result["max_steps"] == 300
    # an untrained greedy policy on CliffWalking walks into a wall forever: each episode is cut
    assert result["capped_episodes"] == 2 and result["mean_length"] == 300
    code, out_text, _ = cli("eval", out, "--episodes", 1, "--deterministic", "--max-steps", 50)
    assert code == 0 and "1 of 1 episode(s) stopped at eval's 50-step cap (--max-steps)" in out_text
    code, out_text, _ = cli("eval", out, "--episodes", 1, "--deterministic", "--json")
    assert json.loads(out_text)["max_steps"] == 10_000  # no time limit: the default cap


def test_eval_tells_the_envs_own_time_limit_from_its_cap(cli, tmp_path):
    """Issue 57 item 8: eval on Pendulum-v1 (every episode ends at its time limit: that is its episode)
    said "3 of 3 episode(s) cut by a time limit: their return is the partial sum", as if something were
    wrong. The env's own limit is said as information; only eval's cap makes a partial return."""
    out = tmp_path / "run"
    assert cli("train", "--env", "Pendulum-v1", *FAST, "--total-steps", 128, "--out", out)[0] == 0
    code, text, err = cli("eval", out, "--episodes", 2)
    assert code == 0, err
    assert "; 2 of 2 episode(s) ran to the env's time limit; params_sha256" in text and "partial" not in text
    code, text, err = cli("eval", out, "--episodes", 2, "--max-steps", 50)
    assert code == 0, err
    assert ("; 2 of 2 episode(s) stopped at eval's 50-step cap (--max-steps): their return is a partial sum; "
            "params_sha256") in text and "time limit" not in text
    assert json.loads(cli("eval", out, "--episodes", 2, "--json")[1])["truncated_episodes"] == 2  # as before


def test_eval_uses_the_env_time_limit_as_cap(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("train", *CARTPOLE, "--total-steps", 128, "--out", out)[0] == 0
    code, out_text, err = cli("eval", out, "--episodes", 1, "--json")
    result = json.loads(out_text)
    assert result["max_steps"] == 500 and result["capped_episodes"] == 0
    assert result["returns"][0] == result["mean_length"]  # CartPole pays 1 per step: the sum is the true return


# ---------------------------------------------------------------------------- 5, 6, 11, 12: one line, exit 2

@pytest.mark.parametrize("out", ["/proc/reflectrl-x", "/sys/reflectrl-x/y", "FILE/sub"])
def test_out_that_cannot_be_created(cli, tmp_path, out):
    if out.startswith("FILE"):
        (tmp_path / "FILE").write_text("a file")
        out = str(tmp_path / out)
    code, _, err = cli("train", *CARTPOLE, "--total-steps", 128, "--out", out)
    assert_one_line_error(code, err, "cannot create the directory")
    code, _, err = cli("compare", "--env", "CartPole-v1", "--algos", "ppo", "--seeds", 1, "--total-steps", 128,
                       "--out", out, "--no-progress", "--set", *FAST[2:])
    assert_one_line_error(code, err, "cannot create the directory")


@pytest.mark.parametrize("seed", ["99999999999999999999", str(2**32)])
def test_seed_out_of_range(cli, tmp_path, seed):
    code, _, err = cli("train", *CARTPOLE, "--seed", seed, "--out", tmp_path / "run")
    assert_one_line_error(code, err, f"--seed {seed}", "2**32 - 1")
    assert not (tmp_path / "run").exists()


def test_largest_seed_is_accepted(cli, tmp_path):
    code, _, err = cli("train", *CARTPOLE, "--seed", 2**32 - 1, "--total-steps", 64, "--out", tmp_path / "run")
    assert code == 0, err


def test_minibatch_of_one_with_norm_adv_is_refused(cli, tmp_path):
    argv = ["train", "--env", "CartPole-v1", "--no-progress", "--total-steps", 64, "--out", tmp_path / "run",
            "--set", "num_envs=1", "num_steps=1", "num_minibatches=1"]
    code, _, err = cli(*argv)
    assert_one_line_error(code, err, "minibatches of 1 sample", "norm_adv")
    code, _, err = cli(*argv, "norm_adv=false")
    assert code == 0, err


def test_report_of_a_missing_directory(cli, tmp_path):
    code, _, err = cli("report", tmp_path / "nope")
    assert_one_line_error(code, err, "does not exist")


# ---------------------------------------------------------------------------- 8, 9, 10, 13: run kinds, models

def _fake_llm_run(path):
    from reflectrl.runs import RunDir
    from reflectrl.trainers.grpo.config import LLMRunConfig

    run = RunDir.create(path, LLMRunConfig(model="m").to_dict())
    run.unlock()
    return run


def test_llm_resume_of_an_env_run_names_the_right_command(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("train", *CARTPOLE, "--total-steps", 64, "--out", out)[0] == 0
    code, _, err = cli("llm", "train", "--resume", out)
    assert_one_line_error(code, err, "reflectrl train --resume")


@pytest.mark.parametrize("command", [["train", "--resume"], ["eval"]])
def test_env_commands_on_an_llm_run_name_the_llm_commands(cli, tmp_path, command):
    _fake_llm_run(tmp_path / "llm")
    code, _, err = cli(*command, tmp_path / "llm")
    assert_one_line_error(code, err, "language-model run", "reflectrl llm")


def test_llm_model_may_be_a_run_directory(tmp_path, tiny_model_dir):
    import shutil

    from reflectrl.errors import UserError
    from reflectrl.llm.model import load_model

    run = _fake_llm_run(tmp_path / "llm")
    with pytest.raises(UserError, match="run directory without a saved policy"):
        load_model(str(run.path))
    shutil.copytree(tiny_model_dir, run.path / "model")
    model, tokenizer = load_model(str(run.path))
    # an env run given as --model names the commands that take it (not 'llm train --resume')
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "run.json").write_text("{}")
    (tmp_path / "env" / "config.json").write_text(json.dumps({"algo": "ppo", "env_id": "CartPole-v1"}))
    with pytest.raises(UserError, match=r"env \(reflectrl train\) run: use reflectrl train"):
        load_model(str(tmp_path / "env"))
    assert model.config.hidden_size == 32 and tokenizer.eos_token is not None


def test_hub_name_fails_fast_when_offline(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    from reflectrl.errors import UserError
    from reflectrl.llm import model as model_mod

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(UserError, match="HF_HUB_OFFLINE"):
        model_mod.load_model("reflectrl-no-such-org/no-such-model")
    assert time.perf_counter() - start < 10
    monkeypatch.delenv("HF_HUB_OFFLINE")
    # an unreachable hub (a closed local port stands for it) is found in one probe
    monkeypatch.setattr(model_mod, "HUB_HOST", ("127.0.0.1", 9))
    with pytest.raises(UserError, match="cannot be reached"):
        model_mod.load_model("reflectrl-no-such-org/no-such-model")


# ---------------------------------------------------------------------------- 16, 17: runs going wrong

def _iterations(monitor, count, start_up=5.0, seconds=0.1, steps=512):
    """`count` iterations of `steps` each: the first takes `start_up` seconds, the others `seconds`."""
    for k in range(1, count + 1):
        monitor.after_iteration({"global_step": k * steps}, done=k * steps, done_this_session=k * steps,
                                seconds=start_up + (k - 1) * seconds)


def test_monitor_estimates_time_and_warns_past_a_day(capsys):
    from reflectrl.runs.health import RunMonitor

    monitor = RunMonitor(total=10**12, unit="env steps")  # 5,120 steps/s: about 6 years
    with pytest.warns(UserWarning, match="would take about .* years"):
        _iterations(monitor, 4)
    assert "to go for" in capsys.readouterr().err
    hour = RunMonitor(total=4 * 512 + 3600 * 5120, unit="env steps")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _iterations(hour, 4)
    assert "about 60 min to go" in capsys.readouterr().err
    quick = RunMonitor(total=10_000, unit="env steps")  # under a minute: no line, the progress bar says it
    _iterations(quick, 4)
    assert capsys.readouterr().err == ""


def test_the_time_estimate_leaves_out_the_first_iterations_start_up(capsys):
    """Issue 57 item 8: "about 3 min to go for 29 steps" for a 34 s run, the first step's model loading and
    step-0 evaluation taken for its speed. The estimate comes from the iterations after the first."""
    from reflectrl.runs.health import RunMonitor

    short = RunMonitor(total=30, unit="steps")  # 6 s of start-up, then 1 s a step: 29 s more
    _iterations(short, 30, start_up=6.0, seconds=1.0, steps=1)
    assert capsys.readouterr().err == ""  # under a minute to go: no line
    long = RunMonitor(total=304, unit="steps")
    _iterations(long, 3, start_up=6.0, seconds=1.0, steps=1)
    assert capsys.readouterr().err == ""  # 2 iterations after the start-up: not measured yet
    long.after_iteration({"step": 4}, done=4, done_this_session=4, seconds=9.0)
    err = capsys.readouterr().err
    assert "about 5 min to go for 300 steps at 1 steps/s (measured after the first iteration" in err
    slow = RunMonitor(total=100, unit="steps")  # a long iteration is measured after its 10 s, not 3 of them
    _iterations(slow, 2, start_up=30.0, seconds=20.0, steps=1)
    assert "about 33 min to go for 98 steps" in capsys.readouterr().err


def test_monitor_warns_on_entropy_collapse_and_loss_explosion():
    from reflectrl.runs.health import RunMonitor

    monitor = RunMonitor(total=100, unit="steps")
    monitor.estimated = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for step in range(5):
            monitor.after_iteration({"global_step": step, "entropy": 0.6, "value_loss": 2.0 + step},
                                    step, step, 1.0)
        monitor.after_iteration({"global_step": 5, "entropy": 0.5, "value_loss": 500.0}, 5, 5, 1.0)  # 125x: fine
    with pytest.warns(UserWarning, match="value_loss is 1e\\+07"):
        monitor.after_iteration({"global_step": 6, "entropy": 0.5, "value_loss": 1e7}, 6, 6, 1.0)
    with pytest.warns(UserWarning, match="entropy has collapsed"):
        monitor.after_iteration({"global_step": 7, "entropy": 0.0, "value_loss": 1.0}, 7, 7, 1.0)
    with warnings.catch_warnings():  # each warning once
        warnings.simplefilter("error")
        monitor.after_iteration({"global_step": 8, "entropy": 0.0, "value_loss": 1e9}, 8, 8, 1.0)


def test_huge_learning_rate_is_warned_about(cli, tmp_path):
    with pytest.warns(UserWarning, match="entropy has collapsed|over 1000x its early level"):
        code, _, err = cli("train", *CARTPOLE, "--total-steps", 4096, "--out", tmp_path / "run",
                           "--set", "learning_rate=1e9")
    assert code == 0, err  # it stays finite: without the warning the user would hear nothing


def test_a_sane_run_gets_no_health_warning(cli, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code, _, err = cli("train", *CARTPOLE, "--total-steps", 4096, "--out", tmp_path / "run")
    assert code == 0, err


# ---------------------------------------------------------------------------- 18, 20

def test_knobs_lists_every_field_with_its_default_and_meaning(cli):
    import dataclasses

    from reflectrl.config import SECTION_TYPES
    from reflectrl.knobs import field_docs
    from reflectrl.trainers.grpo.config import GRPOConfig
    from reflectrl.trainers.ppo.config import PPOConfig

    for cls in (PPOConfig, GRPOConfig, *SECTION_TYPES.values()):
        missing = [f.name for f in dataclasses.fields(cls) if not field_docs(cls).get(f.name)]
        assert not missing, f"{cls.__name__} knobs without a line of meaning: {missing}"
    code, out, _ = cli("knobs", "--json")
    table = json.loads(out)
    calibration = {row["key"]: row["default"] for row in table["calibration"]}
    assert calibration["calibration.alpha"] == "0.05"
    ppo = {row["key"]: row["default"] for row in table["ppo"]}
    assert ppo["num_envs"] == "discrete 4, continuous 1, Atari 8"
    code, out, _ = cli("knobs", "--algo", "gear")
    assert code == 0 and "gear.temperature" in out and "calibration.alpha" not in out
    code, out, _ = cli("knobs", "--algo", "llm:refgrpo")
    assert code == 0 and "group_size" in out and "calibration.alpha" in out and "num_envs" not in out
    code, _, err = cli("knobs", "nosuch")
    assert_one_line_error(code, err, "unknown section")


def test_warnings_are_one_line_without_colour_codes():
    from reflectrl.cli import _one_line_warnings

    text = _one_line_warnings("\x1b[33mWARN: The environment Hopper-v4 is out of date.\x1b[0m", UserWarning, "f", 1)
    assert text == "reflectrl: warning: The environment Hopper-v4 is out of date.\n"


# ---------------------------------------------------------------------------- 20. video without a display

@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Hopper-v5"])
def test_eval_video_is_quiet_and_works_without_a_display(cli, tmp_path, env_id):
    out = tmp_path / "run"
    assert cli("train", "--env", env_id, *FAST, "--total-steps", 64, "--out", out)[0] == 0
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "XDG_RUNTIME_DIR", "MUJOCO_GL",
                                                            "SDL_VIDEODRIVER", "SDL_AUDIODRIVER")}
    video = tmp_path / "ep.mp4"
    proc = subprocess.run([sys.executable, "-m", "reflectrl", "eval", str(out), "--episodes", "1",
                           "--max-steps", "20", "--video", str(video)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr  # no SDL / ALSA / GLFW noise
    assert video.stat().st_size > 1000


def test_resume_from_the_step0_checkpoint_drops_the_rows_logged_after_it(cli, tmp_path, monkeypatch):
    """Killed before its first periodic checkpoint, a run resumes from step 0: the rows it had
    logged must go, or metrics.jsonl repeats steps (and the report reads a step count going back)."""
    from reflectrl.trainers.ppo.trainer import PPOTrainer

    out = tmp_path / "run"
    real = PPOTrainer.run_iteration

    def crash_at_4(self):
        if self.iteration == 3:
            raise KeyboardInterrupt  # as a kill would: no checkpoint at this point
        return real(self)

    monkeypatch.setattr(PPOTrainer, "run_iteration", crash_at_4)
    code, _, _ = cli("train", *CARTPOLE, "--total-steps", 640, "--set", "checkpoint_every=100000", "--out", out)
    assert code == 130
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    monkeypatch.setattr(PPOTrainer, "run_iteration", real)
    code, _, err = cli("train", "--resume", out)
    assert code == 0, err
    steps = [json.loads(line)["global_step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and len(steps) == 10, steps  # 640 steps of 64


def test_out_of_a_run_being_trained_says_so(tmp_path):
    from reflectrl.errors import UserError
    from reflectrl.runs import RunDir

    run = RunDir.create(tmp_path / "run", {"env_id": "x"})
    with pytest.raises(UserError, match="another process is training"):
        RunDir.create(tmp_path / "run", {"env_id": "x"})
    run.unlock()
    with pytest.raises(UserError, match="--resume"):
        RunDir.create(tmp_path / "run", {"env_id": "x"})
