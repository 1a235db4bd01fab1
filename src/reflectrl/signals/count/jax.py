"""The episodic count bonus on the JAX side (torch: signals/count/torch.py): r_t += beta / sqrt(N(s_{t+1})).

`episodic=true` (the default): each env keeps the counts of its current episode, its first
state counted, dropped when it ends, carried over rollouts; the table is (N, key_space) int32
with, per entry, the episode it was written in (`stamps`): an entry of an earlier episode
reads 0, so starting an episode costs nothing (no O(key_space) reset per step). The torch
signal's order exactly: per env, a step that starts an episode counts its first state, then
the state it reaches. `episodic=false`: one (key_space,) table over all of training and every
env. DELIBERATE DIFFERENCE: there the torch loop runs env by env over the whole rollout (env 0's
T steps, then env 1's), which a compiled program cannot afford (N x T sequential steps); here
the envs' steps are counted time-major, step t of every env before step t + 1, envs in column
order within a step (the episodes' first states of step t first). With one env, and for the
table at the end of every rollout, the two agree.

`schedule` (issue 42) decays beta over the run: beta x factor (signals/schedule.py; the JAX
progress reads the batch's 0-based iteration + 1, or its global_step + T x N); `constant` leaves
today's program as it was. Logged: `count_beta` (beta x factor).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from reflectrl.signals._jax import schedule_factor
from reflectrl.signals.count import CountConfig
from reflectrl.signals.jax_base import Batch, Signal


def episodic_visits(counts, stamps, episode, starting, state_keys, next_state_keys, ended):
    """(T, N) visit counts N_episode(s_{t+1}) and the updated (counts, stamps, episode, starting)."""
    rows = jnp.arange(state_keys.shape[1])

    def step(carry, x):
        counts, stamps, episode, starting = carry
        s, s2, end = x
        episode = episode + starting.astype(episode.dtype)  # a new episode: every older entry reads 0
        cur = jnp.where(stamps[rows, s] == episode, counts[rows, s], 0)
        counts = counts.at[rows, s].set(jnp.where(starting, cur + 1, counts[rows, s]))
        stamps = stamps.at[rows, s].set(jnp.where(starting, episode, stamps[rows, s]))
        n = jnp.where(stamps[rows, s2] == episode, counts[rows, s2], 0) + 1
        counts = counts.at[rows, s2].set(n)
        stamps = stamps.at[rows, s2].set(episode)
        return (counts, stamps, episode, end), n

    carry, n = jax.lax.scan(step, (counts, stamps, episode, starting), (state_keys, next_state_keys, ended))
    return n, carry


def global_visits(table, starting, state_keys, next_state_keys, ended):
    """(T, N) visit counts N(s_{t+1}) over all of training (time-major) and the updated (table, starting)."""
    N = state_keys.shape[1]
    earlier = jnp.tril(jnp.ones((N, N), jnp.int32), -1)  # earlier[i, j] = 1 where j < i

    def step(carry, x):
        table, starting = carry
        s, s2, end = x
        table = table.at[s].add(starting.astype(table.dtype))
        same_before = ((s2[:, None] == s2[None, :]).astype(jnp.int32) * earlier).sum(1)
        n = table[s2] + same_before + 1
        table = table.at[s2].add(1)
        return (table, end), n

    carry, n = jax.lax.scan(step, (table, starting), (state_keys, next_state_keys, ended))
    return n, carry


class Count(Signal):
    name = "count"
    vector_knobs = ("beta",)
    reads = ("state_keys", "next_state_keys")
    config = CountConfig

    def __init__(self, cfg: CountConfig):
        super().__init__(cfg)

    def init(self, key, ctx):
        super().init(key, ctx)
        N, K = ctx.num_envs, ctx.key_space
        starting = jnp.ones((N,), bool)
        if self.cfg.episodic:
            return {"counts": jnp.zeros((N, K), jnp.int32), "stamps": jnp.zeros((N, K), jnp.int32),
                    "episode": jnp.zeros((N,), jnp.int32), "starting": starting}
        return {"counts": jnp.zeros((K,), jnp.int32), "starting": starting}

    def visits(self, state, state_keys, next_state_keys, ended):
        """(T, N) int32 visits after each step, and the state with the counts updated."""
        s, s2 = state_keys.astype(jnp.int32), next_state_keys.astype(jnp.int32)
        ended = ended.astype(bool)
        if self.cfg.episodic:
            n, (counts, stamps, episode, starting) = episodic_visits(
                state["counts"], state["stamps"], state["episode"], state["starting"], s, s2, ended)
            return n, {"counts": counts, "stamps": stamps, "episode": episode, "starting": starting}
        n, (counts, starting) = global_visits(state["counts"], state["starting"], s, s2, ended)
        return n, {"counts": counts, "starting": starting}

    def shape_rewards(self, state, batch: Batch, key):
        ended = (batch.terminations > 0) | (batch.truncations > 0)
        n, state = self.visits(state, batch.state_keys, batch.next_state_keys, ended)
        factor = schedule_factor(self.cfg, batch, self.ctx)
        cfg = self.seed_cfg(batch)
        beta = cfg.beta if factor is None else cfg.beta * factor  # constant: today's program exactly
        bonus = (beta / jnp.sqrt(n.astype(jnp.float32))).astype(jnp.float32)
        metrics = {"count_bonus_mean": bonus.mean(), "count_visits_mean": n.astype(jnp.float32).mean(),
                   "count_new_frac": (n == 1).astype(jnp.float32).mean(),
                   "count_beta": jnp.asarray(beta, jnp.float32)}
        return state, bonus, metrics
