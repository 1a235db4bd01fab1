"""Generalised advantage estimation, re-exported from reflectrl.estimators.

The recursion lives in reflectrl/estimators.py, shared with GEAR's returns-to-go; this
module keeps `reflectrl.control.gae.compute_gae` importable where trainers expect it.
"""

from reflectrl.estimators import compute_gae

__all__ = ["compute_gae"]
