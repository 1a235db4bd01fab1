"""The project's JSON files, written strict and read back (no torch: the CLI's light paths use it).

JSON has no infinity or NaN (Python's `json` writes the bare words Infinity and NaN, which other
readers refuse: JavaScript's JSON.parse, jq). A run keeps such floats (calibration.max_ratio=inf, a
metric that is NaN), so `dumps` writes them as the strings "Infinity", "-Infinity" and "NaN" (what
JavaScript's Number() and Python's float() read), and `from_strict` turns exactly those strings back
into the floats: `loads(dumps(x)) == x`. Files written before this, with the bare words, still load.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from reflectrl.errors import UserError

NON_FINITE = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def to_strict(value: Any) -> Any:
    """`value` with every non-finite float (numpy's and 0-d tensors' too) as its string in NON_FINITE."""
    if isinstance(value, float) or (hasattr(value, "item") and getattr(value, "shape", None) == ()):
        number = value if isinstance(value, float) else value.item()
        if isinstance(number, float) and not math.isfinite(number):
            return "NaN" if math.isnan(number) else ("Infinity" if number > 0 else "-Infinity")
        return number
    if isinstance(value, dict):
        return {k: to_strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_strict(v) for v in value]
    return value


def from_strict(value: Any) -> Any:
    """The inverse of to_strict: the strings "Infinity", "-Infinity" and "NaN" back to floats."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: from_strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_strict(v) for v in value]
    return value


def dumps(value: Any, **kwargs) -> str:
    """Strict JSON text of `value` (json.dumps' keywords): non-finite floats as to_strict writes them."""
    return json.dumps(to_strict(value), allow_nan=False, **kwargs)


def loads(text: str | bytes) -> Any:
    """What `dumps` wrote (or a file from before it, with bare Infinity / NaN), non-finite floats restored."""
    return from_strict(json.loads(text))


def read_json_object(path: Path, consequence: str) -> dict:
    """Every strict reader of a project file (config.json, run.json, experiment.json, sweep.json):
    the JSON object in `path`, or one line saying what is wrong with it and `consequence`
    (what the user can do), never a traceback, whatever shape the file has."""
    try:
        with open(path) as f:
            data = from_strict(json.load(f))
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError and bad UTF-8
        raise UserError(f"{path} is missing or corrupt ({type(err).__name__}); {consequence}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not the object it should; {consequence}")
    return data
