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

The long families have 3-6 line bodies with a loop and/or a conditional, for tasks where
per-token credit can matter (the demonstration's lines are joined by "\\n", each indented
4 spaces and nested blocks 8): sum_pos, count_gt (k), running_max, first_neg, clip (k)
(list of ints xs); reverse_words (str s of words), remove_vowels (str s). E.g.

    prompt  "# index of the first negative item of xs, or -1\\ndef f(xs):\\n"
    demonstration ["    i = 0\\n    while i < len(xs):\\n        if xs[i] < 0:\\n            return i\\n"
                   "        i = i + 1\\n    return -1"]

Use cases >= 5 with them (the default) so that the tests tell a loop from a shortcut.

The code runs in `reflectrl.sandbox`; `score_batch` runs a batch in parallel (one
process per core). Without bubblewrap, scoring raises `SandboxUnavailable` (a UserError).
"""

from __future__ import annotations

import random

from reflectrl import sandbox
from reflectrl.errors import UserError
from reflectrl.llm.tasks.base import Problem, Task


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


class CodeTask(Task):
    name = "code"
    max_turns = 1
    max_new_tokens = 32  # the longest reference body, "    return s.count('a')", is 23 bytes

    def __init__(self, families: str = ",".join(FAMILIES), cases: int = 5, timeout: float = 5.0,
                 isolation: str = "bwrap"):
        chosen = [g for f in families.split(",") if f.strip() for g in _GROUPS.get(f.strip(), (f.strip(),))]
        bad = [f for f in chosen if f not in _FAMILIES]
        if bad or not chosen:
            raise UserError(f"task code: unknown family {bad[0] if bad else families!r}; "
                            f"families is a comma-separated subset of {', '.join(FAMILIES)} (short), "
                            f"{', '.join(LONG_FAMILIES)} (long), or the groups short, long")
        if not 1 <= cases <= 100:
            raise UserError(f"task code: cases must be in 1..100, got {cases}")
        if not timeout > 0:
            raise UserError(f"task code: timeout must be > 0 seconds, got {timeout}")
        if isolation not in sandbox.ISOLATION_MODES:
            raise UserError(f"task code: isolation must be one of {', '.join(sandbox.ISOLATION_MODES)}, "
                            f"got {isolation!r}")
        self.families = tuple(f for f in _FAMILIES if f in chosen)  # canonical order
        self.cases, self.timeout, self.isolation = cases, timeout, isolation
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

    def program(self, problem: Problem, turns: list[str]) -> str:
        """The code that is run: the function header plus the agent's body."""
        return problem.meta["header"] + (turns[-1] if turns else "")

    def _run_kwargs(self) -> dict:
        return {"timeout": self.timeout, "isolation": self.isolation}

    def score(self, problem: Problem, turns: list[str]) -> float:
        if not turns:
            return 0.0
        result = sandbox.run_code(self.program(problem, turns), problem.meta["tests"], **self._run_kwargs())
        return sandbox.code_reward(result)

    def score_batch(self, problems: list[Problem], episodes: list[list[str]]) -> list[float]:
        results = sandbox.run_batch([(self.program(p, t), p.meta["tests"]) for p, t in zip(problems, episodes)],
                                    **self._run_kwargs())
        # an episode without a turn would run the bare header (a syntax error): 0 either way
        return [sandbox.code_reward(r) if t else 0.0 for r, t in zip(results, episodes)]

    def demonstration(self, problem: Problem) -> list[str]:
        return [problem.answer]

