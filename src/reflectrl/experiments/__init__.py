"""Multi-seed experiments: every (env, algo entry, seed) is an ordinary run directory.

The names below load on first use, so that `reflectrl --help` (which reads the presets) does
not import the runner and what it needs."""

__all__ = ["AlgoEntry", "ExperimentSpec", "RunSpec", "parse_algos", "run_experiment"]


def __getattr__(name: str):
    if name == "run_experiment":
        from reflectrl.experiments.runner import run_experiment

        return run_experiment
    if name in ("AlgoEntry", "ExperimentSpec", "RunSpec", "parse_algos"):
        from reflectrl.experiments import spec

        return getattr(spec, name)
    raise AttributeError(name)
