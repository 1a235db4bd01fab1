"""What a run directory holds, the progress bar, env families, wrappers through the CLI, eval."""

import copy
import hashlib
import json

import pytest
import torch

from reflectrl.runs import RunDir

SMALL = ["--set", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1"]


def test_run_directory_contents(cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, _ = cli("train", "--env", "CartPole-v1", "--total-steps", 512, "--out", out, "--no-progress",
                          *SMALL, "checkpoint_every=256")
    assert code == 0 and "finished ppo on CartPole-v1" in stdout
    config = json.loads((out / "config.json").read_text())
    assert config["ppo"]["num_envs"] == 2 and config["ppo"]["learning_rate"] == 2.5e-4  # CleanRL discrete default
    assert config["ppo"]["ent_coef"] == 0.01 and config["ppo"]["norm_obs"] is False
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "finished" and status["global_step"] == 512
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [128, 256, 384, 512]
    for key in ("episodic_return", "policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac",
                "explained_variance", "steps_per_second", "learning_rate"):
        assert key in rows[-1]
    assert rows[0]["learning_rate"] > rows[-1]["learning_rate"]  # annealed
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert (out / "checkpoint.pt").is_file()
    assert not list(out.glob(".*.tmp"))


def test_continuous_defaults_and_true_return(cli, tmp_path):
    out = tmp_path / "run"
    code, _, _ = cli("train", "--env", "Pendulum-v1", "--total-steps", 2048, "--out", out, "--no-progress",
                     "--set", "num_minibatches=4", "update_epochs=1")
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["ppo"]["num_envs"] == 1 and config["ppo"]["num_steps"] == 2048
    assert config["ppo"]["norm_obs"] is True and config["ppo"]["norm_reward"] is True
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    # normalised rewards would sum to tens; the true Pendulum return of a random policy is about -1200
    assert row["episodic_return"] < -400
    assert row["episodic_length"] == 200


@pytest.mark.parametrize("wrapper", ["sparse", "delayed:7"])
def test_reward_wrappers_keep_true_return(cli, tmp_path, wrapper):
    plain, wrapped = tmp_path / "plain", tmp_path / "wrapped"
    base = ["train", "--env", "CartPole-v1", "--total-steps", 256, "--no-progress", *SMALL]
    assert cli(*base, "--out", plain)[0] == 0
    assert cli(*base, "--out", wrapped, "--wrapper", wrapper)[0] == 0
    first = [json.loads((d / "metrics.jsonl").read_text().splitlines()[0]) for d in (plain, wrapped)]
    # same seed, same first rollout (the policy has not been updated yet): same true returns
    assert first[0]["episodic_return"] == first[1]["episodic_return"]
    assert json.loads((wrapped / "config.json").read_text())["wrapper"] == wrapper


@pytest.mark.parametrize("env_id", ["reflectrl/GridWorld-v0", "MiniGrid-DoorKey-5x5-v0", "HalfCheetah-v5"])
def test_env_families_train_and_eval(cli, tmp_path, env_id):
    out = tmp_path / "run"
    extra = ["num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=1"]
    code, _, err = cli("train", "--env", env_id, "--total-steps", 64, "--out", out, "--no-progress", "--set", *extra)
    assert code == 0, err
    code, stdout, _ = cli("eval", out, "--episodes", 1, "--json")
    assert code == 0
    result = json.loads(stdout)
    assert result["episodes"] == 1 and len(result["returns"]) == 1
    # eval ran the weights training finished with: the hash run.json recorded at the end of
    # training, and a hash computed here over the checkpoint's parameters
    agent = RunDir.open(out).load_checkpoint()["agent"]
    assert result["params_sha256"] == json.loads((out / "run.json").read_text())["params_sha256"]
    assert result["params_sha256"] == state_sha256(agent)


def state_sha256(state):
    """sha256 over every (name, tensor bytes) of a state dict in name order, written out here."""
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def test_params_sha256_tells_weights_apart():
    from reflectrl.trainers.policies import ActorCritic, params_sha256

    torch.manual_seed(0)
    a = ActorCritic(4, 2, False, (8, 8))
    b = copy.deepcopy(a)
    assert params_sha256(a) == params_sha256(b) == state_sha256(a.state_dict())  # equal weights, equal hash
    with torch.no_grad():
        b.critic[0].weight[3, 1] += 1e-6  # one element of one tensor, by a hair
    assert params_sha256(b) != params_sha256(a)
    assert params_sha256(b) == state_sha256(b.state_dict())
    # every tensor counts: the same weights plus the continuous policy's log-std hash otherwise
    c = ActorCritic(4, 2, True, (8, 8))
    c.load_state_dict({**a.state_dict(), "actor_logstd": c.actor_logstd.detach()})
    assert params_sha256(c) != params_sha256(a)


def test_gridworld_env_kwargs(cli, tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("train", "--total-steps", 512, "--out", out, "--no-progress", *SMALL,
                       "env.size=5", "env.layout=empty")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["env"] == {"size": 5, "layout": "empty"}


def test_eval_json_fields_and_determinism(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("train", "--env", "CartPole-v1", "--total-steps", 256, "--out", out, "--no-progress", *SMALL)[0] == 0
    results = []
    for _ in range(2):
        code, stdout, _ = cli("eval", out, "--episodes", 3, "--json")
        assert code == 0
        results.append(json.loads(stdout))
    for key in ("mean_return", "std_return", "episodes", "params_sha256"):
        assert key in results[0]
    assert results[0] == results[1]  # seeded evaluation episodes
    code, stdout, _ = cli("eval", out, "--episodes", 2)
    assert code == 0 and "mean return" in stdout


def test_eval_video(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("train", "--total-steps", 256, "--out", out, "--no-progress", *SMALL, "env.size=5")[0] == 0
    video = tmp_path / "gw.mp4"
    code, _, err = cli("eval", out, "--episodes", 1, "--video", video)
    assert code == 0, err
    assert video.stat().st_size > 1000
    assert video.read_bytes()[4:8] == b"ftyp"  # an MP4 container


def test_progress_bar_shows_steps_rate_return(cli, tmp_path, monkeypatch):
    from reflectrl.runs.progress import PROGRESS_SECONDS_VARIABLE

    monkeypatch.setenv(PROGRESS_SECONDS_VARIABLE, "0")  # stderr is no terminal here: a line at every update
    out = tmp_path / "run"
    code, _, err = cli("train", "--env", "CartPole-v1", "--total-steps", 512, "--out", out, *SMALL)
    assert code == 0
    assert "512/512 env steps (100%)" in err and "env steps/s" in err and "return=" in err


def _fake_clock(times):
    return lambda: times[0]


def test_progress_without_a_terminal_is_a_plain_line_every_n_seconds():
    """Issue 57 item 10: without a TTY, a bar's refreshes flooded the captured stderr (hundreds of
    carriage-return fragments). Now: one plain line every N seconds, its speed measured after the first
    update (the start-up), and none at all for a run shorter than N."""
    import io

    from reflectrl.runs.progress import ProgressLines, progress_bar

    assert isinstance(progress_bar(100, "steps", stream=io.StringIO()), ProgressLines)
    stream, now = io.StringIO(), [0.0]
    bar = ProgressLines(1000, "env steps", every=30, stream=stream, clock=_fake_clock(now))
    now[0] = 20.0
    bar.update(10)  # the first iteration: 20 s of start-up
    for _ in range(89):  # then 10 steps a second
        now[0] += 1.0
        bar.update(10)
        bar.set_postfix_str(f"return={bar.n}")
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue() and len(lines) == 2  # 30 s and 60 s after the start-up's end
    assert lines[0] == "reflectrl: 310/1,000 env steps (31%) in 50s, 10 env steps/s, about 69s to go; return=300"
    assert lines[1] == "reflectrl: 610/1,000 env steps (61%) in 80s, 10 env steps/s, about 39s to go; return=600"
    quiet = io.StringIO()
    short = ProgressLines(1000, "env steps", every=30, stream=quiet, clock=_fake_clock(now))
    for _ in range(20):
        now[0] += 1.0
        short.update(50)
    short.close()
    assert quiet.getvalue() == ""


def test_progress_lines_go_on_while_runs_are_starting():
    """compare polls its runs and sets the text after the counts every half second; while nothing can be
    counted yet (a JAX group compiling logs no step for minutes) a line still comes every N seconds, with
    no speed, and the speed of the first line after it is measured from the first update."""
    import io

    from reflectrl.runs.progress import ProgressLines

    stream, now = io.StringIO(), [0.0]
    bar = ProgressLines(400, "env steps", every=30, stream=stream, clock=_fake_clock(now))
    for _ in range(130):  # 65 s of polls before any step is logged
        now[0] += 0.5
        bar.set_postfix_str("runs 0/4 done, 4 running")
    assert stream.getvalue().splitlines() == ["reflectrl: 0/400 env steps (0%) in 30s; runs 0/4 done, 4 running",
                                              "reflectrl: 0/400 env steps (0%) in 60s; runs 0/4 done, 4 running"]
    bar.update(100)  # the first update ends the start-up
    now[0] += 40.0
    bar.update(100)
    assert stream.getvalue().splitlines()[-1] == ("reflectrl: 200/400 env steps (50%) in 2 min, 2.5 env "
                                                  "steps/s, about 80s to go; runs 0/4 done, 4 running")


def test_progress_on_a_terminal_is_the_bar_with_its_speed_after_the_start_up(monkeypatch):
    import io

    from reflectrl.runs.progress import TerminalBar, progress_bar

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream, now = Terminal(), [0.0]
    bar = progress_bar(1000, "env steps", stream=stream, mininterval=0)
    assert isinstance(bar, TerminalBar)
    bar.bar._time = _fake_clock(now)
    bar.bar.start_t = bar.bar.last_print_t = 0.0
    now[0] = 20.0
    bar.update(10)  # 20 s of start-up
    for _ in range(3):  # then 10 steps a second
        now[0] += 1.0
        bar.update(10)
    bar.set_postfix_str("return=1")
    assert bar.bar.format_dict["rate"] == pytest.approx(10.0)  # the start-up's 0.5 steps/s forgotten
    bar.close()
    assert "\r" in stream.getvalue() and "40.0/1.00k" in stream.getvalue()


def test_a_running_run_whose_process_is_gone_reads_as_stopped(tmp_path):
    """run.json says "running" while a trainer holds the directory's lock; once no process holds it
    (a kill -9 leaves the word behind) readers show "stopped", and the other words pass through."""
    from reflectrl.runs.files import live_status

    assert live_status(tmp_path / "nothing") == "not started"
    run = RunDir.create(tmp_path / "run", {"algo": "ppo"})
    assert live_status(run.path) == "running"  # this process holds the lock
    run.unlock()
    assert live_status(run.path) == "stopped"
    run.set_status("interrupted")
    assert live_status(run.path) == "interrupted"


def _strict(text: str):
    """json.loads that refuses what is not JSON: the bare Infinity / NaN Python's json writes by default."""
    def refuse(word):
        raise ValueError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def test_run_files_are_strict_json_and_load_back(cli, tmp_path):
    """calibration.max_ratio defaults to inf: config.json holds it as the string "Infinity" (every JSON
    reader takes the files), the run resumes and evaluates with the float inf, and a file from before, with
    the bare word, still loads."""
    from reflectrl.config import RunConfig
    from reflectrl.runs.files import read_logged_rows, run_config

    out = tmp_path / "run"
    code, _, err = cli("train", "--algo", "ppo+calibration", "--env", "CartPole-v1", "--total-steps", 256,
                       "--out", out, "--no-progress", *SMALL)
    assert code == 0, err
    for name in ("config.json", "run.json"):
        _strict((out / name).read_text())
    for line in (out / "metrics.jsonl").read_text().splitlines():
        _strict(line)
    config = _strict((out / "config.json").read_text())
    assert config["sections"]["calibration"]["max_ratio"] == "Infinity"
    for loaded in (RunConfig.from_dict(RunDir(out).config()), RunConfig.from_dict(run_config(out))):
        assert loaded.sections["calibration"].max_ratio == float("inf")
    assert read_logged_rows(out)

    # a run written before: bare Infinity in config.json, NaN in a metric row
    (out / "config.json").write_text((out / "config.json").read_text().replace('"Infinity"', "Infinity"))
    rows = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join([rows[0].replace("}", ', "old": NaN}'), *rows[1:]]) + "\n")
    assert RunConfig.from_dict(RunDir(out).config()).sections["calibration"].max_ratio == float("inf")
    assert read_logged_rows(out)[0]["old"] != read_logged_rows(out)[0]["old"]  # NaN
    code, stdout, err = cli("eval", out, "--episodes", 1, "--json")
    assert code == 0, err
    _strict(stdout)


def test_strict_json_round_trips_non_finite_floats():
    import math

    import numpy as np

    from reflectrl.runs import jsonfile

    value = {"a": float("inf"), "b": [-math.inf, 1.5, np.float32("nan")], "c": "text", "d": np.float64(2.0),
             "e": torch.tensor(float("-inf"))}
    text = jsonfile.dumps(value)
    assert _strict(text) == {"a": "Infinity", "b": ["-Infinity", 1.5, "NaN"], "c": "text", "d": 2.0,
                             "e": "-Infinity"}
    back = jsonfile.loads(text)
    assert back["a"] == math.inf and back["b"][0] == -math.inf and math.isnan(back["b"][2])
    assert back["e"] == -math.inf and back["c"] == "text"
