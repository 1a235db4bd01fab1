"""`reflectrl eval` of a backend=jax run: its latest checkpoint's policy on fresh episodes of the
JAX env, all episodes at once (vmapped) in one compiled loop; the same report as the torch side's.
The return is the env's own; with norm_obs the observations are normalised with env 0's statistics
frozen, as on the torch side. A recurrent policy (policy=gru) carries its hidden state through each episode
from zeros at its start."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from reflectrl.config import EVAL_MAX_STEPS, RunConfig
from reflectrl.errors import UserError
from reflectrl.runs import RunDir


def evaluate_run(run: RunDir, episodes: int, deterministic: bool, seed: int | None, video: str | None,
                 max_steps: int | None) -> dict:
    if video is not None:
        raise UserError("--video is torch-only: backend=jax envs (gymnax, navix, xminigrid, craftax) are not rendered "
                        "by eval")
    cfg = RunConfig.from_dict(run.config())
    state = run.load_checkpoint()
    group, params, normalise = load_actor(cfg, state)
    setup, env = group.setup, group.env
    limit = int(max_steps or getattr(env, "max_steps", 0) or EVAL_MAX_STEPS)
    base = cfg.seed + 1_000_003 if seed is None else seed

    def episode(key):
        k_reset, k_loop = jax.random.split(key)
        obs, env_state, _ = env.reset(k_reset)

        def body(carry):
            obs, env_state, key, ret, steps, done, cut_short, hidden = carry
            key, k_act, k_env = jax.random.split(key, 3)
            if setup.recurrent:
                action, hidden = act(setup, params, normalise, obs, deterministic, k_act, hidden)
            else:
                action = act(setup, params, normalise, obs, deterministic, k_act)
            res = env.step(k_env, env_state, action)
            ended = jnp.logical_or(res.terminated, res.truncated)
            return (res.obs, res.env_state, key, ret + res.reward, steps + 1, ended, res.truncated & ~res.terminated,
                    hidden)

        def cond(carry):
            return jnp.logical_and(~carry[5], carry[4] < limit)

        hidden = initial_hidden(setup)  # (): none, for a feed-forward policy
        carry = (obs, env_state, k_loop, jnp.zeros(()), jnp.zeros((), jnp.int32), jnp.array(False), jnp.array(False),
                 hidden)
        _, _, _, ret, steps, done, truncated, _ = jax.lax.while_loop(cond, body, carry)
        return ret, steps, done, truncated

    keys = jnp.stack([jax.random.PRNGKey(np.uint32((base + i) % 2**32)) for i in range(episodes)])
    returns, lengths, done, truncated = (np.asarray(x) for x in jax.jit(jax.vmap(episode))(keys))
    capped = int((~done).sum())
    return {
        "run": str(run.path), "env_id": cfg.env_id, "global_step": int(state["global_step"]),
        "episodes": episodes, "deterministic": deterministic,
        "mean_return": float(np.mean(returns)), "std_return": float(np.std(returns)),
        "min_return": float(np.min(returns)), "max_return": float(np.max(returns)),
        "mean_length": float(np.mean(lengths)), "max_steps": limit, "capped_episodes": capped,
        "truncated_episodes": int(truncated.sum()) + capped, "video": None,
        "returns": [float(r) for r in returns], "params_sha256": group.params_sha256(0),
    }


def load_actor(cfg: RunConfig, state: dict):
    """A run's policy at a checkpoint: (its JaxGroup of one seed, that seed's parameters, the observation
    normaliser with its statistics frozen: the observations as the policy saw them in training, as the
    torch side's eval_env gives them)."""
    from reflectrl.trainers.ppo_jax import ppo
    from reflectrl.trainers.ppo_jax.trainer import JaxGroup

    group = JaxGroup([cfg], [None])
    group.load_seed_states([state])
    params = jax.tree_util.tree_map(lambda x: x[0], group.states["params"])
    return group, params, ppo.frozen_obs_normaliser(group.setup.knobs, group.states.get("normalizer"))


def initial_hidden(setup, batch_shape=()):
    """A recurrent policy's hidden state at an episode's start for one observation (or a batch of
    `batch_shape`): zeros; () for a feed-forward policy, which has none."""
    from reflectrl.trainers.ppo_jax import ppo

    return ppo.init_hidden(setup, batch_shape) if setup.recurrent else ()


def act(setup, params, normalise, obs, deterministic: bool, key, hidden=None):
    """The env's action(s) for one observation or a batch: the greedy / mean action, or a sample.
    A recurrent policy (setup.recurrent) takes the hidden state from the step before (initial_hidden at an
    episode's start) and returns (action, the next hidden state)."""
    from reflectrl.trainers.ppo_jax import ppo

    if setup.recurrent:
        if hidden is None:
            raise ValueError("a recurrent policy acts from a hidden state: pass initial_hidden(setup) at an "
                             "episode's start, then the one act returned")
        hidden = ppo.recurrent_features(params, hidden, normalise(obs))
        out = ppo.head_out(params, hidden, "actor")
    else:
        out, _ = ppo.policy_out(params, normalise(obs))
    if deterministic:
        action = jnp.argmax(out, -1).astype(jnp.int32) if setup.env.discrete else out
    else:
        action = ppo.sample_action(setup, params, out, key)
    action = ppo.env_action(setup, action)
    return (action, hidden) if setup.recurrent else action


def act_with_state(setup, params, normalise, obs, state, episode_start, deterministic: bool, key):
    """A recurrent policy's act in the Python API's convention (sb3-contrib's RecurrentPPO, as the torch
    side's predict): obs (N, obs_dim); `state` None at the first step, else the (1, N, width) the last call
    gave; `episode_start` (N,) bool where an episode begins (its hidden state zeroed first), None: none does.
    Returns (actions, state) as numpy."""
    from reflectrl.errors import UserError

    n, width = obs.shape[0], setup.knobs.hidden_sizes[-1]
    hidden = np.zeros((1, n, width), np.float32) if state is None else np.asarray(state, np.float32)
    if hidden.shape != (1, n, width):
        raise UserError(f"predict: a state of shape {hidden.shape}; this policy's is (1, {n}, {width}) for {n} "
                        "observation(s) (None at the first step)")
    if episode_start is not None:
        hidden = np.where(np.asarray(episode_start, bool).reshape(1, n, 1), 0.0, hidden).astype(np.float32)
    action, hidden = act(setup, params, normalise, jnp.asarray(obs), deterministic, key, jnp.asarray(hidden[0]))
    return np.asarray(action), np.asarray(hidden)[None]
