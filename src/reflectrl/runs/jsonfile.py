"""The one strict reader of the project's JSON files (no torch: the CLI's light paths use it)."""

from __future__ import annotations

import json
from pathlib import Path

from reflectrl.errors import UserError


def read_json_object(path: Path, consequence: str) -> dict:
    """Every strict reader of a project file (config.json, run.json, experiment.json, sweep.json):
    the JSON object in `path`, or one line saying what is wrong with it and `consequence`
    (what the user can do), never a traceback, whatever shape the file has."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError and bad UTF-8
        raise UserError(f"{path} is missing or corrupt ({type(err).__name__}); {consequence}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not the object it should; {consequence}")
    return data
