"""SAC's twin critics as two networks (what trainers/replay/sac.py runs) against one batched
network (each layer's two weight matrices stacked and applied with one `torch.baddbmm`), on
the same Q-step: forward of both, the two MSE losses, backward, one fused Adam step (issue 38:
"the twin critics as one batched network" as a way past parity with Stable-Baselines3).

Best of --repeats interleaved timings; prints microseconds per Q-step and the ratio. On the
2-core development VM at SAC's shapes (batch 256, 256-256 ReLU) the two are within noise of
each other (3,233 vs 3,218 us, 3,368 vs 3,407 us): the step is the matrix products' arithmetic,
not the op count, so the batched network was not adopted (it would change the weights'
layout and checkpoints for nothing measurable).

    python bench/twin_critics.py [--batch 256] [--hidden 256] [--obs-dim 17] [--action-dim 6]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from reflectrl.trainers.replay.sac import SoftQNetwork


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--obs-dim", type=int, default=17)
    parser.add_argument("--action-dim", type=int, default=6)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    hidden = (args.hidden, args.hidden)
    q1, q2 = SoftQNetwork(args.obs_dim, args.action_dim, hidden), SoftQNetwork(args.obs_dim, args.action_dim, hidden)

    def linears(q):
        return [m for m in q.net if isinstance(m, nn.Linear)]

    # the batched network starts from the same weights: layer i's [2, in, out] and [2, 1, out]
    weights = [nn.Parameter(torch.stack([a.weight.detach().t(), b.weight.detach().t()]))
               for a, b in zip(linears(q1), linears(q2))]
    biases = [nn.Parameter(torch.stack([a.bias.detach(), b.bias.detach()]).unsqueeze(1))
              for a, b in zip(linears(q1), linears(q2))]

    def twin(obs, actions):
        h = torch.cat([obs, actions], 1).expand(2, -1, -1)
        for i, (w, b) in enumerate(zip(weights, biases)):
            h = torch.baddbmm(b, h, w)
            if i < len(weights) - 1:
                h = torch.relu(h)
        return h.squeeze(-1)

    obs, actions = torch.randn(args.batch, args.obs_dim), torch.randn(args.batch, args.action_dim)
    target = torch.randn(args.batch)
    both = twin(obs, actions)
    diff = max(float((both[0] - q1(obs, actions)).abs().max()), float((both[1] - q2(obs, actions)).abs().max()))
    print(f"same values: max |difference| {diff:.2e} (float32 rounding)")
    opt_two = torch.optim.Adam([*q1.parameters(), *q2.parameters()], fused=True)
    opt_one = torch.optim.Adam([*weights, *biases], fused=True)

    def two_networks():
        loss = ((q1(obs, actions) - target) ** 2).mean() + ((q2(obs, actions) - target) ** 2).mean()
        opt_two.zero_grad()
        loss.backward()
        opt_two.step()

    def one_batched():
        loss = ((twin(obs, actions) - target) ** 2).mean(1).sum()
        opt_one.zero_grad()
        loss.backward()
        opt_one.step()

    best = {two_networks: float("inf"), one_batched: float("inf")}
    for _ in range(args.repeats):
        for step in best:
            for _ in range(20):
                step()
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            best[step] = min(best[step], (time.perf_counter() - start) / args.steps * 1e6)
    a, b = best[two_networks], best[one_batched]
    print(f"batch {args.batch}, hidden {hidden}: two networks {a:,.0f} us per Q-step, one batched {b:,.0f} us; "
          f"batched / two = {b / a:.2f}")


if __name__ == "__main__":
    main()
