"""The toy: collect a rollout, run the signals (apply_signals), one clipped update: PPO in 80 lines
of the kit's parts."""

import math
from collections import deque

import numpy as np
import torch

from reflectrl.envs import make_vector_env
from reflectrl.estimators import compute_gae
from reflectrl.nets import flatten_parameters
from reflectrl.signals import Batch, SignalContext, make_signal
from reflectrl.trainers.base import EnvStepTrainer, apply_signals, global_rngs, restore_global_rngs
from reflectrl.trainers.onpolicy.update import ClipKnobs, clipped_update
from reflectrl.trainers.policies import ActorCritic, params_sha256


class ToyTrainer(EnvStepTrainer):
    def __init__(self, cfg, run=None):
        self.cfg, self.run, k = cfg, run, cfg.knobs
        self.envs = make_vector_env(cfg)
        obs_dim = int(np.prod(self.envs.single_observation_space.shape))
        n_actions = int(self.envs.single_action_space.n)
        torch.manual_seed(cfg.seed)
        self.agent = ActorCritic(obs_dim, n_actions, False, k.hidden_sizes)
        self.flat = flatten_parameters(self.agent)
        self.optimizer = torch.optim.Adam([self.flat], lr=k.learning_rate, eps=1e-5)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.num_iterations = math.ceil(cfg.total_steps / k.batch_size)
        self.signal = make_signal(cfg)
        if self.signal is not None:
            self.signal.bind(SignalContext(obs_dim=obs_dim, action_dim=n_actions, discrete=True, feature_dim=0,
                                           learning_rate=k.learning_rate, gamma=k.gamma, gae_lambda=k.gae_lambda,
                                           seed=cfg.seed, total_iterations=self.num_iterations))
        self.global_step = self.iteration = 0
        self.recent_returns = deque(maxlen=20)
        self.obs = torch.as_tensor(self.envs.reset(seed=cfg.seed)[0], dtype=torch.float32)
        self.logger = None
        self.policy_module = self.agent

    def total_units(self):
        return self.num_iterations * self.cfg.knobs.batch_size

    def run_iteration(self):
        k, T = self.cfg.knobs, self.cfg.knobs.num_steps
        obs, actions, logprobs, rewards, terms, truncs, next_obs = [], [], [], [], [], [], []
        with torch.no_grad():
            for _ in range(T):
                action, logprob = self.agent.act(self.obs, self.generator)
                o, r, te, tr, info = self.envs.step(action.numpy())
                real_next = np.array(o, dtype=np.float32)
                if "final_obs" in info:
                    for i in np.flatnonzero(info["_final_obs"]):
                        real_next[i] = info["final_obs"][i]
                    final = info["final_info"]
                    if "episode" in final:
                        self.recent_returns.extend(final["episode"]["r"][final["_episode"]].tolist())
                obs.append(self.obs), actions.append(action), logprobs.append(logprob)
                rewards.append(torch.as_tensor(r, dtype=torch.float32)), next_obs.append(torch.from_numpy(real_next))
                terms.append(torch.as_tensor(te)), truncs.append(torch.as_tensor(tr))
                self.obs = torch.as_tensor(o, dtype=torch.float32)
            obs, actions, logprobs, rewards, next_obs = map(torch.stack, (obs, actions, logprobs, rewards, next_obs))
            terms, truncs = torch.stack(terms), torch.stack(truncs)
            values, next_values = self.agent.value(obs), self.agent.value(next_obs)
        self.global_step += T * k.num_envs
        self.iteration += 1

        def estimate(r):
            return compute_gae(r, values, next_values, terms, truncs, k.gamma, k.gae_lambda)

        weights = None
        if self.signal is None:
            advantages, returns = estimate(rewards)
        else:
            batch = Batch(obs=obs, actions=actions, rewards=rewards, terminations=terms, truncations=truncs,
                          values=values, next_values=next_values, next_obs=next_obs, iteration=self.iteration,
                          global_step=self.global_step, estimate=estimate, value_fn=self.agent.value)
            result = apply_signals(self.signal, batch, estimate)
            advantages, returns, weights = result.advantages, result.returns, result.weights
        b = {"logprobs": logprobs.reshape(-1), "advantages": advantages.reshape(-1), "returns": returns.reshape(-1),
             "values": values.reshape(-1), "weights": None if weights is None else weights.reshape(-1)}
        b_obs, b_actions = obs.reshape(-1, obs.shape[-1]), actions.reshape(-1)
        stats = clipped_update(self.flat, self.optimizer, lambda idx: self.agent.evaluate(b_obs[idx], b_actions[idx]),
                               b, ClipKnobs.of(k), self.generator, self.global_step)
        if self.signal is not None:
            self.signal.after_update(batch)
            stats.update(self.signal.metrics())
        return {"global_step": self.global_step, "iteration": self.iteration,
                "episodic_return": float(np.mean(self.recent_returns)) if self.recent_returns else None, **stats}

    def state_dict(self):
        return {"config": self.cfg.to_dict(), "global_step": self.global_step, "iteration": self.iteration,
                "agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict(),
                "generator": self.generator.get_state(), "obs": self.obs, **global_rngs(),
                "signal": None if self.signal is None else self.signal.state_dict(),
                "params_sha256": params_sha256(self.agent)}

    def save_checkpoint(self):
        self.run.save_checkpoint(self.state_dict())

    def close(self):
        self.envs.close()

    def load_state_dict(self, state):
        self.global_step, self.iteration = state["global_step"], state["iteration"]
        self.agent.load_state_dict(state["agent"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        restore_global_rngs(state)
        if self.signal is not None:
            self.signal.load_state_dict(state["signal"])
