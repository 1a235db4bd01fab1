"""The test-suite model: the tests format, its validation (`load_tests`) and `TestSuite`.

    {"entry_point": "solve", "cases": [{"args": [...], "kwargs": {...}?, "expected": ...}, ...]}

`load_tests` checks this once and normalises every value to plain JSON data (what a
JSON round trip gives: tuples become lists, int dict keys strings; NaN and Infinity are
rejected), so the comparison in `reflectrl.sandbox.verdict` works on the same kind of data
the child's outputs decode to. A `TestSuite` keeps the arguments (the only part sent into
the sandbox) apart from the expected values (which never leave the parent). Bad tests
raise `InvalidTests`, a `UserError`: the CLI shows it as one line and exits with code 2.
Nothing here runs code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from reflectrl.errors import UserError

__all__ = ["InvalidTests", "TestSuite", "load_tests"]


class InvalidTests(UserError, ValueError):
    """The tests are not of the form {"entry_point": str, "cases": [{"args": [...], "expected": ...}]}."""


@dataclass(frozen=True)
class TestSuite:
    __test__ = False  # not a pytest class

    entry_point: str
    args: tuple          # per case: list of positional args (plain JSON data)
    kwargs: tuple        # per case: dict of keyword args
    expected: tuple      # per case: plain JSON data

    def __len__(self) -> int:
        return len(self.expected)


def _plain(value, what: str):
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as err:
        raise InvalidTests(f"{what} is not plain JSON data ({err})") from None


def load_tests(tests: Mapping | TestSuite, *, source: str = "tests") -> TestSuite:
    """Validate `{"entry_point": "solve", "cases": [{"args": [...], "kwargs": {...}?, "expected": ...}]}`.

    Raises InvalidTests (a UserError: the CLI shows it as one line) naming what is wrong.
    """
    if isinstance(tests, TestSuite):
        return tests
    if not isinstance(tests, Mapping):
        raise InvalidTests(f"{source} must be a JSON object with 'entry_point' and 'cases', got {type(tests).__name__}")
    if "entry_point" not in tests:
        raise InvalidTests(f"{source} has no 'entry_point' (the name of the function to call, e.g. \"solve\")")
    entry = tests["entry_point"]
    if not isinstance(entry, str) or not entry.isidentifier():
        raise InvalidTests(f"{source}: 'entry_point' must be a Python identifier, got {entry!r}")
    if "cases" not in tests:
        raise InvalidTests(f"{source} has no 'cases' (a list of {{\"args\": [...], \"expected\": ...}})")
    cases = tests["cases"]
    if not isinstance(cases, (list, tuple)):
        raise InvalidTests(f"{source}: 'cases' must be a list, got {type(cases).__name__}")
    args, kwargs, expected = [], [], []
    for i, case in enumerate(cases):
        where = f"{source}: case {i}"
        if not isinstance(case, Mapping):
            raise InvalidTests(f"{where} must be an object with 'args' and 'expected'")
        unknown = set(case) - {"args", "kwargs", "expected"}
        if unknown:
            raise InvalidTests(f"{where} has unknown key(s) {sorted(unknown)}; allowed: args, kwargs, expected")
        if "expected" not in case:
            raise InvalidTests(f"{where} has no 'expected'")
        a = case.get("args", [])
        if not isinstance(a, (list, tuple)):
            raise InvalidTests(f"{where}: 'args' must be a list, got {type(a).__name__}")
        k = case.get("kwargs", {})
        if not isinstance(k, Mapping) or not all(isinstance(key, str) and key.isidentifier() for key in k):
            raise InvalidTests(f"{where}: 'kwargs' must be an object whose keys are identifiers")
        args.append(_plain(list(a), f"{where} args"))
        kwargs.append(_plain(dict(k), f"{where} kwargs"))
        expected.append(_plain(case["expected"], f"{where} expected"))
    return TestSuite(entry, tuple(args), tuple(kwargs), tuple(expected))
