"""What a signal needs of its trainer is declared once, by its registry entry (SignalSpec.wants,
or a function of its config), and fixed when the signal is built: `Signal.wants` equals the
entry's `wants_for(config)`, the `wants_*` flags the trainers read are read-only views of it,
binding (images read by a CNN included) leaves it as it is, and a stack needs the union of its
members' needs. A run validates each signal's knob section once."""

from types import SimpleNamespace

import pytest

from reflectrl.errors import UserError
from reflectrl.registry import signal_spec, signals
from reflectrl.signals import Signal, SignalContext, build_signals, make_signal
from reflectrl.signals.calibration.torch import CalibrationBonus, CalibrationConfig
from reflectrl.signals.compose import SignalStack

# knob settings under which a signal asks for something else than under its defaults
VARIANTS = {
    "calibration": [{"inputs": "features_action"}, {"inputs": "obs_action_features", "shared_trunk": True}],
    "gear": [{"inputs": "obs"}, {"inputs": "features"}],
    "shaping": [{"safety_beta": 1.0}, {"labels": "team"}],
}
FLAGS = {"wants_features": "features", "wants_feature_grad": "feature_grad", "wants_next_obs": "next_obs",
         "wants_teacher": "teacher"}


def _configs():
    for name, spec in signals().items():
        for knobs in [{}, *VARIANTS.get(name, [])]:
            yield pytest.param(name, knobs, id=f"{name}{knobs or ''}")


def _ctx(image_obs: bool = False) -> SignalContext:
    return SignalContext(obs_dim=147 if image_obs else 4, action_dim=3, discrete=True, feature_dim=64,
                         learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, seed=1, total_iterations=4,
                         obs_shape=(7, 7, 3) if image_obs else (4,), image_obs=image_obs)


@pytest.mark.parametrize("name,knobs", list(_configs()))
def test_a_signals_wants_are_its_specs_and_cannot_change(name, knobs):
    spec = signal_spec(name)
    config = spec.config(**knobs)
    declared = frozenset(spec.wants_for(config))
    for signal in (spec.factory(config), *build_signals([name], {name: config})):  # by hand, and as a run builds it
        assert signal.wants == declared
        for flag, want in FLAGS.items():
            assert getattr(signal, flag) == (want in declared)
            with pytest.raises(AttributeError):
                setattr(signal, flag, want not in declared)
        with pytest.raises(AttributeError):
            signal.wants = frozenset()
        with pytest.raises(AttributeError):
            signal.fix_wants(declared ^ {"features"})
        signal.fix_wants(declared)  # saying it again changes nothing
        assert signal.wants == declared


@pytest.mark.parametrize("image_obs", [False, True])
@pytest.mark.parametrize("name", ["calibration", "gear", "shaping", "rnd", "count"])
def test_binding_leaves_the_wants_as_built(name, image_obs):
    spec = signal_spec(name)
    config = spec.config()
    signal = spec.factory(config)
    signal.bind(_ctx(image_obs))
    assert signal.wants == frozenset(spec.wants_for(config))


def test_calibration_on_images_reads_the_features_without_asking_for_them():
    """On images read by a CNN, calibration.inputs=obs_action means the policy's features; it asks
    for none (its knobs say so) and reads them through Batch.features_fn."""
    signal = CalibrationBonus(CalibrationConfig())
    signal.bind(_ctx(image_obs=True))
    assert signal.wants == frozenset() and not signal.wants_features
    assert signal.inputs == "features_action" and signal.net[0].in_features == 64 + 3


def test_a_stack_needs_the_union_of_its_members_needs():
    algo = "ppo+calibration+rnd+gear"
    sections = {"calibration": CalibrationConfig(inputs="features_action", shared_trunk=True),
                "gear": signal_spec("gear").config(inputs="obs")}

    stack = make_signal(SimpleNamespace(algo=algo, sections=sections))
    assert isinstance(stack, SignalStack)
    union = frozenset().union(*(signal_spec(m.name).wants_for(sections.get(m.name) or signal_spec(m.name).config())
                                for m in stack.members))
    assert stack.wants == union == {"features", "feature_grad", "next_obs", "value_stream"}
    assert stack.wants_features and stack.wants_feature_grad and stack.wants_next_obs and not stack.wants_teacher
    stack.bind(_ctx())
    assert stack.wants == union
    with pytest.raises(AttributeError):
        stack.wants_next_obs = False


def test_a_signal_outside_the_registry_needs_nothing_unless_it_says_so():
    class Plain(Signal):
        name = "plain"

    signal = Plain()
    assert signal.wants == frozenset() and not signal.wants_next_obs
    signal.fix_wants({"next_obs"})
    assert signal.wants_next_obs
    with pytest.raises(AttributeError):
        signal.fix_wants(set())


def test_a_run_validates_the_calibration_section_once(monkeypatch, tmp_path):
    calls = []
    validate = CalibrationConfig.validate
    monkeypatch.setattr(CalibrationConfig, "validate", lambda self: (calls.append(1), validate(self))[1])
    from reflectrl.cli import main

    code = main(["train", "--algo", "ppo+calibration", "--env", "CartPole-v1", "--total-steps", "256",
                 "--set", "num_envs=2", "num_steps=64", "--no-progress", "--out", str(tmp_path / "run")])
    assert code == 0
    assert len(calls) == 1


def test_a_signal_built_by_hand_is_still_checked():
    with pytest.raises(UserError, match="alpha"):
        CalibrationBonus(CalibrationConfig(alpha=-1.0))
    config = CalibrationConfig()
    config.validate()
    config.alpha = -1.0  # changed after it passed: checked again when a signal is built from it
    with pytest.raises(UserError, match="alpha"):
        CalibrationBonus(config)
