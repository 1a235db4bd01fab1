"""A new trainer is its own package plus one registration (issue 37): tests/toy_trainer/ is written
only from the trainer kit's shared parts, registered here with one TrainerSpec, and trained with a
signal through `reflectrl train`; `reflectrl knobs` lists its knobs and its refusals are one line."""

import json

import pytest

from reflectrl import registry
from reflectrl.registry import TRAINERS, TrainerSpec, register_trainer


@pytest.fixture
def toy():
    spec = register_trainer(TrainerSpec(
        "toy", "control", ("env_step",), frozenset({"next_obs"}), "a toy on-policy trainer (tests/toy_trainer)",
        entry="toy_trainer.trainer:ToyTrainer", config="toy_trainer.config:ToyConfig",
        resolve="toy_trainer.resolve:resolve"))
    yield spec
    TRAINERS.pop("toy")
    registry._parse_cached.cache_clear()  # the memo of parsed --algo texts may hold toy's


def test_a_new_trainer_needs_only_its_package_and_registration(toy, cli, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = cli("train", "--algo", "toy+calibration", "--env", "CartPole-v1", "--total-steps", 256,
                            "--set", "update_epochs=2", "calibration.alpha=0.5", "--no-progress", "--out", out)
    assert code == 0, err
    assert "finished toy+calibration on CartPole-v1: 256 steps" in stdout
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "finished" and len(status["params_sha256"]) == 64
    config = json.loads((out / "config.json").read_text())
    assert config["toy"]["update_epochs"] == 2 and config["sections"]["calibration"]["alpha"] == 0.5
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in rows] == [64, 128, 192, 256]
    assert all("policy_loss" in r and "calibration_loss" in r for r in rows), rows[-1].keys()

    # the same seed trains the same weights; the signal changes them
    again, plain = tmp_path / "again", tmp_path / "plain"
    assert cli("train", "--algo", "toy+calibration", "--env", "CartPole-v1", "--total-steps", 256, "--set",
               "update_epochs=2", "calibration.alpha=0.5", "--no-progress", "--out", again)[0] == 0
    assert cli("train", "--algo", "toy", "--env", "CartPole-v1", "--total-steps", 256, "--set", "update_epochs=2",
               "--no-progress", "--out", plain)[0] == 0
    sha = {d: json.loads((d / "run.json").read_text())["params_sha256"] for d in (out, again, plain)}
    assert sha[out] == sha[again] != sha[plain]


def test_a_new_trainer_joins_the_knobs_and_the_refusals(toy, cli, tmp_path):
    code, stdout, _ = cli("knobs", "toy")
    assert code == 0 and "[toy]  reflectrl train --algo toy: bare names, or toy.NAME" in stdout
    assert "update_epochs" in stdout and "epochs over each rollout" in stdout
    code, _, err = cli("train", "--algo", "toy", "--env", "Pendulum-v1", "--total-steps", 256, "--out", tmp_path / "r")
    assert code == 2 and "needs discrete actions" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("train", "--algo", "toy+count", "--env", "CartPole-v1", "--out", tmp_path / "r")
    assert code == 2 and "trainer 'toy'" in err  # count needs state keys, which toy does not provide
    assert not (tmp_path / "r").exists()


def test_the_algo_is_read_once_per_run(cli, tmp_path, monkeypatch):
    import functools



    reads, parse = [], registry._parse_cached.__wrapped__

    def read(text, family):
        reads.append((text, family))
        return parse(text, family)

    monkeypatch.setattr(registry, "_parse_cached", functools.lru_cache(maxsize=256)(read))
    code, _, err = cli("train", "--algo", "ppo+calibration", "--env", "CartPole-v1", "--total-steps", 256,
                       "--set", "num_envs=2", "num_steps=64", "--no-progress", "--out", tmp_path / "r")
    assert code == 0, err
    assert reads == [("ppo+calibration", "control")]
    assert registry._parse_cached.cache_info().hits > 5  # every later look-up reads the parsed one
