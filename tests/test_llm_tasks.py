"""The LLM tasks: demonstrations solve their problems, wrong answers do not, sampling is
seeded, and bad specs are one-line UserErrors."""

import importlib.util
import random

import pytest

from reflectrl import sandbox
from reflectrl.errors import UserError
from reflectrl.llm.tasks import TASK_NAMES, make_task, parse_spec

RG_SMALL = ("rg:basic_arithmetic[min_terms=2;max_terms=2;max_digits=2;operators=+,-;"
            "allow_parentheses=false;allow_negation=false]")


def play(task, problem, turns):
    """Run an episode with fixed agent turns, as the trainer would; returns the turns used and replies."""
    used, replies = [], []
    for turn in turns:
        used.append(turn)
        reply = task.respond(problem, used)
        replies.append(reply)
        if reply is None or len(used) == task.max_turns:
            break
    return used, replies


def problems(spec, n=20, seed=0):
    task = make_task(spec)
    rng = random.Random(seed)
    return task, [task.sample(rng) for _ in range(n)]


@pytest.mark.parametrize("spec", ["arith", "arith[max_operand=99;ops=+-*]", "tools", "tools[max_operand=0]"])
def test_demonstration_solves_and_wrong_answer_fails(spec):
    task, ps = problems(spec)
    for p in ps:
        demo = task.demonstration(p)
        turns, replies = play(task, p, demo)
        assert turns == demo and len(demo) <= task.max_turns
        assert task.score(p, turns) == 1.0
        assert replies[-1] is None  # every task here ends after the final answer
        wrong = demo[:-1] + [demo[-1] + "1"]
        assert task.score(p, wrong) == 0.0
        assert task.score(p, []) == 0.0
        assert p.prompt.isascii() and all(t.isascii() for t in demo)
    assert task.score_batch(ps, [task.demonstration(p) for p in ps]) == [1.0] * len(ps)


@pytest.mark.parametrize("spec", ["arith", "tools", "code", RG_SMALL])
def test_sampling_is_deterministic(spec):
    task, a = problems(spec, seed=3)
    _, b = problems(spec, seed=3)
    _, c = problems(spec, seed=4)
    assert [(p.prompt, p.answer) for p in a] == [(p.prompt, p.answer) for p in b]
    assert [p.prompt for p in a] != [p.prompt for p in c]
    # a task object holds no hidden random state: the same rng seed gives the same problem
    assert task.sample(random.Random(7)).prompt == task.sample(random.Random(7)).prompt


def test_arith_format():
    task = make_task("arith[max_operand=9;ops=+]")
    p = task.sample(random.Random(0))
    a, b = p.meta["a"], p.meta["b"]
    assert p.prompt == f"{a}+{b}=" and task.demonstration(p) == [str(a + b)]
    assert task.score(p, [f" {a + b}\n"]) == 1.0           # surrounding whitespace is ignored
    assert task.score(p, [f"{a + b}0"]) == 0.0              # exact match only
    assert task.max_turns == 1 and task.max_new_tokens <= 8


def test_tools_episode_and_errors():
    task = make_task("tools")
    p = next(p for p in (task.sample(random.Random(s)) for s in range(50)) if p.meta["op"] == "*")
    key, c = p.meta["key"], p.meta["constant"]
    value = p.meta["table"][key]
    assert p.prompt == f"What is {key}*{c}?\n"  # the table is hidden: only `lookup` knows the value
    assert task.demonstration(p) == [f"lookup {key}", f"calc {value}*{c}", f"answer {value * c}"]
    assert task.respond(p, [f"lookup {key}"]) == f"= {value}\n"
    assert task.respond(p, ["calc 6 * -7"]) == "= -42\n"
    assert task.respond(p, ["lookup k99"]) == "error: no key k99\n"
    assert task.respond(p, ["what?"]).startswith("error:")
    assert task.respond(p, [f"answer {value * c}"]) is None
    # malformed calls do not end the episode; running out of turns without an answer scores 0
    turns, replies = play(task, p, ["hello", "lookup", "calc 1/2", "answer 0"])
    assert len(turns) == task.max_turns and all(r.startswith("error:") for r in replies)
    assert task.score(p, turns) == 0.0
    # the answer must be the final turn and exactly right
    assert task.score(p, [f"answer {value * c}", "lookup k0"]) == 0.0
    assert task.score(p, [f"answer  {value * c} \n"]) == 1.0


def test_reasoning_gym_round_trip():
    pytest.importorskip("reasoning_gym")
    task, ps = problems(RG_SMALL, n=10)
    assert task.name == "rg:basic_arithmetic" and task.max_turns == 1
    for p in ps:
        assert p.prompt.startswith("Calculate ") and p.prompt.endswith("\n") and len(p.prompt) < 25
        assert task.score(p, task.demonstration(p)) == 1.0
        assert task.score(p, ["banana"]) == 0.0
        assert task.score(p, []) == 0.0
    # options reach the dataset's config; seed picks another dataset
    assert task.dataset.config.operators == ("+", "-") and task.dataset.config.allow_parentheses is False
    _, qs = problems(RG_SMALL[:-1] + ";seed=1]", n=10)
    assert [p.prompt for p in ps] != [q.prompt for q in qs]


def test_code_task_format_without_sandbox():
    task, ps = problems("code", n=60)
    assert {p.meta["family"] for p in ps} >= {"add", "reverse", "max"}
    p = next(p for p in ps if p.meta["family"] == "add")
    k = p.prompt.split()[2]
    assert p.prompt == f"# add {k} to x\ndef f(x):\n" and task.demonstration(p) == [f"    return x + {k}"]
    cases = p.meta["tests"]["cases"]
    assert len(cases) == 5 and all(c["expected"] == c["args"][0] + int(k) for c in cases)
    assert task.program(p, ["    return 1"]) == "def f(x):\n    return 1"
    only = make_task("code[families=upper,sorted;cases=3]")
    qs = [only.sample(random.Random(s)) for s in range(10)]
    assert {q.meta["family"] for q in qs} == {"upper", "sorted"}
    assert all(len(q.meta["tests"]["cases"]) == 3 for q in qs)


def test_code_task_through_the_sandbox():
    if not sandbox.bwrap_available():
        pytest.skip("bubblewrap is not installed")
    task, ps = problems("code[families=add,reverse,max,count,first]", n=6)
    demos = [task.demonstration(p) for p in ps]
    assert task.score_batch(ps, demos) == [1.0] * len(ps)
    p = next(p for p in (task.sample(random.Random(s)) for s in range(100)) if p.meta["family"] == "add")
    k = int(p.prompt.split()[2])
    # partial credit: `abs(x) + k` is right exactly on the cases with x >= 0
    expected = sum(c["args"][0] >= 0 for c in p.meta["tests"]["cases"]) / 5
    wrong = [["    return x"], ["    return x +"], [f"    return abs(x) + {k}"], []]
    assert task.score_batch([p] * 4, wrong) == [0.0, 0.0, expected, 0.0]
    assert task.score(p, task.demonstration(p)) == 1.0


@pytest.mark.parametrize("spec, words", [
    ("", ["empty", "arith"]),
    ("arit", ["unknown task", "did you mean 'arith'", "rg:NAME"]),
    ("arith[foo=1]", ["unknown option 'foo'", "max_operand"]),
    ("arith[max_oprand=3]", ["did you mean 'max_operand'"]),
    ("arith[max_operand=x]", ["must be an integer"]),
    ("arith[max_operand]", ["key=value"]),
    ("arith[ops=/]", ["ops"]),
    ("arith(ops=+)", ["cannot parse"]),
    ("code[families=add,foo]", ["unknown family 'foo'", "reverse"]),
    ("tools[keys=0]", ["keys"]),
    ("rg", ["dataset name", "rg:basic_arithmetic"]),
    ("rg:basic_arithmatic", ["unknown reasoning-gym dataset", "rg:basic_arithmetic"]),
    ("rg:chain_sum[min_terms=5;max_terms=2]", ["max_terms must be >= min_terms"]),
    ("rg:chain_sum[bogus=1]", ["unknown option 'bogus'", "max_terms"]),
])
def test_bad_specs_are_one_line_user_errors(spec, words):
    if spec.startswith("rg"):
        pytest.importorskip("reasoning_gym")
    with pytest.raises(UserError) as err:
        make_task(spec)
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message


def test_spec_parsing_and_names():
    assert parse_spec("arith") == ("arith", {})
    assert parse_spec(" rg:chain_sum[ max_terms = 2 ; ] ") == ("rg:chain_sum", {"max_terms": "2"})
    assert parse_spec("arith[ops=+-*]") == ("arith", {"ops": "+-*"})
    assert make_task("arith[max_operand=20;ops=*+]").ops == "+*"


def test_every_listed_task_name_builds_a_task_and_errors_list_them_all():
    """TASK_NAMES (what the CLI's help shows) names tasks make_task can build, and the
    unknown-task message lists every one of them."""
    for name in TASK_NAMES:
        if name == "rg:NAME":
            if importlib.util.find_spec("reasoning_gym") is not None:
                assert make_task("rg:basic_arithmetic").name == "rg:basic_arithmetic"
            with pytest.raises(UserError, match="rg:basic_arithmetic"):  # rg without a NAME says what NAME is
                make_task("rg")
            continue
        task = make_task(name)
        assert task.name == name
        assert task.score(task.sample(random.Random(0)), []) == 0.0  # a working task, not just a name
    with pytest.raises(UserError) as err:
        make_task("no_such_task")
    for name in TASK_NAMES:
        assert name in str(err.value)
