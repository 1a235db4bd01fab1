"""reflectrl: agentic RL in which the agent learns its own learning signal.

Layers (data flows one way): envs -> trainers (collect, estimate, update) -> signals
(fit, apply); runs hold config, logs and checkpoints; experiments and reports sit on top.
"""

__version__ = "0.1.0"

from reflectrl.errors import NonFiniteError, UserError  # noqa: E402

__all__ = ["UserError", "NonFiniteError", "__version__"]
