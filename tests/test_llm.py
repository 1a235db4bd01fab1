"""The LLM trainer: GRPO's advantage and loss math, GEAR on token batches, turn-level
calibration, multi-turn loss masks, runs (resume, errors, non-finite stop)."""

import json
import math
import random
import sys

import pytest
import torch

pytest.importorskip("transformers")

from reflectrl.signals import SignalContext  # noqa: E402
from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting  # noqa: E402
from reflectrl.trainers.grpo.config import LLMRunConfig, loss_types  # noqa: E402
from reflectrl.trainers.grpo.trainer import (  # noqa: E402
    Episodes,
    GRPOTrainer,
    aggregate,
    clipped_objective,
    group_advantages,
    rollout,
    token_batch,
    turn_batch,
)

# ---------------------------------------------------------------------------- advantages


def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv, base, scale = group_advantages(r, 4, "group")
    std = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4)
    assert torch.allclose(adv[:4], expected, atol=1e-6)
    # all-equal rewards: nothing to learn from the group, and no division by zero
    assert torch.equal(adv[4:], torch.zeros(4))
    assert torch.allclose(base, torch.tensor([0.5] * 4 + [1.0] * 4))
    adv_none, _, _ = group_advantages(r, 4, "none")
    assert torch.allclose(adv_none, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    adv_batch, _, scale_b = group_advantages(r, 4, "batch")
    assert torch.allclose(scale_b, torch.full((8,), r.std().item() + 1e-4))
    assert torch.allclose(adv_batch, adv_none / (r.std() + 1e-4))


def test_loss_aggregations_by_hand():
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])
    assert aggregate(per_token, mask, "grpo").item() == pytest.approx((2.0 + 4.0) / 2)   # mean of sequence means
    assert aggregate(per_token, mask, "dapo").item() == pytest.approx(10.0 / 4)          # mean over all tokens
    assert aggregate(per_token, mask, "dr_grpo").item() == pytest.approx(10.0 / (2 * 3))  # / (sequences x longest)


def test_clipped_objective():
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, clipped = clipped_objective(logp, old, adv, 0.2, 0.28)
    # ratio 1.5 with A>0: capped at 1.28; ratio 0.5 with A<0: capped at 0.8; ratio 1: untouched
    assert torch.allclose(loss, torch.tensor([[-1.28, 0.8, -2.0]]))
    assert clipped.tolist() == [[True, True, False]]


# ---------------------------------------------------------------------------- GEAR on tokens

def _synthetic_token_batch(seed=0):
    """8 sequences in 2 groups of 4; tokens 0-1 are the prompt, the rest the completion, of
    varying length. The hidden state carries the sequence's reward in its first feature."""
    g = torch.Generator().manual_seed(seed)
    n, length, width = 8, 7, 6
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    agent = torch.zeros(n, length, dtype=torch.bool)
    ends = [6, 5, 6, 4, 6, 3, 5, 6]
    for i, end in enumerate(ends):
        agent[i, 2:end + 1] = True
    hidden = torch.randn(n, length, width, generator=g) * 0.1
    hidden[..., 0] = rewards[:, None] * 2 - 1
    ids = torch.randint(0, 50, (n, length), generator=g)
    adv, base, _ = group_advantages(rewards, 4)
    return token_batch(agent, rewards, base, adv, hidden, ids, 4), agent, rewards


def _gear(**kw):
    signal = GEARReweighting(GEARConfig(**kw))
    signal.bind(SignalContext(obs_dim=6, action_dim=0, discrete=False, feature_dim=6, learning_rate=1e-2,
                              gamma=0.99, gae_lambda=0.95, seed=0, total_iterations=10))
    return signal


def test_token_batch_layout():
    batch, agent, rewards = _synthetic_token_batch()
    # time-major (L-1, N): step t is token t+1; the outcome sits on each sequence's last agent token
    assert batch.rewards.shape == (6, 8)
    assert torch.equal(batch.mask, agent[:, 1:].T)
    last = [5, 4, 5, 3, 5, 2, 4, 5]
    for i, t in enumerate(last):
        assert batch.rewards[t, i] == rewards[i] and batch.rewards[:, i].sum() == rewards[i]
    assert batch.groups[:, :4].eq(0).all() and batch.groups[:, 4:].eq(1).all()


def test_gear_weights_on_synthetic_hidden_states():
    batch, agent, rewards = _synthetic_token_batch()
    signal = _gear(distill_on="all", head="linear", epochs=200, temperature=1.0)
    assert signal.after_advantages(batch) is None  # no weights before the first distillation
    signal.after_update(batch)
    m = signal.metrics()
    assert m["trajectories"] == 8 and m["winners"] == 2  # the top 25% of each group of 4: one per group
    out = signal.after_advantages(batch)
    w = out.weights
    assert w.shape == batch.mask.shape
    assert torch.all(w[~batch.mask] == 1.0)  # prompt and padding: untouched
    real = w[batch.mask]
    assert real.min() >= 0.5 and real.max() <= 2.0
    # the head learned that the first feature predicts the return: solved sequences' tokens weigh more
    solved = (rewards[None, :] == 1).expand_as(w) & batch.mask
    unsolved = (rewards[None, :] == 0).expand_as(w) & batch.mask
    assert w[solved].mean() > 1.0 > w[unsolved].mean()
    assert signal.metrics()["weights_max"] > signal.metrics()["weights_min"]


def _head_inputs(signal, batch):
    """Distil once, recording the rows of every minibatch the head is trained on."""
    seen = []
    hook = signal.head.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    try:
        signal.after_update(batch)
    finally:
        hook.remove()
    return seen


def _rows(x):
    return sorted(tuple(row) for row in x.tolist())


@pytest.mark.parametrize("distill_on", ["winners", "all"])
def test_gear_head_sees_exactly_the_tokens_it_distils_on(distill_on):
    """distill_on=winners: the head is fit on the winners' completion tokens and nothing else
    (all: on every completion token, the control that shows the spy can tell)."""
    batch, agent, _ = _synthetic_token_batch()
    signal = _gear(distill_on=distill_on, top_frac=0.5)
    seen = _head_inputs(signal, batch)
    assert signal.metrics()["winners"] == 4  # two per group
    # winners by hand: group 0 (rewards 1,0,0,0) takes sequence 0 and, of the three tied at 0,
    # the shortest completion, sequence 3; group 1 (rewards 1,1,0,0) takes sequences 4 and 5
    sequences = [0, 3, 4, 5] if distill_on == "winners" else list(range(8))
    # their completion tokens: step t of sequence i is token t+1, predicted from the state at t
    expected = [batch.features[t, i] for i in sequences for t in range(agent.shape[1] - 1) if agent[i, t + 1]]
    expected = _rows(torch.stack(expected))
    assert len(expected) == (5 + 3 + 5 + 2 if distill_on == "winners" else 33)
    # every distillation minibatch (one per epoch here) and the final loss see exactly these rows:
    # no prompt or padding position, no loser's token, each winner's token once
    assert len(seen) == signal.cfg.epochs + 1
    for x in seen:
        assert _rows(x) == expected


# ---------------------------------------------------------------------------- turns

def _episodes(turn_ends, n_tokens=12, width=4):
    n = len(turn_ends)
    agent = torch.zeros(n, n_tokens, dtype=torch.bool)
    turn = torch.full((n, n_tokens), -1)
    for i, ends in enumerate(turn_ends):
        start = 2
        for k, end in enumerate(ends):
            agent[i, start:end + 1] = True
            turn[i, start:end + 1] = k
            start = end + 3  # two tool tokens between turns
    return Episodes(ids=torch.zeros(n, n_tokens, dtype=torch.long), attention=torch.ones(n, n_tokens),
                    agent=agent, turn=turn, turn_ends=turn_ends, turns=[[""] * len(e) for e in turn_ends],
                    problems=[None] * n)


def test_turn_batch_single_turn_is_grpo():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv, base, scale = group_advantages(rewards, 2)
    ep = _episodes([[4], [5], [3], [6]])
    batch = turn_batch(ep, rewards, base, scale, torch.randn(4, 12, 4), 2, 0.99, 0.95)
    assert batch.advantages.shape == (1, 4)
    assert torch.allclose(batch.advantages[0], adv)


def test_turn_batch_multi_turn_credit():
    rewards = torch.tensor([1.0, 0.0])
    adv, base, scale = group_advantages(rewards, 2, "none")
    ep = _episodes([[3, 7], [4]])
    hidden = torch.arange(2 * 12 * 4, dtype=torch.float32).reshape(2, 12, 4)
    batch = turn_batch(ep, rewards, base, scale, hidden, 2, 1.0, 1.0)
    assert batch.mask.tolist() == [[True, True], [True, False]]
    assert torch.equal(batch.features[1, 0], hidden[0, 7])  # the state at the turn's last token
    # gamma = lambda = 1: every turn's credit is the outcome minus the baseline
    assert torch.allclose(batch.advantages[:, 0], torch.tensor([0.5, 0.5]))
    assert batch.advantages[0, 1] == pytest.approx(-0.5) and batch.advantages[1, 1] == 0


# ---------------------------------------------------------------------------- rollouts and masks

def test_multi_turn_rollout_masks_tool_output(tiny_model_dir):
    from reflectrl.llm.model import load_model
    from reflectrl.llm.tasks import make_task

    model, tok = load_model(str(tiny_model_dir))
    task = make_task("tools")
    rng = random.Random(0)
    problems = [task.sample(rng) for _ in range(6)]
    torch.manual_seed(0)
    ep = rollout(model, tok, task, problems, max_new_tokens=6)
    assert max(len(t) for t in ep.turns) > 1  # a random model's turns are malformed calls: the tool replies
    for i, problem in enumerate(problems):
        real = ep.attention[i].bool()
        ids = ep.ids[i][real]
        agent = ep.agent[i][real]
        # the prompt is not the agent's, and each turn's tokens are exactly the agent's tokens of that turn
        assert not agent[:len(tok.encode(problem.prompt))].any()
        for k, text in enumerate(ep.turns[i]):
            toks = ids[(ep.turn[i][real] == k)]
            assert tok.decode([t for t in toks.tolist() if t != tok.eos_token_id]) == text
        # everything that is not the agent's after the prompt is the tool's replies, in order
        turns_so_far, replies = [], ""
        for text in ep.turns[i][:-1]:
            turns_so_far.append(text)
            replies += task.respond(problem, turns_so_far)
        tool_ids = ids[~agent][len(tok.encode(problem.prompt)):]
        assert tok.decode(tool_ids.tolist()) == replies


def test_sft_demonstration_mask_covers_turns_only(tiny_model_dir):
    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import demonstration_tokens
    from reflectrl.llm.tasks import make_task

    _, tok = load_model(str(tiny_model_dir))
    task = make_task("tools")
    problem = task.sample(random.Random(3))
    ids, agent = demonstration_tokens(tok, task, problem)
    agent_text = tok.decode([t for t, a in zip(ids, agent) if a])
    assert agent_text == "<|eos|>".join(task.demonstration(problem)) + "<|eos|>"
    assert "=" in tok.decode([t for t, a in zip(ids, agent) if not a])  # the tool's "= value" is not learned


# ---------------------------------------------------------------------------- trainer

def _trainer(tiny_model_dir, algo="grpo", steps=4, run=None, task="arith", **grpo):
    from reflectrl.llm.model import load_model
    from reflectrl.trainers.grpo.config import apply_llm_overrides, validate_llm

    cfg = LLMRunConfig(algo=algo, task=task, model=str(tiny_model_dir), steps=steps, seed=3)
    apply_llm_overrides(cfg, ["prompts_per_step=2", "group_size=4", "eval_every=0", "max_new_tokens=4",
                              *(f"{k}={v}" for k, v in grpo.items())])
    validate_llm(cfg)
    model, tok = load_model(cfg.model)
    return GRPOTrainer(cfg, model, tok, run)


def _params(trainer):
    return torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])


def _rewarding(trainer, monkeypatch):
    """The trainer with a verifier that rewards the episodes of even length: the tiny random model solves
    nothing (every advantage 0, so no update), this way each group has both outcomes and GRPO updates."""
    monkeypatch.setattr(trainer.task, "score_batch",
                        lambda problems, episodes: [float(len("".join(t)) % 2 == 0) for t in episodes])
    return trainer


def _trained(model_dir, algo="grpo", steps=3, **knobs):
    """(parameters before, after `steps` GRPO steps, the last row) of one trainer, built and run
    alone: generation draws from torch's global RNG, so two trainers must not interleave."""
    from conftest import SFT_ARITH

    trainer = _trainer(model_dir, algo=algo, task=SFT_ARITH, **knobs)
    start = _params(trainer)
    rows = [trainer.train_step() for _ in range(steps)]
    return start, _params(trainer), rows[-1]


@pytest.mark.slow
def test_refgrpo_alpha_zero_is_grpo(sft_arith_model_dir):
    start, plain, _ = _trained(sft_arith_model_dir)
    _, zero, row = _trained(sft_arith_model_dir, algo="refgrpo", **{"calibration.alpha": 0})
    assert not torch.equal(start, plain)  # GRPO updated the model: the comparison is not vacuous
    assert "calibration_loss" in row
    assert torch.equal(plain, zero)


@pytest.mark.slow
def test_gear_infinite_temperature_is_grpo(sft_arith_model_dir):
    start, plain, _ = _trained(sft_arith_model_dir)
    _, gear, row = _trained(sft_arith_model_dir, algo="gear", **{"gear.temperature": "inf"})
    _, weighted, _ = _trained(sft_arith_model_dir, algo="gear")
    assert not torch.equal(start, plain)
    assert row["weights_mean"] == 1.0 and "value_head_loss" in row
    assert torch.equal(plain, gear)
    assert not torch.equal(plain, weighted)  # finite temperature: GEAR's weights do change the update


# each loss with other knobs on top: dapo with the prepass (2 epochs of 2 minibatches) and a KL term
LOSS_KNOBS = {"grpo": {}, "dapo": dict(num_iterations=2, minibatches=2, beta=0.1),
              "dr_grpo": dict(scale_rewards="batch", clip_eps_high=0.28)}


@pytest.mark.parametrize("loss_type", loss_types())
def test_gear_trains_with_every_loss_and_prepass(tiny_model_dir, monkeypatch, loss_type):
    trainer = _rewarding(_trainer(tiny_model_dir, algo="gear", loss_type=loss_type, max_new_tokens=16,
                                  **LOSS_KNOBS.get(loss_type, {})), monkeypatch)
    # what each update's loss was, and what every other loss type gives on the same tokens
    trainer_module, updates = sys.modules[type(trainer).__module__], []

    def recording_aggregate(per_token, mask, kind):
        loss = aggregate(per_token, mask, kind)
        if kind == loss_type and per_token.requires_grad:
            updates.append({other: aggregate(per_token.detach(), mask, other).item() for other in loss_types()})
        return loss

    monkeypatch.setattr(trainer_module, "aggregate", recording_aggregate)
    start = _params(trainer)
    rows = [trainer.train_step() for _ in range(3)]
    assert all(math.isfinite(r["loss"]) and r["grad_norm"] > 0 for r in rows)
    assert any(r["loss"] != 0 for r in rows) and rows[-1]["weights_std"] > 0
    assert not torch.equal(start, _params(trainer))  # the updates changed the weights
    assert rows[-1]["kl"] > rows[0]["kl"] and rows[-1]["kl"] > 0  # and moved the policy off the reference
    # every update's loss was this loss type's (the logged loss is their mean over the step), and on these
    # completions (of different lengths) every other loss type gives another value
    per_step = trainer.cfg.grpo.num_iterations * trainer.cfg.grpo.minibatches
    assert len(updates) == 3 * per_step
    for i, row in enumerate(rows):
        assert row["loss"] == pytest.approx(sum(u[loss_type] for u in updates[i * per_step:(i + 1) * per_step])
                                            / per_step, rel=1e-5, abs=1e-9)
    assert any(all(u[other] != pytest.approx(u[loss_type]) for other in loss_types() if other != loss_type)
               for u in updates)


@pytest.mark.slow
def test_resume_is_bit_identical(sft_arith_model_dir, tmp_path):
    from conftest import SFT_ARITH

    from reflectrl.runs import RunDir

    tiny_model_dir = sft_arith_model_dir
    full = _trainer(tiny_model_dir, algo="gear", steps=4, task=SFT_ARITH)
    start = _params(full)
    for _ in range(4):
        full.train_step()
    assert not torch.equal(start, _params(full))  # the run learnt: resuming it has something to reproduce

    run = RunDir.create(tmp_path / "run", {})
    first = _trainer(tiny_model_dir, algo="gear", steps=4, run=run, task=SFT_ARITH)
    first.train_step()
    first.train_step()
    first.save_checkpoint()
    del first
    second = _trainer(tiny_model_dir, algo="gear", steps=4, run=run, task=SFT_ARITH)
    second.load_state_dict(run.load_checkpoint())
    second.train(progress=False)
    assert second.step == 4
    assert torch.equal(_params(full), _params(second))


def test_non_finite_loss_stops_and_keeps_the_checkpoint(tiny_model_dir, tmp_path):
    from reflectrl.errors import NonFiniteError
    from reflectrl.runs import RunDir

    run = RunDir.create(tmp_path / "run", {})
    trainer = _trainer(tiny_model_dir, steps=4, run=run, checkpoint_every=1)
    trainer.train_step()
    trainer.save_checkpoint()
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteError, match="non-finite"):
        trainer.train(progress=False)
    assert run.load_checkpoint()["step"] == 1


# ---------------------------------------------------------------------------- command line

def test_cli_sft_train_resume_eval(cli, tiny_model_dir, tmp_path):
    sft_dir = tmp_path / "sft"
    code, out, err = cli("llm", "sft", "--model", tiny_model_dir, "--task", "tools", "--steps", "3",
                         "--batch-size", "4", "--out", sft_dir, "--no-progress")
    assert code == 0, err
    assert (sft_dir / "config.json").exists() and (sft_dir / "sft_log.jsonl").exists()
    run_dir = tmp_path / "run"
    code, out, err = cli("llm", "train", "--algo", "refgrpo", "--task", "tools", "--model", sft_dir, "--steps", "2",
                         "--seed", "1", "--out", run_dir, "--no-progress",
                         "--set", "prompts_per_step=2", "group_size=2", "eval_every=1", "eval_problems=4")
    assert code == 0, err
    assert "finished refgrpo on tools" in out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "reward" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for key in ("reward", "accuracy", "kl", "calibration_loss", "bonus_mean", "eval_accuracy", "turns"):
        assert key in train_rows[-1], key
    assert (run_dir / "model" / "config.json").exists()
    code, out, err = cli("llm", "train", "--resume", run_dir)
    assert code == 0 and "already finished" in err
    code, out, err = cli("llm", "eval", "--model", run_dir / "model", "--task", "tools", "--problems", "3", "--json")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["problems"] == 3


@pytest.mark.parametrize("args, message", [
    (["--model", "/no/such/dir"], "no such directory"),
    (["--algo", "ppo"], "unknown --algo 'ppo'"),
    (["--task", "arithmetic"], "arith"),
    (["--set", "group_size=1"], "group_size=1"),
    (["--set", "gear.top_frac=2"], "apply to --algo gear"),
    (["--set", "lerning_rate=1"], "did you mean learning_rate"),
])
def test_cli_bad_input_is_one_line_and_no_run_dir(cli, tiny_model_dir, tmp_path, args, message):
    base = {"--model": str(tiny_model_dir), "--algo": "grpo", "--task": "arith"}
    argv, i = [], 0
    while i < len(args):
        if args[i] in base:
            base[args[i]] = args[i + 1]
            i += 2
        else:
            argv += args[i:]
            break
    out_dir = tmp_path / "run"
    flat = [x for kv in base.items() for x in kv]
    code, out, err = cli("llm", "train", *flat, "--steps", "2", "--out", out_dir, "--no-progress", *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out_dir.exists()


@pytest.mark.slow
def test_grpo_raises_arith_accuracy_of_the_tiny_sft_model(tiny_model_dir, tmp_path):
    """The learning test: a short seeded CPU run improves both the sampled reward and the
    greedy held-out accuracy of a tiny model warm-started by SFT."""
    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import sft
    from reflectrl.llm.tasks import make_task

    task = "arith[max_operand=5]"
    model, tok = load_model(str(tiny_model_dir))
    sft(model, tok, make_task(task), steps=60, out=tmp_path / "sft", learning_rate=3e-3, progress=False)
    cfg = LLMRunConfig(task=task, model=str(tmp_path / "sft"), steps=100, seed=1)
    cfg.grpo.learning_rate = 1e-3
    cfg.grpo.log_kl = False
    model, tok = load_model(cfg.model)
    trainer = GRPOTrainer(cfg, model, tok)
    before = trainer.evaluate()["eval_accuracy"]
    rewards = [trainer.train_step()["reward"] for _ in range(100)]
    after = trainer.evaluate()["eval_accuracy"]
    first, last = sum(rewards[:25]) / 25, sum(rewards[-25:]) / 25
    print(f"reward {first:.3f} -> {last:.3f}, greedy accuracy {before:.3f} -> {after:.3f}")
    assert last > 2 * first + 0.01, (first, last)
    assert after > before + 0.05, (before, after)


def readme_llm_command(name: str) -> list[str]:
    """The README's `reflectrl llm NAME ...` example line, split as the shell splits it (after `llm`)."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith(f"reflectrl llm {name} ")]
    return shlex.split(line, comments=True)[2:]


@pytest.mark.slow
def test_the_readme_sft_example_teaches_the_tiny_model(cli, tmp_path):
    """The README's language-model example (issue 57): its init-tiny and SFT commands, run as written
    but into tmp_path, lift the held-out greedy accuracy well above the untrained model's."""
    def with_paths(argv: list[str], **paths) -> list[str]:
        argv = list(argv)
        for flag, path in paths.items():
            argv[argv.index(f"--{flag}") + 1] = str(path)
        return argv

    tiny, sft_out = tmp_path / "tiny", tmp_path / "tiny-arith"
    assert cli("llm", *with_paths(readme_llm_command("init-tiny"), out=tiny))[0] == 0
    sft_argv = with_paths(readme_llm_command("sft"), model=tiny, out=sft_out)
    assert cli("llm", *sft_argv, "--no-progress")[0] == 0
    task = sft_argv[sft_argv.index("--task") + 1]

    def accuracy(model) -> float:
        code, out, err = cli("llm", "eval", "--model", model, "--task", task, "--problems", "64", "--json")
        assert code == 0, err
        return json.loads(out)["accuracy"]

    untrained, taught = accuracy(tiny), accuracy(sft_out)
    print(f"{task}: greedy accuracy {untrained:.3f} untrained, {taught:.3f} after the README's SFT")
    assert taught >= untrained + 0.2, (untrained, taught)


def test_gear_with_no_real_winner_steps_keeps_its_head():
    batch, _, _ = _synthetic_token_batch()
    batch.mask[:] = False
    signal = _gear()
    before = [p.clone() for p in signal.head.parameters()]
    signal.after_update(batch)
    assert all(torch.equal(a, b) for a, b in zip(before, signal.head.parameters()))
    assert not signal.distilled
