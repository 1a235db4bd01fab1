"""reflectrl: agentic RL in which the agent learns its own learning signal.

Layers (data flows one way): envs -> trainers (collect, estimate, update) -> signals
(fit, apply); runs hold config, logs and checkpoints; experiments and reports sit on top.
"""

# the built-in signals and trainers: each package's registration (its __init__: no torch or JAX), loaded as
# Gymnasium's own envs are, so that every look-up of the registry sees them
import reflectrl.signals  # noqa: F401
import reflectrl.trainers  # noqa: F401
from reflectrl._version import __version__
from reflectrl.errors import NonFiniteError, UserError

__all__ = ["UserError", "NonFiniteError", "__version__", "train", "load", "compare", "Run", "Policy", "StopTraining"]

# the Python API (api.py), imported on first use: `import reflectrl` (and every command) stays light
_API = ("train", "load", "compare", "Run", "Policy", "StopTraining")


def __getattr__(name: str):
    if name in _API:
        from reflectrl import api

        return getattr(api, name)
    raise AttributeError(f"module 'reflectrl' has no attribute '{name}'")


def __dir__():
    return sorted([*globals(), *_API])
