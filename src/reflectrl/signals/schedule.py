"""Decay schedules of an exploration bonus's scale (issue 42): `count.schedule`, `rnd.schedule`,
`calibration.schedule`, each with its `schedule_steps`.

The factor multiplies the bonus's scale (count's beta, RND's intrinsic reward, calibration's
alpha) at a point of the run, `progress`:

- constant: 1 (exactly: the run is today's bit for bit);
- linear: max(0, 1 - progress), gone at progress 1;
- exponential: 0.01 ** progress, 1% left at progress 1 and decaying on after it.

progress = (env steps after the rollout) / schedule_steps where schedule_steps > 0, else
(iterations done) / (the run's iterations): with `schedule_steps=0` the bonus is gone by the
end of the run whatever its length.
"""

from __future__ import annotations

from reflectrl.errors import UserError

SCHEDULES = ("constant", "linear", "exponential")
EXPONENTIAL_END = 0.01  # what the exponential schedule leaves of the bonus at progress 1


def check_schedule(section: str, schedule: str, schedule_steps: int) -> None:
    """One line naming the knob that is wrong."""
    if schedule not in SCHEDULES:
        raise UserError(f"{section}.schedule='{schedule}': use one of {', '.join(SCHEDULES)}")
    if schedule_steps < 0:
        raise UserError(f"{section}.schedule_steps={schedule_steps}: must be >= 0 (0: the run's whole length)")


def schedule_factor(schedule: str, progress: float) -> float:
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return EXPONENTIAL_END ** progress


def progress(schedule_steps: int, global_step: int, iteration: int, total_iterations: int) -> float:
    """How far through its schedule a bonus is after a rollout: `global_step` the env steps after
    it, `iteration` the iterations done (1 after the first rollout)."""
    if schedule_steps > 0:
        return global_step / schedule_steps
    return iteration / max(1, total_iterations)


def factor_at(cfg, batch, total_iterations: int) -> float:
    """The factor of a config with `schedule` and `schedule_steps` for a torch Batch."""
    if cfg.schedule == "constant":
        return 1.0
    return schedule_factor(cfg.schedule, progress(cfg.schedule_steps, batch.global_step, batch.iteration,
                                                  total_iterations))
