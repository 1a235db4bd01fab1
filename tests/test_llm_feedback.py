"""Reflection after feedback (issue 41): the `reflect_after=` option and its refusals, the turn
structure on code (body, the visible tests' output, then the reflection), tools and rag (after the
last tool output), the targets (the hidden tests; rag's relevance judgements against the search's
truth), the before/after-feedback metrics, the SFT demonstrations' format, the rollout, and
`llm train --algo grpo+verdict --task 'code[reflect=verdict;reflect_after=feedback]'` end to end."""

import json
import random

import pytest

from reflectrl import sandbox
from reflectrl.errors import UserError
from reflectrl.llm.calibration import FEEDBACK_KEYS, KEYS, calibration_metrics
from reflectrl.llm.tasks import make_task
from reflectrl.llm.tasks.base import turn_text
from reflectrl.llm.tasks.reflect import Reflection, parse_reflection
from reflectrl.signals.verdict.torch import verdict_terms

CODE = "code[reflect=both;reflect_after=feedback]"
needs_bwrap = pytest.mark.skipif(not sandbox.bwrap_available(), reason="bubblewrap is not installed")


def _problem(task, family, seed=0):
    rng = random.Random(seed)
    return next(p for p in (task.sample(rng) for _ in range(500)) if p.meta["family"] == family)


# ---------------------------------------------------------------------------- the option


@pytest.mark.parametrize("spec, after", [("code[reflect=verdict]", "feedback"), ("tools[reflect=both]", "feedback"),
                                         ("rag[reflect=both]", "feedback"), ("arith[reflect=both]", "answer"),
                                         ("code[reflect=verdict;reflect_after=answer]", "answer"),
                                         ("code[reflect=verdict;reflect_after=feedback]", "feedback")])
def test_reflect_after_defaults_to_feedback_where_the_task_has_it(spec, after):
    assert make_task(spec).reflect_after == after


@pytest.mark.parametrize("spec, words", [
    ("arith[reflect=verdict;reflect_after=feedback]", ["arith gives no feedback", "reflect_after=answer"]),
    ("arith[reflect_after=feedback]", ["arith gives no feedback"]),  # refused whatever the mode
    ("code[reflect=both;reflect_after=later]", ["reflect_after='later'", "feedback", "answer"]),
    ("rag[reflect=both;reflect_after=never]", ["reflect_after='never'"]),
    ("code[reflect=both;visible=0]", ["visible must be in 1..20"]),
])
def test_bad_reflect_after_is_one_line(spec, words):
    with pytest.raises(UserError) as err:
        make_task(spec)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words)


def test_the_problems_are_the_same_whatever_reflect_after():
    plain, fb, ans = make_task("code"), make_task(CODE), make_task("code[reflect=both;reflect_after=answer]")
    a, b, c = random.Random(4), random.Random(4), random.Random(4)
    for _ in range(30):
        p, q, r = plain.sample(a), fb.sample(b), ans.sample(c)
        assert (p.prompt, p.answer, p.meta["tests"]) == (q.prompt, q.answer, q.meta["tests"]) == \
               (r.prompt, r.answer, r.meta["tests"])
        assert set(p.meta) == {"family", "header", "tests"}  # nothing added to a plain task's problems


# ---------------------------------------------------------------------------- code: the turns


def test_code_turns_are_body_then_visible_tests_then_the_reflection():
    task = make_task(CODE)
    assert task.max_turns == 2 and task.own_turn
    p = _problem(task, "add")
    k = int(p.prompt.split()[2])
    visible = task.inner.visible_tests(p)
    assert visible == task.inner.visible_tests(p) and len(visible["cases"]) == 2  # seeded by the problem
    hidden = [c["args"] for c in p.meta["tests"]["cases"]]
    args = [c["args"][0] for c in visible["cases"]]
    # the reference body's feedback is known without the sandbox: every visible test passes
    reply = task.respond(p, [p.answer])
    assert reply == "".join(f"pass f({a}) == {a + k}\n" for a in args)
    assert task.respond(p, [p.answer, "solved 0.9"]) is None  # the reflection turn ends the episode
    refl = task.reflections(p, [p.answer, "solved 0.9"])
    assert refl[0] == [] and refl[1] == [Reflection(True, 0.9, True)] and refl[1][0].after_feedback
    assert task.reflections(p, [p.answer, "maybe"])[1] == [Reflection()]  # malformed: missing, after feedback
    assert task.reflections(p, [p.answer])[-1] == [Reflection()]  # the turns ran out before it
    assert parse_reflection("not solved 0.2", "both") == Reflection(False, 0.2, True)
    assert len(hidden) == 5  # the hidden tests: `cases`, never shown


def test_code_reflect_after_answer_keeps_the_first_format():
    task = make_task("code[reflect=both;reflect_after=answer]")
    p = _problem(task, "add")
    assert task.max_turns == 1 and task.respond(p, [p.answer + " | solved 0.8"]) is None
    (r,), = task.reflections(p, [p.answer + " | solved 0.8"])
    assert r == Reflection(True, 0.8, True) and not r.after_feedback


@needs_bwrap
def test_code_feedback_runs_the_visible_tests_and_the_score_the_hidden_ones():
    task = make_task(CODE)
    p = _problem(task, "add", seed=1)
    k = int(p.prompt.split()[2])
    visible = [c["args"][0] for c in task.inner.visible_tests(p)["cases"]]
    hidden = [c["args"][0] for c in p.meta["tests"]["cases"]]
    # right on the visible inputs only: the feedback says pass, the hidden tests (the outcome) fail
    cheat = f"    return x + {k} if x in {tuple(visible)!r} else x"
    assert not set(hidden) <= set(visible)
    assert task.respond(p, [cheat]) == "".join(f"pass f({a}) == {a + k}\n" for a in visible)
    outcome = task.score(p, [cheat, "solved 0.9"])
    assert outcome == sum(a in visible for a in hidden) / len(hidden) < 1.0
    # the verdict is judged against the hidden outcome, not against the visible tests
    episode = task.reflections(p, [cheat, "solved 0.9"])
    assert verdict_terms(episode, float(outcome >= 1.0), 0.1) == ([0.0, 0.0], 0)
    assert verdict_terms(task.reflections(p, [cheat, "not solved"]), 0.0, 0.1) == ([0.0, 0.1], 1)
    # errors and wrong outputs, one line per visible test; a syntax error in one line
    wrong, broken, crash = task.respond_batch([p] * 3, [["    return x"], ["    return x +"], ["    return y"]])
    assert wrong == "".join(f"fail f({a}) = {a}, expected {a + k}\n" for a in visible)
    assert broken.startswith("error: SyntaxError") and broken.count("\n") == 1
    assert crash.splitlines() == [f"fail f({a}): NameError: name 'y' is not defined" for a in visible]
    assert task.score_batch([p] * 2, [[p.answer, "solved"], ["    return x", "solved"]]) == [1.0, 0.0]


# ---------------------------------------------------------------------------- tools and rag


def test_tools_reflection_follows_the_last_tool_output():
    task = make_task("tools[reflect=both]")
    assert task.reflect_after == "feedback" and task.max_turns == 3 and not task.own_turn
    p = task.sample(random.Random(2))
    demo = [turn_text(t) for t in task.demonstration(p)]
    assert demo[-1].startswith("answer ") and " | " in demo[-1]
    refl = task.reflections(p, demo)
    assert all(r == [] for r in refl[:-1]) and refl[-1][0].after_feedback  # after the last tool's output
    (first,), = task.reflections(p, [f"answer {p.answer} | solved 0.7"])  # no tool call: before any feedback
    assert not first.after_feedback


def test_rag_relevance_judgements_are_rewarded_against_the_searches_truth():
    fb, ans = make_task("rag[max_hops=2;min_hops=2;reflect=verdict]"), \
        make_task("rag[max_hops=2;min_hops=2;reflect=verdict;reflect_after=answer]")
    problem = fb.sample(random.Random(3))
    q1, q2 = problem.meta["queries"]
    # both searches found what was needed; the answer is wrong: the outcome is 0
    turns = [f"search {q1}", f"relevant; search {q2}", "relevant; answer Nobody | not solved"]
    with_truth = fb.reflections(problem, turns)
    assert [r.target for r in with_truth[1] + with_truth[2]] == [True, True, None]
    assert all(r.after_feedback for r in with_truth[1] + with_truth[2])
    # each of the 3 judgements is right against its own truth: the whole c
    terms, agree = verdict_terms(with_truth, 0.0, 0.3)
    assert agree == 3 and sum(terms) == pytest.approx(0.3)
    # against the final outcome (reflect_after=answer) the two "relevant" judgements are wrong
    terms, agree = verdict_terms(ans.reflections(problem, turns), 0.0, 0.3)
    assert agree == 1 and sum(terms) == pytest.approx(0.1)
    assert all(r.target is None for turn in ans.reflections(problem, turns) for r in turn)


# ---------------------------------------------------------------------------- the metrics


def test_before_and_after_feedback_metrics_by_hand():
    before = [Reflection(True, 0.9, True), Reflection(False, 0.2, True)]  # stated in the answer's turn
    after = [Reflection(True, 0.8, True, after_feedback=True), Reflection(True, 0.7, True, after_feedback=True),
             Reflection(False, 0.1, True, after_feedback=True)]
    correct = [False, True, True, False, False]
    m = calibration_metrics(correct, before + after)
    assert set(FEEDBACK_KEYS) <= set(KEYS) and set(m) == set(KEYS)
    # before: a wrong answer judged solved (over), a right one judged not solved (under)
    assert m["reflection_accuracy_before_feedback"] == 0.0
    assert m["under_confidence_rate_before_feedback"] == 1.0 and m["over_confidence_rate_before_feedback"] == 1.0
    # after: right "solved", wrong "solved" (over), wrong "not solved"
    assert m["reflection_accuracy_after_feedback"] == pytest.approx(2 / 3)
    assert m["under_confidence_rate_after_feedback"] == 0.0  # the one correct answer is judged solved
    assert m["over_confidence_rate_after_feedback"] == pytest.approx(1 / 2)
    assert m["ece_after_feedback"] == pytest.approx(1 / 3 * (0.2 + 0.7 + 0.1))
    assert m["reflection_accuracy"] == pytest.approx(2 / 5)  # the names without a suffix: every episode
    only_after = calibration_metrics(correct[2:], after)
    assert only_after["reflection_accuracy_before_feedback"] is None
    assert only_after["reflection_accuracy_after_feedback"] == only_after["reflection_accuracy"]


# ---------------------------------------------------------------------------- SFT demonstrations


def test_sft_demonstrations_teach_feedback_then_reflection(tiny_model_dir):
    from reflectrl.llm.model import load_model
    from reflectrl.llm.sft import demonstration_tokens

    _, tok = load_model(str(tiny_model_dir))
    task = make_task("code[reflect=both;reflect_after=feedback;reflect_negatives=1]")
    p = task.sample(random.Random(0))
    body, reflection = task.demonstration(p)
    (wrong, learned), = body
    assert not learned and wrong != p.answer and reflection.startswith("not solved 0.")
    feedback = task.respond(p, [wrong])
    assert "fail" in feedback  # the wrong body fails a visible test, or at least a hidden one
    ids, agent = demonstration_tokens(tok, task, p)
    text = tok.decode(ids, skip_special_tokens=True)
    assert text.index(wrong) < text.index(feedback) < text.index(reflection)  # body, feedback, judgement
    learned_text = tok.decode([i for i, a in zip(ids, agent) if a], skip_special_tokens=True)
    assert learned_text == reflection  # neither the wrong body nor the feedback is learned
    positive = make_task("code[reflect=verdict;reflect_after=feedback;reflect_negatives=0]")
    q = positive.sample(random.Random(0))
    assert positive.demonstration(q) == [q.answer, "solved"]
    ids, agent = demonstration_tokens(tok, positive, q)
    assert tok.decode([i for i, a in zip(ids, agent) if a], skip_special_tokens=True) == q.answer + "solved"
    assert "pass f(" in tok.decode(ids, skip_special_tokens=True)


def test_wrong_bodies_fail_a_hidden_test():
    task = make_task("code[reflect=both;reflect_after=feedback;reflect_negatives=1;families=short,long]")
    rng = random.Random(0)
    for _ in range(60):
        p = task.sample(rng)
        (wrong,) = task.inner.wrong_turns(p, random.Random(1))
        fn = task.inner._trusted[(p.meta["header"], wrong)]
        assert any(fn(c["args"][0]) != c["expected"] for c in p.meta["tests"]["cases"])


# ---------------------------------------------------------------------------- rollout and the CLI


@needs_bwrap
def test_rollout_shows_the_feedback_in_context_not_learned(tiny_model_dir):
    import torch

    from reflectrl.llm.model import load_model
    from reflectrl.trainers.grpo.trainer import rollout

    model, tok = load_model(str(tiny_model_dir))
    task = make_task(CODE)
    problems = [task.sample(random.Random(s)) for s in range(4)]
    torch.manual_seed(0)
    episodes = rollout(model.eval(), tok, task, problems, max_new_tokens=8)
    for i, p in enumerate(problems):
        assert len(episodes.turns[i]) == 2  # the body, then the reflection after the feedback
        reply = task.respond(p, episodes.turns[i][:1])
        context = tok.decode(episodes.ids[i][~episodes.agent[i] & episodes.attention[i].bool()],
                             skip_special_tokens=True)
        assert context.endswith(reply) and reply.startswith(("pass", "fail", "error"))
        assert (episodes.turn[i] == 1).any() and episodes.reflections[i][1][0].after_feedback


@pytest.mark.slow
@needs_bwrap
def test_llm_train_grpo_verdict_on_code_after_feedback_end_to_end(cli, tiny_model_dir, tmp_path):
    spec = "code[reflect=verdict;reflect_after=feedback]"
    sft_dir = tmp_path / "sft"
    code, _, err = cli("llm", "sft", "--model", tiny_model_dir, "--task", spec, "--steps", "30", "--lr", "3e-3",
                       "--out", sft_dir, "--no-progress")
    assert code == 0, err
    run = tmp_path / "run"
    code, out, err = cli("llm", "train", "--algo", "grpo+verdict", "--task", spec, "--model", sft_dir, "--steps", "2",
                         "--seed", "1", "--out", run, "--no-progress", "--set", "prompts_per_step=2", "group_size=4",
                         "eval_every=2", "eval_problems=8", "log_kl=false")
    assert code == 0, err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    for key in ("reflection_accuracy", "reflection_accuracy_after_feedback", "verdict_agreement",
                "eval_reflection_accuracy", "eval_reflection_accuracy_after_feedback"):
        assert key in last, key
    # among correct answers (under) or wrong ones (over): whichever population the step has
    assert {"under_confidence_rate_after_feedback", "over_confidence_rate_after_feedback"} & set(last)
    assert last["turns"] == 2.0 and "reflection_accuracy_before_feedback" not in last
    assert last["reflection_accuracy_after_feedback"] == last["reflection_accuracy"]
    calibration = json.loads((run / "calibration.json").read_text())
    assert calibration["reflection_accuracy_before_feedback"] is None
    code, out, err = cli("llm", "eval", "--model", run, "--task", spec, "--problems", "4", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert set(KEYS) <= set(result) and result["reflection_accuracy_after_feedback"] is not None
    code, _, err = cli("llm", "train", "--algo", "grpo+verdict", "--task", "arith[reflect_after=feedback]",
                       "--model", sft_dir, "--steps", "1", "--out", tmp_path / "bad", "--no-progress")
    assert code != 0 and "arith gives no feedback" in err and "Traceback" not in err
