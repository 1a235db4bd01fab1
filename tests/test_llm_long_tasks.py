"""Long-horizon task options: tools[calls=N], code[families=long], rg:...[worked=true].

Each demonstration, played through `respond` as an episode is, scores 1.0; a wrong final
answer scores 0; the completions are 32+ tokens; the defaults are unchanged (digests of the
sampled problems computed with the code before these options existed)."""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest

from reflectrl import sandbox
from reflectrl.errors import UserError
from reflectrl.llm.tasks import make_task
from reflectrl.llm.tasks.base import turn_text

TOOLS_LONG = "tools[calls=8;ops=+-]"
CODE_LONG = "code[families=long]"
RG_LONG = "rg:chain_sum[min_terms=7;max_terms=9;max_digits=2;worked=true]"
RG_BASIC = "rg:basic_arithmetic[min_terms=6;max_terms=8;min_digits=2;max_digits=2;worked=true]"
SYSTEM_PYTHON = "/usr/bin/python3"


def has_rg() -> bool:
    try:
        import reasoning_gym  # noqa: F401
    except ImportError:
        return False
    return True


LONG_SPECS = [TOOLS_LONG, CODE_LONG] + ([RG_LONG, RG_BASIC] if has_rg() else [])  # 32+ token completions
NEW_SPECS = LONG_SPECS + ["tools[calls=5]"]


def play(task, problem, turns) -> tuple[list[str], list[str]]:
    """The episode loop of tasks/base.py with the agent's turns given: (turns played, replies)."""
    played, replies = [], []
    for turn in turns:
        played.append(turn_text(turn))
        reply = task.respond(problem, played)
        if reply is None or len(played) == task.max_turns:
            break
        replies.append(reply)
    return played, replies


@pytest.fixture(scope="module")
def tokenizer():
    from reflectrl.llm.model import CORPUS_TASKS, build_tokenizer

    return build_tokenizer(tasks=CORPUS_TASKS + tuple(LONG_SPECS))


def digest(task, n=50):
    rng, out = random.Random(0), []
    for _ in range(n):
        p = task.sample(rng)
        out.append([p.prompt, repr(p.answer), task.demonstration(p), repr(sorted(p.meta.items()))])
    return hashlib.sha256(json.dumps(out).encode()).hexdigest()[:16], task.max_turns, task.max_new_tokens


@pytest.mark.parametrize("spec, expected", [
    ("tools", ("51afbb8dd7f2920d", 3, 12)),
    ("tools[keys=8;ops=+-]", ("5f83ebd39ac7c6a2", 3, 12)),
    ("code", ("7a83f0d204306a96", 1, 32)),
    ("rg:chain_sum[min_terms=5;max_terms=8]", ("7886e521609d69de", 1, 16)),
    ("rg:basic_arithmetic", ("d98f57684e8c2497", 1, 20)),
])
def test_defaults_are_unchanged(spec, expected):
    if spec.startswith("rg"):
        pytest.importorskip("reasoning_gym")
    assert digest(make_task(spec)) == expected


@pytest.mark.parametrize("spec", NEW_SPECS)
def test_generators_are_seeded(spec):
    task = make_task(spec)
    a = [task.sample(random.Random(s)) for s in range(5)]
    b = [make_task(spec).sample(random.Random(s)) for s in range(5)]
    assert [(p.prompt, p.answer, task.demonstration(p)) for p in a] == \
           [(p.prompt, p.answer, task.demonstration(p)) for p in b]
    assert len({p.prompt for p in a}) > 1


@pytest.mark.parametrize("spec", LONG_SPECS)
def test_demonstrations_are_long(spec, tokenizer):
    from reflectrl.llm.sft import demonstration_tokens

    task = make_task(spec)
    rng = random.Random(0)
    for _ in range(50):
        p = task.sample(rng)
        _, agent = demonstration_tokens(tokenizer, task, p)
        assert sum(agent) >= 32, (spec, p.prompt, task.demonstration(p))
        for turn in task.demonstration(p):  # each turn fits the generation budget
            assert len(tokenizer.encode(turn_text(turn), add_special_tokens=False)) < task.max_new_tokens
        assert len(task.demonstration(p)) <= task.max_turns


@pytest.mark.parametrize("calls", [4, 5, 6, 7, 8, 12])
def test_tools_chain_needs_exactly_calls_tool_calls(calls):
    task = make_task(f"tools[calls={calls};keys=8;ops=+-]")
    assert task.max_turns == calls + 2
    rng = random.Random(calls)
    for _ in range(30):
        p = task.sample(rng)
        demo = task.demonstration(p)
        assert len(demo) == calls
        assert sum(t.startswith("lookup ") for t in demo) == calls // 2 == len(set(p.meta["chain"]))
        assert sum(t.startswith("calc ") for t in demo) == calls // 2 - 1 + calls % 2
        assert demo[-1] == f"answer {p.answer}"
        played, replies = play(task, p, demo)
        assert played == demo and len(replies) == calls - 1
        assert all(r.startswith("= ") for r in replies)
        assert task.score(p, played) == 1.0
        assert task.reference(p) == "\n".join(demo) and task.reference(p, "answer") == str(p.answer)
        # the question is the chain, left to right
        question = p.prompt.removeprefix("What is ").removesuffix("?\n")
        value = None
        for tok in __import__("re").findall(r"[-+*]|\w+", question):
            if tok in "+-*":
                op = tok
                continue
            v = p.meta["table"][tok] if tok in p.meta["table"] else int(tok)
            value = v if value is None else {"+": value + v, "-": value - v, "*": value * v}[op]
        assert value == p.answer
        wrong = task.wrong_turns(p, random.Random(1))
        assert wrong[:-1] == demo[:-1] and task.score(p, play(task, p, wrong)[0]) == 0.0


def test_tools_chain_example_and_bad_calls():
    task = make_task("tools[calls=6]")
    p = task.sample(random.Random(3))
    keys, ops = p.meta["chain"], p.meta["ops"]
    assert p.prompt == f"What is {keys[0]}{ops[0]}{keys[1]}{ops[1]}{keys[2]}?\n"
    demo = task.demonstration(p)
    assert [t.split()[0] for t in demo] == ["lookup", "lookup", "calc", "lookup", "calc", "answer"]
    assert task.score(p, demo[:-1] + [f"answer {p.answer + 1}"]) == 0.0
    assert task.score(p, demo[:-1]) == 0.0  # no answer
    assert task.respond(p, ["lookup k99"]) == "error: no key k99\n"


@pytest.mark.parametrize("spec, words", [
    ("tools[calls=3]", ["calls", "4..12"]),
    ("tools[calls=13]", ["calls", "4..12"]),
    ("tools[calls=8;keys=3]", ["keys>=4"]),
    ("tools[calls=5;max_operand=0]", ["max_operand"]),
    ("tools[calls=12;keys=6;max_value=1000]", ["9 digits", "ops=+-"]),
    ("code[families=long,bogus]", ["unknown family 'bogus'", "sum_pos", "long"]),
    ("rg:leg_counting[worked=true]", ["worked=true is only for", "rg:chain_sum"]),
    ("rg:chain_sum[worked=maybe]", ["worked", "true or false"]),
])
def test_bad_options_are_one_line_user_errors(spec, words):
    if spec.startswith("rg"):
        pytest.importorskip("reasoning_gym")
    with pytest.raises(UserError) as err:
        make_task(spec)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_code_long_families_format():
    task = make_task(CODE_LONG)
    assert task.families == ("sum_pos", "count_gt", "running_max", "first_neg", "clip", "reverse_words",
                             "remove_vowels")
    assert make_task("code[families=short]").families == make_task("code").families
    assert set(make_task("code[families=short,long]").families) == set(task.families) | set(make_task("code").families)
    ps = [task.sample(random.Random(s)) for s in range(60)]
    assert {p.meta["family"] for p in ps} == set(task.families)
    for p in ps:
        (body,) = task.demonstration(p)
        lines = body.split("\n")
        assert 3 <= len(lines) <= 6 and all(line.startswith("    ") for line in lines)
        assert len(p.meta["tests"]["cases"]) >= 5
        assert task.reference(p) == body
        assert len(body.encode()) < task.max_new_tokens
    p = next(p for p in ps if p.meta["family"] == "first_neg")
    assert p.prompt == "# index of the first negative item of xs, or -1\ndef f(xs):\n"
    assert p.answer == ("    i = 0\n    while i < len(xs):\n        if xs[i] < 0:\n            return i\n"
                        "        i = i + 1\n    return -1")
    # the reference functions agree with the bodies (run here, in-process: our own code)
    for p in ps:
        scope: dict = {}
        exec(task.program(p, task.demonstration(p)), scope)  # noqa: S102
        for case in p.meta["tests"]["cases"]:
            assert scope["f"](*case["args"]) == case["expected"], (p.prompt, case)


def _sandbox_kwargs():
    if sandbox.bwrap_available():
        return {}
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("neither bubblewrap nor a world-readable system python")
    return {"isolation": "rlimits-only", "python": SYSTEM_PYTHON}


def test_code_long_through_the_sandbox():
    kwargs = _sandbox_kwargs()
    task = make_task(CODE_LONG)
    ps = [task.sample(random.Random(s)) for s in range(14)]
    episodes = [task.demonstration(p) for p in ps]
    p = next(p for p in (task.sample(random.Random(s)) for s in range(100)) if p.meta["family"] == "sum_pos")
    wrong = ["    return sum(xs)", "    total = 0\n    for x in xs:\n        total = total + x\n    return total",
             "    return sum(x for x in xs if x > 0)", "    for x in xs:\n    return x"]
    cases = p.meta["tests"]["cases"]
    expected = [sum(c["expected"] == sum(c["args"][0]) for c in cases) / len(cases)] * 2 + [1.0, 0.0]
    if sandbox.bwrap_available():  # the task's own scoring path
        assert task.score_batch(ps, episodes) == [1.0] * len(ps)
        assert task.score_batch([p] * 4, [[w] for w in wrong]) == expected
        reflective = make_task("code[families=long;reflect=both;reflect_negatives=0]")
        qs = [reflective.sample(random.Random(s)) for s in range(4)]
        demos = [[turn_text(t) for t in reflective.demonstration(q)] for q in qs]
        assert reflective.score_batch(qs, demos) == [1.0] * 4
        return
    # no bubblewrap here: the same programs through the rlimits-only sandbox with a system python
    results = sandbox.run_batch([(task.program(q, e), q.meta["tests"]) for q, e in zip(ps, episodes)],
                                timeout=10, **kwargs)
    assert [sandbox.code_reward(r) for r in results] == [1.0] * len(ps)
    results = sandbox.run_batch([(task.program(p, [w]), p.meta["tests"]) for w in wrong], timeout=10, **kwargs)
    assert [sandbox.code_reward(r) for r in results] == expected


def test_rg_worked_chain_sum():
    pytest.importorskip("reasoning_gym")
    task = make_task(RG_LONG)
    rng = random.Random(0)
    for _ in range(100):
        p = task.sample(rng)
        (demo,) = task.demonstration(p)
        entry = p.meta["entry"]
        assert p.prompt == entry["question"].rstrip() + "\n"  # reasoning-gym's own question
        steps = demo.split()
        assert steps[-2:] == ["answer", entry["answer"]]
        assert len(steps) - 2 == entry["metadata"]["num_terms"] - 1  # one step per operation
        assert task.score(p, [demo]) == 1.0
        assert task.reference(p) == demo and task.reference(p, "answer") == entry["answer"]
        wrong = task.wrong_turns(p, random.Random(1))
        assert wrong[0].rpartition("answer")[0] == demo.rpartition("answer")[0]
        assert task.score(p, wrong) < 1.0  # score_answer gives partial credit to a near miss
        assert task.score(p, [demo.rpartition("answer")[0]]) == 0.0  # no marker: no answer
        assert task.score(p, [entry["answer"]]) == 0.0
    p = make_task("rg:chain_sum[min_terms=6;max_terms=6;max_digits=1;worked=true]").sample(random.Random(1))
    a, *ops = p.meta["entry"]["metadata"]["expression"].split()
    value, expected = int(a), []
    for op, b in zip(ops[::2], ops[1::2]):
        new = value + int(b) if op == "+" else value - int(b)
        expected.append(f"{value}{op}{b}={new}")
        value = new
    assert p.meta["worked"] == " ".join(expected) + f" answer {value}"


@pytest.mark.parametrize("spec", [RG_BASIC, "rg:basic_arithmetic[worked=true]",
                                  "rg:basic_arithmetic[allow_parentheses=false;worked=true]",
                                  "rg:basic_arithmetic[whitespace=random;worked=true]"])
def test_rg_worked_basic_arithmetic(spec):
    pytest.importorskip("reasoning_gym")
    task = make_task(spec)
    rng = random.Random(0)
    for _ in range(100):
        p = task.sample(rng)
        (demo,) = task.demonstration(p)
        assert demo.endswith(f"answer {p.answer}")
        assert task.score(p, [demo]) == 1.0
        assert task.score(p, [demo.rpartition("answer")[0] + f"answer {int(p.answer) + 3}"]) < 1.0


def test_worked_steps():
    from reflectrl.llm.tasks.reasoning_gym import worked_steps

    assert worked_steps("3 + 5 - 2") == (["3+5=8", "8-2=6"], 6)
    assert worked_steps("7 - -6 * 7 - 4") == (["-6*7=-42", "7--42=49", "49-4=45"], 45)
    assert worked_steps("-( 2 + 3 ) * 4 / 3") == (["2+3=5", "-(5)=-5", "-5*4=-20", "-20/3=-7"], -7)
    assert worked_steps("3 + 5 * 2", left_to_right=True) == (["3+5=8", "8*2=16"], 16)
    with pytest.raises(ValueError):
        worked_steps("3 + x")


@pytest.mark.parametrize("spec", NEW_SPECS)
def test_reflect_both_on_the_long_options(spec):
    base, _, rest = spec.partition("[")
    task = make_task(f"{base}[{rest[:-1]};reflect=both]")
    if base == "code":
        task = make_task("code[families=long;reflect=both;isolation=rlimits-only]")
    rng = random.Random(0)
    positives = negatives = 0
    for _ in range(20):
        p = task.sample(rng)
        demo = task.demonstration(p)
        played, _ = play(task, p, demo)
        assert len(played) == len(demo)  # the episode runs to its last turn
        (reflection,) = task.reflections(p, played)[-1]
        assert reflection.well_formed
        if base == "code":  # scoring needs a sandbox: checked in test_code_long_through_the_sandbox
            assert task.inner.program(p, task._strip(played)).startswith(p.meta["header"])
            continue
        score = task.score(p, played)
        if reflection.verdict:
            positives += 1
            assert score == 1.0
        else:
            negatives += 1
            assert score < 1.0
    assert base == "code" or (positives and negatives)
