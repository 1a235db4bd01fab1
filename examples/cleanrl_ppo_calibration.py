"""CleanRL's single-file PPO (cleanrl/ppo.py) on CartPole-v1, with reflectrl's calibration bonus and count
bonus added: every line that is reflectrl's ends in `# reflectrl`; delete them and this is CleanRL's PPO.

    python examples/cleanrl_ppo_calibration.py --total-timesteps 50000 --calibration-alpha 0.05 --count-beta 0.01

The signals come from `reflectrl.signals.make(...)` and see each rollout through `sig.process(...)`, which
runs the hooks exactly as reflectrl's own trainers do; they give back the advantages on the rewards plus
their terms (your GAE below re-estimates them) and per-step weights on the advantage. `--no-signals` runs
the plain CleanRL loop; at alpha=0 and beta=0 the signals change nothing, bit for bit (the printed
params_sha256 is the same: tests/test_standalone_torch.py checks it).
"""

import argparse
import hashlib
import random
import time

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
from torch.distributions.categorical import Categorical

import reflectrl.signals  # reflectrl


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env-id", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--total-timesteps", type=int, default=2048, help="small by default: a CI smoke run")
    p.add_argument("--learning-rate", type=float, default=2.5e-4)
    p.add_argument("--num-envs", type=int, default=4)
    p.add_argument("--num-steps", type=int, default=128)
    p.add_argument("--anneal-lr", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--gae-lambda", type=float, default=0.95)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--update-epochs", type=int, default=4)
    p.add_argument("--norm-adv", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--clip-coef", type=float, default=0.2)
    p.add_argument("--clip-vloss", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--ent-coef", type=float, default=0.01)
    p.add_argument("--vf-coef", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--target-kl", type=float, default=None)
    p.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--calibration-alpha", type=float, default=0.05, help="0: no bonus")  # reflectrl
    p.add_argument("--count-beta", type=float, default=0.01, help="0: no bonus")  # reflectrl
    p.add_argument("--no-signals", action="store_true", help="CleanRL's PPO as it is")  # reflectrl
    args = p.parse_args(argv)
    args.batch_size = int(args.num_envs * args.num_steps)
    args.minibatch_size = int(args.batch_size // args.num_minibatches)
    args.num_iterations = args.total_timesteps // args.batch_size
    return args


def make_env(env_id):
    def thunk():
        env = gym.make(env_id)
        env = gym.wrappers.RecordEpisodeStatistics(env)
        return env

    return thunk


def layer_init(layer, std=2**0.5, bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, envs):
        super().__init__()
        obs_dim = np.array(envs.single_observation_space.shape).prod()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, 64)), nn.Tanh(),
            layer_init(nn.Linear(64, envs.single_action_space.n), std=0.01),
        )

    def get_value(self, x):
        return self.critic(x)

    def get_action_and_value(self, x, action=None):
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def main(argv=None):
    args = parse_args(argv)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = True
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    # CleanRL's envs, autoresetting in the step that ends an episode (its final observation in the info)
    envs = gym.vector.SyncVectorEnv([make_env(args.env_id) for _ in range(args.num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "only discrete action space is supported"

    agent = Agent(envs).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    sig = None  # reflectrl
    if not args.no_signals:  # reflectrl
        sig = reflectrl.signals.make(  # reflectrl
            "calibration+count", envs.single_observation_space, envs.single_action_space,  # reflectrl
            num_envs=args.num_envs, num_steps=args.num_steps, total_steps=args.total_timesteps,  # reflectrl
            gamma=args.gamma, gae_lambda=args.gae_lambda, learning_rate=args.learning_rate, seed=args.seed,  # reflectrl
            calibration={"alpha": args.calibration_alpha}, count={"beta": args.count_beta})  # reflectrl

    # ALGO Logic: Storage setup
    obs = torch.zeros((args.num_steps, args.num_envs) + envs.single_observation_space.shape).to(device)
    actions = torch.zeros((args.num_steps, args.num_envs) + envs.single_action_space.shape).to(device)
    logprobs = torch.zeros((args.num_steps, args.num_envs)).to(device)
    rewards = torch.zeros((args.num_steps, args.num_envs)).to(device)
    dones = torch.zeros((args.num_steps, args.num_envs)).to(device)
    values = torch.zeros((args.num_steps, args.num_envs)).to(device)
    terminations = torch.zeros((args.num_steps, args.num_envs), dtype=torch.bool)  # reflectrl
    truncations = torch.zeros((args.num_steps, args.num_envs), dtype=torch.bool)  # reflectrl
    reached = torch.zeros_like(obs)  # reflectrl: the state each step reached (the final one where it ended)

    # TRY NOT TO MODIFY: start the game
    global_step = 0
    start_time = time.time()
    next_obs, _ = envs.reset(seed=args.seed)
    next_obs = torch.Tensor(next_obs).to(device)
    next_done = torch.zeros(args.num_envs).to(device)
    episodic_returns = []

    for iteration in range(1, args.num_iterations + 1):
        # Annealing the rate if instructed to do so.
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            lrnow = frac * args.learning_rate
            optimizer.param_groups[0]["lr"] = lrnow

        for step in range(0, args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            dones[step] = next_done

            # ALGO LOGIC: action logic
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
                values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            # TRY NOT TO MODIFY: execute the game and log data.
            next_obs, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
            next_done = np.logical_or(terminated, truncated)
            rewards[step] = torch.tensor(reward).to(device).view(-1)
            terminations[step], truncations[step] = torch.tensor(terminated), torch.tensor(truncated)  # reflectrl
            reached[step] = torch.Tensor(next_obs).to(device)  # reflectrl
            next_obs, next_done = torch.Tensor(next_obs).to(device), torch.Tensor(next_done).to(device)

            if "final_obs" in infos:
                for i in np.flatnonzero(infos["_final_obs"]):
                    reached[step, i] = torch.Tensor(infos["final_obs"][i]).to(device)  # reflectrl
                final = infos["final_info"]
                if "episode" in final:
                    for i in np.flatnonzero(final["_episode"]):
                        episodic_returns.append(float(final["episode"]["r"][i]))

        # bootstrap value if not done
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)

            def gae(rewards):  # CleanRL's GAE, on any rewards (the signals' terms added)
                advantages = torch.zeros_like(rewards).to(device)
                lastgaelam = 0
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal = 1.0 - next_done
                        nextvalues = next_value
                    else:
                        nextnonterminal = 1.0 - dones[t + 1]
                        nextvalues = values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                returns = advantages + values
                return advantages, returns

            advantages, returns = gae(rewards)
            weights = torch.ones_like(rewards)  # reflectrl: the signals' per-step weights on the advantage
            if sig is not None:  # reflectrl
                terms = sig.process(  # reflectrl
                    obs, actions, rewards, terminations, truncations, values,  # reflectrl
                    torch.cat([values[1:], next_value]), estimate=gae,  # reflectrl
                    state_keys=sig.state_keys(obs), next_state_keys=sig.state_keys(reached))  # reflectrl
                advantages, returns, weights = terms.advantages, terms.returns, terms.weights  # reflectrl

        # flatten the batch
        b_obs = obs.reshape((-1,) + envs.single_observation_space.shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape((-1,) + envs.single_action_space.shape)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        b_weights = weights.reshape(-1)  # reflectrl

        # Optimizing the policy and value network
        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                end = start + args.minibatch_size
                mb_inds = b_inds[start:end]

                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions.long()[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()

                with torch.no_grad():
                    # calculate approx_kl http://joschu.net/blog/kl-approx.html
                    approx_kl = ((ratio - 1) - logratio).mean()
                    clipfracs += [((ratio - 1.0).abs() > args.clip_coef).float().mean().item()]

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                mb_advantages = mb_advantages * b_weights[mb_inds]  # reflectrl

                # Policy loss
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                # Value loss
                newvalue = newvalue.view(-1)
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds],
                        -args.clip_coef,
                        args.clip_coef,
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
                    v_loss = 0.5 * v_loss_max.mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        signal_metrics = {}  # reflectrl
        if sig is not None:  # reflectrl
            signal_metrics = sig.after_update(value_fn=lambda x: agent.get_value(x).flatten())  # reflectrl
        recent = np.mean(episodic_returns[-20:]) if episodic_returns else float("nan")
        print(f"iteration={iteration} global_step={global_step} episodic_return={recent:.1f} "
              f"value_loss={v_loss.item():.3f} policy_loss={pg_loss.item():.4f} approx_kl={approx_kl.item():.4f} "
              f"clipfrac={np.mean(clipfracs):.3f} "
              f"calibration_loss={signal_metrics.get('calibration_loss', float('nan')):.3f} "  # reflectrl
              f"count_bonus_mean={signal_metrics.get('count_bonus_mean', float('nan')):.4f} "  # reflectrl
              f"SPS={int(global_step / (time.time() - start_time))}")

    envs.close()
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in agent.parameters()])
    print(f"params_sha256={hashlib.sha256(flat.numpy().tobytes()).hexdigest()}")


if __name__ == "__main__":
    main()
