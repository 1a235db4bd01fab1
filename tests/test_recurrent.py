"""Recurrent policies on the torch PPO (`--set policy=gru` / `lstm`, trainers/policies.py RecurrentActorCritic):
the memory reset at episode starts, whole per-env sequences in the update, exact resume, the feed-forward
policy unchanged, eval and the Python API's predict on a recurrent run, one-line refusals, and the
mask_velocity wrapper (envs/wrappers.py) that makes CartPole a memory task."""

import json

import numpy as np
import pytest
import torch

import reflectrl
from reflectrl.errors import UserError

FAST = ["--set", "num_envs=2", "num_steps=32", "num_minibatches=2", "update_epochs=2"]
TINY = dict(num_envs=2, num_steps=32, num_minibatches=2, update_epochs=2)


def _trainer(algo="ppo", env="CartPole-v1", total_steps=128, sets=(), policy="gru"):
    from reflectrl.trainers.ppo.trainer import PPOTrainer
    from reflectrl.trainers.resolve import new_run_config

    cfg = new_run_config(algo=algo, env_id=env, total_steps=total_steps,
                         overrides=[f"policy={policy}", *(f"{k}={v}" for k, v in TINY.items()), *sets])
    return PPOTrainer(cfg)


def _assert_one_line_error(code, err, *needles):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


# ----------------------------------------------------------------------------- the memory

@pytest.mark.parametrize("layer", ["gru", "lstm"])
def test_the_memory_is_cleared_where_an_episode_starts(layer):
    from reflectrl.trainers.policies import RecurrentActorCritic

    torch.manual_seed(0)
    agent = RecurrentActorCritic((4,), 2, False, layer)
    T, B = 6, 3
    obs = torch.randn(T, B, 4)
    starts = torch.zeros(T, B, dtype=torch.bool)
    starts[3, 1] = True  # env 1 begins an episode at step 3
    memory = torch.randn(agent.memory_rows, B, agent.memory_width)
    with torch.no_grad():
        out, _ = agent.unroll(obs, memory, starts)
        other = obs.clone()
        other[:3, 1] = torch.randn(3, 4)  # what env 1 saw before its episode began
        out_other, _ = agent.unroll(other, torch.randn_like(memory), starts)
        # from the start on, env 1's outputs forget what came before; they are a fresh episode's
        fresh, _ = agent.unroll(obs[3:, 1:2], agent.initial_memory(1), torch.zeros(T - 3, 1, dtype=torch.bool))
    torch.testing.assert_close(out[3:, 1], out_other[3:, 1], rtol=0, atol=1e-6)
    torch.testing.assert_close(out[3:, 1], fresh[:, 0], rtol=0, atol=1e-6)
    assert not torch.allclose(out[:3, 0], out_other[:3, 0])  # env 0 kept its (different) memory


def test_a_sequence_unrolled_at_once_equals_its_steps_one_by_one():
    from reflectrl.trainers.policies import RecurrentActorCritic

    torch.manual_seed(1)
    agent = RecurrentActorCritic((5,), 3, False, "gru")
    T, B = 8, 2
    obs, starts = torch.randn(T, B, 5), torch.rand(T, B) < 0.25
    memory = agent.initial_memory(B)
    with torch.no_grad():
        whole, last = agent.unroll(obs, memory, starts)
        steps = []
        for t in range(T):
            y, memory = agent.step(obs[t], memory, starts[t])
            steps.append(y)
    torch.testing.assert_close(whole, torch.stack(steps), rtol=0, atol=1e-5)
    torch.testing.assert_close(last, memory, rtol=0, atol=1e-5)


def test_the_rollout_marks_episode_starts_and_keeps_its_first_memory():
    trainer = _trainer(total_steps=256)
    carried = trainer.memory.clone()
    rollout, _ = trainer.collect()
    ends = rollout.terminations | rollout.truncations
    assert rollout.starts[0].all()  # the first rollout begins every episode
    assert torch.equal(rollout.starts[1:], ends[:-1])  # a step after an episode's end begins the next
    assert torch.equal(trainer.episode_starts, ends[-1])  # carried into the next rollout
    assert torch.equal(rollout.memory, carried) and not torch.equal(trainer.memory, carried)
    assert ends.any()  # CartPole's early episodes end within a rollout: the masks were exercised


def test_sequence_minibatches_cover_every_step_once_per_epoch(monkeypatch):
    from reflectrl.trainers import streams as streams_module

    seen = []
    value_loss = streams_module.ValueStreams.value_loss

    def record(self, obs, idx):
        seen.append(idx.clone())
        return value_loss(self, obs, idx)

    monkeypatch.setattr(streams_module.ValueStreams, "value_loss", record)
    trainer = _trainer("ppo+rnd", "reflectrl/GridWorld-v0", total_steps=64)
    trainer.run_iteration()
    T, N = 32, 2
    assert len(seen) == 2 * 2  # update_epochs x num_minibatches
    for epoch in (seen[:2], seen[2:]):
        assert all(len(idx) == T * N // 2 for idx in epoch)
        assert torch.equal(torch.cat(epoch).sort().values, torch.arange(T * N))
        for idx in epoch:  # whole sequences: one env's T steps in order, t*N + env
            env = idx[0].item() % N
            assert torch.equal(idx, torch.arange(T) * N + env)


# ----------------------------------------------------------------------------- resume, the default unchanged

def test_a_gru_run_stopped_and_resumed_ends_with_the_uninterrupted_weights(cli, tmp_path, sigterm_after_rows):
    argv = ["train", "--algo", "ppo", "--env", "CartPole-v1", "--total-steps", 256, "--wrapper", "mask_velocity",
            "--no-progress", "--set", "policy=gru", "checkpoint_every=64", *FAST[1:]]
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    code, _, err = cli(*argv, "--out", reference)
    assert code == 0, err
    sigterm_after_rows(2)
    code, _, err = cli(*argv, "--out", resumed)
    assert code == 143 and "--resume" in err, err
    assert json.loads((resumed / "run.json").read_text())["global_step"] == 128
    code, _, err = cli("train", "--resume", resumed, "--no-progress")
    assert code == 0, err
    ref, res = (json.loads((run / "run.json").read_text()) for run in (reference, resumed))
    assert res["status"] == ref["status"] == "finished" and res["params_sha256"] == ref["params_sha256"]
    rows = [[json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            for run in (reference, resumed)]
    for key in ("policy_loss", "value_loss", "approx_kl"):
        assert [r[key] for r in rows[1]] == [r[key] for r in rows[0]], key


def test_policy_mlp_is_the_feed_forward_policy_with_its_pinned_weights(cli, tmp_path):
    from test_params_hash import HASHES, HASHES_AVX2, RUNS

    from reflectrl.trainers.cnn import make_policy
    from reflectrl.trainers.policies import ActorCritic

    assert type(make_policy((4,), 2, False, "mlp", (64, 64), "mlp")) is ActorCritic
    code, _, err = cli("train", *RUNS["ppo"][0].split(), "--seed", "3", "--set", "policy=mlp", "--no-progress",
                       "--out", tmp_path / "run")
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "run.json").read_text())["params_sha256"] in (
        HASHES["ppo"], HASHES_AVX2.get("ppo"))


# ----------------------------------------------------------------------------- eval and predict

def test_eval_and_predict_act_with_the_memory(cli, tmp_path):
    run = reflectrl.train("ppo", "CartPole-v1", 128, seed=2, out=tmp_path / "run", wrapper="mask_velocity",
                          policy="gru", **TINY)
    assert run.status["status"] == "finished"
    code, out, err = cli("eval", tmp_path / "run", "--episodes", "2", "--json")
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])  # after what training printed
    assert result["episodes"] == 2 and result["params_sha256"] == run.params_sha256

    policy = reflectrl.load(tmp_path / "run").policy
    assert policy.recurrent
    obs = np.array([0.01, 0.5, -0.02, 0.7], dtype=np.float32)  # what CartPole gives; predict masks it
    action, state = policy.predict(obs, deterministic=True)
    assert action.shape == () and state.shape == (1, 1, 64)
    again, state2 = policy.predict(obs, state=state, deterministic=True)
    assert not np.array_equal(state2, state)  # the memory moved on
    fresh, state3 = policy.predict(obs, state=state2, episode_start=[True], deterministic=True)
    np.testing.assert_array_equal(state3, state)  # an episode's start: as from no state at all
    assert fresh == action
    batch, states = policy.predict(np.stack([obs] * 3), deterministic=True)
    assert batch.shape == (3,) and states.shape == (1, 3, 64)
    with pytest.raises(UserError, match="a state of shape"):
        policy.predict(obs, state=states)


def test_predict_of_a_feed_forward_run_refuses_a_state(tmp_path):
    run = reflectrl.train("ppo", "CartPole-v1", 64, seed=1, out=tmp_path / "run", **TINY)
    assert not run.policy.recurrent
    with pytest.raises(UserError, match="feed-forward"):
        run.policy.predict(np.zeros(4, np.float32), state=np.zeros((1, 1, 64)))


# ----------------------------------------------------------------------------- refusals, the wrapper

@pytest.mark.parametrize("argv, needles", [
    (["--set", "policy=rnn"], ["policy='rnn'", "mlp, gru, lstm"]),
    (["--set", "policy=gru", "num_envs=2", "num_minibatches=4", "num_steps=32"],
     ["policy=gru", "num_envs=2", "multiple of num_minibatches"]),
    (["--algo", "ppo+shaping", "--set", "policy=lstm", "shaping.imagined_fraction=0.5", "shaping.mode=direct"],
     ["shaping", "recurrent", "policy=mlp"]),
    (["--algo", "dqn", "--set", "policy=gru"], ["policy"]),
    (["--wrapper", "mask_velocity", "--env", "Acrobot-v1"], ["mask_velocity", "Acrobot", "CartPole"]),
])
def test_a_bad_combination_is_one_line(cli, tmp_path, argv, needles):
    code, _, err = cli("train", "--env", "CartPole-v1", "--total-steps", 1024, "--no-progress", *argv,
                       "--out", tmp_path / "run")
    _assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "run").exists()


def test_mask_velocity_hides_the_velocities_in_training_and_in_eval():
    from reflectrl.config import RunConfig
    from reflectrl.envs import make_env
    from reflectrl.evaluate import eval_env

    for env_id, hidden in (("CartPole-v1", [1, 3]), ("Pendulum-v1", [2]), ("LunarLander-v3", [2, 3, 5])):
        env = make_env(env_id, wrapper="mask_velocity")
        obs, _ = env.reset(seed=0)
        for _ in range(3):
            obs, *_ = env.step(env.action_space.sample())
        assert (obs[hidden] == 0).all() and (np.delete(obs, hidden) != 0).any(), env_id
        env.close()
    cfg = RunConfig(algo="ppo", env_id="CartPole-v1", wrapper="sparse,mask_velocity")
    env = eval_env(cfg, {})
    env.reset(seed=0)
    obs, reward, *_ = env.step(0)
    assert obs[1] == obs[3] == 0 and reward == 1.0  # the mask stays, the reward wrapper does not
    env.close()


@pytest.mark.slow
@pytest.mark.parametrize("algo, env, sets", [
    ("ppo+calibration+gear", "CartPole-v1", ["policy=lstm"]),
    ("ppo+rnd", "MiniGrid-Empty-5x5-v0", ["policy=gru", "encoder=cnn"]),  # stream heads on the recurrent output
    ("ppo+lagrangian", "reflectrl/GridWorld-v0", ["policy=gru", "env.hazards=3"]),
    ("ppo", "Pendulum-v1", ["policy=lstm", "num_minibatches=1"]),
])
def test_signals_encoders_and_action_spaces_compose_with_a_recurrent_policy(algo, env, sets):
    if env.startswith("MiniGrid"):
        pytest.importorskip("minigrid")
    trainer = _trainer(algo, env, total_steps=128, sets=[s for s in sets if not s.startswith("policy")],
                       policy=sets[0].split("=")[1])
    for _ in range(2):
        row = trainer.run_iteration()
    assert np.isfinite(row["policy_loss"]) and np.isfinite(row["value_loss"])
    if "rnd" in algo:
        assert trainer.streams.shared  # auto puts the heads on the CNN policy's shared trunk: the memory's output
