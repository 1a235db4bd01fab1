"""Import a script of examples/experiments as a module (they import each other by file name)."""

import importlib.util
import sys
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parent.parent / "examples" / "experiments"


def experiment_module(name):
    spec = importlib.util.spec_from_file_location(name, EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXPERIMENTS))
    return module
