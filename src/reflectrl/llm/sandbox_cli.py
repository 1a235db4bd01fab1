"""Alias of `reflectrl.sandbox.cli` (`reflectrl sandbox run`), kept so that older imports
keep working: `reflectrl.cli` wires the command through `add_parser(sub)` and `run(args)`
from here. Importing it stays cheap: the sandbox itself is imported when a command runs.
"""

from __future__ import annotations

from reflectrl.sandbox.cli import add_parser, run  # noqa: F401

__all__ = ["add_parser", "run"]
