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

    families  comma-separated subset of the families above (default: all)
    cases     unit tests per problem (default 5)
    timeout   wall-clock seconds per sandbox run (default 5.0)
    isolation "bwrap" (default) or "rlimits-only": the weaker sandbox for machines
              without bubblewrap (see reflectrl.sandbox); only for code you would run anyway

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
FAMILIES = tuple(_FAMILIES)
_INDENT = " " * 4


class CodeTask(Task):
    name = "code"
    max_turns = 1
    max_new_tokens = 32  # the longest reference body, "    return s.count('a')", is 23 bytes

    def __init__(self, families: str = ",".join(FAMILIES), cases: int = 5, timeout: float = 5.0,
                 isolation: str = "bwrap"):
        chosen = [f.strip() for f in families.split(",") if f.strip()]
        bad = [f for f in chosen if f not in _FAMILIES]
        if bad or not chosen:
            raise UserError(f"task code: unknown family {bad[0] if bad else families!r}; "
                            f"families is a comma-separated subset of {', '.join(FAMILIES)}")
        if not 1 <= cases <= 100:
            raise UserError(f"task code: cases must be in 1..100, got {cases}")
        if not timeout > 0:
            raise UserError(f"task code: timeout must be > 0 seconds, got {timeout}")
        if isolation not in sandbox.ISOLATION_MODES:
            raise UserError(f"task code: isolation must be one of {', '.join(sandbox.ISOLATION_MODES)}, "
                            f"got {isolation!r}")
        self.families = tuple(f for f in FAMILIES if f in chosen)  # canonical order
        self.cases, self.timeout, self.isolation = cases, timeout, isolation

    def sample(self, rng: random.Random) -> Problem:
        family = rng.choice(self.families)
        arg, gen, make = _FAMILIES[family]
        k = rng.randint(2, 9)
        comment, body, ref = make(k)
        args = [gen(rng) for _ in range(self.cases)]
        tests = {"entry_point": "f", "cases": [{"args": [a], "expected": ref(a)} for a in args]}
        header = f"def f({arg}):\n"
        return Problem(prompt=f"# {comment}\n{header}", answer=_INDENT + body,
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
