"""`reflectrl knobs`: every knob `--set` takes, with its default and one line of meaning,
read from the config dataclasses themselves (each field's default, and the attribute
docstring under it), so the listing cannot drift from what the code does.

    reflectrl knobs                     every section
    reflectrl knobs calibration         one section
    reflectrl knobs --algo refgrpo      what `reflectrl train --algo refgrpo` reads
    reflectrl knobs --algo llm:gear     what `reflectrl llm train --algo gear` reads
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import math
import sys
import textwrap

from reflectrl.errors import UserError


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: the string literal written under it in the class body}, a subclass's over its bases'
    (a trainer's knobs on onpolicy.OnPolicyConfig)."""
    docs = {}
    for klass in reversed(cls.__mro__):
        if klass is not object and dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # no source (a frozen build): the names and defaults still list
        return {}
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _show(value) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if value == "":
        return '""'
    return str(value)


def _rows(cls: type, prefix: str, only: tuple[str, ...] | None = None) -> list[dict]:
    docs = field_docs(cls)
    per_env = cls.env_defaults() if hasattr(cls, "env_defaults") else {}
    labels = getattr(cls, "ENV_DEFAULTS", ())
    rows = []
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        shown = _show(_default(f))
        if f.name in per_env:  # a default that depends on the env: each, as the trainer's config names them
            shown = ", ".join(f"{label} {_show(v)}".strip() for label, v in zip(labels, per_env[f.name]))
        rows.append({"key": prefix + f.name, "default": shown, "help": docs.get(f.name, "")})
    return rows


def _trainers(family: str):
    from reflectrl.registry import TRAINERS

    return [t for t in TRAINERS.values() if t.family == family]


def section_names() -> list[str]:
    """The sections `sections()` lists, in its order, without building their tables (the CLI's help)."""
    from reflectrl.registry import signals

    return ["run", *(t.name for t in _trainers("control")), "env", *signals(), *(t.name for t in _trainers("llm"))]


def sections() -> dict[str, dict]:
    """{section: {"rows": [...], "for": what reads it}} in the order they are listed."""
    from reflectrl.config import RUN_KNOBS, SECTION_TYPES, RunConfig
    from reflectrl.registry import DEFAULT_TRAINER

    out = {"run": {"rows": _rows(RunConfig, "", RUN_KNOBS), "for": "reflectrl train"}}
    for t in _trainers("control"):
        algo = "" if t.name == DEFAULT_TRAINER["control"] else f" --algo {t.name}"
        out[t.name] = {"rows": _rows(t.config_class(), ""),
                       "for": f"reflectrl train{algo}: bare names, or {t.name}.NAME"}
    out["env"] = {"rows": [{"key": "env.NAME", "default": "", "help": "a keyword for the env's constructor "
                            "(e.g. env.size=12 for reflectrl/GridWorld-v0, env.max_episode_steps=500)"}],
                  "for": "reflectrl train"}
    for name, cls in SECTION_TYPES.items():
        out[name] = {"rows": _rows(cls, f"{name}."), "for": f"any --algo with the {name} signal: {name}.KNOB"}
    for t in _trainers("llm"):  # the LLM run's knobs join its trainer's: `llm train` takes both bare
        module = sys.modules[t.config_class().__module__]  # its run config sits beside its knobs
        out[t.name] = {"rows": _rows(t.config_class(), "") + _rows(module.LLMRunConfig, "", module.RUN_KNOBS),
                       "for": "reflectrl llm train: bare names"}
    return out


def sections_for_algo(algo: str) -> list[str]:
    """The knob sections an --algo reads: any TRAINER[+SIGNAL...] or alias (`llm:` for llm train), knobs in
    brackets allowed (config.split_algo)."""
    from reflectrl.config import split_algo
    from reflectrl.registry import parse_algo

    llm = algo.startswith("llm:")
    family = "llm" if llm else "control"
    parsed = parse_algo(split_algo(algo.removeprefix("llm:"), family)[0], family)
    if llm:
        return [parsed.trainer, *parsed.signals]
    return ["run", parsed.trainer, "env", *parsed.signals]


def print_knobs(section: str | None = None, algo: str | None = None, as_json: bool = False) -> int:
    table = sections()
    names = list(table)
    if algo is not None:
        names = sections_for_algo(algo)
    if section is not None:
        if section not in table:
            raise UserError(f"unknown section '{section}'; sections: {', '.join(table)}")
        if section not in names:
            raise UserError(f"--algo {algo} does not read the '{section}' knobs; it reads: {', '.join(names)}")
        names = [section]
    if as_json:
        print(json.dumps({n: table[n]["rows"] for n in names}, indent=2))
        return 0
    for n in names:
        rows = table[n]["rows"]
        print(f"[{n}]  {table[n]['for']}")
        kw = max(len(r["key"]) for r in rows)
        dw = min(max(len(r["default"]) for r in rows), 34)
        for r in rows:
            print(f"  {r['key']:<{kw}}  {r['default']:<{dw}}  {r['help']}".rstrip())
        print()
    print("set any of these with --set KEY=VALUE (signal knobs as SECTION.KEY=VALUE)")
    return 0


def markdown_table(section: str) -> str:
    """The docs' table of a section's knobs (tests/test_readme.py keeps docs/ in step)."""
    rows = sections()[section]["rows"]
    from reflectrl.registry import TRAINERS

    bare = ("run", "env", *TRAINERS)
    prefix = f"{section}." if section not in bare else ""
    lines = ["| knob | default | meaning |", "|---|---|---|"]
    for r in rows:
        key = r["key"][len(prefix):] if prefix and r["key"].startswith(prefix) else r["key"]
        lines.append(f"| `{key}` | {r['default'] or ''} | {r['help']} |")
    return "\n".join(lines)


def algos_table() -> str:
    """The docs' table of --algo names, read from the registry."""
    from reflectrl.registry import TRAINERS, aliases, signals

    lines = ["| `--algo` | command | what it runs |", "|---|---|---|"]
    for trainer in TRAINERS.values():
        command = "reflectrl train" if trainer.family == "control" else "reflectrl llm train"
        lines.append(f"| `{trainer.name}` | {command} | {trainer.summary} |")
    for name, spec in signals().items():
        names = [f"`{t}+{name}`" for t in TRAINERS
                 if TRAINERS[t].runs_signals and any(k in TRAINERS[t].step_kinds for k in spec.step_kinds)
                 and (callable(spec.wants) or spec.wants <= TRAINERS[t].provides)]
        legacy = sorted({a for fam in ("control", "llm") for a, comp in aliases(fam).items()
                         if comp.split("+")[1:] == [name]})
        alias = f" (alias: {', '.join(f'`{a}`' for a in legacy)})" if legacy else ""
        lines.append(f"| {' / '.join(names)}{alias} | | {spec.summary}; neutral at `{name}.{spec.neutral}` |")
    return "\n".join(lines)


BLOCK = "<!-- generated: {name} -->"
END = "<!-- end generated -->"


def readme_blocks() -> dict[str, str]:
    """{block name: its generated text}: the algos table and each signal's knob table."""
    from reflectrl.registry import signals

    blocks = {"algos": algos_table()}
    for name in signals():
        blocks[f"knobs:{name}"] = markdown_table(name)
    return blocks


def update_readme(path) -> list[str]:
    """Rewrite the generated blocks of a Markdown page in place; returns the names of blocks that changed."""
    from pathlib import Path

    path = Path(path)
    text = path.read_text()
    changed = []
    for name, body in readme_blocks().items():
        start = BLOCK.format(name=name)
        if start not in text:
            continue
        head, rest = text.split(start, 1)
        old, tail = rest.split(END, 1)
        new = f"\n{body}\n"
        if old != new:
            changed.append(name)
        text = head + start + new + END + tail
    path.write_text(text)
    return changed


# the pages that hold generated tables: `python -m reflectrl.knobs` refreshes them all (or the pages named)
DOC_PAGES = ("docs/signals.md", "docs/llm-usage.md")

if __name__ == "__main__":  # python -m reflectrl.knobs [PAGE.md ...]: refresh the generated tables
    import sys

    for page in sys.argv[1:] or DOC_PAGES:
        print(f"{page}: {', '.join(update_readme(page)) or 'up to date'}")
