"""An env of your own (issue 57): Gymnasium's `--env MODULE:ID` form, where importing MODULE runs its
gym.register, taken by train, eval, compare and report, and recorded whole in the run so that later
commands (in new processes) import MODULE again; an id they could not make is refused up front."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

from reflectrl.envs import check_new_processes_can_make, make_env, registered_id
from reflectrl.errors import UserError

ENV_MODULE = '''
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Walk right to the end of a corridor: reward 1 there."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length=4):
        self.length, self.pos = length, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        done = self.pos >= self.length
        return np.array([self.pos / self.length], np.float32), float(done), done, False, {}


gym.register("{env}", entry_point=Corridor, max_episode_steps=20)
'''

TINY = ["--total-steps", "256", "--set", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1",
        "hidden_sizes=8,8"]


@pytest.fixture
def env_module(tmp_path, monkeypatch):
    """`make(name, env)`: a module NAME.py in tmp_path (on sys.path) whose import registers ENV; the module
    and its ids are forgotten afterwards, as a new process would not know them."""
    made: list[tuple[str, str]] = []

    def make(name: str, env: str = "Corridor-v0"):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(ENV_MODULE.replace("{env}", env)))
        made.append((name, env))
        return tmp_path

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name, env in made:
        forget(name, env)


def forget(module: str, env: str) -> None:
    """What a new process knows: neither the module nor the id it registers."""
    sys.modules.pop(module, None)
    gym.registry.pop(env, None)


def test_module_form_trains_and_a_later_eval_imports_the_module_again(cli, tmp_path, env_module):
    env_module("reflectrl_test_corridor_a")
    out = tmp_path / "run"
    code, stdout, err = cli("train", "--env", "reflectrl_test_corridor_a:Corridor-v0", "--out", out,
                            "--no-progress", *TINY)
    assert code == 0, err
    assert "finished ppo on reflectrl_test_corridor_a:Corridor-v0" in stdout
    assert json.loads((out / "config.json").read_text())["env_id"] == "reflectrl_test_corridor_a:Corridor-v0"

    forget("reflectrl_test_corridor_a", "Corridor-v0")  # eval as a new process would run it
    code, stdout, err = cli("eval", out, "--episodes", "2", "--json")
    assert code == 0, err
    result = json.loads(stdout)
    assert result["env_id"] == "reflectrl_test_corridor_a:Corridor-v0" and len(result["returns"]) == 2
    assert "reflectrl_test_corridor_a" in sys.modules  # eval imported it: its gym.register ran again


def test_the_env_is_the_registered_one_with_its_keywords(env_module):
    env_module("reflectrl_test_corridor_b")
    env = make_env("reflectrl_test_corridor_b:Corridor-v0", env_kwargs={"length": 2})
    assert type(env.unwrapped).__name__ == "Corridor" and env.unwrapped.length == 2
    env.reset(seed=0)
    assert env.step(1)[1:3] == (0.0, False) and env.step(1)[1:3] == (1.0, True)


def test_a_module_in_the_current_folder_is_found_without_pythonpath(tmp_path, env_module, monkeypatch):
    """The `reflectrl` script does not put the current folder on its path; `python -m reflectrl` (compare's
    runs) does: make_env looks there too, so both find the same module."""
    env_module("reflectrl_test_corridor_c")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    assert registered_id("reflectrl_test_corridor_c:Corridor-v0") == "Corridor-v0"


@pytest.mark.parametrize("env_id, needles", [
    ("reflectrl_no_such_module:Corridor-v0",
     ["env 'reflectrl_no_such_module:Corridor-v0': no module 'reflectrl_no_such_module'", "PYTHONPATH",
      "pip install -e"]),
    ("json:Corridor-v0", ["importing module 'json' registered no env 'Corridor-v0'", "gym.register"]),
    (":Corridor-v0", ["give MODULE:ID"]),
])
def test_a_module_form_that_cannot_work_is_one_line(cli, tmp_path, env_id, needles):
    out = tmp_path / "run"
    code, _, err = cli("train", "--env", env_id, "--out", out, *TINY)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and all(n in lines[0] for n in needles), err
    assert not out.exists()


def test_a_module_that_registers_other_ids_names_them(env_module):
    env_module("reflectrl_test_corridor_d", env="Corridor-v1")
    with pytest.raises(UserError, match=r"registered no env 'Hallway-v0'; it registered Corridor-v1$"):
        registered_id("reflectrl_test_corridor_d:Hallway-v0")
    gym.registry.pop("Corridor-v1", None)


class _ScriptEnv(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, True, False, {}


_ScriptEnv.__module__ = "__main__"  # as a class defined in the script that calls compare


def test_compare_refuses_an_id_registered_only_in_this_process_before_anything_starts(cli, tmp_path):
    """Issue 57: every run (a new process) failed with "unknown env id", and runs/cmp/ was left behind."""
    gym.register("ReflectrlTestScript-v0", entry_point=_ScriptEnv, max_episode_steps=5)
    try:
        out = tmp_path / "cmp"
        code, _, err = cli("compare", "--env", "ReflectrlTestScript-v0", "--algos", "ppo", "--seeds", "1",
                           "--out", out, "--no-progress", *TINY)
    finally:
        gym.registry.pop("ReflectrlTestScript-v0", None)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "registered only in this process" in lines[0] and "--env MODULE:ReflectrlTestScript-v0" in lines[0]
    assert not out.exists()


def test_ids_every_new_process_knows_are_taken_without_a_new_process(monkeypatch):
    import reflectrl.envs as envs

    def no_new_process(env_ids):
        raise AssertionError(f"a new process was started for {env_ids}")

    monkeypatch.setattr(envs, "_errors_in_a_new_process", no_new_process)
    check_new_processes_can_make(["CartPole-v1", "reflectrl/GridWorld-v0", "reflectrl:GridWorld-v0",
                                  "gymnax:CartPole-v1", "pettingzoo:mpe2.simple_spread_v3"])


@pytest.mark.slow
def test_a_new_process_is_asked_about_an_id_of_unknown_source(env_module, tmp_path, monkeypatch):
    """An id registered here from an importable module (not on the runs' path), and a MODULE:ID whose
    module only this process can import: both refused, as the runs (new processes) would fail."""
    import reflectrl.envs as envs

    monkeypatch.setattr(envs, "_NEW_PROCESS_ERRORS", {})
    monkeypatch.chdir(tmp_path.parent)  # not the module's folder: only this process's sys.path has it
    env_module("reflectrl_test_corridor_e", env="ReflectrlTestImported-v0")
    import reflectrl_test_corridor_e  # noqa: F401  (registers ReflectrlTestImported-v0 here only)

    with pytest.raises(UserError, match="registered only in this process.*--env MODULE:ReflectrlTestImported-v0"):
        check_new_processes_can_make(["ReflectrlTestImported-v0"])
    with pytest.raises(UserError, match=r"no module 'reflectrl_test_corridor_e'.*\(in a new process"):
        check_new_processes_can_make(["reflectrl_test_corridor_e:ReflectrlTestImported-v0"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setattr(envs, "_NEW_PROCESS_ERRORS", {})
    check_new_processes_can_make(["reflectrl_test_corridor_e:ReflectrlTestImported-v0"])  # on the runs' path now


@pytest.mark.slow
def test_compare_and_report_run_a_module_env_in_subprocesses(cli, tmp_path, env_module, monkeypatch):
    """Two tiny runs of `compare` (each a `python -m reflectrl train` subprocess) import the module named in
    --env; the report reads them."""
    where = env_module("reflectrl_test_corridor_f")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "cmp"
    env_id = "reflectrl_test_corridor_f:Corridor-v0"
    code, _, err = cli("compare", "--env", env_id, "--algos", "ppo,ppo+count", "--seeds", "1", "--workers", "2",
                            "--out", out, "--no-progress", *TINY)
    assert code == 0, err
    from reflectrl.runs.files import run_status

    for entry in ("ppo", "ppo+count"):
        run = out / "runs" / "reflectrl_test_corridor_f_Corridor-v0" / entry / "seed1"
        assert run_status(run)["status"] == "finished"
        assert json.loads((run / "config.json").read_text())["env_id"] == env_id
    stats = json.loads((out / "report" / "stats.json").read_text())
    assert {row["env"] for row in stats["table"]} == {env_id}
