"""Optimizers without `torch._dynamo`: 2.5 s of a run's start-up, for a compiler nothing here uses.

Every `torch.optim` optimizer imports `torch._dynamo` (and with it most of the compiler stack)
the first time it adds a parameter group or takes a step: `add_param_group`, `state_dict`,
`load_state_dict` and `zero_grad` are wrapped by `torch._disable_dynamo`, which imports it to
mark them as not compilable, and `Adam.step`/`AdamW.step` by `_use_grad_for_differentiable`,
which imports it for a `graph_break()` that only matters while compiling. On this 2-core
machine the import costs 2.5 s of every `reflectrl train` process (a third of a 65k-step
CartPole run's start-up), against 11 ms for the optimizer work itself.

`optimizers_without_dynamo()` removes those imports, and nothing else: the wrapped methods run
the same code (the step under `torch.no_grad()`, as `_use_grad` runs it when the optimizer is
not differentiable), so the weights are bit-identical (tests/test_torch_setup.py checks it
against stock torch). A differentiable optimizer keeps torch's own step. Set
`REFLECTRL_TORCH_DYNAMO=1` to leave torch untouched (e.g. to `torch.compile` a training step).
"""

from __future__ import annotations

import functools
import os

_DONE = False


def optimizers_without_dynamo() -> bool:
    """Patch torch.optim once (idempotent); False where it was left alone."""
    global _DONE
    if _DONE:
        return True
    if os.environ.get("REFLECTRL_TORCH_DYNAMO", "") not in ("", "0"):
        return False
    import torch
    import torch.optim as optim

    for cls in (optim.Optimizer, optim.Adam, optim.AdamW):
        for name, fn in list(vars(cls).items()):
            code = getattr(fn, "__code__", None)
            raw = getattr(fn, "__wrapped__", None)
            if code is None or raw is None:
                continue
            if code.co_name == "inner" and code.co_filename.endswith("_compile.py"):
                # torch._disable_dynamo's wrapper caches the disabled function here: give it the function itself
                raw.__dynamo_disable = raw
            elif name == "step" and code.co_name == "_use_grad":
                setattr(cls, name, _step_without_graph_break(raw, fn, torch))
    _DONE = True
    return True


def _step_without_graph_break(raw, original, torch):
    @functools.wraps(raw)
    def step(self, *args, **kwargs):
        if self.defaults.get("differentiable"):
            return original(self, *args, **kwargs)
        with torch.no_grad():
            return raw(self, *args, **kwargs)

    return step
