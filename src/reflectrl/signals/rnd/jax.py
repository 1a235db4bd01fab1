"""Random Network Distillation on the JAX side (torch: signals/rnd/torch.py; its docstring states the method),
for vector observations.

A fixed random target g and a predictor f (MLPs: LeakyReLU trunks of `hidden_sizes`, the target
ending in a linear `embedding_dim` layer, the predictor in two more ReLU layers; orthogonal init,
gain sqrt 2, zero biases). After advantages: the intrinsic reward of step t is
||f(x) - g(x)||^2 / 2 on x = clip((s' - mu) / sigma, +-obs_clip), the running observation
statistics initialised by the first rollout, divided by the running std of a forward filter
R_t = int_gamma R_{t-1} + r_t (per env, over time, across episode ends and rollouts); it is the
rewards of the reward stream "rnd" (`self.stream`: non-episodic, gamma int_gamma, coef int_coef,
the extrinsic advantage weighted ext_coef), None with int_coef=0. After the update: the
predictor trains for `epochs` x `num_minibatches` steps, each on a random `update_proportion`
of its minibatch's rows, with its own Adam (eps 1e-5) at lr_multiplier x the policy's learning
rate, annealed as the policy's, its gradient norm clipped to `max_grad_norm` (torch's
clip_grad_norm_: a factor max_norm / (norm + 1e-6) where below 1).

`schedule` (issue 42): the stream's rewards times the decay factor (signals/schedule.py), logged as
`rnd_schedule_factor`; `constant` multiplies by nothing.

DELIBERATE DIFFERENCE: the running statistics are float32 (torch keeps them in float64).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from reflectrl.nets_jax import orthogonal_many
from reflectrl.signals._jax import schedule_factor
from reflectrl.signals.jax_base import Batch, Output, Signal, Stream
from reflectrl.signals.rnd import RndConfig


def rnd_nets(key, in_dim: int, hidden_sizes, embedding_dim: int):
    """(target, predictor) parameters (torch mlp_nets)."""
    last = hidden_sizes[-1] if hidden_sizes else in_dim
    target_sizes = [in_dim, *hidden_sizes, embedding_dim]
    trunk_sizes = [in_dim, *hidden_sizes]
    tail_sizes = [last, embedding_dim, embedding_dim, embedding_dim]
    shapes = [list(zip(s[:-1], s[1:], strict=True)) for s in (target_sizes, trunk_sizes, tail_sizes)]
    flat = [shape for group in shapes for shape in group]
    ws = orthogonal_many(list(jax.random.split(key, len(flat))), flat, math.sqrt(2.0))
    layers = [{"w": w, "b": jnp.zeros((shape[1],), jnp.float32)} for w, shape in zip(ws, flat, strict=True)]
    return layers[:len(shapes[0])], layers[len(shapes[0]):]


def target_forward(params, x):
    for layer in params[:-1]:
        x = jax.nn.leaky_relu(x @ layer["w"] + layer["b"], 0.01)
    return x @ params[-1]["w"] + params[-1]["b"]


def predictor_forward(params, x, trunk_layers: int):
    """The predictor: `trunk_layers` LeakyReLU layers, then ReLU layers, the last linear."""
    for i, layer in enumerate(params[:-1]):
        z = x @ layer["w"] + layer["b"]
        x = jax.nn.leaky_relu(z, 0.01) if i < trunk_layers else jax.nn.relu(z)
    return x @ params[-1]["w"] + params[-1]["b"]


def rms_init(shape=()):
    """Gymnasium's RunningMeanStd before any data: mean 0, var 1, count 1e-4."""
    return {"mean": jnp.zeros(shape, jnp.float32), "var": jnp.ones(shape, jnp.float32),
            "count": jnp.asarray(1e-4, jnp.float32)}


def rms_update_from_moments(rms, batch_mean, batch_var, batch_count):
    """The parallel update of Chan et al. (gymnasium's update_mean_var_count_from_moments)."""
    delta = batch_mean - rms["mean"]
    tot = rms["count"] + batch_count
    mean = rms["mean"] + delta * batch_count / tot
    m2 = rms["var"] * rms["count"] + batch_var * batch_count + delta ** 2 * rms["count"] * batch_count / tot
    return {"mean": mean, "var": m2 / tot, "count": tot}


def rms_update(rms, x):
    return rms_update_from_moments(rms, x.mean(0), x.var(0), jnp.asarray(x.shape[0], jnp.float32))


def normalise(rms, x, clip: float):
    return jnp.clip((x - rms["mean"]) / jnp.sqrt(rms["var"] + 1e-8), -clip, clip)


def prediction_error(target, predictor, z, trunk_layers: int):
    """||f(z) - g(z)||^2 / 2 per row."""
    return ((predictor_forward(predictor, z, trunk_layers) - target_forward(target, z)) ** 2).sum(-1) / 2


def forward_filter(rewems, rewards, gamma: float):
    """R_t = gamma R_{t-1} + r_t per env over time: (the (T, N) filtered values, the last R)."""
    def step(r_prev, r):
        r_new = r_prev * gamma + r
        return r_new, r_new

    last, out = jax.lax.scan(step, rewems, rewards)
    return out, last


def clip_by_norm_torch(grads, max_norm: float):
    """torch.nn.utils.clip_grad_norm_: scale by max_norm / (norm + 1e-6) where that is below 1."""
    norm = jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree_util.tree_leaves(grads)))
    coef = jnp.minimum(max_norm / (norm + 1e-6), 1.0)
    return jax.tree_util.tree_map(lambda g: g * coef, grads)


class Rnd(Signal):
    name = "rnd"
    config = RndConfig
    vector_knobs = ("int_coef", "ext_coef")
    stream_knobs = {"coef": "int_coef", "extrinsic_coef": "ext_coef"}
    positive_knobs = ("int_coef",)
    reads = ("next_obs",)

    def term_kinds(self):
        return ()  # its rewards are its reward stream's

    def __init__(self, cfg: RndConfig):
        super().__init__(cfg)
        self.stream = (Stream(name="rnd", gamma=cfg.int_gamma, episodic=False, coef=cfg.int_coef,
                              extrinsic_coef=cfg.ext_coef) if cfg.int_coef > 0 else None)
        self.trunk_layers = len(cfg.hidden_sizes)
        self.opt = optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-5)

    def init(self, key, ctx):
        super().init(key, ctx)
        target, predictor = rnd_nets(key, ctx.obs_dim, tuple(self.cfg.hidden_sizes), self.cfg.embedding_dim)
        return {"target": target, "predictor": predictor, "opt": self.opt.init(predictor),
                "obs_rms": rms_init((ctx.obs_dim,)), "reward_rms": rms_init(),
                "rewems": jnp.zeros((ctx.num_envs,), jnp.float32), "initialised": jnp.asarray(False)}

    def _x(self, batch: Batch):
        return batch.next_obs.reshape(batch.values.size, -1).astype(jnp.float32)

    def intrinsic(self, state, batch: Batch):
        """(T, N) intrinsic rewards, raw errors, and the state with its statistics updated (torch
        after_advantages)."""
        x = self._x(batch)
        first = ~state["initialised"]
        updated = rms_update(state["obs_rms"], x)
        obs_rms = jax.tree_util.tree_map(lambda a, b: jnp.where(first, a, b), updated, state["obs_rms"])
        raw = prediction_error(state["target"], state["predictor"], normalise(obs_rms, x, self.cfg.obs_clip),
                               self.trunk_layers).reshape(batch.values.shape)
        filtered, rewems = forward_filter(state["rewems"], raw, self.cfg.int_gamma)
        reward_rms = rms_update_from_moments(state["reward_rms"], filtered.mean(), filtered.var(),
                                             jnp.asarray(filtered.size, jnp.float32))
        reward = raw / jnp.sqrt(reward_rms["var"])
        obs_rms = jax.tree_util.tree_map(lambda a, b: jnp.where(first, a, b), obs_rms, updated)
        state = {**state, "obs_rms": obs_rms, "reward_rms": reward_rms, "rewems": rewems,
                 "initialised": jnp.asarray(True)}
        return reward, raw, state

    def after_advantages(self, state, batch: Batch, key, estimate):
        reward, raw, state = self.intrinsic(state, batch)
        factor = schedule_factor(self.cfg, batch, self.ctx)
        if factor is not None:  # the decayed reward is what the stream's value head learns
            reward = reward * factor
        metrics = {"rnd_intrinsic_mean": reward.mean(), "rnd_intrinsic_max": reward.max(),
                   "rnd_error_mean": raw.mean(), "rnd_return_std": jnp.sqrt(state["reward_rms"]["var"]),
                   "rnd_schedule_factor": jnp.asarray(1.0 if factor is None else factor, jnp.float32)}
        if self.stream is None:
            return state, Output(), metrics
        return state, Output(stream=reward.astype(jnp.float32)), metrics

    def after_update(self, state, batch: Batch, key, value_fn, estimate):
        cfg = self.cfg
        z = normalise(state["obs_rms"], self._x(batch), cfg.obs_clip)
        # torch's iteration is 1-based: frac = 1 - (iteration - 1) / total
        frac = 1.0 - batch.iteration.astype(jnp.float32) / max(1, self.ctx.total_iterations)
        lr = frac * cfg.lr_multiplier * self.ctx.learning_rate
        n = z.shape[0]
        size = max(1, n // cfg.num_minibatches)
        target = target_forward(state["target"], z)

        def loss_fn(p, idx, mask):
            per_row = ((predictor_forward(p, z[idx], self.trunk_layers) - target[idx]) ** 2).mean(-1)
            return (per_row * mask).sum() / jnp.maximum(mask.sum(), 1.0)

        def step(carry, k):
            params, opt_state, order = carry
            j, k = k
            idx = jax.lax.dynamic_slice(order, (j * size,), (size,))
            mask = (jax.random.uniform(k, (size,)) < cfg.update_proportion).astype(jnp.float32)
            loss, grads = jax.value_and_grad(loss_fn)(params, idx, mask)
            grads = clip_by_norm_torch(grads, cfg.max_grad_norm)
            updates, opt_state = self.opt.update(grads, opt_state, params)
            params = jax.tree_util.tree_map(lambda p, u: p - lr * u, params, updates)
            return (params, opt_state, order), loss

        def epoch(carry, k):
            params, opt_state = carry
            k_order, k_masks = jax.random.split(k)
            order = jax.random.permutation(k_order, n)
            steps = (jnp.arange(cfg.num_minibatches), jax.random.split(k_masks, cfg.num_minibatches))
            (params, opt_state, _), losses = jax.lax.scan(step, (params, opt_state, order), steps)
            return (params, opt_state), losses

        (predictor, opt_state), losses = jax.lax.scan(epoch, (state["predictor"], state["opt"]),
                                                      jax.random.split(key, cfg.epochs))
        return {**state, "predictor": predictor, "opt": opt_state}, {"rnd_predictor_loss": losses.mean()}
