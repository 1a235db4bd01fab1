"""Run directories: resolved config, metrics.jsonl, TensorBoard events, atomic checkpoints."""

__all__ = ["RunDir", "MetricsLogger", "atomic_write_bytes"]


def __getattr__(name: str):
    # from rundir.py on first use: reading a run's JSON files (jsonfile.py, files.py), as checking a command
    # line does, needs none of it
    if name in __all__:
        from reflectrl.runs import rundir

        return getattr(rundir, name)
    raise AttributeError(f"module 'reflectrl.runs' has no attribute '{name}'")
