"""Every bad input gets one line on stderr, exit code 2, no traceback, no run directory."""

import json

import gymnasium as gym
import numpy as np
import pytest

FAST = ["--no-progress", "--set", "num_steps=32", "num_envs=2", "num_minibatches=2", "update_epochs=1"]


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("reflectrl: error: ")
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("argv, needles", [
    (["--env", "CartPol-v1"], ["unknown env id", "CartPole-v1"]),
    (["--algo", "ppx"], ["unknown --algo 'ppx'", "ppo"]),
    (["--set", "learning_rat=0.1"], ["unknown --set key 'learning_rat'", "learning_rate"]),
    (["--set", "gamma=1.5"], ["gamma=1.5", "(0, 1]"]),
    (["--set", "gamma=0"], ["gamma=0.0"]),
    (["--set", "learning_rate=-1"], ["learning_rate=-1.0", "> 0"]),
    (["--set", "ent_coef=nan"], ["ent_coef=nan", "finite"]),
    (["--set", "vf_coef=-0.5"], ["vf_coef"]),
    (["--set", "max_grad_norm=inf"], ["max_grad_norm=inf"]),
    (["--set", "num_minibatches=3"], ["does not divide", "num_minibatches=3"]),
    (["--set", "num_envs=0"], ["num_envs=0"]),
    (["--set", "num_envs=two"], ["expected an integer"]),
    (["--set", "target_kl=-0.1"], ["target_kl"]),
    (["--set", "nokeyvalue"], ["not key=value"]),
    (["--set", "bogus.knob=1"], ["unknown --set section 'bogus'"]),
    (["--total-steps", "-5"], ["--total-steps -5"]),
    (["--total-steps", "10"], ["smaller than one batch"]),
    (["--seed", "-1"], ["--seed -1"]),
    (["--wrapper", "dense"], ["unknown --wrapper 'dense'"]),
    (["--wrapper", "delayed:0"], ["delayed:0"]),
    (["--set", "env.size=1000"], ["cannot make env"]),
    (["--total-steps", "abc"], ["invalid int value"]),
    # knobs in the --algo's brackets (issue 57: the grammar of compare's entries, for every command)
    (["--algo", "ppo+calibration[nope=1]"], ["unknown --set key 'calibration.nope' for section 'calibration'"]),
    (["--algo", "ppo+calibration[alpha]"], ["--algo 'ppo+calibration[alpha]': 'alpha' is not key=value"]),
    (["--algo", "ppo+calibration[alpha=0.1"], ["unbalanced '['"]),
    (["--algo", "ppo+calibration[mode=nope]"], ["calibration.mode='nope': use one of miscalibration, uncertainty"]),
    (["--algo", "ppo+calibration[alpha=0.1]", "--set", "calibration.alpha=0.2"],
     ["--algo ppo+calibration[alpha=0.1] gives calibration.alpha=0.1 and --set calibration.alpha=0.2 another value"]),
])
def test_bad_train_input(cli, tmp_path, argv, needles):
    out = tmp_path / "run"
    base = ["train", "--env", "CartPole-v1", "--total-steps", "1000", "--out", out]
    if "--env" in argv:
        base = ["train", "--total-steps", "1000", "--out", out]
    if argv[0] == "--env" and argv[1] == "CartPol-v1":
        base = ["train", "--total-steps", "1000", "--out", out]
    if "env.size=1000" in argv:
        base = ["train", "--env", "reflectrl/GridWorld-v0", "--total-steps", "1000", "--out", out]
    code, _, err = cli(*base, *argv)
    assert_one_line_error(code, err, *needles)
    assert not out.exists(), "a rejected run must leave no directory behind"



@pytest.mark.parametrize("content, needles", [
    ('{"path": "RUN", "argv": []}', ["holds an object, not a list", '[{"path": DIR, "argv": [train arguments]}']),
    ('"RUN"', ["holds a string, not a list"]),
    ('[{"path": "RUN"}]', ["item 1 of", '{"path": DIR, "argv"']),
    ('[{"path": "RUN", "argv": []}, {"path": 3, "argv": []}]', ["item 2 of"]),
    ('[{"path": "RUN", "argv": ["--seed", 2]}]', ["item 1 of", "as strings"]),
    ("[not json", ["cannot read"]),
])
def test_bad_train_group_file(cli, tmp_path, content, needles):
    """compare writes train-group's file; one written by hand of another shape is one line, exit 2."""
    spec = tmp_path / "group.json"
    spec.write_text(content.replace('"RUN"', json.dumps(str(tmp_path / "runs" / "a"))))  # nothing may be made there
    code, _, err = cli("train-group", spec)
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "runs").exists()


def test_out_holding_a_run_is_refused(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("train", "--env", "CartPole-v1", "--total-steps", 64, "--out", out, *FAST)[0] == 0
    code, _, err = cli("train", "--env", "CartPole-v1", "--total-steps", 64, "--out", out, *FAST)
    assert_one_line_error(code, err, "already holds a finished run", f"reflectrl eval {out}")


@pytest.mark.parametrize("command", ["resume", "eval"])
def test_missing_run_dir(cli, tmp_path, command):
    missing = tmp_path / "nope"
    argv = ["train", "--resume", missing] if command == "resume" else ["eval", missing]
    code, _, err = cli(*argv)
    assert_one_line_error(code, err, "no run directory")


@pytest.mark.parametrize("damage", ["checkpoint", "config", "no_checkpoint"])
def test_corrupt_run_dir(cli, tmp_path, damage):
    out = tmp_path / "run"
    assert cli("train", "--env", "CartPole-v1", "--total-steps", 128, "--out", out, *FAST)[0] == 0
    (out / "run.json").write_text(json.dumps({"status": "interrupted"}))
    if damage == "checkpoint":
        (out / "checkpoint.pt").write_bytes(b"not a checkpoint at all")
    elif damage == "config":
        (out / "config.json").write_text("{ broken")
    else:
        (out / "checkpoint.pt").unlink()
    for argv in (["train", "--resume", out], ["eval", out]):
        code, _, err = cli(*argv)
        assert_one_line_error(
            code, err, {"checkpoint": "corrupt", "config": "corrupt", "no_checkpoint": "no checkpoint"}[damage])


# what a refusal of each kind imports (issue 57: a bad command line was refused in 3-16 s, --help takes 0.2 s):
# the config dataclasses and the registry only (config.new_config, signals/specs/); bench/refusal_time.py times them
REFUSED_WITHOUT_TORCH = [
    ["train", "--set", "no_such_knob=1"],
    ["train", "--set", "num_envs=abc"],
    ["train", "--algo", "ppo+calibration", "--set", "calibration.nope=1"],
    ["train", "--algo", "ppo+calibration", "--set", "calibration.alpha=-1"],
    ["train", "--algo", "ppo", "--set", "gear.temperature=4"],
    ["train", "--algo", "ppo+nosuch"],
    ["train", "--algo", "ppo+calibration[mode=nope]"],
    ["train", "--algo", "ppo+calibration[alpha=0.1]", "--set", "calibration.alpha=0.2"],
    ["train", "--env", "gymnax:CartPole-v1", "--set", "backend=jax", "no_such_knob=1"],
    ["train", "--env", "gymnax:CartPole-v1", "--set", "backend=jax", "encoder=cnn"],
    ["train", "--algo", "ppo+gear", "--env", "gymnax:CartPole-v1", "--set", "backend=jax", "gear.history=2"],
    ["train", "--algo", "dqn", "--env", "gymnax:CartPole-v1", "--set", "backend=jax"],
    ["compare", "--algos", "ppo,ppo+gear", "--total-steps", "1000", "--set", "no_such_knob=1"],
    ["compare", "--algos", "ppo,ppo+gear[nope=1]", "--total-steps", "1000"],
    ["sweep", "--algo", "ppo", "--space", "learning_rate=uniform(0.0001,0.001)", "--trials", "2", "--seeds", "1",
     "--total-steps", "1000", "--set", "no_such_knob=1"],
    ["llm", "train", "--model", "m", "--set", "no_such_knob=1"],
    ["llm", "train", "--algo", "grpo+gear[top_frac=2]", "--model", "m"],
]


@pytest.mark.slow
def test_refusals_import_no_torch_jax_or_env_package(tmp_path):
    import subprocess
    import sys

    script = """
import json, sys
from reflectrl.cli import main
heavy = ("torch", "jax", "gymnasium")
for n, argv in enumerate(json.loads(sys.argv[1])):
    env = [] if argv[0] == "llm" else ["--env", "CartPole-v1"] if "--env" not in argv else []
    code = main([*argv, *env, "--out", sys.argv[2] + f"/out{n}"])
    print(json.dumps([argv, code, [m for m in heavy if m in sys.modules]]))
"""
    done = subprocess.run([sys.executable, "-c", script, json.dumps(REFUSED_WITHOUT_TORCH), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(REFUSED_WITHOUT_TORCH), done.stderr
    for argv, code, imported in results:
        assert code == 2 and imported == [], (argv, code, imported)
    assert len([line for line in done.stderr.splitlines() if line.startswith("reflectrl: error: ")]) == len(results)
    assert not list(tmp_path.iterdir())


def test_resume_rejects_other_options(cli, tmp_path):
    code, _, err = cli("train", "--resume", tmp_path, "--seed", "3")
    assert_one_line_error(code, err, "drop --seed")


def test_eval_bad_episodes(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("train", "--env", "CartPole-v1", "--total-steps", 64, "--out", out, *FAST)[0] == 0
    code, _, err = cli("eval", out, "--episodes", "0")
    assert_one_line_error(code, err, "--episodes 0")


# ---------------------------------------------------------------- non-finite quantities

class _BadEnv(gym.Env):
    """Fine for `good_steps` steps, then emits a NaN observation or a huge reward."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, mode="nan_obs", good_steps=300):
        self.mode, self.good_steps, self.t = mode, good_steps, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        reward = 0.0
        if self.t > self.good_steps:
            if self.mode == "nan_obs":
                obs[0] = np.nan
            else:
                reward = 3e38  # finite, but the value loss on it overflows
        return obs, reward, False, self.t % 50 == 0, {}


gym.register("reflectrl-test/Bad-v0", entry_point=_BadEnv)


@pytest.mark.parametrize("mode, quantity", [("nan_obs", "observation"), ("huge_reward", "loss")])
def test_non_finite_stops_and_keeps_checkpoint(cli, tmp_path, mode, quantity):
    out = tmp_path / "run"
    code, _, err = cli("train", "--env", "reflectrl-test/Bad-v0", "--total-steps", 2000, "--out", out,
                       "--set", f"env.mode={mode}", "checkpoint_every=64", "num_steps=32", "num_envs=2",
                       "num_minibatches=2", "update_epochs=1", "--no-progress")
    assert code == 1
    assert f"non-finite {quantity}" in err and "Traceback" not in err
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "failed"
    code, stdout, _ = cli("eval", out, "--episodes", 1, "--json")  # the kept checkpoint still loads
    assert code == 0
    assert 0 < json.loads(stdout)["global_step"] <= 2 * 300  # 2 envs, each good for 300 steps
