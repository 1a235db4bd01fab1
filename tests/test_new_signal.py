"""A new signal with a torch form and a JAX form is one package plus one registration (issue 58):
tests/toy_signal/ holds its knobs and registry entry (__init__.py), its torch form and its JAX form,
named by module path; registered here with one call, `reflectrl train` runs it on either backend, the
knobs listing and the refusals take it, and at its neutral setting it trains the plain run bit for bit."""

import json

import pytest

from reflectrl import registry
from reflectrl.registry import register_signal

TINY = ["num_envs=2", "num_steps=16", "num_minibatches=2", "update_epochs=1", "hidden_sizes=8,8"]


@pytest.fixture
def toy(monkeypatch):
    from toy_signal import SPEC

    monkeypatch.setattr(registry, "_SIGNALS", dict(registry.signals()))
    register_signal(SPEC)  # the one registration
    yield SPEC
    registry._parse_cached.cache_clear()  # the memo of parsed --algo texts may hold toy's


def _train(cli, out, algo, env, *sets):
    code, stdout, err = cli("train", "--algo", algo, "--env", env, "--total-steps", 64, "--no-progress",
                            "--out", out, "--set", *TINY, *sets)
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return json.loads((out / "run.json").read_text())["params_sha256"], rows


def test_the_torch_form_trains_and_is_neutral_at_size_0(toy, cli, tmp_path):
    sha, rows = _train(cli, tmp_path / "toy", "ppo+toy", "CartPole-v1", "toy.size=0.5")
    assert rows[-1]["toy_size"] == 0.5
    neutral, _ = _train(cli, tmp_path / "neutral", "ppo+toy[size=0]", "CartPole-v1")
    plain, _ = _train(cli, tmp_path / "plain", "ppo", "CartPole-v1")
    assert neutral == plain != sha


def test_the_registration_joins_the_knobs_and_the_refusals(toy, cli, tmp_path):
    code, stdout, _ = cli("knobs", "toy")
    assert code == 0 and "size" in stdout and "reward added to every step" in stdout
    code, _, err = cli("train", "--algo", "ppo+toy", "--env", "CartPole-v1", "--out", tmp_path / "r",
                       "--set", "toy.size=-1")
    assert code == 2 and "toy.size=-1" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_the_jax_form_trains_on_backend_jax_and_is_neutral_at_size_0(toy, cli, tmp_path):
    pytest.importorskip("gymnax")
    jax_env = ("gymnax:CartPole-v1", "backend=jax")
    sha, rows = _train(cli, tmp_path / "toy", "ppo+toy", jax_env[0], jax_env[1], "toy.size=0.5")
    assert rows[-1]["toy_size"] == 0.5
    neutral, _ = _train(cli, tmp_path / "neutral", "ppo+toy[size=0]", *jax_env)
    plain, _ = _train(cli, tmp_path / "plain", "ppo", *jax_env)
    assert neutral == plain != sha
