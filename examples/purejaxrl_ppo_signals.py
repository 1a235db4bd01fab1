"""PureJaxRL's PPO (github.com/luchris429/purejaxrl, ppo.py) on gymnax CartPole-v1, with reflectrl's count
bonus and GEAR weights inside its jitted update: the lines marked `# [signals]`.

    python examples/purejaxrl_ppo_signals.py                # count + GEAR
    python examples/purejaxrl_ppo_signals.py --no-signals   # PureJaxRL's PPO as it is

The signals are pure functions (reflectrl/signals/jax_standalone.py): `init(key, spec)`, then per rollout
`update(state, batch, key, estimate)` gives the advantages after the count bonus and GEAR's per-step
weights, and `after_update` distils GEAR's value head. At their neutral settings (count beta=0, GEAR
temperature=inf) the run is PureJaxRL's bit for bit (tests/test_standalone_jax.py).
"""

from __future__ import annotations

import argparse
from typing import NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState
from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper

import reflectrl.signals.jax_standalone as signals  # [signals]

CONFIG = {
    "LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 40_000, "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5, "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True,
    # [signals] which and their knobs (None: PureJaxRL's PPO); GEAR's head reads the observation
    "SIGNALS": "count+gear", "SIGNAL_KNOBS": {"count": {"beta": 0.01}, "gear": {"temperature": 2.0, "inputs": "obs"}},
}
KEY_BITS = 16  # [signals] the count bonus counts states by a 16-bit SimHash of the observation


class ActorCritic(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, x):
        actor = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x))
        actor = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(actor))
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(actor)
        critic = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x))
        critic = nn.tanh(nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(critic))
        critic = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(critic)
        return logits, jnp.squeeze(critic, axis=-1)


class Transition(NamedTuple):
    done: jnp.ndarray
    action: jnp.ndarray
    value: jnp.ndarray
    reward: jnp.ndarray
    log_prob: jnp.ndarray
    obs: jnp.ndarray
    info: dict


def simhash(obs):  # [signals] a state's key for the count bonus: the signs of KEY_BITS fixed projections
    planes = jax.random.normal(jax.random.PRNGKey(0), (obs.shape[-1], KEY_BITS))
    return jnp.sum(((obs @ planes) > 0).astype(jnp.int32) << jnp.arange(KEY_BITS), axis=-1)


def make_train(config):
    config = {**config, "NUM_UPDATES": config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]}
    config["MINIBATCH_SIZE"] = config["NUM_ENVS"] * config["NUM_STEPS"] // config["NUM_MINIBATCHES"]
    env, env_params = gymnax.make(config["ENV_NAME"])
    env = LogWrapper(FlattenObservationWrapper(env))
    obs_dim, action_dim = env.observation_space(env_params).shape[0], env.action_space(env_params).n
    tx_signals = (signals.signals(config["SIGNALS"], **config["SIGNAL_KNOBS"])  # [signals]
                  if config["SIGNALS"] else None)
    spec = signals.Context(obs_dim=obs_dim, action_dim=action_dim, discrete=True, feature_dim=64,  # [signals]
                           learning_rate=config["LR"], gamma=config["GAMMA"], gae_lambda=config["GAE_LAMBDA"],
                           num_steps=config["NUM_STEPS"], num_envs=config["NUM_ENVS"],
                           total_iterations=config["NUM_UPDATES"], key_space=2 ** KEY_BITS)

    def linear_schedule(count):
        frac = 1.0 - (count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"])) / config["NUM_UPDATES"]
        return config["LR"] * frac

    def log_prob_entropy(logits, action):
        logp = jax.nn.log_softmax(logits)
        return jnp.take_along_axis(logp, action[..., None], -1)[..., 0], -(jnp.exp(logp) * logp).sum(-1)

    def train(rng):
        rng, signal_rng = jax.random.split(rng)  # [signals] the signals' keys: apart from PPO's
        network = ActorCritic(action_dim)
        rng, _rng = jax.random.split(rng)
        network_params = network.init(_rng, jnp.zeros((obs_dim,)))
        lr = linear_schedule if config["ANNEAL_LR"] else config["LR"]
        tx = optax.chain(optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(learning_rate=lr, eps=1e-5))
        train_state = TrainState.create(apply_fn=network.apply, params=network_params, tx=tx)
        rng, _rng = jax.random.split(rng)
        obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(_rng, config["NUM_ENVS"]),
                                                                env_params)
        signal_state = tx_signals.init(signal_rng, spec) if tx_signals else None  # [signals]

        def _update_step(runner_state, update_i):
            def _env_step(runner_state, unused):
                train_state, env_state, last_obs, rng = runner_state
                rng, _rng = jax.random.split(rng)
                logits, value = network.apply(train_state.params, last_obs)
                action = jax.random.categorical(_rng, logits)
                log_prob, _ = log_prob_entropy(logits, action)
                rng, _rng = jax.random.split(rng)
                rng_step = jax.random.split(_rng, config["NUM_ENVS"])
                obsv, env_state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                    rng_step, env_state, action, env_params)
                transition = Transition(terminated | truncated, action, value, reward, log_prob, last_obs, info)
                return (train_state, env_state, obsv, rng), transition

            (train_state, env_state, last_obs, rng), signal_state = runner_state[:4], runner_state[4]
            (train_state, env_state, last_obs, rng), traj_batch = jax.lax.scan(
                _env_step, (train_state, env_state, last_obs, rng), None, config["NUM_STEPS"])
            _, last_val = network.apply(train_state.params, last_obs)

            def _calculate_gae(traj_batch, last_val, rewards):
                def _get_advantages(gae_and_next_value, transition):
                    gae, next_value = gae_and_next_value
                    done, value, reward = transition
                    delta = reward + config["GAMMA"] * next_value * (1 - done) - value
                    gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * (1 - done) * gae
                    return (gae, value), gae

                _, advantages = jax.lax.scan(_get_advantages, (jnp.zeros_like(last_val), last_val),
                                             (traj_batch.done, traj_batch.value, rewards), reverse=True, unroll=16)
                return advantages, advantages + traj_batch.value

            weights, signal_metrics = None, {}
            if tx_signals is None:
                advantages, targets = _calculate_gae(traj_batch, last_val, traj_batch.reward)
            else:  # [signals] the count bonus and GEAR's weights; advantages by PureJaxRL's own GAE
                info = traj_batch.info  # gymnax tells termination from truncation, and keeps the final obs
                terminated, next_obs = info["terminated"].astype(jnp.float32), info["final_observation"]
                next_values = network.apply(train_state.params, next_obs)[1] * (1.0 - terminated)
                batch = signals.make_batch(
                    obs=traj_batch.obs, actions=traj_batch.action, rewards=traj_batch.reward, terminations=terminated,
                    truncations=info["truncated"].astype(jnp.float32), values=traj_batch.value,
                    next_values=next_values, next_obs=next_obs, state_keys=simhash(traj_batch.obs),
                    next_state_keys=simhash(next_obs), iteration=update_i,
                    global_step=update_i * config["NUM_STEPS"] * config["NUM_ENVS"])
                key_update, key_after = jax.random.split(jax.random.fold_in(signal_rng, update_i))
                signal_state, terms, signal_metrics = tx_signals.update(
                    signal_state, batch, key_update, lambda rewards: _calculate_gae(traj_batch, last_val, rewards))
                advantages, targets, weights = terms.advantages, terms.returns, terms.weights

            def _update_epoch(update_state, unused):
                def _update_minbatch(train_state, batch_info):
                    traj_batch, advantages, targets, *weights = batch_info

                    def _loss_fn(params, traj_batch, gae, targets):
                        logits, value = network.apply(params, traj_batch.obs)
                        log_prob, entropy = log_prob_entropy(logits, traj_batch.action)
                        value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(
                            -config["CLIP_EPS"], config["CLIP_EPS"])
                        value_losses = jnp.square(value - targets)
                        value_losses_clipped = jnp.square(value_pred_clipped - targets)
                        value_loss = 0.5 * jnp.maximum(value_losses, value_losses_clipped).mean()
                        ratio = jnp.exp(log_prob - traj_batch.log_prob)
                        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                        if weights:  # [signals] GEAR's per-step weights
                            gae = gae * weights[0]
                        loss_actor1 = ratio * gae
                        loss_actor2 = jnp.clip(ratio, 1.0 - config["CLIP_EPS"], 1.0 + config["CLIP_EPS"]) * gae
                        loss_actor = -jnp.minimum(loss_actor1, loss_actor2).mean()
                        total_loss = loss_actor + config["VF_COEF"] * value_loss - config["ENT_COEF"] * entropy.mean()
                        return total_loss, (value_loss, loss_actor, entropy.mean())

                    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
                    total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)
                    return train_state.apply_gradients(grads=grads), total_loss

                train_state, traj_batch, advantages, targets, weights, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = config["MINIBATCH_SIZE"] * config["NUM_MINIBATCHES"]
                permutation = jax.random.permutation(_rng, batch_size)
                batch = (traj_batch, advantages, targets) + ((weights,) if weights is not None else ())
                batch = jax.tree_util.tree_map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
                shuffled_batch = jax.tree_util.tree_map(lambda x: jnp.take(x, permutation, axis=0), batch)
                minibatches = jax.tree_util.tree_map(
                    lambda x: jnp.reshape(x, [config["NUM_MINIBATCHES"], -1] + list(x.shape[1:])), shuffled_batch)
                train_state, total_loss = jax.lax.scan(_update_minbatch, train_state, minibatches)
                return (train_state, traj_batch, advantages, targets, weights, rng), total_loss

            update_state = (train_state, traj_batch, advantages, targets, weights, rng)
            update_state, loss_info = jax.lax.scan(_update_epoch, update_state, None, config["UPDATE_EPOCHS"])
            train_state, rng = update_state[0], update_state[-1]
            if tx_signals is not None:  # [signals] GEAR distils its value head on this rollout's winners
                value_fn = lambda obs: network.apply(train_state.params, obs)[1]  # noqa: E731
                signal_state, after_metrics = tx_signals.after_update(signal_state, terms.batch, key_after, value_fn)
                signal_metrics = {**signal_metrics, **after_metrics}
            metric = {**traj_batch.info, **signal_metrics}
            return (train_state, env_state, last_obs, rng, signal_state), metric

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, env_state, obsv, _rng, signal_state)
        runner_state, metric = jax.lax.scan(_update_step, runner_state, jnp.arange(config["NUM_UPDATES"]))
        return {"runner_state": runner_state, "metrics": metric}

    return train


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-signals", action="store_true", help="PureJaxRL's PPO without the signals")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = {**CONFIG, "SIGNALS": None} if args.no_signals else CONFIG
    out = jax.jit(make_train(config))(jax.random.PRNGKey(args.seed))
    metrics = jax.device_get(out["metrics"])
    returned = metrics["returned_episode_returns"][metrics["returned_episode"]]
    print(f"{config['SIGNALS'] or 'ppo'}: {config['TOTAL_TIMESTEPS']} steps, mean return of the last 20 episodes "
          f"{returned[-20:].mean():.1f}")
    if config["SIGNALS"]:
        print(f"last update: count_bonus_mean {metrics['count_bonus_mean'][-1]:.4f}, "
              f"gear weights_std {metrics['weights_std'][-1]:.3f}")


if __name__ == "__main__":
    main()
