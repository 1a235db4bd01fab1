"""Multi-seed experiments: every (env, algo entry, seed) is an ordinary run directory."""

from reflectrl.experiments.runner import run_experiment
from reflectrl.experiments.spec import AlgoEntry, ExperimentSpec, RunSpec, parse_algos

__all__ = ["AlgoEntry", "ExperimentSpec", "RunSpec", "parse_algos", "run_experiment"]
