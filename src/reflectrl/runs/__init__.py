"""Run directories: resolved config, metrics.jsonl, TensorBoard events, atomic checkpoints."""

from reflectrl.runs.rundir import MetricsLogger, RunDir, atomic_write_bytes

__all__ = ["RunDir", "MetricsLogger", "atomic_write_bytes"]
