"""Observation and reward normalisation on backend=jax (issue 61): the torch side's per-env wrappers
(envs/normalize.py under FastSyncVectorEnv's same-step autoreset) computed inside the compiled program,
checked on one stream against those wrappers themselves; its statistics checkpointed and resumed
exactly, frozen at eval; off at the JAX defaults. Shapes are tiny and the compiled programs shared."""

from __future__ import annotations

import json
from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("gymnax")

import jax.numpy as jnp  # noqa: E402

from reflectrl.cli import main  # noqa: E402
from reflectrl.envs import ClipObservation, find_wrapper  # noqa: E402
from reflectrl.envs.jax_envs import StepOut  # noqa: E402
from reflectrl.envs.normalize import NormalizeObservation, NormalizeReward  # noqa: E402
from reflectrl.envs.vector import FastSyncVectorEnv  # noqa: E402
from reflectrl.runs.rundir import RunDir, read_metrics  # noqa: E402
from reflectrl.trainers.ppo.config import PPOConfig  # noqa: E402
from reflectrl.trainers.ppo_jax import ppo  # noqa: E402
from reflectrl.trainers.ppo_jax.trainer import JaxGroup, train_group  # noqa: E402
from reflectrl.trainers.resolve import new_run_config  # noqa: E402

TINY = ["backend=jax", "num_envs=2", "num_steps=16", "num_minibatches=2", "update_epochs=2", "hidden_sizes=8,8",
        "checkpoint_every=64"]
NORM = ["norm_obs=true", "norm_reward=true"]


# --------------------------------------------------------------------------- parity with the torch side's wrappers

class Replay(gym.Env):
    """An env that replays env i's column of a recorded stream: its observations, rewards, terminations,
    truncations, and the first observation of each reset."""

    def __init__(self, stream: dict, i: int):
        self.s, self.i, self.t, self.resets = stream, i, 0, 0
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, stream["obs"].shape[2:], np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        obs = self.s["first_obs"][self.i] if self.resets == 0 else self.s["reset_obs"][self.t - 1, self.i]
        self.resets += 1
        return obs, {}

    def step(self, action):
        t, i = self.t, self.i
        self.t += 1
        return (self.s["obs"][t, i], float(self.s["rewards"][t, i]), bool(self.s["terminated"][t, i]),
                bool(self.s["truncated"][t, i]), {})


def a_stream(T: int, N: int, D: int, seed: int = 0) -> dict:
    """Observations far from 0 and 1 in scale, rewards of both signs, terminations and truncations apart."""
    rng = np.random.default_rng(seed)
    scale = np.array([5.0, 0.1, 30.0][:D], np.float32)
    obs = (3.0 + scale * rng.standard_normal((T, N, D))).astype(np.float32)
    ends = rng.random((T, N))
    return {"first_obs": (3.0 + scale * rng.standard_normal((N, D))).astype(np.float32), "obs": obs,
            "reset_obs": (3.0 + scale * rng.standard_normal((T, N, D))).astype(np.float32),
            "rewards": (2.0 + 4.0 * rng.standard_normal((T, N))).astype(np.float32),
            "terminated": ends < 0.08, "truncated": (ends >= 0.08) & (ends < 0.12)}


def torch_side(stream: dict, knobs: PPOConfig):
    """The stream through the torch PPO's training wrappers (envs/__init__.py _make_training_env's order) in its
    vector env: (first observations, per step (next observations, final observations, rewards), the wrappers)."""
    def make(i):
        def fn():
            env = ClipObservation(NormalizeObservation(Replay(stream, i)), knobs.clip_obs)
            env = NormalizeReward(env, gamma=knobs.gamma)
            return gym.wrappers.ClipReward(env, -knobs.clip_reward, knobs.clip_reward)
        return fn

    N = stream["obs"].shape[1]
    envs = FastSyncVectorEnv([make(i) for i in range(N)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    first, _ = envs.reset()
    out = []
    for _ in range(stream["obs"].shape[0]):
        next_obs, rewards, term, trunc, infos = envs.step(np.zeros(N, np.int64))
        final = next_obs.copy()
        for i in np.flatnonzero(term | trunc):
            final[i] = infos["final_obs"][i]
        out.append((next_obs.copy(), final, rewards.copy()))
    return first, out, envs


def jax_side(stream: dict, knobs: PPOConfig):
    """The same stream through the program's normaliser (ppo.init_normalizer, ppo.normalise_step)."""
    T, N, D = stream["obs"].shape
    setup = ppo.Setup(env=SimpleNamespace(obs_dim=D), knobs=knobs)
    normalizer, first = jax.jit(lambda o: ppo.init_normalizer(setup, o))(jnp.asarray(stream["first_obs"]))
    step = jax.jit(lambda n, r: ppo.normalise_step(setup, n, r))
    out = []
    for t in range(T):
        done = stream["terminated"][t] | stream["truncated"][t]
        obs = np.where(done[:, None], stream["reset_obs"][t], stream["obs"][t])
        res = StepOut(obs=jnp.asarray(obs), env_state=None, reward=jnp.asarray(stream["rewards"][t]),
                      terminated=jnp.asarray(stream["terminated"][t]), truncated=jnp.asarray(stream["truncated"][t]),
                      final_obs=jnp.asarray(stream["obs"][t]), reached_key=None, key=None, achievements=None)
        normalizer, next_obs, final_obs, reward = step(normalizer, res)
        out.append((np.asarray(next_obs), np.asarray(final_obs), np.asarray(reward)))
    return np.asarray(first), out, jax.device_get(normalizer)


# float32 in the program against the wrappers' float32 observation statistics and float64 return statistics,
# 300 steps: what differs is rounding
RTOL, ATOL = 1e-5, 1e-5


@pytest.mark.parametrize("clip", [10.0, 0.7])  # the default clip, and one that clips observations and rewards
def test_the_programs_normaliser_is_the_torch_wrappers_on_one_stream(clip):
    T, N, D = 300, 3, 3
    stream = a_stream(T, N, D)
    knobs = PPOConfig(num_envs=N, norm_obs=True, norm_reward=True, clip_obs=clip, clip_reward=clip, gamma=0.97)
    first_t, steps_t, envs = torch_side(stream, knobs)
    first_j, steps_j, normalizer = jax_side(stream, knobs)
    np.testing.assert_allclose(first_j, first_t, rtol=RTOL, atol=ATOL)
    for t, (a, b) in enumerate(zip(steps_j, steps_t, strict=True)):
        for name, x, y in zip(("next obs", "final obs", "reward"), a, b, strict=True):
            np.testing.assert_allclose(x, y, rtol=RTOL, atol=ATOL, err_msg=f"step {t}: {name}")
    ended = (stream["terminated"] | stream["truncated"]).sum(0)
    assert ended.min() > 5 and stream["terminated"].sum() > stream["truncated"].sum() > 5
    clipped = np.abs(np.asarray([s[0] for s in steps_t])) == clip
    assert clipped.any() == (clip < 1)
    for i, env in enumerate(envs.envs):  # each env its own statistics, as the torch side wraps each env
        obs_rms = find_wrapper(env, NormalizeObservation).obs_rms
        rewards = find_wrapper(env, NormalizeReward)
        np.testing.assert_allclose(normalizer["obs"]["mean"][i], obs_rms.mean, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(normalizer["obs"]["var"][i], obs_rms.var, rtol=RTOL)
        assert normalizer["obs"]["count"][i] == pytest.approx(obs_rms.count, rel=1e-6)
        assert obs_rms.count == pytest.approx(1e-4 + 1 + T + ended[i])  # a reset's observation counts too
        np.testing.assert_allclose(normalizer["return"]["mean"][i], rewards.return_rms.mean, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(normalizer["return"]["var"][i], rewards.return_rms.var, rtol=RTOL)
        assert normalizer["return"]["count"][i] == pytest.approx(rewards.return_rms.count, rel=1e-6)
        np.testing.assert_allclose(normalizer["discounted_return"][i],
                                   np.asarray(rewards.discounted_reward).reshape(-1)[0], rtol=RTOL, atol=ATOL)


def test_the_frozen_normaliser_is_the_torch_eval_envs():
    """eval (and api.Policy) of a JAX run: env 0's statistics frozen, then the clip, as evaluate.eval_env."""
    rng = np.random.default_rng(1)
    rms = {"mean": rng.normal(size=(1, 2, 3)).astype(np.float32), "var": rng.random((1, 2, 3)).astype(np.float32),
           "count": np.full((1, 2), 57.0, np.float32)}
    knobs = PPOConfig(norm_obs=True, clip_obs=2.5)
    frozen = ppo.frozen_obs_normaliser(knobs, {"obs": rms})
    norm = gym.wrappers.NormalizeObservation(Replay(a_stream(4, 1, 3), 0))
    norm.update_running_mean = False
    norm.obs_rms.mean, norm.obs_rms.var, norm.obs_rms.count = rms["mean"][0, 0], rms["var"][0, 0], 57.0
    clip = ClipObservation(norm, 2.5)
    observations = 1.5 * rng.normal(size=(20, 3)).astype(np.float32)
    expected = np.stack([clip.observation(norm.observation(obs)) for obs in observations])
    assert 0 < (np.abs(expected) == 2.5).mean() < 0.5  # some clipped, most not
    np.testing.assert_allclose(np.asarray(frozen(jnp.asarray(observations))), expected, rtol=1e-6, atol=1e-6)
    obs = observations[0]
    assert ppo.frozen_obs_normaliser(PPOConfig(norm_obs=False), {"obs": rms})(obs) is obs


# --------------------------------------------------------------------------- the knobs

def test_normalisation_is_off_by_default_on_backend_jax_and_on_where_set():
    """PPOConfig's continuous defaults turn both on for torch; on backend=jax they stay off (discrete and
    continuous gymnax envs alike: their compiled results at the defaults are unchanged) unless set."""
    for env_id in ("gymnax:CartPole-v1", "gymnax:Pendulum-v1"):
        knobs = new_run_config(algo="ppo", env_id=env_id, seed=1, total_steps=4096, overrides=["backend=jax"]).knobs
        assert (knobs.norm_obs, knobs.norm_reward) == (False, False)
    knobs = new_run_config(algo="ppo", env_id="gymnax:Pendulum-v1", seed=1, total_steps=4096,
                           overrides=["backend=jax", "norm_obs=true"]).knobs
    assert (knobs.norm_obs, knobs.norm_reward, knobs.num_envs) == (True, False, 1)  # the rest: continuous defaults
    torch = new_run_config(algo="ppo", env_id="Pendulum-v1", seed=1, total_steps=4096).knobs
    assert (torch.norm_obs, torch.norm_reward) == (True, True)


# --------------------------------------------------------------------------- in the program

def tiny_config(seed: int, total: int = 256, extra=()):
    return new_run_config(algo="ppo", env_id="gymnax:CartPole-v1", seed=seed, total_steps=total,
                          overrides=[*TINY, *NORM, *extra])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Seeds 1 and 2 with norm_obs and norm_reward, 8 iterations of 2 envs x 16 steps, in run directories."""
    root = tmp_path_factory.mktemp("norm")
    cfgs = [tiny_config(1), tiny_config(2)]
    paths = [str(root / f"seed{c.seed}") for c in cfgs]
    assert train_group([(p, c, []) for p, c in zip(paths, cfgs, strict=True)]) == 0
    return cfgs, paths


@pytest.fixture(scope="module")
def loaded(trained):
    """The trained seeds' checkpoints loaded into one group (as eval and a resume load them)."""
    cfgs, paths = trained
    group = JaxGroup(cfgs, [None, None])
    group.load_seed_states([RunDir(p).load_checkpoint() for p in paths])
    return group


def test_each_env_of_each_seed_keeps_its_statistics_in_the_program(trained, loaded):
    cfgs, paths = trained
    norm = jax.device_get(loaded.states["normalizer"])
    assert norm["obs"]["mean"].shape == (2, 2, 4) and norm["return"]["var"].shape == (2, 2)  # (seeds, envs, ...)
    for i, path in enumerate(paths):
        episodes = sum(r["episodes"] for r in read_metrics(path))
        # each env: 1e-4, its first observation, one per step and one per reset (Gymnasium's same-step autoreset)
        assert norm["obs"]["count"][i].sum() == pytest.approx(2 * (1e-4 + 1) + 256 + episodes, rel=1e-6)
        np.testing.assert_allclose(norm["return"]["count"][i], 1e-4 + 128, rtol=1e-6)
        assert np.all(norm["obs"]["var"][i] > 0) and not np.allclose(norm["obs"]["mean"][i, 0],
                                                                     norm["obs"]["mean"][i, 1])
        saved = RunDir(path).load_checkpoint()["obs_normalizer"]  # as the torch PPO's: env 0's, what eval freezes
        np.testing.assert_array_equal(saved["mean"], norm["obs"]["mean"][i, 0])
        assert saved["count"] == pytest.approx(float(norm["obs"]["count"][i, 0]))
        rows = read_metrics(path)
        assert len(rows) == 8 and all(np.isfinite(r["loss"]) for r in rows)
        assert any(r.get("episodic_return") for r in rows)
    assert json.loads((RunDir(paths[0]).path / "config.json").read_text())["ppo"]["norm_obs"] is True


@pytest.mark.slow
def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_statistics_and_parameters(trained, tmp_path, monkeypatch):
    """Killed after 2 chunks, as the checkpoint after the second is put in place (the first chunk's stays), then
    resumed: the same parameters, metrics and normaliser statistics, bit for bit, as the group never stopped."""
    cfgs, whole = trained
    commits = {"n": 0}
    commit = RunDir.commit_checkpoint

    def killed_at_the_fifth_commit(self):
        commits["n"] += 1
        if commits["n"] == 5:  # the 3rd checkpoint's first seed (the first is before training): iteration 4
            raise KeyboardInterrupt
        commit(self)

    monkeypatch.setattr(RunDir, "commit_checkpoint", killed_at_the_fifth_commit)
    killed = [str(tmp_path / f"seed{c.seed}") for c in cfgs]
    with pytest.raises(KeyboardInterrupt):
        train_group([(p, c, []) for p, c in zip(killed, cfgs, strict=True)])
    monkeypatch.undo()
    assert {RunDir(p).load_checkpoint()["iteration"] for p in killed} == {2}
    assert train_group([(p, None, ["--resume", p]) for p in killed]) == 0
    for a, b in zip(whole, killed, strict=True):
        ra, rb = (json.loads((RunDir(p).path / "run.json").read_text()) for p in (a, b))
        assert rb["status"] == "finished" and ra["params_sha256"] == rb["params_sha256"]
        la, lb = (RunDir(p).load_checkpoint()["leaves"] for p in (a, b))
        assert all(x.tobytes() == y.tobytes() for x, y in zip(la, lb, strict=True))  # the statistics among them
        assert [r["loss"] for r in read_metrics(a)] == [r["loss"] for r in read_metrics(b)]


def test_eval_and_predict_see_the_frozen_normaliser(trained, loaded, capsys):
    """`reflectrl eval` and api.Policy.predict of a norm_obs run: the policy acts on observations normalised with
    env 0's saved statistics (predict's greedy action on a raw observation is the policy's on the normalised one)."""
    import reflectrl

    _, paths = trained
    assert main(["eval", paths[0], "--episodes", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["episodes"] == 3 and result["mean_return"] > 0  # CartPole's return: the env's own, unnormalised
    policy = reflectrl.load(paths[0]).policy
    params = jax.tree_util.tree_map(lambda x: x[0], loaded.states["params"])
    raw = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32) * [1.0, 1.0, 0.1, 1.0]
    saved = RunDir(paths[0]).load_checkpoint()["obs_normalizer"]
    seen = np.clip((raw - saved["mean"]) / np.sqrt(saved["var"] + 1e-8), -10, 10)
    out, _ = ppo.policy_out(params, jnp.asarray(seen, jnp.float32))
    np.testing.assert_array_equal(policy.predict(raw, deterministic=True), np.asarray(jnp.argmax(out, -1)))


@pytest.mark.slow
def test_cartpole_learns_and_pendulum_trains_with_normalisation(tmp_path, capsys):
    """A learning smoke, normalisation on: gymnax CartPole-v1 at its defaults (4 envs x 128 steps) learns in 51k
    steps (2 seeds here: from about 20 to 150-180, as without normalisation), and gymnax Pendulum-v1 (continuous
    actions, its defaults: 1 env x 2048 steps) trains, logs finite losses and evaluates."""
    out = tmp_path / "cartpole"
    assert main(["train", "--env", "gymnax:CartPole-v1", "--total-steps", "51200", "--seed", "1", "--out", str(out),
                 "--no-progress", "--set", "backend=jax", *NORM]) == 0
    rows = read_metrics(out)
    assert all(np.isfinite(r["loss"]) for r in rows)
    returns = [r["episodic_return"] for r in rows if r.get("episodic_return") is not None]
    first, last = np.mean(returns[:10]), np.mean(returns[-10:])
    assert last > first + 50, (first, last)
    out = tmp_path / "pendulum"
    assert main(["train", "--env", "gymnax:Pendulum-v1", "--total-steps", "4096", "--seed", "1", "--out", str(out),
                 "--no-progress", "--set", "backend=jax", *NORM]) == 0
    rows = read_metrics(out)
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)
    capsys.readouterr()
    assert main(["eval", str(out), "--episodes", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mean_length"] == 200 and -2000 < result["mean_return"] < 0  # the env's own return
