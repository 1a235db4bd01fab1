"""PPO compiled end to end (PureJaxRL's shape): one training iteration, rollout, GAE, the
signals' fits and terms, the update and the exploration metrics, is one pure function of the
training state; `make_program` vmaps it over seeds, scans that over K iterations and jits the
whole, so a call advances every seed K iterations without returning to Python.

The algorithm is the torch PPO's (trainers/ppo, onpolicy/update.py), with CleanRL's ppo.py
and ppo_continuous_action.py settings and the same knobs (PPOConfig): separate tanh MLPs for
actor and critic with orthogonal init, Adam (eps 1e-5) with linear annealing, per-minibatch
advantage normalisation then the signals' weights, clipped value loss, global grad-norm clip;
GAE that tells truncation from termination (bootstrapping a truncated step from V of its
final observation). Signals apply in the order written and combine as signals/compose.py
says: reward terms add (one estimate on their sum), advantage terms add, weights multiply;
a signal's reward stream gets its own value head (RND's intrinsic stream), and the signals
see it weighted by k_s = coef / extrinsic_coef in the Batch's intrinsic_* fields: its values
at collection from the start, its rewards once its signal gave them, its advantages as the
policy used them in after_update (gear's advantage/select, shaping's distill=total).

With policy=gru the policy is PureJaxRL's ppo_rnn.py shape: a GRU above the encoder, linear heads on its
output (the Batch's features); its hidden state is in the state ("hidden"), zeroed where an episode starts, and
the update re-runs whole per-env sequences from the rollout's initial hidden state (minibatches split the envs).

With norm_obs / norm_reward, each env's running statistics are in the state and the rollout sees
the env through the torch side's per-env wrappers (normalise_step; off at the JAX defaults).

Exploration metrics inside the program: `unique_states` (distinct keys among the
iteration's steps), `unique_states_total` (over training: a visited-table of key_space
entries), `visitation_entropy` (of the keys of the last WINDOW iterations), and
`first_reward_step` (-1 until the first non-zero env reward; the host logs None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from reflectrl import nets_jax as nets
from reflectrl.envs.jax_envs import vector_step
from reflectrl.estimators_jax import gae
from reflectrl.runs.progress import RECENT_EPISODES
from reflectrl.signals.jax_base import Batch, Context, SeedKnobs
from reflectrl.signals.jax_standalone import compose

WINDOW = 10  # iterations in the visitation-entropy window (trainers/exploration_metrics.py)
# A row's returns of the last episodes that ended in its iteration (oldest first, NaN where fewer ended): not a
# logged metric, but what the end-of-run summary's "mean return of the last N episodes" is made of, as on torch
ENDED_RETURNS = "ended_returns"
# PPO's knobs that may differ between the seeds of one program (a sweep's trials, `sweep --vmap-trials`):
# read from each seed's state["hyper"] (traced) where they differ, from PPOConfig (constants) where they do not.
# A signal's own (as "SIGNAL.KNOB"): its class's vector_knobs, read through Signal.seed_cfg.
VECTOR_KNOBS = ("learning_rate", "ent_coef", "vf_coef", "clip_coef", "max_grad_norm")


@dataclass(frozen=True, eq=False)
class Setup:
    """What the compiled program is built from (static)."""

    env: Any                    # envs.jax_envs.JaxEnv
    knobs: Any                  # PPOConfig, resolved
    signals: tuple = ()         # the JAX signals (signals/NAME/jax.py), in --algo order
    total_iterations: int = 1
    snapshots: tuple = ()       # 1-based iterations whose rollouts are kept for state maps (runs/state_samples.py)
    varying: tuple = ()         # knobs that differ between the program's seeds (VECTOR_KNOBS, "SIGNAL.KNOB"):
                                # their values in each seed's state["hyper"]

    @property
    def recurrent(self) -> bool:
        """policy=gru: a GRU above the encoder, its hidden state carried in state["hidden"]."""
        return getattr(self.knobs, "policy", "mlp") == "gru"

    @property
    def T(self) -> int:
        return self.knobs.num_steps

    @property
    def N(self) -> int:
        return self.knobs.num_envs

    @property
    def stream(self):
        streams = [s.stream for s in self.signals if s.stream is not None]
        if len(streams) > 1:
            from reflectrl.errors import UserError

            raise UserError("backend=jax learns one signal reward stream; these signals declare "
                            f"{', '.join(s.name for s in streams)}")
        return streams[0] if streams else None

    def seed_stream(self, knobs: dict | None):
        """The reward stream as one seed sees it (Signal.seed_stream: its coefficients may differ between
        the program's seeds); `knobs`: the seed's signal knobs (signal_knobs)."""
        owner = next((s for s in self.signals if s.stream is not None), None)
        return None if owner is None else owner.seed_stream(knobs)

    def context(self) -> Context:
        k, env = self.knobs, self.env
        return Context(obs_dim=env.obs_dim, action_dim=env.action_dim, discrete=env.discrete,
                       feature_dim=k.hidden_sizes[-1], learning_rate=k.learning_rate, gamma=k.gamma,
                       gae_lambda=k.gae_lambda, num_steps=k.num_steps, num_envs=k.num_envs,
                       total_iterations=self.total_iterations, key_space=env.key_space)


def seed_knobs(setup: Setup, state: dict):
    """PPOConfig's knobs as one seed sees them: the varying ones (Setup.varying) from its state["hyper"]."""
    ppo = {k: v for k, v in state.get("hyper", {}).items() if "." not in k}
    return SeedKnobs(setup.knobs, ppo) if ppo else setup.knobs


def signal_knobs(state: dict) -> dict | None:
    """The signals' varying knobs ("SIGNAL.KNOB": this seed's value) for the Batch; None where none vary."""
    knobs = {k: v for k, v in state.get("hyper", {}).items() if "." in k}
    return knobs or None


# --------------------------------------------------------------------------- the policy

def init_params(setup: Setup, key) -> dict:
    if setup.recurrent:
        return init_recurrent_params(setup, key)
    env, sizes = setup.env, tuple(setup.knobs.hidden_sizes)
    k_actor, k_critic, k_stream = jax.random.split(key, 3)
    params = {"actor": nets.orthogonal_mlp(k_actor, (env.obs_dim, *sizes, env.action_dim), 0.01),
              "critic": nets.orthogonal_mlp(k_critic, (env.obs_dim, *sizes, 1), 1.0)}
    if not env.discrete:
        params["log_std"] = jnp.zeros((env.action_dim,))
    if setup.stream is not None:
        params["stream_critic"] = nets.orthogonal_mlp(k_stream, (env.obs_dim, *sizes, 1), 1.0)
    return params


def actor_features(params, obs):
    """The actor's last hidden layer (Batch.features)."""
    x = obs
    for layer in params["actor"][:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x


def policy_out(params, obs):
    """(logits or mean, features)."""
    features = actor_features(params, obs)
    last = params["actor"][-1]
    return features @ last["w"] + last["b"], features


def value(params, obs, head: str = "critic"):
    return nets.mlp(params[head], obs, jnp.tanh)[..., 0]


# --------------------------------------------------------------------------- the recurrent policy (policy=gru)
# PureJaxRL's ppo_rnn.py shape: one encoder (the tanh MLP of hidden_sizes), a GRU of width hidden_sizes[-1] above
# it, and linear actor, critic (and stream critic) heads on the GRU's output, which is also Batch.features. The
# hidden state is zeroed where an episode starts: the rollout zeroes it after a step that ended its episode, and
# the update re-runs each env's sequence from the rollout's initial hidden state, zeroing it at the same steps.

def init_recurrent_params(setup: Setup, key) -> dict:
    env, sizes = setup.env, tuple(setup.knobs.hidden_sizes)
    width = sizes[-1]
    k_enc, k_gru, k_actor, k_critic, k_stream = jax.random.split(key, 5)
    params = {"encoder": nets.orthogonal_mlp(k_enc, (env.obs_dim, *sizes), math.sqrt(2.0)),
              "gru": nets.gru_init(k_gru, width, width),
              "actor": nets.orthogonal_mlp(k_actor, (width, env.action_dim), 0.01),
              "critic": nets.orthogonal_mlp(k_critic, (width, 1), 1.0)}
    if not env.discrete:
        params["log_std"] = jnp.zeros((env.action_dim,))
    if setup.stream is not None:
        params["stream_critic"] = nets.orthogonal_mlp(k_stream, (width, 1), 1.0)
    return params


def init_hidden(setup: Setup, batch_shape=()) -> jax.Array:
    """The hidden state at an episode's start: zeros (..., hidden_sizes[-1])."""
    return jnp.zeros((*batch_shape, setup.knobs.hidden_sizes[-1]), jnp.float32)


def encode(params, obs):
    """The recurrent policy's encoder: tanh after every layer."""
    x = obs
    for layer in params["encoder"]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x


def recurrent_features(params, hidden, obs):
    """The GRU's output for `obs` from `hidden` (the features: the heads' input, and the next hidden state)."""
    return nets.gru(params["gru"], hidden, encode(params, obs))


def unroll(params, hidden, obs, starts):
    """The features of a rollout's sequences (T, n, H) from their initial hidden state (n, H), zeroed before
    each step where `starts` (T, n): the step's observation begins an episode."""
    def step(h, x):
        o, start = x
        h = recurrent_features(params, jnp.where(start[:, None], 0.0, h), o)
        return h, h

    _, features = jax.lax.scan(step, hidden, (obs, starts))
    return features


def head_out(params, features, head: str):
    """A linear head's output on the features ((..., out))."""
    return nets.mlp(params[head], features)


def episode_starts(done):
    """(T, N): whether step t's observation begins an episode (step t - 1 ended one); False at t = 0,
    whose hidden state the rollout already zeroed where the last rollout's final step ended an episode."""
    return jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]], axis=0)


def log_prob_entropy(setup: Setup, params, out, actions):
    if setup.env.discrete:
        logp_all = jax.nn.log_softmax(out)
        logp = jnp.take_along_axis(logp_all, actions[..., None].astype(jnp.int32), -1)[..., 0]
        entropy = -(jnp.exp(logp_all) * logp_all).sum(-1)
        return logp, entropy
    log_std = jnp.broadcast_to(params["log_std"], out.shape)
    logp = (-0.5 * ((actions - out) / jnp.exp(log_std)) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
    return logp, entropy


def sample_action(setup: Setup, params, out, key):
    if setup.env.discrete:
        return jax.random.categorical(key, out).astype(jnp.int32)
    return out + jnp.exp(params["log_std"]) * jax.random.normal(key, out.shape)


def env_action(setup: Setup, action):
    """What the env is given: a continuous action clipped to its Box (CleanRL's ClipAction)."""
    if setup.env.discrete:
        return action
    return jnp.clip(action, setup.env.action_low, setup.env.action_high)


def optimizer(knobs) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(knobs.max_grad_norm),
                       optax.inject_hyperparams(optax.adam)(learning_rate=knobs.learning_rate, eps=1e-5))


# --------------------------------------------------------------------------- the training state

def init_state(setup: Setup, seed_key, hyper: dict | None = None) -> dict:
    """A seed's training state, every leaf strongly typed: a weakly typed leaf (navix's reset writes a
    Python 0.0) comes back strongly typed from an iteration, and the program would compile a second time.
    `hyper`: the seed's values of Setup.varying (float32 scalars), kept in the state as "hyper"."""
    state = _init_state(setup, seed_key)
    if setup.varying:
        state["hyper"] = {name: jnp.asarray(hyper[name], jnp.float32) for name in setup.varying}
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), state)


def _init_state(setup: Setup, seed_key) -> dict:
    env, N = setup.env, setup.N
    k_params, k_env, k_sig, k_rng = jax.random.split(seed_key, 4)
    params = init_params(setup, k_params)
    obs, env_state, keys = jax.vmap(env.reset)(jax.random.split(k_env, N))
    signal_states = compose(setup.signals).init(k_sig, setup.context())
    achievements = len(env.achievement_names)
    normalizer, obs = init_normalizer(setup, obs)
    state = {
        "params": params,
        "opt_state": optimizer(setup.knobs).init(params),
        "env_state": env_state, "obs": obs, "keys": keys.astype(jnp.int32),
        "rng": k_rng,
        "signals": signal_states,
        "ep_return": jnp.zeros((N,)), "ep_length": jnp.zeros((N,), jnp.int32),
        "iteration": jnp.zeros((), jnp.int32), "global_step": jnp.zeros((), jnp.int32),
        "seen": jnp.zeros((env.key_space,), bool),
        "window": jnp.full((WINDOW, setup.T * N), -1, jnp.int32),
        "first_reward_step": jnp.full((), -1, jnp.int32),
        "achieved_ever": jnp.zeros((achievements,), bool),
        "snapshots": init_snapshots(setup),
    }
    if setup.recurrent:  # absent with policy=mlp: its leaves stay as they were
        state["hidden"] = init_hidden(setup, (N,))
    if normalizer:  # absent at the defaults: their leaves stay as they were
        state["normalizer"] = normalizer
    return state


SNAPSHOT_OBS_DIM = 64  # observations kept in a state-map snapshot up to this width (state_samples.MAX_OBS_DIM)


def snapshot_fields(setup: Setup) -> dict:
    """{name: (shape per step, dtype)} of what a state-map snapshot keeps of a rollout."""
    fields = {"state_keys": ((), jnp.int32), "rewards": ((), jnp.float32)}
    if setup.env.obs_dim <= SNAPSHOT_OBS_DIM:
        fields["obs"] = ((setup.env.obs_dim,), jnp.float32)
    for name in term_names(setup):
        fields[f"term:{name}"] = ((), jnp.float32)
    return fields


def term_names(setup: Setup) -> list[str]:
    """The per-step terms the signals give, as the torch side names them ("count reward", "gear weight", ...)."""
    names = []
    for s in setup.signals:
        names += [f"{s.name} {kind}" for kind in s.term_kinds()]
        if s.stream is not None:
            names.append(f"{s.name} {s.stream.name}")
    return list(dict.fromkeys(names))


def init_snapshots(setup: Setup) -> dict:
    k = len(setup.snapshots)
    out = {name: jnp.zeros((k, setup.T, setup.N, *shape), dtype) for name, (shape, dtype) in
           snapshot_fields(setup).items()}
    out["global_step"] = jnp.zeros((k,), jnp.int32)
    return out


def keep_snapshot(setup: Setup, state: dict, traj: dict, terms: dict, step_before, it) -> dict:
    """Write this iteration's rollout into its snapshot slot, where it is one of setup.snapshots."""
    if not setup.snapshots:
        return state["snapshots"]
    at = jnp.asarray(setup.snapshots, jnp.int32)
    hit = at == it + 1
    slot, any_hit = jnp.argmax(hit), hit.any()
    values = {"state_keys": traj["state_keys"], "rewards": traj["rewards"], "obs": traj["obs"]}
    # a term a signal did not give this iteration: 0, or for weights 1 (gear at temperature inf gives none)
    values.update({f"term:{name}": terms.get(name, (jnp.ones_like if name.endswith(" weight") else jnp.zeros_like)(
        traj["rewards"])) for name in term_names(setup)})
    snaps = dict(state["snapshots"])
    for name in snapshot_fields(setup):
        snaps[name] = jnp.where(any_hit, snaps[name].at[slot].set(values[name].astype(snaps[name].dtype)), snaps[name])
    snaps["global_step"] = jnp.where(any_hit, snaps["global_step"].at[slot].set(step_before), snaps["global_step"])
    return snaps


# --------------------------------------------------------------------------- observation and reward normalisation
# The torch side's per-env wrappers (envs/__init__.py _make_training_env: NormalizeObservation, ClipObservation,
# NormalizeReward, ClipReward on each of the N envs; envs/normalize.py), in the program: each env keeps its own
# running statistics in state["normalizer"], updated one step at a time as Gymnasium does (Chan's parallel
# update with a batch of one). Off at the defaults on backend=jax (resolve.py); float32, so an env's count
# stops growing past 2^24 updates and its statistics then move by 1/2^24 a step.

NORM_EPSILON = 1e-8  # Gymnasium's epsilon under the square root (NormalizeObservation, NormalizeReward)


def rms_init(envs: int, shape=()) -> dict:
    """Gymnasium's RunningMeanStd before any data, for each of `envs` envs: mean 0, var 1, count 1e-4."""
    return {"mean": jnp.zeros((envs, *shape), jnp.float32), "var": jnp.ones((envs, *shape), jnp.float32),
            "count": jnp.full((envs,), 1e-4, jnp.float32)}


def rms_update(rms: dict, x) -> dict:
    """One sample into one env's statistics (envs/normalize.py's _update_one)."""
    delta = x - rms["mean"]
    total = rms["count"] + 1.0
    return {"mean": rms["mean"] + delta / total,
            "var": (rms["var"] * rms["count"] + jnp.square(delta) * (rms["count"] / total)) / total,
            "count": total}


def normalise_obs(rms: dict, obs, clip: float):
    """NormalizeObservation then ClipObservation."""
    return jnp.clip((obs - rms["mean"]) / jnp.sqrt(rms["var"] + NORM_EPSILON), -clip, clip)


def init_normalizer(setup: Setup, obs):
    """(each env's statistics after Gymnasium's reset has seen its first observation, that observation as
    the policy sees it); ({}, obs) where the run normalises nothing."""
    k, N = setup.knobs, setup.N
    normalizer = {}
    if k.norm_obs:
        rms = jax.vmap(rms_update)(rms_init(N, (setup.env.obs_dim,)), obs)
        normalizer["obs"] = rms
        obs = normalise_obs(rms, obs, k.clip_obs)
    if k.norm_reward:
        normalizer["return"] = rms_init(N)
        normalizer["discounted_return"] = jnp.zeros((N,), jnp.float32)
    return normalizer, obs


def normalise_step(setup: Setup, normalizer: dict, res):
    """A vector step through each env's wrappers: (statistics, next observation, final observation, reward)
    as the policy sees them. An env whose episode ended updates its observation statistics twice, as
    Gymnasium's step then same-step reset do: with the observation reached, then with the reset's. Its
    discounted return restarts at a termination (reward normaliser: r / sqrt(var of that return + eps))."""
    k = setup.knobs
    normalizer = dict(normalizer)
    next_obs, final_obs, reward = res.obs, res.final_obs, res.reward
    if k.norm_obs:
        done = jnp.logical_or(res.terminated, res.truncated)
        stepped = jax.vmap(rms_update)(normalizer["obs"], res.final_obs)
        final_obs = normalise_obs(stepped, res.final_obs, k.clip_obs)
        reset = jax.vmap(rms_update)(stepped, res.obs)
        rms = jax.tree_util.tree_map(lambda a, b: jnp.where(done.reshape(done.shape + (1,) * (a.ndim - 1)), a, b),
                                     reset, stepped)
        next_obs = jnp.where(done[:, None], normalise_obs(rms, res.obs, k.clip_obs), final_obs)
        normalizer["obs"] = rms
    if k.norm_reward:
        ret = normalizer["discounted_return"] * k.gamma * (1.0 - res.terminated.astype(jnp.float32)) + res.reward
        rms = jax.vmap(rms_update)(normalizer["return"], ret)
        reward = jnp.clip(res.reward / jnp.sqrt(rms["var"] + NORM_EPSILON), -k.clip_reward, k.clip_reward)
        normalizer["return"], normalizer["discounted_return"] = rms, ret
    return normalizer, next_obs, final_obs, reward


def frozen_obs_normaliser(knobs, normalizer: dict | None, seed: int = 0):
    """obs -> obs as the policy saw it in training, with env 0's statistics frozen (the torch side's eval and
    checkpoint keep envs[0]'s); the identity where the run did not normalise observations. `normalizer`:
    state["normalizer"] of the program's seeds (leaves (S, N, ...))."""
    if not knobs.norm_obs or not normalizer:
        return lambda obs: obs
    rms = jax.tree_util.tree_map(lambda x: np.asarray(x)[seed, 0], normalizer["obs"])  # on the host: no gather
    return lambda obs: normalise_obs(rms, obs, knobs.clip_obs)


# --------------------------------------------------------------------------- one iteration

def rollout(setup: Setup, state: dict):
    env, T = setup.env, setup.T
    params = state["params"]

    def step(carry, key):
        obs, env_state, keys, ep_ret, ep_len, normalizer, hidden = carry
        k_act, k_env = jax.random.split(key)
        if setup.recurrent:
            features = recurrent_features(params, hidden, obs)
            out = head_out(params, features, "actor")
        else:
            out, features = policy_out(params, obs)
        action = sample_action(setup, params, out, k_act)
        logp, _ = log_prob_entropy(setup, params, out, action)
        v = head_out(params, features, "critic")[..., 0] if setup.recurrent else value(params, obs)
        res = vector_step(env, k_env, env_state, env_action(setup, action))
        next_obs, final_obs, reward = res.obs, res.final_obs, res.reward
        if normalizer:
            normalizer, next_obs, final_obs, reward = normalise_step(setup, normalizer, res)
        done = jnp.logical_or(res.terminated, res.truncated)
        ep_ret = ep_ret + res.reward  # the env's own return, as torch's RecordEpisodeStatistics below the wrappers
        ep_len = ep_len + 1
        record = {"obs": obs, "actions": action, "logprobs": logp, "values": v, "features": features,
                  "rewards": reward, "terminations": res.terminated.astype(jnp.float32),
                  "truncations": res.truncated.astype(jnp.float32), "next_obs": final_obs,
                  "state_keys": keys, "next_state_keys": res.reached_key.astype(jnp.int32),
                  "done": done, "episode_return": ep_ret, "episode_length": ep_len,
                  "achievements": res.achievements}
        ep_ret = jnp.where(done, 0.0, ep_ret)
        ep_len = jnp.where(done, 0, ep_len)
        if setup.recurrent:  # the next step's hidden state: zeroed where the next observation begins an episode
            hidden = jnp.where(done[:, None], 0.0, features)
        return (next_obs, res.env_state, res.key.astype(jnp.int32), ep_ret, ep_len, normalizer, hidden), record

    rng, key = jax.random.split(state["rng"])
    carry = (state["obs"], state["env_state"], state["keys"], state["ep_return"], state["ep_length"],
             state.get("normalizer", {}), state.get("hidden", ()))
    carry, traj = jax.lax.scan(step, carry, jax.random.split(key, T))
    obs, env_state, keys, ep_ret, ep_len, normalizer, hidden = carry
    if setup.recurrent:  # the rollout's initial hidden state, from which the update re-runs its sequences
        traj = {**traj, "initial_hidden": state["hidden"]}
    state = {**state, "rng": rng, "obs": obs, "env_state": env_state, "keys": keys, "ep_return": ep_ret,
             "ep_length": ep_len}
    if normalizer:
        state["normalizer"] = normalizer
    if setup.recurrent:
        state["hidden"] = hidden
    return state, traj


def exploration_metrics(setup: Setup, state: dict, traj: dict):
    keys = traj["state_keys"].reshape(-1)
    sorted_keys = jnp.sort(keys)
    unique = 1 + jnp.sum(sorted_keys[1:] != sorted_keys[:-1])
    seen = state["seen"].at[keys].set(True).at[traj["next_state_keys"].reshape(-1)].set(True)
    window = jnp.roll(state["window"], 1, axis=0).at[0].set(keys)
    flat = jnp.sort(window.reshape(-1))
    valid = flat >= 0
    starts = jnp.concatenate([jnp.array([True]), flat[1:] != flat[:-1]]) & valid
    segment = jnp.cumsum(starts) - 1
    counts = jax.ops.segment_sum(valid.astype(jnp.float32), jnp.where(valid, segment, flat.shape[0] - 1),
                                 num_segments=flat.shape[0])
    p = counts / jnp.maximum(valid.sum(), 1)
    entropy = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
    rewarded = traj["rewards"] != 0
    any_reward = rewarded.any()
    first_t = jnp.argmax(rewarded.any(axis=1))
    first = jnp.where((state["first_reward_step"] < 0) & any_reward,
                      state["global_step"] + (first_t + 1) * setup.N, state["first_reward_step"])
    state = {**state, "seen": seen, "window": window, "first_reward_step": first}
    return state, {"unique_states": unique, "unique_states_total": seen.sum(), "visitation_entropy": entropy,
                   "first_reward_step": first}


def recurrent_next_features(params, traj: dict):
    """(T, N, H): the GRU's output on the state each step reached, from that step's hidden state (its
    features): what the critic bootstraps a truncated step from, and V of the next step where none ended.
    No recurrence across steps, so one batched call."""
    return recurrent_features(params, traj["features"], traj["next_obs"])


def make_batch(traj: dict, state: dict, params, iteration, global_step, streamed=None) -> Batch:
    """The signals' Batch of a rollout; `streamed`: the reward stream's (values, next values) at
    collection (stream_values), given to the signals weighted by the stream's k_s."""
    not_term = 1.0 - traj["terminations"]
    if "next_features" in traj:  # policy=gru: the critic on the state reached, from the step's hidden state
        next_values = head_out(params, traj["next_features"], "critic")[..., 0] * not_term
    else:
        next_values = value(params, traj["next_obs"]) * not_term
    zeros = jnp.zeros_like(traj["rewards"])
    batch = Batch(obs=traj["obs"], actions=traj["actions"], rewards=traj["rewards"],
                  terminations=traj["terminations"], truncations=traj["truncations"], values=traj["values"],
                  next_values=next_values, next_obs=traj["next_obs"], features=traj["features"],
                  state_keys=traj["state_keys"], next_state_keys=traj["next_state_keys"], advantages=zeros,
                  returns=zeros, iteration=iteration, global_step=global_step, knobs=signal_knobs(state))
    if streamed is not None:
        (values_s, next_values_s), k = streamed
        batch = batch._replace(intrinsic_values=k * values_s, intrinsic_next_values=k * next_values_s)
    return batch


def apply_signals(setup: Setup, state: dict, batch: Batch, key):
    """The signals' hooks before and after the estimate, through their standalone form
    (signals/jax_standalone.py: what a user's own loop calls). Returns (state, Terms, metrics)."""
    k = setup.knobs

    def estimate(rewards):
        return gae(rewards, batch.values, batch.next_values, batch.terminations, batch.truncations, k.gamma,
                   k.gae_lambda)

    states, terms, metrics = compose(setup.signals).update(state["signals"], batch, key, estimate)
    return {**state, "signals": states}, terms, metrics


def stream_values(setup: Setup, params, traj: dict):
    """(V_s(obs), V'_s) of the reward stream under its value head as it collected: V'_s the value of
    the state reached, 0 where an episodic stream's episode terminated (a non-episodic stream runs on)."""
    if "next_features" in traj:  # policy=gru: the head on the features at collection (recurrent_next_features)
        values = head_out(params, traj["features"], "stream_critic")[..., 0]
        next_values = head_out(params, traj["next_features"], "stream_critic")[..., 0]
    else:
        values = value(params, traj["obs"], "stream_critic")
        next_values = value(params, traj["next_obs"], "stream_critic")
    if setup.stream.episodic:
        next_values = next_values * (1.0 - traj["terminations"])
    return values, next_values


def stream_advantages(setup: Setup, streamed, traj: dict, stream_rewards):
    """GAE of a signal's reward stream under its own gamma with its own value head (`streamed`:
    stream_values); a non-episodic stream runs on over episode ends (signals/base.py RewardStream)."""
    s = setup.stream
    values, next_values = streamed
    zeros = jnp.zeros_like(values)
    if s.episodic:
        return gae(stream_rewards, values, next_values, traj["terminations"], traj["truncations"], s.gamma,
                   setup.knobs.gae_lambda)
    return gae(stream_rewards, values, next_values, zeros, zeros, s.gamma, setup.knobs.gae_lambda)


def update(setup: Setup, state: dict, traj: dict, advantages, returns, weights, stream_returns, key, it):
    k = seed_knobs(setup, state)
    B = setup.T * setup.N
    mb = B // k.num_minibatches
    flat = {"obs": traj["obs"].reshape(B, -1), "actions": traj["actions"].reshape((B,) + traj["actions"].shape[2:]),
            "logprobs": traj["logprobs"].reshape(B), "values": traj["values"].reshape(B),
            "advantages": advantages.reshape(B), "returns": returns.reshape(B),
            "weights": (jnp.ones((B,)) if weights is None else weights.reshape(B)),
            "stream_returns": (jnp.zeros((B,)) if stream_returns is None else stream_returns.reshape(B))}
    if setup.recurrent:  # whole per-env sequences (T, N, ...): minibatches split the envs, not the steps
        flat = {"obs": traj["obs"], "actions": traj["actions"], "logprobs": traj["logprobs"],
                "values": traj["values"], "advantages": advantages, "returns": returns,
                "weights": jnp.ones_like(advantages) if weights is None else weights,
                "stream_returns": jnp.zeros_like(advantages) if stream_returns is None else stream_returns,
                "starts": episode_starts(traj["done"])}
    opt = optimizer(k)
    frac = 1.0 - jnp.asarray(it, jnp.float32) / setup.total_iterations if k.anneal_lr else 1.0
    opt_state = state["opt_state"]
    opt_state[1].hyperparams["learning_rate"] = frac * k.learning_rate

    def loss_fn(params, b):
        if setup.recurrent:
            features = unroll(params, b["initial_hidden"], b["obs"], b["starts"])
            out = head_out(params, features, "actor")
        else:
            out, _ = policy_out(params, b["obs"])
        logp, entropy = log_prob_entropy(setup, params, out, b["actions"])
        logratio = logp - b["logprobs"]
        ratio = jnp.exp(logratio)
        adv = b["advantages"]
        if k.norm_adv:
            adv = (adv - adv.mean()) / (adv.std(ddof=1) + 1e-8)
        adv = adv * b["weights"]
        pg_loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1 - k.clip_coef, 1 + k.clip_coef)).mean()
        newvalue = head_out(params, features, "critic")[..., 0] if setup.recurrent else value(params, b["obs"])
        if k.clip_vloss:
            clipped = b["values"] + jnp.clip(newvalue - b["values"], -k.clip_coef, k.clip_coef)
            v_loss = 0.5 * jnp.maximum((newvalue - b["returns"]) ** 2, (clipped - b["returns"]) ** 2).mean()
        else:
            v_loss = 0.5 * ((newvalue - b["returns"]) ** 2).mean()
        if setup.stream is not None:
            stream_value = (head_out(params, features, "stream_critic")[..., 0] if setup.recurrent
                            else value(params, b["obs"], "stream_critic"))
            v_loss = v_loss + 0.5 * ((stream_value - b["stream_returns"]) ** 2).mean()
        loss = pg_loss - k.ent_coef * entropy.mean() + k.vf_coef * v_loss
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = (jnp.abs(ratio - 1.0) > k.clip_coef).mean()
        return loss, (pg_loss, v_loss, entropy.mean(), approx_kl, clipfrac)

    def epoch(carry, ekey):
        params, opt_state = carry
        if setup.recurrent:
            perm = jax.random.permutation(ekey, setup.N).reshape(k.num_minibatches, setup.N // k.num_minibatches)
        else:
            perm = jax.random.permutation(ekey, B).reshape(k.num_minibatches, mb)

        def minibatch(carry, idx):
            params, opt_state = carry
            if setup.recurrent:  # these envs' sequences, re-run from the rollout's initial hidden state
                b = {**jax.tree_util.tree_map(lambda x: x[:, idx], flat), "initial_hidden": traj["initial_hidden"][idx]}
            else:
                b = jax.tree_util.tree_map(lambda x: x[idx], flat)
            (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, b)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), (loss, *aux)

        return jax.lax.scan(minibatch, (params, opt_state), perm)

    (params, opt_state), stats = jax.lax.scan(epoch, (state["params"], opt_state),
                                              jax.random.split(key, k.update_epochs))
    loss, pg_loss, v_loss, entropy, approx_kl, clipfrac = (x.mean() for x in stats)
    y_pred, y_true = flat["values"], flat["returns"]
    if setup.recurrent:
        y_pred, y_true = y_pred.reshape(-1), y_true.reshape(-1)
    var_y = jnp.var(y_true)
    explained = jnp.where(var_y == 0, jnp.nan, 1 - jnp.var(y_true - y_pred) / jnp.where(var_y == 0, 1.0, var_y))
    metrics = {"loss": loss, "policy_loss": pg_loss, "value_loss": v_loss, "entropy": entropy,
               "approx_kl": approx_kl, "clipfrac": clipfrac, "explained_variance": explained,
               "learning_rate": frac * k.learning_rate}
    return {**state, "params": params, "opt_state": opt_state}, metrics


def iteration(setup: Setup, state: dict, it=None):
    """One PPO iteration of one seed: (state, metrics of scalars). `it`: the 0-based iteration, given
    unbatched by the program (every seed is at the same one) so that a signal's `lax.cond` on it stays a
    branch under vmap instead of computing both sides; None: read from the state."""
    k = setup.knobs
    it = state["iteration"] if it is None else it
    step_before = state["global_step"]
    state, traj = rollout(setup, state)
    if setup.recurrent:
        traj = {**traj, "next_features": recurrent_next_features(state["params"], traj)}
    state, explore = exploration_metrics(setup, state, traj)
    rng, k_sig, k_upd, k_after = jax.random.split(state["rng"], 4)
    state = {**state, "rng": rng}
    streamed = stream_values(setup, state["params"], traj) if setup.stream is not None else None
    seed_stream = setup.seed_stream(signal_knobs(state))  # its coefficients: this seed's
    batch = make_batch(traj, state, state["params"], it, step_before,
                       None if streamed is None else (streamed, seed_stream.weight))
    state, terms, sig_metrics = apply_signals(setup, state, batch, k_sig)
    batch, weights, stream = terms.batch, terms.weights, terms.stream
    state = {**state, "snapshots": keep_snapshot(setup, state, traj, terms.by_signal, step_before, it)}
    advantages, returns = terms.advantages, terms.returns
    stream_returns = None
    if setup.stream is not None:
        s = seed_stream
        stream_rewards = stream if stream is not None else jnp.zeros_like(batch.rewards)
        stream_adv, stream_returns = stream_advantages(setup, streamed, traj, stream_rewards)
        advantages = s.extrinsic_coef * advantages + s.coef * stream_adv
        # after the update the signals see the stream as the policy used it (shaping's and gear's totals)
        batch = batch._replace(intrinsic_rewards=s.weight * stream_rewards, intrinsic_advantages=s.weight * stream_adv)
    state, metrics = update(setup, state, traj, advantages, returns, weights, stream_returns, k_upd, it)

    def value_fn(obs):
        if setup.recurrent:  # a lone observation: the critic from an episode's start (zero hidden state)
            params = state["params"]
            return head_out(params, recurrent_features(params, init_hidden(setup, obs.shape[:-1]), obs),
                            "critic")[..., 0]
        return value(state["params"], obs)

    estimate = lambda rewards: gae(rewards, batch.values, batch.next_values, batch.terminations,  # noqa: E731
                                   batch.truncations, k.gamma, k.gae_lambda)
    states, m = compose(setup.signals).after_update(state["signals"], batch, k_after, value_fn, estimate)
    sig_metrics.update(m)
    done = traj["done"]
    episodes = done.sum()
    achieved = traj["achievements"]
    row = {
        "episodes": episodes,
        "episodic_return": jnp.where(episodes > 0, (traj["episode_return"] * done).sum() / jnp.maximum(episodes, 1),
                                     jnp.nan),
        "episodic_length": jnp.where(episodes > 0, (traj["episode_length"] * done).sum() / jnp.maximum(episodes, 1),
                                     jnp.nan),
        ENDED_RETURNS: last_ended(done, traj["episode_return"], RECENT_EPISODES),
        **metrics, **explore, **sig_metrics,
    }
    new_ever = state["achieved_ever"]
    if achieved.shape[-1]:
        ended = achieved * done[..., None]  # an episode's achievements, where it ended
        row["achievements_per_episode"] = jnp.where(episodes > 0, ended.sum() / jnp.maximum(episodes, 1), jnp.nan)
        new_ever = new_ever | achieved.any(axis=(0, 1))
        row["achievements_total"] = new_ever.sum()
        for j, name in enumerate(setup.env.achievement_names):
            row[f"achievement/{name}"] = jnp.where(episodes > 0, ended[..., j].sum() / jnp.maximum(episodes, 1),
                                                   jnp.nan)
    state = {**state, "signals": states, "iteration": state["iteration"] + 1,
             "global_step": step_before + setup.T * setup.N, "achieved_ever": new_ever}
    return state, row


def last_ended(done: jax.Array, returns: jax.Array, count: int) -> jax.Array:
    """The returns of the last `count` episodes that ended in a rollout ((T, N) arrays), oldest first; NaN
    where fewer ended."""
    done, returns = done.reshape(-1), returns.reshape(-1)  # time-major: a later step comes later
    order = jnp.where(done, jnp.arange(done.size), -1)
    latest, at = jax.lax.top_k(order, min(count, done.size))  # the latest first
    return jnp.where(latest >= 0, returns[at], jnp.nan)[::-1]


def make_program(setup: Setup, chunk: int, total: int | None = None):
    """jit(scan of `chunk` iterations of vmap over seeds): (states, first iteration) -> (states, rows
    (chunk, S)). An iteration at or past `total` is computed but not applied (the state passes through),
    so one program of fixed length serves the last, short chunk too."""
    def masked(state, it):
        new, row = iteration(setup, state, it)
        if total is None:
            return new, row
        return jax.tree_util.tree_map(lambda a, b: jnp.where(it < total, a, b), new, state), row

    def run(states, first):
        def body(carry, _):
            states, it = carry
            states, rows = jax.vmap(masked, in_axes=(0, None))(states, it)
            return (states, it + 1), rows

        (states, _), rows = jax.lax.scan(body, (states, jnp.asarray(first, jnp.int32)), None, length=chunk)
        return states, rows

    return jax.jit(run)


def make_init(setup: Setup):
    """jit(vmap(init_state)): (seed keys (S,), {varying knob: values (S,)}) -> states."""
    return jax.jit(jax.vmap(lambda key, hyper: init_state(setup, key, hyper)))


def seed_key(seed: int) -> jax.Array:
    return jax.random.PRNGKey(np.uint32(seed))
