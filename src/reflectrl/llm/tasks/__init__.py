"""Verifiable, procedurally generated LLM tasks, built from a one-line spec.

    task = make_task("arith[max_operand=20;ops=+-*]")
    task = make_task("rg:basic_arithmetic[max_terms=2;operators=+,-]")

A spec is a task name, optionally followed by options in brackets: `name[k=v;k=v]`.
Values are converted to the type of the option's default (int, float, bool as
true/false, str; a list or tuple option takes comma-separated items); unknown keys are
an error. The tasks:

    arith     exact-match arithmetic, "12+7=" -> "19"            (tasks/arith.py)
    rg:NAME   any reasoning-gym dataset, scored by its own verifier (tasks/reasoning_gym.py)
    code      write a small Python function body, scored by unit tests in the sandbox (tasks/code.py)
    tools     multi-turn: look a value up and calculate with tools, then answer (tasks/tools.py)
    rag       multi-turn: search a generated corpus (BM25), hop by hop, then answer (tasks/rag.py)

Long completions (32+ tokens, for per-token credit): `tools[calls=4..12]` (a chain of
lookups and calculations), `rg:chain_sum[...;worked=true]` and `rg:basic_arithmetic[...;worked=true]`
(the running computation, then `answer N`), `code[families=long]` (3-6 line function bodies).
Every task gives `reference(problem, kind)`: the ground truth a teacher reads (tasks/base.py).

Every task also takes `reflect=none|verdict|confidence|both`, `reflect_negatives=0.5` and
`reflect_after=auto|feedback|answer`: the agent then states a verdict and/or confidence on its
answer, after the environment's feedback (code: the visible tests' output, then a reflection
turn; tools, rag: after the last tool output) or in the answer's own turn (tasks/reflect.py;
auto: feedback where the task has feedback, else answer).

Every bad spec raises `UserError` with one line saying what is wrong and how to fix it.
"""

from __future__ import annotations

import difflib
import inspect
import re

from reflectrl.errors import UserError
from reflectrl.llm.tasks.arith import ArithTask
from reflectrl.llm.tasks.base import Problem, Task
from reflectrl.llm.tasks.code import CodeTask
from reflectrl.llm.tasks.rag import RagTask
from reflectrl.llm.tasks.reflect import check_mode, wrap
from reflectrl.llm.tasks.tools import ToolsTask
from reflectrl.overrides import parse_value

__all__ = ["TASK_NAMES", "Problem", "Task", "make_task", "parse_spec"]

_BUILTIN = {"arith": ArithTask, "code": CodeTask, "tools": ToolsTask, "rag": RagTask}
TASK_NAMES = ("arith", "rg:NAME", "code", "tools", "rag")

_SPEC = re.compile(r"^\s*([A-Za-z_][\w:.-]*)\s*(?:\[(.*)\])?\s*$", re.DOTALL)
_NAMES_HINT = "valid tasks: arith, code, tools, rag, rg:NAME (NAME: a reasoning-gym dataset, e.g. rg:basic_arithmetic)"


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`name[k=v;k=v]` -> (name, {k: raw string v}). Types are applied later, per task."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(f"empty task spec; {_NAMES_HINT}")
    m = _SPEC.match(spec)
    if m is None:
        raise UserError(f"cannot parse task spec {spec!r}; write NAME or NAME[key=value;key=value], "
                        "e.g. arith[max_operand=20;ops=+-]")
    name, body = m.group(1), m.group(2)
    options: dict[str, str] = {}
    for item in (body or "").split(";"):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key.isidentifier():
            raise UserError(f"task spec {spec!r}: option {item.strip()!r} is not key=value "
                            "(separate options with ';', e.g. arith[max_operand=20;ops=+-])")
        if key in options:
            raise UserError(f"task spec {spec!r}: option {key!r} is given twice")
        options[key] = value.strip()
    return name, options


def coerce(raw: str, default, key: str, where: str):
    """Convert the raw text of option `key` to the type of its default (reflectrl/overrides.py)."""
    try:
        if isinstance(default, bool) and raw.strip().lower() not in ("true", "false", "1", "0"):
            raise ValueError("true or false")
        return parse_value(key, raw.strip() if not isinstance(default, str) else raw, default, annotation=False)
    except ValueError as err:
        raise UserError(f"{where}: option {key}={raw!r} must be {err} (default: {default!r})") from None


def coerce_all(raw: dict[str, str], defaults: dict, where: str) -> dict:
    unknown = sorted(set(raw) - set(defaults))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(defaults), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"{where}: unknown option {unknown[0]!r}{hint}; valid options: "
                        f"{', '.join(sorted(defaults)) or 'none'}")
    return {k: coerce(v, defaults[k], k, where) for k, v in raw.items()}


REFLECT_OPTIONS = {"reflect": "none", "reflect_negatives": 0.5, "reflect_after": "auto"}


def make_task(spec: str) -> Task:
    """Build a task from its spec, e.g. "arith", "tools[keys=8]", "rg:chain_sum[max_terms=2]",
    "arith[reflect=both]"."""
    name, raw = parse_spec(spec)
    reflect_raw = {k: raw.pop(k) for k in list(raw) if k in REFLECT_OPTIONS}
    reflect = coerce_all(reflect_raw, REFLECT_OPTIONS, f"task {name}")
    mode = check_mode(reflect.get("reflect", "none"), f"task {name}")
    cls = _BUILTIN.get(name)
    if cls is not None and getattr(cls, "native_reflect", False):  # the task places its own reflections (rag)
        return _build(cls, name, raw, **reflect)
    return wrap(_make_plain(name, raw), mode, reflect.get("reflect_negatives", REFLECT_OPTIONS["reflect_negatives"]),
                reflect.get("reflect_after", REFLECT_OPTIONS["reflect_after"]))


def _build(cls, name: str, raw: dict, **fixed) -> Task:
    params = inspect.signature(cls.__init__).parameters
    defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty
                and k not in fixed}
    return cls(**coerce_all(raw, defaults, f"task {name}"), **fixed)


def _make_plain(name: str, raw: dict) -> Task:
    if name.startswith("rg:") or name == "rg":
        dataset = name[3:]
        if not dataset:
            raise UserError("rg needs a reasoning-gym dataset name, e.g. rg:basic_arithmetic")
        # imported only here: importing reasoning_gym takes over a second
        from reflectrl.llm.tasks.reasoning_gym import ReasoningGymTask, dataset_options

        defaults = dataset_options(dataset)
        return ReasoningGymTask(dataset, **coerce_all(raw, defaults, f"task rg:{dataset}"))
    cls = _BUILTIN.get(name)
    if cls is None:
        raise UserError(f"unknown task {name!r}{_suggest(name)}; {_NAMES_HINT}")
    return _build(cls, name, raw)


def _suggest(name: str) -> str:
    close = difflib.get_close_matches(name, list(_BUILTIN), n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    try:  # a reasoning-gym dataset written without its prefix
        from reflectrl.llm.tasks.reasoning_gym import dataset_names
        names = dataset_names()
    except UserError:  # reasoning-gym is not installed
        return ""
    if name in names:
        return f" (did you mean 'rg:{name}'?)"
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean 'rg:{close[0]}'?)" if close else ""
