"""One way to read `KEY=VALUE` overrides, for every config: `--set` of `train` and `llm train`,
`compare`'s entries (which become `--set` items), and task options (`arith[max_operand=9]`).

- `parse_value(key, raw, like)` reads the text as the type a field is annotated with (or,
  given a default value instead of an annotation, as that value's type);
- `apply(items, bare=..., prefixed=...)` routes each item: a bare key to the first table
  of `bare` that has it, `PREFIX.NAME` to the table registered under PREFIX (a dataclass,
  or a dict that takes any name), and says what each set;
- `apply_after_algo(...)`: an --algo's bracket knobs (`ppo+calibration[alpha=0.1]`, read by
  config.split_algo), then --set; a knob given both ways with different values is refused;
- a dataclass may rename a knob by listing `RENAMED = {"old": "new"}` as a class attribute:
  the old name keeps working, with a deprecation warning, in `--set` and in saved configs.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any

from reflectrl.errors import UserError

KINDS = {bool: "true or false", int: "an integer", float: "a number"}
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def _auto(text: str):
    """A value whose type nothing says: int, float, bool or the string itself."""
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without Optional, whether None is allowed)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return (non_none[0] if len(non_none) == 1 else str), type(None) in args
    return annotation, False


def parse_value(key: str, raw: str, like: Any, *, annotation: bool = True) -> Any:
    """Read `raw` as the type `like` (an annotation, or with annotation=False a default value).
    Raises ValueError whose text says what was expected."""
    text = raw.strip()
    if annotation:
        base, optional = _base_type(like)
    else:
        base, optional = (None if like is None else type(like)), like is None
    if optional and text.lower() in ("none", "null"):
        return None
    if base is None:
        return _auto(text)
    if base is bool:
        low = text.lower()
        if low in TRUE or low in FALSE:
            return low in TRUE
        raise ValueError(KINDS[bool])
    if base is int:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(KINDS[int]) from None
        if not value.is_integer():
            raise ValueError(KINDS[int])
        return int(value)
    if base is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(KINDS[float]) from None
    if base is tuple or typing.get_origin(base) is tuple or base is list:
        items = [x.strip() for x in text.replace("(", "").replace(")", "").split(",") if x.strip()]
        item_type = (typing.get_args(base) or (None,))[0] if annotation else None
        if item_type is int:
            try:
                return tuple(int(x) for x in items)
            except ValueError:
                raise ValueError("a comma-separated list of integers") from None
        values = [_auto(x) for x in items]
        return values if base is list else tuple(values)
    return text


def value_text(value: Any) -> str:
    """A Python value as the text of a KEY=VALUE item, which parse_value reads back into it: booleans as
    true/false, None as none, a list or tuple comma-separated (the Python API's keyword knobs)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return ",".join(value_text(v) for v in value)
    return str(value)


def parse_free(raw: str) -> Any:
    """A free-form value (an env's constructor keyword): a JSON literal, else true/false (none:
    None, as the typed knobs read it), else the text."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        low = raw.lower()
        return {"true": True, "false": False, "none": None}.get(low, raw)


def split(item: str, example: str = "num_envs=8") -> tuple[str, str]:
    if "=" not in item:
        raise UserError(f"--set '{item}' is not key=value (example: --set {example})")
    key, raw = item.split("=", 1)
    return key.strip(), raw


def field_name(obj_or_cls, name: str, warn: bool = True) -> str:
    """The current name of a knob: a renamed one maps to its new name (with a warning)."""
    renamed = getattr(obj_or_cls, "RENAMED", {})
    if name in renamed:
        if warn:
            warnings.warn(f"knob '{name}' is now '{renamed[name]}'; the old name is deprecated", FutureWarning,
                          stacklevel=3)
        return renamed[name]
    return name


def set_field(obj: Any, key: str, name: str, raw: str, where: str) -> str:
    """Set dataclass field `name` of `obj` from text, one line naming what is wrong otherwise; returns
    the field's (current) name."""
    name = field_name(obj, name)
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else f"; known: {', '.join(names)}"
        raise UserError(f"unknown --set key '{key}' for {where}{hint}")
    try:
        setattr(obj, name, parse_value(key, raw, hints[name]))
    except ValueError as err:
        raise UserError(f"--set {key}={raw}: expected {err}") from None
    return name


def apply(items: list[str], *, bare: list[tuple[str, Any, tuple[str, ...] | None]],
          prefixed: dict[str, Any | Callable[[], Any]], example: str = "num_envs=8") -> list[tuple[Any, str]]:
    """Route `KEY=VALUE` items, in order; returns what each set: (its dataclass or dict, the field or key).

    bare: (what, dataclass, names or None for all its fields), searched in order for a bare key;
    prefixed: PREFIX -> a dataclass, a dict (free-form values), or a callable making the dataclass."""
    touched = []
    for item in items:
        key, raw = split(item, example)
        if "." in key:
            prefix, name = key.split(".", 1)
            if prefix not in prefixed:
                raise UserError(f"unknown --set section '{prefix}' in '{key}'; known sections: {', '.join(prefixed)}")
            target = prefixed[prefix]
            if callable(target) and not dataclasses.is_dataclass(target):
                target = target()
            if isinstance(target, dict):
                target[name] = parse_free(raw)
                touched.append((target, name))
            else:
                touched.append((target, set_field(target, key, name, raw, f"section '{prefix}'")))
            continue
        for what, obj, names in bare:
            fields = [f.name for f in dataclasses.fields(obj)] if names is None else list(names)
            if field_name(obj, key, warn=False) in fields:
                touched.append((obj, set_field(obj, key, key, raw, what)))
                break
        else:
            known = [n for _, obj, names in bare for n in ([f.name for f in dataclasses.fields(obj)]
                                                           if names is None else names)]
            close = difflib.get_close_matches(key, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            tables = "; ".join(f"{what} knobs: " + ", ".join([f.name for f in dataclasses.fields(obj)]
                                                              if names is None else names)
                               for what, obj, names in bare)
            raise UserError(f"unknown --set key '{key}'{hint}; {tables} (all knobs: 'reflectrl knobs')")
    return touched


def apply_after_algo(apply_items: Callable[[list[str]], list[tuple[Any, str]]], from_algo: list[str],
                     sets: list[str], algo: str) -> None:
    """Apply the knobs an --algo gives in brackets (`ppo+calibration[alpha=0.1]`), then --set's. A knob
    both give with different values is refused: which one was meant is not clear (the same value twice
    is no conflict). `apply_items(items)` applies items and returns what each set (as `apply` does)."""
    by_algo = {(id(obj), name): (item, _value(obj, name)) for (obj, name), item in zip(apply_items(from_algo),
                                                                                       from_algo)}
    for (obj, name), item in zip(apply_items(sets), sets):
        earlier = by_algo.get((id(obj), name))
        if earlier is not None and _value(obj, name) != earlier[1]:
            raise UserError(f"--algo {algo} gives {earlier[0]} and --set {item} another value of the same knob; "
                            "give it in one place")


def _value(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name)


def from_dict(cls, values: dict, what: str = "config"):
    """A dataclass from a saved config's dict: lists back to tuples, renamed knobs mapped."""
    if not isinstance(values, dict):
        raise UserError(f"{what}'s {cls.__name__} is a JSON {type(values).__name__}, not an object; "
                        "was it written by reflectrl?")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        key = field_name(cls, key, warn=False)
        if key not in names:
            raise UserError(f"{what} has unknown {cls.__name__} keys ['{key}']; was it written by a newer reflectrl?")
        if isinstance(value, list) and "tuple" in str(hints[key]):
            value = tuple(value)
        kwargs[key] = value
    return cls(**kwargs)
