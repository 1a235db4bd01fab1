"""`reflectrl eval` of a backend=jax run: its latest checkpoint's policy on fresh episodes of the
JAX env, all episodes at once (vmapped) in one compiled loop; the same report as the torch side's.
The return is the env's own; with norm_obs the observations are normalised with env 0's statistics
frozen, as on the torch side."""

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
            obs, env_state, key, ret, steps, done, cut_short = carry
            key, k_act, k_env = jax.random.split(key, 3)
            res = env.step(k_env, env_state, act(setup, params, normalise, obs, deterministic, k_act))
            ended = jnp.logical_or(res.terminated, res.truncated)
            return (res.obs, res.env_state, key, ret + res.reward, steps + 1, ended, res.truncated & ~res.terminated)

        def cond(carry):
            return jnp.logical_and(~carry[5], carry[4] < limit)

        carry = (obs, env_state, k_loop, jnp.zeros(()), jnp.zeros((), jnp.int32), jnp.array(False), jnp.array(False))
        _, _, _, ret, steps, done, truncated = jax.lax.while_loop(cond, body, carry)
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


def act(setup, params, normalise, obs, deterministic: bool, key):
    """The env's action(s) for one observation or a batch: the greedy / mean action, or a sample."""
    from reflectrl.trainers.ppo_jax import ppo

    out, _ = ppo.policy_out(params, normalise(obs))
    if deterministic:
        action = jnp.argmax(out, -1).astype(jnp.int32) if setup.env.discrete else out
    else:
        action = ppo.sample_action(setup, params, out, key)
    return ppo.env_action(setup, action)
