"""Each signal's registry entry (SignalSpec), its knobs (the config dataclass) and their checks,
one module per signal beside its Signal (signals/NAME.py, which imports its knobs from here).

Nothing here imports torch, JAX or an env package: reading a command line (`--algo`, `--set`)
and refusing a bad one needs only these, so a refusal answers in about the time of `--help`
(bench/refusal_time.py); a signal's Signal is imported when a run builds it (SignalSpec.factory
names it as "module:attribute").

A knob dataclass is decorated with config.checked_once: its validate() runs once per value set.
"""
