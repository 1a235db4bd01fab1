"""One progress display for all of an experiment's runs: env steps over every run (a finished
run counts in full, a run's steps never go backwards or past the budget) and the runs done,
running and failed."""

from __future__ import annotations

from pathlib import Path

from reflectrl.experiments.spec import ExperimentSpec, RunSpec
from reflectrl.experiments.state import ExperimentResult


class Progress:
    def __init__(self, spec: ExperimentSpec, runs: list[RunSpec], result: ExperimentResult, enabled: bool):
        from reflectrl.runs.progress import progress_bar

        self.total_runs = len(runs)
        self.cap = spec.total_steps  # runs end on a whole batch, a little past it
        self.result = result
        self.steps: dict[Path, int] = {r.path: (spec.total_steps if r in result.skipped else 0) for r in runs}
        self.bar = progress_bar(spec.total_steps * len(runs), "env steps", initial=sum(self.steps.values()),
                                enabled=enabled, smoothing=0.05, mininterval=1.0)
        self.set_running(0)

    def set_step(self, path: Path, step: int) -> None:
        step = max(min(step, self.cap), self.steps.get(path, 0))
        delta = step - self.steps.get(path, 0)
        self.steps[path] = step
        if delta:
            self.bar.update(delta)

    def set_running(self, running: int) -> None:
        done = len(self.result.finished) + len(self.result.skipped)
        failed = f", {len(self.result.failed)} failed" if self.result.failed else ""
        self.bar.set_postfix_str(f"runs {done}/{self.total_runs} done, {running} running{failed}", refresh=False)

    def close(self) -> None:
        self.bar.close()


_Progress = Progress
