"""The registry holds the machinery, and each trainer and signal registers itself where it lives (issue 58):
`import reflectrl` loads every built-in package's registration (no torch or JAX), a trainer is held by
(name, backend), and the backend is resolved once, through `registry.trainer_spec`."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from reflectrl import registry
from reflectrl.errors import UserError
from reflectrl.registry import TRAINERS, TrainerSpec, register_trainer, trainer_forms, trainer_spec

SRC = Path(__file__).resolve().parents[1] / "src" / "reflectrl"


def test_import_reflectrl_registers_every_built_in_package_and_imports_nothing_heavy():
    code = ("import json, sys, reflectrl\nfrom reflectrl import registry\n"
            "print(json.dumps([sorted(registry.TRAINERS), sorted(registry.signals()), "
            "sorted(registry.trainer_forms('ppo')), sorted(sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    trainers, signals, ppo_backends, modules = json.loads(out)
    assert trainers == sorted(["ppo", "dqn", "sac", "impala", "mappo", "hppo", "grpo"])
    assert signals == sorted(p.name for p in (SRC / "signals").iterdir() if (p / "__init__.py").exists())
    assert ppo_backends == ["envpool", "gymnasium", "jax"]
    # each package that registers something is loaded (a new one forgotten in its parent's __init__ fails here)
    registering = [f"reflectrl.{p.parent.parent.name}.{p.parent.name}" for folder in ("trainers", "signals")
                   for p in (SRC / folder).glob("*/__init__.py") if "register_" in p.read_text()]
    assert len(registering) == 7 + len(signals) and not set(registering) - set(modules)
    assert not {"torch", "jax", "gymnasium", "numpy"} & set(modules)


def test_the_registry_lists_no_trainer_or_signal():
    tree = ast.parse((SRC / "registry.py").read_text())
    made = [node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id in ("TrainerSpec", "SignalSpec")]
    assert made == []  # no registration: each trainer's and signal's package makes its own


def test_a_trainer_has_a_form_per_backend():
    jax = trainer_spec("ppo", "jax")
    torch_ppo = trainer_spec("ppo", "gymnasium")
    assert torch_ppo is TRAINERS["ppo"] is trainer_spec("ppo", "envpool")
    assert jax.entry.endswith(":JaxTrainer") and jax.groups_seeds and jax.evaluate and jax.check
    # the JAX form reads PPO's knobs and gives signals what ppo gives them (left empty: shared with its first form)
    assert jax.config == torch_ppo.config and jax.provides == torch_ppo.provides
    assert not torch_ppo.groups_seeds and not torch_ppo.evaluate and not jax.load_policy


def test_a_trainer_without_a_form_on_a_backend_is_refused_in_one_line():
    with pytest.raises(UserError) as err:
        trainer_spec("dqn", "jax")
    assert str(err.value) == ("backend=jax trains --algo ppo and its signals; dqn trains on backend=gymnasium or "
                              "envpool (use backend=gymnasium for it)")


def test_another_form_of_a_registered_trainer():
    spec = register_trainer(TrainerSpec("toyform", "control", ("env_step",), frozenset({"next_obs"}), "a toy",
                                        entry="x:A", config="x:Config"))
    try:
        other = register_trainer(TrainerSpec("toyform", "control", backends=("jax",), entry="y:B"))
        assert trainer_forms("toyform") == {"gymnasium": spec, "envpool": spec, "jax": other}
        assert other.config == "x:Config" and other.step_kinds == ("env_step",) and TRAINERS["toyform"] is spec
        with pytest.raises(ValueError, match="family"):
            register_trainer(TrainerSpec("toyform", "llm", backends=("jax",)))
        with pytest.raises(ValueError, match="first form"):
            register_trainer(TrainerSpec("toyform2", "control", backends=("jax",)))
    finally:
        TRAINERS.pop("toyform")
        registry._parse_cached.cache_clear()


def test_each_trainer_object_finishes_its_own_run():
    from reflectrl.trainers.base import EnvStepTrainer
    from reflectrl.trainers.ppo_jax.trainer import JaxTrainer

    assert callable(EnvStepTrainer.finish) and callable(JaxTrainer.finish)


def test_a_plugin_is_loaded_once_by_its_entry_point_on_the_first_look_up(monkeypatch):
    import importlib.metadata

    loaded = []

    class EntryPoint:  # what `pip install` of a plug-in declares under the group reflectrl.signals
        def load(self):
            loaded.append(True)

    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [EntryPoint()] if group == "reflectrl.signals" else [])
    monkeypatch.setattr(registry, "_PLUGIN_GROUPS", {"reflectrl.signals": False})  # as `import reflectrl` left it
    registry.signals()
    registry.signals()
    assert loaded == [True]
