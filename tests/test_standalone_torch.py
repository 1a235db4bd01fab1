"""Signals in anyone's torch loop (issue 58 item 4): reflectrl.signals.make(...).process(...) runs the hooks
exactly as the trainers do (signals/apply.apply_signals), refuses what it lacks in one line, and the examples
built on it give, at the signals' neutral setting, bit for bit the run without them."""

import contextlib
import importlib.util
import io
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import reflectrl.signals
from reflectrl.errors import UserError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CARTPOLE = gym.make("CartPole-v1")
LOOP = dict(num_envs=2, num_steps=16, total_steps=64, gamma=0.99, gae_lambda=0.95, learning_rate=2.5e-4, seed=3)


def run_example(name: str, argv: list[str]) -> str:
    """The example's main(argv) in this process; its printed params_sha256."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out, threads = io.StringIO(), torch.get_num_threads()
    torch.set_num_threads(1)  # tiny nets: one thread is the fastest, and the same in every run compared
    try:
        with contextlib.redirect_stdout(out):
            module.main(argv)
    finally:
        torch.set_num_threads(threads)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("params_sha256=")]
    assert len(lines) == 1, out.getvalue()
    return lines[0].split("=", 1)[1]


def test_cleanrl_example_at_neutral_strengths_is_cleanrl_bit_for_bit():
    small = ["--total-timesteps", "128", "--num-envs", "2", "--num-steps", "32", "--seed", "2"]
    plain = run_example("cleanrl_ppo_calibration", [*small, "--no-signals"])
    neutral = run_example("cleanrl_ppo_calibration", [*small, "--calibration-alpha", "0", "--count-beta", "0"])
    assert neutral == plain
    assert run_example("cleanrl_ppo_calibration", small) != plain  # at their default strengths they act


@pytest.mark.slow
def test_trl_example_at_infinite_temperature_is_trl_bit_for_bit():
    pytest.importorskip("trl")
    plain = run_example("trl_grpo_gear", ["--steps", "2", "--no-gear"])
    assert run_example("trl_grpo_gear", ["--steps", "2", "--gear-temperature", "inf"]) == plain
    assert run_example("trl_grpo_gear", ["--steps", "2"]) != plain  # the distilled head reweights step 2's tokens


def test_terms_equal_what_the_ppo_trainer_gets_from_apply_signals(monkeypatch):
    """The PPO trainer's own batches, given to a standalone signal made with the same knobs: the same
    rewards, advantages, returns and terms, iteration after iteration (the signals' state carried alike),
    and sig.state_keys gives the trainer's state keys."""
    import reflectrl.trainers.ppo.trainer as ppo
    from reflectrl.trainers.resolve import new_run_config

    cfg = new_run_config(algo="ppo+calibration+count", env_id="CartPole-v1", total_steps=256, seed=3,
                         overrides=["num_envs=2", "num_steps=64", "calibration.alpha=0.5", "count.beta=0.1"])
    seen, original = [], ppo.apply_signals

    def recording(signal, batch, estimate, **kwargs):
        given = {k: getattr(batch, k).clone() for k in ("obs", "actions", "rewards", "terminations", "truncations",
                                                          "values", "next_values", "state_keys", "next_state_keys")}
        result = original(signal, batch, estimate, **kwargs)
        seen.append((given, result))
        return result

    monkeypatch.setattr(ppo, "apply_signals", recording)
    trainer = ppo.PPOTrainer(cfg)
    trainer.train(progress=False)
    assert len(seen) == 2

    p = cfg.ppo
    sig = reflectrl.signals.make("calibration+count", CARTPOLE.observation_space, CARTPOLE.action_space,
                                 num_envs=p.num_envs, num_steps=p.num_steps, total_steps=cfg.total_steps,
                                 gamma=p.gamma, gae_lambda=p.gae_lambda, learning_rate=p.learning_rate, seed=cfg.seed,
                                 calibration={"alpha": 0.5}, count={"beta": 0.1})
    for given, result in seen:
        assert torch.equal(sig.state_keys(given["obs"]), given["state_keys"])
        terms = sig.process(**given)
        assert torch.equal(terms.rewards, result.rewards)
        assert torch.equal(terms.advantages, result.advantages)
        assert torch.equal(terms.returns, result.returns)
        assert torch.equal(terms.reward_term, result.reward_term)
        assert result.weights is None and torch.equal(terms.weights, torch.ones(p.num_steps, p.num_envs))
        assert terms.reward_term.abs().sum() > 0  # the bonuses are there
        assert terms.metrics["count_beta"] == 0.1 and "calibration_loss" in terms.metrics


def test_knobs_by_section_dotted_or_bare_and_neutral_changes_nothing():
    T, N = LOOP["num_steps"], LOOP["num_envs"]
    g = torch.Generator().manual_seed(0)
    batch = dict(obs=torch.randn(T, N, 4, generator=g), actions=torch.randint(0, 2, (T, N), generator=g),
                 rewards=torch.rand(T, N, generator=g), terminations=torch.rand(T, N, generator=g) < 0.1,
                 truncations=torch.zeros(T, N, dtype=torch.bool), values=torch.randn(T, N, generator=g),
                 next_values=torch.randn(T, N, generator=g))
    from reflectrl.estimators import compute_gae

    gae = compute_gae(batch["rewards"], batch["values"], batch["next_values"], batch["terminations"],
                      batch["truncations"], LOOP["gamma"], LOOP["gae_lambda"])
    for knobs in ({"alpha": 0}, {"calibration": {"alpha": 0}}, {"calibration.alpha": "0"}):
        sig = reflectrl.signals.make("calibration", CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP, **knobs)
        assert sig.signal.cfg.alpha == 0
        terms = sig.process(**batch)
        assert torch.equal(terms.advantages, gae[0]) and torch.equal(terms.returns, gae[1])
    acting = reflectrl.signals.make("calibration", CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP,
                                    alpha=0.5).process(**batch)
    assert not torch.equal(acting.advantages, gae[0])
    assert torch.equal(acting.rewards, batch["rewards"] + acting.reward_term)


def test_gear_weights_come_back_and_after_update_distils():
    T, N = LOOP["num_steps"], LOOP["num_envs"]
    g = torch.Generator().manual_seed(1)
    terminations = torch.zeros(T, N, dtype=torch.bool)
    terminations[7] = terminations[-1] = True
    batch = dict(obs=torch.randn(T, N, 4, generator=g), actions=torch.randint(0, 2, (T, N), generator=g),
                 rewards=torch.rand(T, N, generator=g), terminations=terminations,
                 truncations=torch.zeros(T, N, dtype=torch.bool), values=torch.randn(T, N, generator=g),
                 next_values=torch.randn(T, N, generator=g))
    sig = reflectrl.signals.make("gear", CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP, temperature=1.0)
    first = sig.process(**batch)
    assert torch.equal(first.weights, torch.ones(T, N))  # no head distilled yet
    metrics = sig.after_update(value_fn=lambda obs: obs.sum(-1))
    assert "value_head_loss" in metrics
    second = sig.process(**batch)
    assert second.weights.std() > 0 and sig.iteration == 2 and sig.global_step == 2 * T * N


@pytest.mark.parametrize("signals, knobs, words", [
    ("calibration+count", {"alpha": 0.1}, "say whose knob it is"),
    ("calibration", {"alpah": 0.1}, "did you mean alpha"),
    ("calibration", {"count.beta": 0.1}, "not among the signals made"),
    ("count", {"beta": -1}, "count.beta=-1"),
    ("rnd", {}, "value_stream"),
    ("verdict", {}, "not env steps"),
    ("calibration", {"inputs": "features_action"}, "feature_dim"),
    ("nosuch", {}, "unknown signal"),
])
def test_make_refuses_in_one_line(signals, knobs, words):
    with pytest.raises(UserError, match=words) as err:
        reflectrl.signals.make(signals, CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP, **knobs)
    assert "\n" not in str(err.value)


def test_process_names_what_is_missing_in_one_line():
    T, N = LOOP["num_steps"], LOOP["num_envs"]
    sig = reflectrl.signals.make("calibration+count", CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP)
    z = torch.zeros(T, N)
    arrays = (torch.zeros(T, N, 4), z.long(), z, z.bool(), z.bool(), z, z)
    with pytest.raises(UserError, match=r"the count signal needs state_keys: pass process\(\.\.\., state_keys=") as err:
        sig.process(*arrays)
    assert "\n" not in str(err.value)
    with pytest.raises(UserError, match=r"obs=\.\.\.\) has shape \(16, 3, 4\)"):
        sig.process(torch.zeros(T, 3, 4), *arrays[1:], state_keys=z.long(), next_state_keys=z.long())
    with pytest.raises(UserError, match="after_update"):
        reflectrl.signals.make("gear", CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP).after_update()
    shaping = reflectrl.signals.make("shaping", CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP)
    with pytest.raises(UserError, match="next_obs"):
        shaping.process(*arrays)


def test_every_env_step_signal_at_its_neutral_setting_changes_nothing():
    """Each signal a standalone loop can run, at its registry's neutral setting (SignalSpec.neutral), gives
    back the default GAE's advantages and returns and weights of 1, and takes an after_update."""
    from reflectrl.estimators import compute_gae
    from reflectrl.registry import signals as registered

    T, N = LOOP["num_steps"], LOOP["num_envs"]
    g = torch.Generator().manual_seed(2)
    terminations = torch.rand(T, N, generator=g) < 0.1
    obs, reached = torch.randn(T, N, 4, generator=g), torch.randn(T, N, 4, generator=g)
    batch = dict(obs=obs, actions=torch.randint(0, 2, (T, N), generator=g), rewards=torch.rand(T, N, generator=g),
                 terminations=terminations, truncations=torch.zeros(T, N, dtype=torch.bool),
                 values=torch.randn(T, N, generator=g), next_values=torch.randn(T, N, generator=g), next_obs=reached,
                 costs=torch.rand(T, N, generator=g), episode_costs=[1.0],
                 state_keys=reflectrl.signals.state_keys(obs, CARTPOLE.observation_space),
                 next_state_keys=reflectrl.signals.state_keys(reached, CARTPOLE.observation_space))
    advantages, returns = compute_gae(batch["rewards"], batch["values"], batch["next_values"], terminations,
                                      batch["truncations"], LOOP["gamma"], LOOP["gae_lambda"])
    ran = []
    for name, spec in registered().items():
        if "env_step" not in spec.step_kinds or "value_stream" in spec.wants_for(spec.config()):
            continue
        knob, value = spec.neutral.split("=")
        sig = reflectrl.signals.make(name, CARTPOLE.observation_space, CARTPOLE.action_space, **LOOP, **{knob: value})
        for _ in range(2):
            terms = sig.process(**batch)
            assert torch.equal(terms.advantages, advantages), name
            assert torch.equal(terms.returns, returns), name
            assert torch.equal(terms.weights, torch.ones(T, N)), name
            sig.after_update(value_fn=lambda x: x.sum(-1))
        ran.append(name)
    assert {"calibration", "count", "gear", "shaping", "lagrangian"} <= set(ran)
