"""The registry and composed algos (issue 14): TRAINER[+SIGNAL...], the old names as aliases,
one way of combining signal outputs, neutral compositions bit-identical to the plain trainer."""

import pytest
import torch

from reflectrl.errors import UserError
from reflectrl.registry import Algo, algo_names, aliases, parse_algo, signals, step_kind
from reflectrl.signals import Signal, SignalOutput


def test_every_signal_declares_itself():
    table = signals()
    assert {"calibration", "shaping", "gear", "rnd", "count"} <= set(table)
    on_ppo = {name for name, spec in table.items() if "env_step" in spec.step_kinds}
    # the neutral test below runs them all but the one that needs a cost channel, which CartPole lacks:
    # its neutral run is PPO bit for bit in tests/test_safety.py
    assert {knob.split(".")[0] for knob in NEUTRAL} == on_ppo - {"lagrangian"}
    # the language-model-only ones: their neutral runs are GRPO bit for bit in tests/test_llm_reflect.py
    # (verdict, confidence) and tests/test_divergence.py (divergence)
    assert set(table) - on_ppo == {"verdict", "confidence", "divergence"}
    for name, spec in table.items():
        assert spec.name == name and spec.summary and spec.step_kinds
        assert spec.neutral, f"{name} has no neutral setting to test bit-identity with"


@pytest.mark.parametrize("text, family, expected", [
    ("ppo", "control", Algo("ppo")),
    ("refgrpo", "control", Algo("ppo", ("calibration",))),
    ("sdrs", "control", Algo("ppo", ("shaping",))),
    ("gear", "control", Algo("ppo", ("gear",))),
    ("ppo+calibration+gear", "control", Algo("ppo", ("calibration", "gear"))),
    ("ppo + gear + shaping", "control", Algo("ppo", ("gear", "shaping"))),
    ("grpo", "llm", Algo("grpo")),
    ("gear", "llm", Algo("grpo", ("gear",))),
    ("refgrpo", "llm", Algo("grpo", ("calibration",))),
    ("grpo+calibration+gear", "llm", Algo("grpo", ("calibration", "gear"))),
])
def test_parse_algo(text, family, expected):
    assert parse_algo(text, family) == expected


@pytest.mark.parametrize("text, family, needle", [
    ("ppo+nosuch", "control", "unknown signal 'nosuch'"),
    ("ppo+gear+gear", "control", "twice"),
    ("grpo+shaping", "llm", "signal 'shaping' cannot run on trainer 'grpo'"),
    ("grpo", "control", "algo of 'reflectrl llm train'"),
    ("sdrs", "llm", "algo of 'reflectrl train'"),
    ("ppo+", "control", "not TRAINER[+SIGNAL...]"),
    ("pppo", "control", "did you mean ppo"),
])
def test_parse_algo_errors(text, family, needle):
    with pytest.raises(UserError, match=needle.replace("[", r"\[").replace("+", r"\+")):
        parse_algo(text, family)


def test_aliases_and_names_come_from_the_registry():
    assert aliases("control") == {"ppo": "ppo", "dqn": "dqn", "sac": "sac", "impala": "impala", "mappo": "mappo",
                                  "hppo": "hppo", "refgrpo": "ppo+calibration", "gear": "ppo+gear",
                                  "sdrs": "ppo+shaping", "ppo_lag": "ppo+lagrangian"}
    assert {"dqn+shaping", "dqn+calibration", "sac+shaping", "sac+calibration"} <= set(algo_names("control"))
    # the replay trainers learn from transitions out of trajectory order: no gear, rnd or count
    assert not {"dqn+gear", "dqn+rnd", "dqn+count", "sac+gear"} & set(algo_names("control"))
    assert step_kind("shaping", "dqn") == "transition" and step_kind("calibration", "sac") == "transition"
    assert "ppo+shaping" in algo_names("control") and "grpo+shaping" not in algo_names("llm")
    assert step_kind("calibration", "grpo") == "turn" and step_kind("gear", "grpo") == "token"
    assert step_kind("calibration", "ppo") == "env_step"


def test_signal_knob_that_needs_what_a_trainer_lacks(cli, tmp_path):
    from reflectrl.trainers.grpo.config import LLMRunConfig, apply_llm_overrides, validate_llm

    cfg = LLMRunConfig(algo="grpo+calibration", model="m")
    apply_llm_overrides(cfg, ["calibration.shared_trunk=true", "calibration.inputs=features_action"])
    with pytest.raises(UserError, match=r"\[feature_grad\], which trainer 'grpo' does not provide"):
        validate_llm(cfg)


def test_sections_of_signals_not_run_are_refused(cli, tmp_path):
    code, _, err = cli("train", "--algo", "ppo+gear", "--env", "CartPole-v1", "--out", tmp_path / "r",
                       "--set", "calibration.alpha=0.1")
    assert code == 2 and "calibration.* knobs apply to --algo refgrpo or ppo+calibration" in err


# ---------------------------------------------------------------------------- combining outputs

class _Fixed(Signal):
    """A signal with fixed outputs, to check how the trainer combines them."""

    def __init__(self, name, reward=None, advantage=None, weights=None, shaping=None):
        self.name, self._reward, self._adv, self._w, self._shaping = name, reward, advantage, weights, shaping
        self.seen_advantages = None

    def shape_rewards(self, batch):
        return None if self._shaping is None else torch.full_like(batch.rewards, self._shaping)

    def after_advantages(self, batch):
        self.seen_advantages = batch.advantages.clone()
        full = lambda v: None if v is None else torch.full_like(batch.rewards, v)  # noqa: E731
        return SignalOutput(reward=full(self._reward), advantage=full(self._adv), weights=full(self._w))


def _ppo(signal, seed=1):
    from reflectrl.config import RunConfig
    from reflectrl.trainers.ppo.config import PPOConfig
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import resolve_config

    cfg = resolve_config(RunConfig(algo="ppo", env_id="CartPole-v1", seed=seed, total_steps=256,
                                   knobs=PPOConfig(num_envs=2, num_steps=16, num_minibatches=2, update_epochs=1)))
    return PPOTrainer(cfg, signal=signal)


def test_stack_combines_reward_terms_advantage_terms_and_weights():
    from reflectrl.signals.compose import SignalStack

    a = _Fixed("a", reward=0.5, advantage=0.25, weights=2.0, shaping=0.1)
    b = _Fixed("b", reward=-0.2, advantage=1.0, weights=0.5)
    c = _Fixed("c", weights=3.0)
    trainer = _ppo(SignalStack([a, b, c]))
    rollout, _ = trainer.collect()
    trainer.apply_signal(rollout)

    reference = _ppo(None)
    ref_rollout, _ = reference.collect()
    assert torch.equal(ref_rollout.rewards, rollout.rewards)
    # reward terms (shaping before advantages, then a's and b's) add, and advantages are estimated on the sum
    expected, _ = reference._gae(ref_rollout, ref_rollout.rewards + 0.1 + 0.5 - 0.2)
    expected = expected + 0.25 + 1.0  # advantage terms add
    assert torch.allclose(rollout.advantages, expected, atol=1e-6)
    assert torch.allclose(rollout.weights, torch.full_like(rollout.rewards, 2.0 * 0.5 * 3.0))  # weights multiply
    # b saw a's work: advantages re-estimated with a's reward term, plus a's advantage term
    seen_by_b, _ = reference._gae(ref_rollout, ref_rollout.rewards + 0.1 + 0.5)
    assert torch.allclose(b.seen_advantages, seen_by_b + 0.25, atol=1e-6)


# ---------------------------------------------------------------------------- neutral = plain, bit for bit

NEUTRAL = ["calibration.alpha=0", "shaping.mode=off", "gear.temperature=inf", "rnd.int_coef=0", "count.beta=0"]


@pytest.mark.slow
def test_neutral_composition_is_ppo_bit_for_bit(cli, tmp_path):
    import json

    fast = ["--env", "CartPole-v1", "--total-steps", 1024, "--no-progress", "--set", "num_envs=2", "num_steps=64",
            "num_minibatches=2", "update_epochs=2"]
    assert cli("train", "--algo", "ppo", *fast, "--out", tmp_path / "ppo")[0] == 0
    every = "ppo+" + "+".join(knob.split(".")[0] for knob in NEUTRAL)  # every signal, each neutral
    code, _, err = cli("train", "--algo", every, *fast, *NEUTRAL, "--out", tmp_path / "all")
    assert code == 0, err
    sha = [json.loads((tmp_path / d / "run.json").read_text())["params_sha256"] for d in ("ppo", "all")]
    assert sha[0] == sha[1]
    # and not by accident: the same composition at its defaults learns something else
    code, _, err = cli("train", "--algo", "ppo+calibration+gear", *fast, "--out", tmp_path / "live")
    assert code == 0, err
    assert json.loads((tmp_path / "live" / "run.json").read_text())["params_sha256"] != sha[0]


def test_composed_run_resumes_bit_identically(tmp_path, monkeypatch):
    from reflectrl.runs import RunDir
    from reflectrl.runs.session import Terminated
    from reflectrl.trainers import base as loop_module
    from reflectrl.trainers.policies import params_sha256
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import new_run_config

    cfg = lambda: new_run_config(algo="ppo+calibration+gear", env_id="CartPole-v1", total_steps=512,  # noqa: E731
                                 overrides=["num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=1"])
    full = PPOTrainer(cfg())
    full.train(progress=False)
    run = RunDir.create(tmp_path / "run", cfg().to_dict())
    first = PPOTrainer(cfg(), run)
    # stop as SIGTERM does: at the end of iteration 3, with a checkpoint written there
    monkeypatch.setattr(loop_module, "stop_requested", lambda: first.iteration >= 3)
    with pytest.raises(Terminated):
        first.train(progress=False)
    monkeypatch.undo()
    assert run.load_checkpoint()["iteration"] == 3
    second = PPOTrainer(cfg(), run)
    second.load_state_dict(run.load_checkpoint())
    second.train(progress=False)
    assert params_sha256(second.agent) == params_sha256(full.agent)
    assert set(run.load_checkpoint()["signal"]["members"]) == {"calibration", "gear"}


def test_neutral_llm_composition_is_grpo_bit_for_bit(tiny_model_dir):
    from test_llm import _params, _trainer

    plain = _trainer(tiny_model_dir)
    both = _trainer(tiny_model_dir, algo="grpo+calibration+gear", **{"calibration.alpha": 0, "gear.temperature": "inf"})
    for _ in range(2):
        plain.train_step()
        row = both.train_step()
    assert torch.equal(_params(plain), _params(both))
    assert "calibration_loss" in row and "weights_mean" in row  # both signals ran (on turns and tokens) and logged
    assert [type(m).__name__ for m in both.members] == ["CalibrationBonus", "GEARReweighting"]
    assert both.kinds == ["turn", "token"]


# ---------------------------------------------------------------------------- compare entries

def test_compare_entries_with_per_signal_brackets():
    from reflectrl.experiments.spec import ExperimentSpec, parse_algos

    entries = parse_algos("ppo+calibration[alpha=0.01]+gear[temperature=4;hidden_sizes=32],refgrpo[alpha=0],"
                          "ppo[ent_coef=0]")
    assert entries[0].algo == "ppo+calibration+gear" and entries[0].canonical == "ppo+calibration+gear"
    # in a signal's brackets its own knob wins (gear has hidden_sizes, as PPO does)
    assert entries[0].overrides == ("calibration.alpha=0.01", "gear.temperature=4", "gear.hidden_sizes=32")
    assert entries[1].algo == "refgrpo" and entries[1].canonical == "ppo+calibration"
    assert entries[1].overrides == ("calibration.alpha=0",)
    assert entries[2].overrides == ("ent_coef=0",)
    # a bare key in a signal's brackets that is its trainer's own knob goes to the trainer (hppo's, mappo's)
    hppo, mappo = parse_algos("hppo+shaping[shaped_levels=low;mode=potential],mappo+shaping[critic=local]")
    assert hppo.overrides == ("shaped_levels=low", "shaping.mode=potential")
    assert mappo.overrides == ("critic=local",)

    spec = ExperimentSpec(envs=["CartPole-v1"], algos=[e.label for e in entries], seeds=1, total_steps=512,
                          sets=["gear.w_max=3", "refgrpo.clip_k=2", "num_envs=2"])
    spec.validate()
    from pathlib import Path

    by_label = {r.entry.label: r.overrides for r in spec.runs(Path("/tmp/x"))}
    assert "gear.w_max=3" in by_label[entries[0].label] and "gear.w_max=3" not in by_label["refgrpo[alpha=0]"]
    assert "calibration.clip_k=2" in by_label["refgrpo[alpha=0]"]
    assert "calibration.clip_k=2" not in by_label[entries[0].label]  # refgrpo.* is for refgrpo entries only
    assert all("num_envs=2" in o for o in by_label.values())
    with pytest.raises(UserError, match="no entry of --algos runs the 'shaping' signal"):
        ExperimentSpec(envs=["CartPole-v1"], algos=["ppo"], seeds=1, total_steps=512,
                       sets=["shaping.eta=1"]).validate()


# ---------------------------------------------------------------------------- one --algo grammar (issue 57)

def test_knobs_in_algo_brackets_are_read_the_same_by_every_command():
    """`train --algo 'ppo+calibration[mode=uncertainty]'` was refused ("unknown signal") while compare took it:
    train, llm train, sweep and knobs now read brackets as compare's entries do (config.split_algo)."""
    from reflectrl.config import new_config, split_algo
    from reflectrl.knobs import sections_for_algo
    from reflectrl.trainers.grpo.config import new_llm_config

    assert split_algo("ppo+calibration[mode=uncertainty]") == ("ppo+calibration", ("calibration.mode=uncertainty",))
    # an alias's bare keys: its signal's knob unless the trainer or the run has it; a signal's own knob wins
    assert split_algo("refgrpo[alpha=0;hidden_sizes=32;checkpoint_every=100]") == (
        "refgrpo", ("calibration.alpha=0", "hidden_sizes=32", "checkpoint_every=100"))
    assert split_algo("ppo[ent_coef=0]+gear[hidden_sizes=32;num_envs=8]") == (
        "ppo+gear", ("ent_coef=0", "gear.hidden_sizes=32", "num_envs=8"))
    assert split_algo("ppo+gear") == ("ppo+gear", ())
    cfg = new_config(algo="ppo+calibration[mode=uncertainty;alpha=0.02]", overrides=["num_envs=2"])
    assert cfg.algo == "ppo+calibration" and cfg.knobs.num_envs == 2
    assert (cfg.sections["calibration"].mode, cfg.sections["calibration"].alpha) == ("uncertainty", 0.02)
    # the same value in brackets and in --set is no conflict; another value is (one line, test_cli_errors.py)
    assert new_config(algo="ppo+gear[top_frac=0.5]", overrides=["gear.top_frac=0.5"]).sections["gear"].top_frac == 0.5
    llm = new_llm_config(algo="grpo+gear[top_frac=0.5]", model="m", sets=["group_size=4"])
    assert llm.algo == "grpo+gear" and llm.sections["gear"].top_frac == 0.5 and llm.grpo.group_size == 4
    assert new_llm_config(algo="refgrpo[alpha=0]", model="m").sections["calibration"].alpha == 0
    with pytest.raises(UserError, match="another value of the same knob"):
        new_llm_config(algo="grpo+gear[top_frac=0.5]", model="m", sets=["gear.top_frac=0.25"])
    assert sections_for_algo("ppo+calibration[mode=uncertainty]") == ["run", "ppo", "env", "calibration"]
    assert sections_for_algo("llm:grpo+gear[top_frac=0.5]") == ["grpo", "gear"]


def test_a_run_with_knobs_in_its_algo_records_them_and_resumes(cli, tmp_path, sigterm_after_rows):
    import json

    out = tmp_path / "run"
    argv = ["train", "--algo", "ppo+calibration[mode=uncertainty;alpha=0.02]", "--env", "CartPole-v1",
            "--total-steps", "256", "--out", out, "--no-progress", "--set", "num_envs=2", "num_steps=32",
            "num_minibatches=2", "update_epochs=1"]
    sigterm_after_rows(2)
    assert cli(*argv)[0] == 143  # stopped mid-run, with a checkpoint
    config = json.loads((out / "config.json").read_text())
    assert config["algo"] == "ppo+calibration"  # the run records the algo and, in its sections, the knobs
    assert (config["sections"]["calibration"]["mode"], config["sections"]["calibration"]["alpha"]) == (
        "uncertainty", 0.02)
    code, stdout, err = cli("train", "--resume", out, "--no-progress")
    assert code == 0, err
    assert "finished ppo+calibration on CartPole-v1: 256 steps" in stdout


# ---------------------------------------------------------------------------- a new signal is one registration

def test_a_new_signal_needs_only_its_registration(tmp_path, monkeypatch):
    """What a new file in reflectrl/signals/ would hold: a config, a Signal, one register_signal call.
    Nothing else changes, yet the CLI, --set, compositions, the knobs listing and validation take it."""
    from dataclasses import dataclass

    from reflectrl import registry
    from reflectrl.cli import main
    from reflectrl.knobs import sections
    from reflectrl.registry import SignalSpec, register_signal

    @dataclass
    class BonusConfig:
        size: float = 0.5
        """reward added to every step"""

        def validate(self):
            if self.size < 0:
                raise UserError(f"bonus.size={self.size}: must be >= 0")

    class ConstantBonus(Signal):
        name = "bonus"

        def __init__(self, cfg):
            self.cfg = cfg

        def shape_rewards(self, batch):
            return torch.full_like(batch.rewards, self.cfg.size)

        def metrics(self):
            return {"bonus_size": self.cfg.size}

    monkeypatch.setattr(registry, "_SIGNALS", dict(registry.signals()))
    register_signal(SignalSpec(name="bonus", config=BonusConfig, factory=ConstantBonus, step_kinds=("env_step",),
                               summary="a constant reward", neutral="size=0"))
    assert "ppo+bonus" in algo_names("control") and "bonus" in sections()
    out = tmp_path / "run"
    code = main(["train", "--algo", "ppo+bonus+gear", "--env", "CartPole-v1", "--total-steps", "256", "--out",
                 str(out), "--no-progress", "--set", "num_envs=2", "num_steps=64", "num_minibatches=2",
                 "update_epochs=1", "bonus.size=0.25"])
    assert code == 0
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["bonus_size"] == 0.25 and "weights_mean" in rows[-1]
    assert json.loads((out / "config.json").read_text())["sections"]["bonus"] == {"size": 0.25}
    assert main(["train", "--algo", "ppo+bonus", "--env", "CartPole-v1", "--out", str(tmp_path / "bad"),
                 "--set", "bonus.size=-1"]) == 2
