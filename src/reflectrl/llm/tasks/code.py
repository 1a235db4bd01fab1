"""`code`: write the body of a small Python function; reward = fraction of unit tests passed.

The prompt is a one-line spec as a comment and the function's header; the agent writes
the body, and the code run is the header plus the agent's turn:

    prompt  "# add 3 to x\\ndef f(x):\\n"
    demonstration ["    return x + 3"]
    runs    "def f(x):\\n    return x + 3"  against 5 cases such as {"args": [-7], "expected": -4}

Putting the header in the prompt keeps the turn short (a tiny model only has to write
one line) and fixes the entry point to `f`. The families (the parameter k is drawn per
problem): add, sub, mul, mod (int x); reverse, upper, count (str s); max, min, sum, len,
first, sorted (list of ints xs). Options:

    families  comma-separated subset of the families above and the long ones below
              (default: all the short ones); `short` and `long` name each group, e.g.
              code[families=long] or code[families=short,long]
    cases     unit tests per problem (default 5)
    timeout   wall-clock seconds per sandbox run (default 5.0)
    isolation "bwrap" (default) or "rlimits-only": the weaker sandbox for machines
              without bubblewrap (see reflectrl.sandbox); only for code you would run anyway
    visible   VISIBLE tests per problem (default 2), other cases than the `cases` above (the
              hidden ones, which score): with a reflection after feedback (`reflect_after=feedback`,
              tasks/reflect.py) the agent's body is run on them and it reads the result before it
              judges its work, e.g.

        prompt  "# add 3 to x\ndef f(x):\n"
        agent   "    return x + 4"
        reply   "fail f(-7) = -3, expected -4\nfail f(2) = 6, expected 5\n"
        agent   "not solved 0.2"                  (judged against the hidden tests)

              One line per visible test: "pass f(ARG) == EXPECTED", "fail f(ARG) = GOT, expected
              EXPECTED", "fail f(ARG): ERROR"; "error: REASON" where nothing ran (a syntax error,
              a timeout). The visible cases are drawn from a generator seeded by the problem
              itself, so the problems' stream is the same with or without them.

The long families have 3-6 line bodies with a loop and/or a conditional, for tasks where
per-token credit can matter (the demonstration's lines are joined by "\\n", each indented
4 spaces and nested blocks 8): sum_pos, count_gt (k), running_max, first_neg, clip (k)
(list of ints xs); reverse_words (str s of words), remove_vowels (str s). E.g.

    prompt  "# index of the first negative item of xs, or -1\\ndef f(xs):\\n"
    demonstration ["    i = 0\\n    while i < len(xs):\\n        if xs[i] < 0:\\n            return i\\n"
                   "        i = i + 1\\n    return -1"]

Use cases >= 5 with them (the default) so that the tests tell a loop from a shortcut.

Chat form (an instruct model, llm/chat.py): the user turn states the spec in words and shows
the header ("Write a Python function named f that returns this: add 3 to x." then the header
in a ```python block), and asks for the complete function in a ```python block. The code run
is the reply's ```python block (else its first fenced block, else the whole reply): where it
defines `def f(` it is the program as it stands, otherwise the body under the header as above
(indented 4 spaces where the reply left it flush). The visible tests' output, as feedback, is
the same lines after "Test results:". SmolLM2-135M-Instruct on the default (short) families in
this form, 64 problems (seed 0), up to 128 new tokens: 78% solved greedily, 33% sampled at T=1.

The code runs in `reflectrl.sandbox`; `score_batch` and `answer_feedback_batch` run a batch
in parallel (one process per core), each distinct program once. Without bubblewrap, scoring
raises `SandboxUnavailable` (a UserError).
"""

from __future__ import annotations

import random
import re
import textwrap

from reflectrl import sandbox
from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task, code_block


def _int(rng):
    return rng.randint(-20, 20)


def _str(rng):
    # a small alphabet, so that `count` has non-zero answers and `upper` is not the identity
    return "".join(rng.choice("abcde") for _ in range(rng.randint(1, 6)))


def _list(rng):
    return [rng.randint(-9, 9) for _ in range(rng.randint(1, 6))]


def _count(k):
    c = "abc"[k % 3]
    return f"count '{c}' in s", f"return s.count('{c}')", lambda s: s.count(c)


def _first(k):
    n = k % 3 + 1
    return f"first {n} items of xs", f"return xs[:{n}]", lambda xs: xs[:n]


# family -> (argument name, argument generator, make(k) -> (comment, body, reference function))
_FAMILIES = {
    "add": ("x", _int, lambda k: (f"add {k} to x", f"return x + {k}", lambda x: x + k)),
    "sub": ("x", _int, lambda k: (f"subtract {k} from x", f"return x - {k}", lambda x: x - k)),
    "mul": ("x", _int, lambda k: (f"multiply x by {k}", f"return x * {k}", lambda x: x * k)),
    "mod": ("x", _int, lambda k: (f"x modulo {k}", f"return x % {k}", lambda x: x % k)),
    "reverse": ("s", _str, lambda k: ("reverse s", "return s[::-1]", lambda s: s[::-1])),
    "upper": ("s", _str, lambda k: ("s in upper case", "return s.upper()", str.upper)),
    "count": ("s", _str, _count),
    "max": ("xs", _list, lambda k: ("largest item of xs", "return max(xs)", max)),
    "min": ("xs", _list, lambda k: ("smallest item of xs", "return min(xs)", min)),
    "sum": ("xs", _list, lambda k: ("sum of xs", "return sum(xs)", sum)),
    "len": ("xs", _list, lambda k: ("length of xs", "return len(xs)", len)),
    "first": ("xs", _list, _first),
    "sorted": ("xs", _list, lambda k: ("xs sorted", "return sorted(xs)", sorted)),
}
FAMILIES = tuple(_FAMILIES)  # the short families: the default


def _words(rng):
    return " ".join(_str(rng)[:4] for _ in range(rng.randint(1, 4)))


def _sum_pos(k):
    return ("sum of the positive items of xs",
            "total = 0\nfor i in range(len(xs)):\n    if xs[i] > 0:\n        total = total + xs[i]\nreturn total",
            lambda xs: sum(x for x in xs if x > 0))


def _count_gt(k):
    t = k - 5  # -3..4: the lists hold -9..9
    return (f"number of items of xs greater than {t}",
            f"count = 0\nfor i in range(len(xs)):\n    if xs[i] > {t}:\n        count = count + 1\nreturn count",
            lambda xs: sum(x > t for x in xs))


def _running_max(k):
    def ref(xs):
        out = []
        for x in xs:
            out.append(x if not out else max(out[-1], x))
        return out
    return ("running maximum of xs, as a list",
            "out = []\nm = xs[0]\nfor x in xs:\n    m = max(m, x)\n    out.append(m)\nreturn out", ref)


def _first_neg(k):
    return ("index of the first negative item of xs, or -1",
            "i = 0\nwhile i < len(xs):\n    if xs[i] < 0:\n        return i\n    i = i + 1\nreturn -1",
            lambda xs: next((i for i, x in enumerate(xs) if x < 0), -1))


def _clip(k):
    return (f"xs with every item above {k} replaced by {k}",
            f"out = []\nfor x in xs:\n    if x > {k}:\n        x = {k}\n    out.append(x)\nreturn out",
            lambda xs: [min(x, k) for x in xs])


def _reverse_words(k):
    return ("the words of s in reverse order, joined by single spaces",
            "words = s.split()\nout = []\nfor i in range(len(words)):\n"
            "    out.append(words[len(words) - 1 - i])\nreturn ' '.join(out)",
            lambda s: " ".join(reversed(s.split())))


def _remove_vowels(k):
    return ("s without its vowels",
            "vowels = 'aeiou'\nout = ''\nfor c in s:\n    if c not in vowels:\n        out = out + c\nreturn out",
            lambda s: "".join(c for c in s if c not in "aeiou"))


_LONG = {
    "sum_pos": ("xs", _list, _sum_pos),
    "count_gt": ("xs", _list, _count_gt),
    "running_max": ("xs", _list, _running_max),
    "first_neg": ("xs", _list, _first_neg),
    "clip": ("xs", _list, _clip),
    "reverse_words": ("s", _words, _reverse_words),
    "remove_vowels": ("s", _str, _remove_vowels),
}
LONG_FAMILIES = tuple(_LONG)
_FAMILIES.update(_LONG)
_GROUPS = {"short": FAMILIES, "long": LONG_FAMILIES}
_INDENT = " " * 4


def _indent(body: str) -> str:
    return "\n".join(_INDENT + line for line in body.split("\n"))


def _short(value, limit: int = 24) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


_FEEDBACK_LINE = 72  # an error line in the feedback is cut to this many characters
_DEF_F = re.compile(r"^[ \t]*def f\(", re.MULTILINE)
_ANY_DEF_F = re.compile(r"\bdef f\(")


def chat_program(header: str, reply: str) -> str:
    """The program an instruct model's reply gives (see the module's doc, chat form)."""
    code = code_block(reply)
    if code is None:
        code = reply
        m = _ANY_DEF_F.search(code)
        if m is not None:  # unfenced: the function from its header on, the prose before it dropped
            code = code[m.start():]
    if _DEF_F.search(code):
        return textwrap.dedent(code)
    lines = code.strip("\n").split("\n")
    if lines and lines[0] and not lines[0][0].isspace():  # a flush body: under the header
        code = _indent(textwrap.dedent("\n".join(lines)))
    return header + code


class CodeTask(Task):
    name = "code"
    max_turns = 1
    max_new_tokens = 32  # the longest reference body, "    return s.count('a')", is 23 bytes
    chat_max_new_tokens = 128  # a fenced function, and often a sentence about it
    feedback = True      # the visible tests' output (answer_feedback)

    def __init__(self, families: str = ",".join(FAMILIES), cases: int = 5, timeout: float = 5.0,
                 isolation: str = "bwrap", visible: int = 2):
        chosen = [g for f in families.split(",") if f.strip() for g in _GROUPS.get(f.strip(), (f.strip(),))]
        bad = [f for f in chosen if f not in _FAMILIES]
        if bad or not chosen:
            raise UserError(f"task code: unknown family {bad[0] if bad else families!r}; "
                            f"families is a comma-separated subset of {', '.join(FAMILIES)} (short), "
                            f"{', '.join(LONG_FAMILIES)} (long), or the groups short, long")
        if not 1 <= cases <= 100:
            raise UserError(f"task code: cases must be in 1..100, got {cases}")
        if not 1 <= visible <= 20:
            raise UserError(f"task code: visible must be in 1..20 (the visible tests shown as feedback), got {visible}")
        if not timeout > 0:
            raise UserError(f"task code: timeout must be > 0 seconds, got {timeout}")
        if isolation not in sandbox.ISOLATION_MODES:
            raise UserError(f"task code: isolation must be one of {', '.join(sandbox.ISOLATION_MODES)}, "
                            f"got {isolation!r}")
        self.families = tuple(f for f in _FAMILIES if f in chosen)  # canonical order
        self.cases, self.timeout, self.isolation, self.visible = cases, timeout, isolation, visible
        self._trusted: dict = {}  # (header, body) -> the Python function it computes (our own bodies only)
        if any(f in _LONG for f in self.families):  # the longest reference body in bytes, plus slack
            longest = max(len(_indent(_FAMILIES[f][2](k)[1])) for f in self.families for k in range(2, 10))
            self.max_new_tokens = max(type(self).max_new_tokens, longest + 16)

    def sample(self, rng: random.Random) -> Problem:
        family = rng.choice(self.families)
        arg, gen, make = _FAMILIES[family]
        k = rng.randint(2, 9)
        comment, body, ref = make(k)
        args = [gen(rng) for _ in range(self.cases)]
        tests = {"entry_point": "f", "cases": [{"args": [a], "expected": ref(a)} for a in args]}
        header = f"def f({arg}):\n"
        return Problem(prompt=f"# {comment}\n{header}", answer=_indent(body),
                       meta={"family": family, "header": header, "tests": tests})

    def instruction(self, problem: Problem) -> str:
        return (f"Write a Python function named f that returns this: {self._comment(problem)}.\n"
                f"```python\n{problem.meta['header']}```\nReply with the complete function in a ```python block.")

    @staticmethod
    def _comment(problem: Problem) -> str:
        return problem.prompt.split("\n", 1)[0][2:]

    def program(self, problem: Problem, turns: list[str]) -> str:
        """The code that is run: the function header plus the agent's body (in chat form, the
        reply's code: `chat_program`)."""
        if self.chat:
            return chat_program(problem.meta["header"], turns[-1] if turns else "")
        return problem.meta["header"] + (turns[-1] if turns else "")

    def _run_kwargs(self) -> dict:
        return {"timeout": self.timeout, "isolation": self.isolation}

    def score(self, problem: Problem, turns: list[str]) -> float:
        if not turns:
            return 0.0
        result = sandbox.run_code(self.program(problem, turns), problem.meta["tests"], **self._run_kwargs())
        return sandbox.code_reward(result)

    def _run_distinct(self, items: list[tuple[str, dict]]) -> list:
        """sandbox.run_batch over (program, tests) pairs, each distinct pair run once."""
        keys = [(code, repr(tests)) for code, tests in items]
        distinct = list(dict.fromkeys(keys))
        where = {k: i for i, k in enumerate(distinct)}
        first = {k: item for k, item in zip(keys, items)}
        results = sandbox.run_batch([first[k] for k in distinct], **self._run_kwargs())
        return [results[where[k]] for k in keys]

    def score_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[float]:
        results = self._run_distinct([(self.program(p, t), p.meta["tests"]) for p, t in zip(problems, episodes)])
        # an episode without a turn would run the bare header (a syntax error): 0 either way
        return [sandbox.code_reward(r) if t else 0.0 for r, t in zip(results, episodes)]

    # -- the visible tests (feedback) -----------------------------------------------------

    def _make(self, problem: Problem):
        """(k, the family's make) of a problem, read back from its prompt (k is not in its meta)."""
        _, _, make = _FAMILIES[problem.meta["family"]]
        comment = self._comment(problem)
        return next(k for k in range(2, 10) if make(k)[0] == comment), make

    def visible_tests(self, problem: Problem) -> dict:
        """The visible tests of a problem: `visible` cases from a generator seeded by the problem."""
        arg, gen, _ = _FAMILIES[problem.meta["family"]]
        k, make = self._make(problem)
        ref = make(k)[2]
        rng = random.Random(f"code-visible:{problem.prompt}:{problem.meta['tests']['cases']!r}")
        args = [gen(rng) for _ in range(self.visible)]
        return {"entry_point": "f", "cases": [{"args": [a], "expected": ref(a)} for a in args]}

    def _feedback_text(self, tests: dict, outputs: list | None, result=None) -> str:
        if result is not None and result.status not in ("ok", "failed"):
            return f"error: {result.reason or result.status}"[:_FEEDBACK_LINE] + "\n"
        lines = []
        for i, case in enumerate(tests["cases"]):
            call, want = f"f({_short(case['args'][0])})", case["expected"]
            if outputs is not None:
                got, error = outputs[i], None
                passed = got == want
            else:
                got, error, passed = result.cases[i].output, result.cases[i].error, result.cases[i].passed
            if passed:
                lines.append(f"pass {call} == {_short(want)}")
            elif error is not None and error != "wrong output":
                lines.append(f"fail {call}: {error}"[:_FEEDBACK_LINE])
            else:
                lines.append(f"fail {call} = {_short(got)}, expected {_short(want)}")
        return "".join(line + "\n" for line in lines)

    def _trusted_outputs(self, problem: Problem, body: str, tests: dict) -> list | None:
        """The outputs of a body we wrote ourselves (the reference, a demonstration's wrong one),
        computed in-process; None for anything else (it goes to the sandbox)."""
        if body == problem.answer:
            return [c["expected"] for c in tests["cases"]]
        fn = self._trusted.get((problem.meta["header"], body))
        return None if fn is None else [fn(c["args"][0]) for c in tests["cases"]]

    def answer_feedback(self, problem: Problem, turns: list[str]) -> str:
        return self.answer_feedback_batch([problem], [turns])[0]

    def answer_feedback_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[str]:
        """The output of the visible tests on each episode's body (the sandbox runs the rest in parallel)."""
        tests = [self.visible_tests(p) for p in problems]
        out: list = [None] * len(problems)
        run = []
        for i, (p, t) in enumerate(zip(problems, episodes)):
            outputs = self._trusted_outputs(p, t[-1] if t else "", tests[i])
            if outputs is not None:
                out[i] = self._feedback_text(tests[i], outputs)
            else:
                run.append(i)
        results = self._run_distinct([(self.program(problems[i], episodes[i]), tests[i]) for i in run])
        for i, result in zip(run, results):
            out[i] = self._feedback_text(tests[i], None, result)
        return ["Test results:\n" + text for text in out] if self.chat else out

    def demonstration(self, problem: Problem) -> list[str]:
        return [problem.answer]

    def wrong_turns(self, problem: Problem, rng: random.Random) -> list[str] | None:
        """A plausible wrong body: the family's with another k, or another family's on the same
        argument, that fails at least one hidden test (checked in-process: every body here is ours)."""
        family = problem.meta["family"]
        arg = _FAMILIES[family][0]
        k, make = self._make(problem)
        header, cases = problem.meta["header"], problem.meta["tests"]["cases"]
        candidates = [make(j) for j in range(2, 10) if make(j)[0] != make(k)[0]]
        candidates += [m(k) for f, (a, _, m) in _FAMILIES.items() if a == arg and f != family
                       and (f in _LONG) == (family in _LONG)]
        wrong = []
        for _, body, fn in candidates:
            try:
                if any(fn(c["args"][0]) != c["expected"] for c in cases):
                    wrong.append((_indent(body), fn))
            except Exception:  # noqa: BLE001 - a body that fails on these inputs is no near miss
                continue
        if not wrong:
            return None
        body, fn = rng.choice(wrong)
        self._trusted[(header, body)] = fn
        return [body]
