"""Stated reflections: parsing verdicts and confidences, the reflect= task option, the verdict
bonus and the confidence score against hand-computed values, their schedule, the calibration
metrics on small hand-computed cases, GRPO's credit of the terms, bit-identity at coef = 0,
the pseudo-reward and its collapse warning, and `llm eval --json`."""

import json
import math
import random
import warnings

import pytest
import torch

from reflectrl.errors import UserError
from reflectrl.llm.calibration import KEYS, auroc, calibration_metrics, ece, selective
from reflectrl.llm.tasks import make_task
from reflectrl.llm.tasks.reflect import Reflection, require_reflect, split_reflection, split_relevance, union
from reflectrl.signals.base import Batch, SignalContext, scheduled
from reflectrl.signals.confidence.torch import ConfidenceConfig, ConfidenceReward, proper_score
from reflectrl.signals.verdict.torch import VerdictBonus, VerdictConfig

R = Reflection

# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("text, answer, verdict, confidence", [
    ("19 | solved 0.8", "19", True, 0.8),
    ("18 | not solved", "18", False, None),
    ("19 | 0.85", "19", None, 0.85),
    ("19 | .3", "19", None, 0.3),
    ("19 | 1", "19", None, 1.0),
    ("19 |not solved 0", "19", False, 0.0),
    ("answer 7 | solved 1.0", "answer 7", True, 1.0),
])
def test_reflections_parse(text, answer, verdict, confidence):
    head, r = split_reflection(text, "both")
    assert head == answer and r.verdict == verdict and r.confidence == confidence


@pytest.mark.parametrize("text", ["19", "19 | solved 1.5", "19 | maybe", "19 | ", "return a | b", "19 | solved0.8x"])
def test_malformed_reflections_are_missing_and_leave_the_answer_whole(text):
    head, r = split_reflection(text, "verdict")
    assert head == text and r == Reflection() and not r.well_formed
    assert r.stated_verdict is None and r.stated_confidence is None


def test_well_formed_follows_the_mode_and_a_lone_part_reads_as_the_other():
    assert split_reflection("1 | solved", "verdict")[1].well_formed
    assert not split_reflection("1 | solved", "both")[1].well_formed
    assert not split_reflection("1 | 0.7", "verdict")[1].well_formed
    only_confidence = split_reflection("1 | 0.7", "confidence")[1]
    assert only_confidence.well_formed and only_confidence.stated_verdict is True
    assert split_reflection("1 | 0.2", "confidence")[1].stated_verdict is False
    assert split_reflection("1 | not solved", "verdict")[1].stated_confidence == 0.0
    assert split_relevance("not relevant; search X") == ("search X", R(False, None, True, final=False))
    assert split_relevance("search X") == ("search X", R(final=False))


# ---------------------------------------------------------------------------- the task option


def test_reflect_option_keeps_the_task_and_its_problems():
    plain, both = make_task("tools"), make_task("tools[reflect=both]")
    a, b = random.Random(5), random.Random(5)
    for _ in range(20):
        p, q = plain.sample(a), both.sample(b)
        assert (p.prompt, p.answer) == (q.prompt, q.answer)
    right = [t for t in plain.demonstration(p)]
    assert both.score(q, right[:-1] + [right[-1] + " | solved 0.9"]) == 1.0
    assert both.respond(q, [right[0] + " | solved"]) == plain.respond(p, [right[0]])  # tools see no reflection
    assert both.respond(q, [right[-1] + " | not solved 0.1"]) is None  # the answer still ends the episode
    assert both.reflections(q, ["lookup k1", "answer 3 | solved 0.4"]) == [[], [R(True, 0.4, True)]]
    assert make_task("tools").reflections(p, ["answer 3"]) == [[]]


def test_negative_demonstrations_mask_the_wrong_answer_and_teach_its_judgement(tiny_model_dir):
    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import demonstration_tokens

    _, tok = load_model(str(tiny_model_dir))
    task = make_task("arith[reflect=both;reflect_negatives=1]")
    problem = task.sample(random.Random(0))
    (pieces,) = task.demonstration(problem)
    (wrong, learned), (judgement, learned_too) = pieces
    assert not learned and learned_too and wrong != problem.answer and judgement.startswith(" | not solved 0.")
    ids, agent = demonstration_tokens(tok, task, problem)
    agent_text = tok.decode([i for i, a in zip(ids, agent) if a], skip_special_tokens=True)
    assert agent_text == judgement
    positive = make_task("arith[reflect=verdict;reflect_negatives=0]")
    p = positive.sample(random.Random(0))
    assert positive.demonstration(p) == [f"{p.answer} | solved"]


@pytest.mark.parametrize("spec, message", [("arith[reflect=maybe]", "reflect='maybe'"),
                                           ("arith[reflect=both;reflect_negatives=2]", "reflect_negatives=2")])
def test_bad_reflect_options_are_one_line(spec, message):
    with pytest.raises(UserError, match=message):
        make_task(spec)


def test_signals_switch_the_reflection_on():
    assert union(["verdict", "confidence"]) == "both" and union([]) == "none"
    assert require_reflect("arith", {"v": "verdict"}) == "arith[reflect=verdict]"
    assert require_reflect("arith[ops=+]", {"v": "verdict", "c": "confidence"}) == "arith[ops=+;reflect=both]"
    assert require_reflect("arith[reflect=both]", {"c": "confidence"}) == "arith[reflect=both]"
    with pytest.raises(UserError, match="use reflect=both"):
        require_reflect("arith[reflect=verdict]", {"signal 'confidence'": "confidence"})


def test_signals_switch_the_reflection_on_beside_reflect_after():
    spec = require_reflect("code[reflect_after=feedback]", {"signal 'verdict'": "verdict"})
    assert spec == "code[reflect_after=feedback;reflect=verdict]"
    task = make_task(spec)
    assert task.reflect == "verdict" and task.reflect_after == "feedback" and task.max_turns == 2
    assert make_task("code[reflect=verdict;reflect_after=feedback]").max_turns == 2  # the option order is free
    with pytest.raises(UserError, match="arith gives no feedback"):
        make_task(require_reflect("arith[reflect_after=feedback]", {"signal 'verdict'": "verdict"}))


def test_a_judgement_with_its_own_target_is_rewarded_against_it():
    from reflectrl.signals.verdict.torch import verdict_terms

    relevant = R(True, None, True, final=False, target=True)    # a search that found what was needed
    irrelevant = R(True, None, True, final=False, target=False)  # called relevant, found nothing
    answer = R(False, 0.2, True)                                 # no target: the outcome (0 here)
    terms, agree = verdict_terms([[], [relevant], [irrelevant, answer]], 0.0, 0.3)
    assert agree == 2 and terms == pytest.approx([0.0, 0.1, 0.1])
    # without targets every judgement is measured against the outcome
    terms, agree = verdict_terms([[], [R(True, None, True, final=False)], [R(True, None, True, final=False), answer]],
                                 0.0, 0.3)
    assert agree == 1 and terms == pytest.approx([0.0, 0.0, 0.1])


# ---------------------------------------------------------------------------- the signals by hand


def _turn_batch(reflections, outcomes, step=0):
    k, n = max(len(e) for e in reflections), len(reflections)
    out = torch.tensor(outcomes, dtype=torch.float32)[None, :].expand(k, n).clone()
    zeros = torch.zeros(k, n)
    return Batch(obs=zeros, actions=zeros, rewards=zeros, terminations=zeros.bool(), truncations=zeros.bool(),
                 values=zeros, next_values=zeros, reflections=reflections, outcomes=out, global_step=step)


def _bind(signal, total=30):
    signal.bind(SignalContext(obs_dim=4, action_dim=0, discrete=False, feature_dim=4, learning_rate=1e-3,
                              gamma=1.0, gae_lambda=1.0, seed=0, total_iterations=total))
    return signal


def test_verdict_bonus_by_hand():
    bonus = _bind(VerdictBonus(VerdictConfig(coef=0.1, schedule="constant")))
    reflections = [[[R(True, None, True)]],          # solved, and it was: 0.1
                   [[R(True, 0.9, True)]],           # solved, but wrong: 0
                   [[R(False, None, True)]],         # not solved, and it was not: 0.1
                   [[R()]],                          # missing: 0
                   [[R(None, 0.2, True)]]]           # a confidence alone reads as "not solved": 0.1
    term = bonus.shape_rewards(_turn_batch(reflections, [1, 0, 0, 1, 0]))
    assert torch.allclose(term, torch.tensor([[0.1, 0.0, 0.1, 0.0, 0.1]]))
    assert bonus.metrics()["verdict_agreement"] == pytest.approx(3 / 5)
    # several reflections in one episode (rag's "relevant" after a search): a share of c each, on its turn,
    # so an episode's bonus is at most c however many judgements it states
    multi = [[[R(True, final=False)], [R(False, final=False), R(True, 0.7, True)]]]
    assert torch.allclose(bonus.shape_rewards(_turn_batch(multi, [1])), torch.tensor([[0.1 / 3], [0.1 / 3]]))
    spam = [[[R(False, final=False)] for _ in range(4)] + [[R(False, final=False), R(False, 0.1, True)]]]
    assert bonus.shape_rewards(_turn_batch(spam, [0])).sum().item() == pytest.approx(0.1)


def test_confidence_score_by_hand():
    assert proper_score(0.8, 1.0) == pytest.approx(-0.04)
    assert proper_score(0.8, 0.0) == pytest.approx(-0.64)
    assert proper_score(None, 1.0) == -1.0
    assert proper_score(0.8, 0.0, "log") == pytest.approx(math.log(0.2))
    assert proper_score(1.0, 0.0, "log", 0.01) == pytest.approx(math.log(0.01))  # clipped: bounded
    assert proper_score(None, 1.0, "log", 0.05) == pytest.approx(math.log(0.05))
    signal = _bind(ConfidenceReward(ConfidenceConfig(coef=2.0)))
    reflections = [[[R(True, 0.8, True)]], [[R(True, None, True)]], [[R(False, final=False), R(False, 0.3, True)]]]
    term = signal.shape_rewards(_turn_batch(reflections, [1, 1, 0]))
    assert torch.allclose(term, torch.tensor([[2 * -0.04, -2.0, 2 * -0.09]]))  # a verdict alone states no confidence


def test_schedules():
    assert scheduled(0.1, "constant", 0.5, 29, 30) == 0.1
    assert [scheduled(0.1, "step", 2 / 3, s, 30) for s in (0, 19, 20, 29)] == [0.1, 0.1, 0.0, 0.0]
    assert [scheduled(1.0, "linear", 0.5, s, 20) for s in (0, 5, 10, 15)] == pytest.approx([1.0, 0.5, 0.0, 0.0])
    late = _bind(VerdictBonus(VerdictConfig(coef=0.1)), total=30)  # the default: the paper's step at 2/3
    assert late.shape_rewards(_turn_batch([[[R(True)]]], [1], step=25)).sum() == 0
    assert late.metrics()["verdict_coef"] == 0.0


@pytest.mark.parametrize("cfg", [VerdictConfig(coef=-1), VerdictConfig(schedule="cosine"), VerdictConfig(until=2),
                                 ConfidenceConfig(score="hinge"), ConfidenceConfig(log_eps=0.7)])
def test_bad_signal_knobs_are_one_line(cfg):
    with pytest.raises(UserError):
        cfg.validate()


def test_verdict_and_confidence_are_refused_on_control_trainers():
    from reflectrl.registry import parse_algo

    with pytest.raises(UserError, match="only a language-model task"):
        parse_algo("ppo+verdict")
    with pytest.raises(UserError, match="only a language-model task"):
        parse_algo("dqn+confidence")
    assert parse_algo("grpo+gear+verdict", "llm").signals == ("gear", "verdict")


# ---------------------------------------------------------------------------- metrics by hand


def test_ece_by_hand():
    conf = torch.tensor([0.05, 0.15, 0.18, 0.95, 1.0]).numpy()
    correct = torch.tensor([0, 1, 0, 1, 1]).bool().numpy()
    # bins: [0, .1) {0.05: acc 0}, [.1, .2) {0.15, 0.18: acc 0.5, conf 0.165}, [.9, 1] {0.95, 1.0: acc 1}
    expected = 1 / 5 * 0.05 + 2 / 5 * abs(0.5 - 0.165) + 2 / 5 * abs(1 - 0.975)
    assert ece(conf, correct) == pytest.approx(expected)


def test_auroc_with_ties_matches_mann_whitney():
    stats = pytest.importorskip("scipy.stats")
    import numpy as np

    conf = np.array([0.9, 0.8, 0.8, 0.5, 0.5, 0.5, 0.2, 0.1])
    correct = np.array([1, 1, 0, 1, 0, 0, 1, 0], dtype=bool)
    # by hand, correct {.9, .8, .5, .2} against wrong {.8, .5, .5, .1}: .9 beats 4; .8 beats 3 and ties 1;
    # .5 beats 1 and ties 2; .2 beats 1 -> (4 + 3.5 + 2 + 1) / 16
    assert auroc(conf, correct) == pytest.approx(10.5 / 16)
    u = stats.mannwhitneyu(conf[correct], conf[~correct]).statistic
    assert auroc(conf, correct) == pytest.approx(u / 16)
    assert auroc(conf, np.ones(8, dtype=bool)) is None


def test_selective_prediction_by_hand():
    import numpy as np

    curve, area = selective(np.array([0.9, 0.7, 0.7, 0.2]), np.array([1, 1, 0, 0], dtype=bool))
    assert curve == [(0.25, 1.0), (0.75, 2 / 3), (1.0, 0.5)]
    assert area == pytest.approx(0.25 * 1 + 0.5 * 2 / 3 + 0.25 * 0.5)
    _, distinct = selective(np.array([0.9, 0.8, 0.3, 0.2]), np.array([1, 0, 1, 0], dtype=bool))
    assert distinct == pytest.approx((1 + 1 / 2 + 2 / 3 + 2 / 4) / 4)  # the mean accuracy of the top k


def test_calibration_metrics_by_hand():
    reflections = [R(True, 0.9, True), R(False, 0.3, True), R(True, 0.8, True), R(False, 0.1, True), R()]
    correct = [True, True, False, False, True]
    m = calibration_metrics(correct, reflections)
    assert set(m) == set(KEYS)
    assert m["accuracy"] == pytest.approx(3 / 5)
    assert m["reflection_format_rate"] == pytest.approx(4 / 5) and m["reflection_missing_rate"] == pytest.approx(1 / 5)
    assert m["reflection_accuracy"] == pytest.approx(2 / 5)   # 0.9 right, 0.1 right; the missing one counts wrong
    assert m["under_confidence_rate"] == pytest.approx(1 / 3)  # of 3 correct, one judged not solved
    assert m["over_confidence_rate"] == pytest.approx(1 / 2)   # of 2 wrong, one judged solved
    assert m["solved_rate"] == pytest.approx(2 / 5) and m["solved_precision"] == pytest.approx(1 / 2)
    conf = [0.9, 0.3, 0.8, 0.1, 0.5]  # the missing one is uninformative, 0.5
    assert m["brier"] == pytest.approx(sum((c - y) ** 2 for c, y in zip(conf, correct)) / 5)
    none = calibration_metrics([True, False], [None, None])
    assert none["accuracy"] == 0.5 and all(none[k] is None for k in KEYS if k != "accuracy")


# ---------------------------------------------------------------------------- in the GRPO trainer


@pytest.fixture(scope="module")
def reflect_model_dirs(tiny_model_dir, tmp_path_factory):
    """The tiny model after an SFT that teaches each task's reflection format (a few seconds each)."""
    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import sft

    out = {}
    for name, spec in (("arith", "arith[max_operand=9;reflect=both]"), ("tools", "tools[keys=3;reflect=both]")):
        model, tok = load_model(str(tiny_model_dir))
        path = tmp_path_factory.mktemp("reflect") / name
        sft(model, tok, make_task(spec), steps=300, out=path, learning_rate=3e-3, progress=False)
        out[name] = path
    return out


def _trainer(model_dir, algo, task, steps=4, **knobs):
    from reflectrl.llm.model import load_model
    from reflectrl.trainers.grpo.config import LLMRunConfig, apply_llm_overrides, validate_llm
    from reflectrl.trainers.grpo.trainer import GRPOTrainer

    cfg = LLMRunConfig(algo=algo, task=task, model=str(model_dir), steps=steps, seed=3)
    apply_llm_overrides(cfg, ["prompts_per_step=4", "group_size=4", "eval_every=0", "log_kl=false",
                              *(f"{k}={v}" for k, v in knobs.items())])
    validate_llm(cfg)
    model, tok = load_model(cfg.model)
    return GRPOTrainer(cfg, model, tok)


def _params(trainer):
    return torch.cat([p.detach().reshape(-1) for p in trainer.model.parameters()])


@pytest.mark.slow
@pytest.mark.parametrize("name, task", [("arith", "arith[max_operand=9;reflect=both]"),
                                        ("tools", "tools[keys=3;reflect=both]")])
@pytest.mark.parametrize("signal", ["verdict", "confidence"])
def test_zero_coef_is_grpo_bit_for_bit_and_a_positive_one_is_not(reflect_model_dirs, name, task, signal):
    params, rows = {}, {}
    for label, algo, knobs in [("plain", "grpo", {}), ("zero", f"grpo+{signal}", {f"{signal}.coef": 0}),
                               ("on", f"grpo+{signal}", {f"{signal}.coef": 0.5, f"{signal}.schedule": "constant"})]:
        trainer = _trainer(reflect_model_dirs[name], algo, task, **knobs)  # one after the other: torch's RNG is global
        start = _params(trainer)
        rows[label] = [trainer.train_step() for _ in range(3)]
        params[label] = _params(trainer)
    assert not torch.equal(start, params["on"])  # it learnt something
    assert max(r["reflection_format_rate"] for r in rows["on"]) > 0.2  # the SFT taught the format: not vacuous
    assert torch.equal(params["plain"], params["zero"])
    assert not torch.equal(params["plain"], params["on"])


@pytest.mark.slow
def test_reward_terms_join_the_outcome_before_group_normalisation(reflect_model_dirs):
    from reflectrl.trainers.base import Stopwatch
    from reflectrl.trainers.grpo.trainer import group_advantages, token_logprobs

    trainer = _trainer(reflect_model_dirs["arith"], "grpo+verdict", "arith[max_operand=9]",
                       **{"verdict.coef": 0.5, "verdict.schedule": "constant"})
    episodes = trainer.generate()
    scored = trainer.score(episodes)
    _, hidden = token_logprobs(trainer.model, episodes.ids, episodes.attention)
    with Stopwatch():
        token_adv, _ = trainer._signal_output(episodes, scored, hidden)
    finals = episodes.final_reflections(trainer.task)
    correct = scored.scores >= 1
    bonus = torch.tensor([0.5 * (f.stated_verdict is not None and f.stated_verdict == bool(c))
                          for f, c in zip(finals, correct)])
    expected, _, _ = group_advantages(scored.rewards + bonus, 4)  # the paper's r = outcome + c 1[verdict == outcome]
    first = episodes.agent[:, 1:].float().argmax(1)
    assert torch.allclose(token_adv[torch.arange(len(first)), first], expected, atol=1e-6)


@pytest.mark.slow
def test_pseudo_reward_trains_on_the_verdict_and_logs_the_withheld_accuracy(reflect_model_dirs):
    trainer = _trainer(reflect_model_dirs["arith"], "grpo", "arith[max_operand=9]", pseudo_reward="verdict")
    assert trainer.cfg.task == "arith[max_operand=9;reflect=verdict]"
    episodes = trainer.generate()
    scored = trainer.score(episodes)
    says = torch.tensor([float(f.stated_verdict is True) for f in episodes.final_reflections(trainer.task)])
    assert torch.equal(scored.rewards, says)
    assert torch.equal(scored.scores, torch.tensor(trainer.task.score_batch(episodes.problems, episodes.turns)))
    row = trainer.train_step()
    assert row["pseudo_solved_rate"] == row["solved_rate"] and row["pseudo_true_accuracy"] == row["accuracy"]
    with pytest.raises(UserError, match="withholds the labels"):
        _trainer(reflect_model_dirs["arith"], "grpo+verdict", "arith", pseudo_reward="verdict")
    with pytest.raises(UserError, match="pseudo_reward='labels'"):
        _trainer(reflect_model_dirs["arith"], "grpo", "arith", pseudo_reward="labels")


def test_collapse_toward_always_solved_is_warned_once():
    from reflectrl.runs.health import PSEUDO_WINDOW, RunMonitor

    monitor = RunMonitor(100, "steps")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(PSEUDO_WINDOW - 1):
            monitor.after_iteration({"step": step, "pseudo_solved_rate": 0.99, "pseudo_true_accuracy": 0.4}, step, 0, 0)
        monitor.after_iteration({"step": 9, "pseudo_solved_rate": 0.5, "pseudo_true_accuracy": 0.4}, 9, 0, 0)
        assert not caught  # a dip resets the window
        for step in range(10, 10 + 2 * PSEUDO_WINDOW):
            monitor.after_iteration({"step": step, "pseudo_solved_rate": 0.97, "pseudo_true_accuracy": 0.4}, step, 0, 0)
    assert len(caught) == 1 and "always 'solved'" in str(caught[0].message) and "40%" in str(caught[0].message)


@pytest.mark.slow
def test_eval_json_always_carries_the_calibration_keys(cli, reflect_model_dirs, tiny_model_dir, tmp_path):
    code, out, _ = cli("llm", "eval", "--model", str(tiny_model_dir), "--task", "arith", "--problems", "4", "--json")
    plain = json.loads(out)
    assert set(KEYS) <= set(plain) and plain["ece"] is None and plain["reliability_png"] is None
    png = tmp_path / "rel.png"
    code, out, _ = cli("llm", "eval", "--model", str(reflect_model_dirs["arith"]), "--task",
                       "arith[max_operand=9;reflect=both]", "--problems", "16", "--json", "--reliability", str(png))
    stated = json.loads(out)
    assert stated["ece"] is not None and stated["reflection_format_rate"] > 0.5
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and stated["reliability_png"] == str(png)
    sampled = [json.loads(cli("llm", "eval", "--model", str(reflect_model_dirs["arith"]), "--task",
                              "arith[max_operand=9;reflect=both]", "--problems", "16", "--json", "--temperature", "1",
                              "--seed", str(seed))[1]) for seed in (0, 0, 1)]
    assert sampled[0] == sampled[1] and sampled[0]["temperature"] == 1.0  # seeded
    assert sampled[0] != sampled[2]  # another seed, other samples
    code, _, err = cli("llm", "eval", "--model", str(tiny_model_dir), "--task", "arith", "--temperature", "-1")
    assert code != 0 and "--temperature -1" in err
    code, _, err = cli("llm", "eval", "--model", str(tiny_model_dir), "--task", "arith", "--reliability",
                       str(tmp_path / "x.png"))
    assert code != 0 and "states no confidence" in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_trl_reward_functions_by_hand():
    from reflectrl.integrations.rewards import task_dataset, task_rewards

    spec = "arith[reflect=both]"
    rows = task_dataset(spec, 4, seed=2, instruct=True)
    assert rows[0]["prompt"].startswith("Give only the final answer") and rows[3]["problem"] == 3
    rng, task = random.Random(2), make_task(spec)
    answers = [task.sample(rng).answer for _ in range(4)]
    completions = [f"{answers[0]} | solved 0.8", "-999 | solved 0.9", "-999 | not solved 0.2", answers[3]]
    outcome, verdict, confidence = task_rewards(spec, ["verdict", "confidence"], seed=2)
    assert outcome(None, completions, problem=[0, 1, 2, 3]) == [1.0, 0.0, 0.0, 1.0]
    assert verdict(None, completions, problem=[0, 1, 2, 3]) == pytest.approx([0.1, 0.0, 0.1, 0.0])
    assert confidence(None, completions, problem=[0, 1, 2, 3]) == pytest.approx([-0.04, -0.81, -0.04, -1.0])

    class State:  # TRL's trainer_state: the paper's step schedule drops the bonus after two thirds
        global_step, max_steps = 90, 100

    assert verdict(None, completions, problem=[0, 1, 2, 3], trainer_state=State) == [0, 0, 0, 0]
    with pytest.raises(UserError, match="multi-turn"):
        task_dataset("tools[reflect=both]", 2)
    with pytest.raises(UserError, match="needs the task to state a confidence"):
        task_rewards("arith[reflect=verdict]", ["confidence"])


def test_trl_rows_and_rewards_in_chat_form_are_what_the_trainer_gives_a_chat_model():
    from reflectrl.integrations.rewards import task_dataset, task_rewards

    rng, task = random.Random(5), make_task("arith")
    task.use_chat(True)
    problems = [task.sample(rng) for _ in range(3)]
    rows = task_dataset("arith", 3, seed=5, chat=True)
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": task.instruction(p)}] for p in problems]
    assert rows[0]["prompt"][0]["content"].startswith("What is ")
    # the raw prompt as a user turn, read in the raw form: what chat=True gave before
    raw = task_dataset("arith", 3, seed=5, chat="raw")
    assert [r["prompt"][0]["content"] for r in raw] == [p.prompt for p in problems]
    assert [r["prompt"] for r in task_dataset("arith", 3, seed=5)] == [p.prompt for p in problems]
    # an instruct model answers in prose: the chat form reads the number after it, the raw form does not
    said = [[{"role": "assistant", "content": f"Sure! {p.meta['a']} {p.meta['op']} {p.meta['b']} is {p.answer}."}]
            for p in problems]
    chat_outcome = task_rewards("arith", seed=5, chat=True)[0]
    raw_outcome = task_rewards("arith", seed=5, chat="raw")[0]
    assert chat_outcome(None, said, problem=[0, 1, 2]) == [1.0, 1.0, 1.0]
    assert raw_outcome(None, said, problem=[0, 1, 2]) == [0.0, 0.0, 0.0]
    wrong = [[{"role": "assistant", "content": f"It is {int(p.answer) + 1}."}] for p in problems]
    assert chat_outcome(None, wrong, problem=[0, 1, 2]) == [0.0, 0.0, 0.0]
    with pytest.raises(UserError, match="chat='yes'"):
        task_dataset("arith", 2, chat="yes")


@pytest.mark.slow
def test_a_finished_run_writes_its_calibration_and_reliability_diagram(cli, reflect_model_dirs, tmp_path):
    run = tmp_path / "run"
    code, _, err = cli("llm", "train", "--algo", "grpo+verdict+confidence", "--task", "arith[max_operand=9]",
                       "--model", str(reflect_model_dirs["arith"]), "--steps", "2", "--out", str(run), "--no-progress",
                       "--set", "prompts_per_step=2", "group_size=4", "eval_every=2", "eval_problems=8")
    assert code == 0, err
    assert json.loads((run / "config.json").read_text())["task"] == "arith[max_operand=9;reflect=both]"
    metrics = json.loads((run / "calibration.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics["ece"] == pytest.approx(rows[-1]["eval_ece"])
    assert {"verdict_coef", "confidence_score", "signal_time_fraction", "reflection_accuracy"} <= set(rows[-1])
    assert (run / "reliability.png").read_bytes()[:4] == b"\x89PNG"


def test_relevance_judgements_are_scored_against_the_searches_truth():
    from reflectrl.llm.calibration import relevance_metrics

    task = make_task("rag[max_hops=2;min_hops=2;reflect=both]")
    problem = task.sample(random.Random(3))
    q1, q2 = problem.meta["queries"]
    other = next(p for p in (task.sample(random.Random(s)) for s in range(50))
                 if not set(task.search(p.meta["queries"][0])) & set(problem.meta["docs"]))
    bad = other.meta["queries"][0]
    episodes = [[f"search {q1}", f"relevant; search {q2}", f"relevant; answer {problem.answer} | solved 0.9"],
                [f"search {bad}", f"relevant; search {q1}", f"search {q2}", "relevant; answer x | not solved 0.2"]]
    reflections = [task.reflections(problem, turns) for turns in episodes]
    m = relevance_metrics(task, [problem, problem], episodes, reflections)
    # 5 judgements due: right, right; wrong (the bad search called relevant), missing (wrong), right
    assert m == {"relevance_accuracy": pytest.approx(3 / 5), "relevant_search_rate": pytest.approx(4 / 5)}
    assert relevance_metrics(make_task("arith[reflect=both]"), [], [], []) == {}


@pytest.mark.slow
def test_verdict_composes_with_gear(reflect_model_dirs):
    trainer = _trainer(reflect_model_dirs["arith"], "grpo+gear+verdict", "arith[max_operand=9;reflect=both]",
                       **{"verdict.schedule": "constant"})
    rows = [trainer.train_step() for _ in range(2)]
    assert {"weights_mean", "verdict_bonus", "verdict_agreement", "reflection_accuracy"} <= set(rows[-1])
    assert all(math.isfinite(r["loss"]) for r in rows)


# ---------------------------------------------------------------------------- a run with nothing to act on


SMALL = {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4}  # an untrained model writes to the limit


def _silence_warnings(trainer, steps):
    """The warnings `steps` iterations of the trainer's loop give."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(steps):
            trainer.run_iteration()
    return [str(w.message) for w in caught]


@pytest.mark.parametrize("algo, knobs, expected", [
    ("grpo+verdict", {}, "reflection_format_rate 0), so signal 'verdict' has nothing to reward: the model has not "
                        "learnt the format. SFT it on the task first: reflectrl llm sft --model {model} --task "
                        "'arith[reflect=verdict]' --steps 300"),
    ("grpo", {"pseudo_reward": "verdict"}, "so pseudo_reward=verdict is 0 on every episode and nothing is learnt"),
])
def test_a_model_that_never_states_the_format_is_named_once_after_the_first_steps(tiny_model_dir, algo, knobs,
                                                                                  expected):
    # the untrained model never writes "19 | solved": the signal (or pseudo-reward) cannot act, and the run says so
    from reflectrl.trainers.grpo.trainer import SILENT_STEPS

    trainer = _trainer(tiny_model_dir, algo, "arith", steps=20, **SMALL, **knobs)
    assert _silence_warnings(trainer, SILENT_STEPS - 1) == []  # a few steps first: one batch proves nothing
    (message,) = _silence_warnings(trainer, 2)  # then one warning, not one per step
    assert f"for {SILENT_STEPS} steps no sampled answer stated its reflection" in message
    assert expected.format(model=tiny_model_dir) in message


def test_a_model_that_solves_nothing_is_named(tiny_model_dir):
    from reflectrl.trainers.grpo.trainer import SILENT_STEPS

    trainer = _trainer(tiny_model_dir, "grpo", "arith", steps=SILENT_STEPS, **SMALL)
    (message,) = _silence_warnings(trainer, SILENT_STEPS)
    assert "every sampled episode's reward was 0 on task 'arith', so the task gives GRPO nothing to learn" in message
    assert f"reflectrl llm sft --model {tiny_model_dir} --task 'arith'" in message


def test_a_short_run_is_named_at_its_end(tiny_model_dir):
    trainer = _trainer(tiny_model_dir, "grpo+verdict", "arith", steps=2, **SMALL)
    (message,) = _silence_warnings(trainer, 2)
    assert "for 2 steps no sampled answer stated its reflection" in message


@pytest.mark.slow
def test_a_model_taught_the_format_gets_no_warning(reflect_model_dirs):
    from reflectrl.trainers.grpo.trainer import SILENT_STEPS

    trainer = _trainer(reflect_model_dirs["arith"], "grpo+verdict", "arith[max_operand=9;reflect=both]",
                       steps=SILENT_STEPS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = [trainer.run_iteration() for _ in range(SILENT_STEPS)]
    assert min(r["reflection_format_rate"] for r in rows) > 0 and max(r["reward"] for r in rows) > 0
    assert not trainer.silence_warned and not [w for w in caught if f"for {SILENT_STEPS} steps" in str(w.message)]


@pytest.mark.slow
def test_the_warning_is_one_line_on_stderr_and_kept_in_run_json(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "reflectrl", "llm", "train", "--algo", "grpo+verdict", "--task",
                           "arith", "--model", str(tiny_model_dir), "--steps", "6", "--out", str(run),
                           "--no-progress", "--set", "prompts_per_step=2", "group_size=2", "max_new_tokens=4",
                           "eval_every=0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("reflectrl: warning:")]
    assert len(lines) == 1 and "reflection_format_rate 0" in lines[0], done.stderr
    (kept,) = json.loads((run / "run.json").read_text())["warnings"]
    assert lines[0] == f"reflectrl: warning: {kept}"
