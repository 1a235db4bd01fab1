"""One name per concept: a renamed knob keeps working under its old name, with a warning (issue 14, item 6)."""

import json

import pytest

from reflectrl.config import RunConfig
from reflectrl.signals.calibration import CalibrationConfig
from reflectrl.signals.shaping import ShapingConfig

FAST = ["--no-progress", "--total-steps", 64, "--set", "num_steps=32", "num_envs=2", "num_minibatches=2",
        "update_epochs=1"]


@pytest.mark.parametrize("algo, old, new, value", [
    ("refgrpo", "calibration.reflection_epochs", "epochs", 3),
    ("sdrs", "shaping.map_snapshots", "snapshots", 2),
])
def test_old_knob_name_sets_the_new_one_with_a_warning(cli, tmp_path, algo, old, new, value):
    out = tmp_path / "run"
    with pytest.warns(FutureWarning, match=f"'{old.split('.')[1]}' is now '{new}'"):
        code, _, err = cli("train", "--algo", algo, "--env", "CartPole-v1", *FAST, f"{old}={value}", "--out", out)
    assert code == 0, err
    section = old.split(".")[0]
    saved = json.loads((out / "config.json").read_text())["sections"][section]
    assert saved[new] == value and old.split(".")[1] not in saved


def test_a_config_saved_under_the_old_names_loads():
    cfg = RunConfig.from_dict({"algo": "ppo+calibration+shaping", "env_id": "CartPole-v1",
                               "sections": {"calibration": {"reflection_epochs": 7},
                                            "shaping": {"map_snapshots": 3}}})
    assert cfg.sections["calibration"] == CalibrationConfig(epochs=7)
    assert cfg.sections["shaping"] == ShapingConfig(snapshots=3)


def test_the_old_names_are_not_fields():
    # the alias is a name, not a second knob: the knob tables and config.json show the new name only
    from dataclasses import fields

    assert "reflection_epochs" not in {f.name for f in fields(CalibrationConfig)}
    assert "map_snapshots" not in {f.name for f in fields(ShapingConfig)}


def test_knobs_for_any_composition():
    from reflectrl.errors import UserError
    from reflectrl.knobs import sections_for_algo

    assert sections_for_algo("llm:grpo+gear+verdict") == ["grpo", "gear", "verdict"]
    assert sections_for_algo("llm:refgrpo") == ["grpo", "calibration"]
    assert sections_for_algo("ppo+rnd+count") == ["run", "ppo", "env", "rnd", "count"]
    assert sections_for_algo("sdrs") == ["run", "ppo", "env", "shaping"]
    assert sections_for_algo("dqn+shaping") == ["run", "dqn", "env", "shaping"]
    with pytest.raises(UserError, match="unknown --algo"):
        sections_for_algo("bogus")
