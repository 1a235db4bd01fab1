"""From an experiment directory to numbers: curves, scores, intervals, claims.

Per run, the learning curve is the true episodic return logged each iteration, averaged
into `GRID` equal bins of env steps (an empty bin carries the previous bin's value).
Per run scores:
* final return: the mean episodic return over the last 10% of training;
* AUC: the mean of the curve over training (the area under it divided by its length);
* early AUC: the same over the first 25% of training.
For aggregates across envs, scores are normalised per env by its fixed reference
(references.REFERENCES: 0 = a policy that learned nothing, 1 = the solved or published score),
or, for an env with none, min-max over all runs' curves in the experiment (0 = the worst value
seen in that env, 1 = the best). A run solves the task when its final return reaches the
reference's solved score (`solved_count`; the final policy, never "reached once").

Only finished runs enter the statistics and the plots; the others (running, interrupted,
stopped (killed without a word: runs/files.live_status), failed, or never started) are listed
by `Experiment.excluded`. Every verdict (a claim's, and each entry's comparison with ppo in the
summary table) is taken at several bootstrap seeds and flagged where it changes; the verdicts
of one family are Holm-corrected.

The claims' verdict rule (`evaluate_claims`), symmetric: each claim is a statistic (an IQM
difference of normalised scores, method - baseline, or the calibration loss's late / early
ratio) tested against a line (0; -margin for non-inferiority; 1 for the ratio), bootstrapped
at each of stats.VERDICT_SEEDS. Over the claims an experiment tests together, three
families of p-values are each Holm-corrected: the one-sided p of the claim's direction, the
one-sided p of the opposite direction, and the TOST p of a tie (the statistic within
+-MARGIN_SHARE of 0, the normalised scores' units: 5% of each env's observed range; for the
ratio, within +-MARGIN_SHARE of 1). Then
* "supported": the 95% CI on the claim's side of the line and its Holm-corrected p < ALPHA / 2;
* "not supported": the 95% CI wholly on the opposite side and the opposite direction's
  Holm-corrected p < ALPHA / 2 (the opposite shown; a tie, a CI pinned on the line, is not);
* "equivalent": neither, and the Holm-corrected TOST p < ALPHA (a tie shown within the margin);
* "inconclusive": none of these, or a verdict that changes with the bootstrap seed;
* "not tested": the experiment lacks an entry or env the claim needs (`Claim.missing` says
  which), or has fewer than MIN_SEEDS_FOR_CI finished seeds of an entry (the estimate is
  shown in the evidence, no verdict is drawn, and the claim is left out of the Holm families);
* "untestable": decided before any test (`untestable_reason`, which the claims ledger uses
  too): the data cannot inform the claim (both entries at a fixed reference's floor or
  ceiling, every run of both scoring the same, the baseline at the floor for non-inferiority
  or at the ceiling for superiority, identical runs, a calibration loss with no reward ever
  seen). The reason is said in words (`Claim.untestable`); the claim is left out of the Holm
  families and out of the supported / equivalent counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reflectrl.errors import UserError
from reflectrl.experiments.spec import ExperimentSpec, RunSpec, read_spec
from reflectrl.registry import DEFAULT_TRAINER, parse_algo
from reflectrl.report import references, stats
from reflectrl.runs.files import has_metrics, live_status, read_logged_rows, run_config, run_status

GRID = 50
BASELINE = DEFAULT_TRAINER["control"]  # the algo every method is compared with: the plain trainer
# The margin of the non-inferiority and equivalence tests, as a share of each env's normalising
# range (its fixed reference, else its observed return range; the report states it in the env's
# return units). The untestable rule's "at the floor / ceiling" uses the same margin.
MARGIN_SHARE = 0.05
ALPHA = 0.05  # two-sided level of every test (one-sided tests at ALPHA / 2, TOST at ALPHA)
# With fewer seeds than this, a stratified bootstrap over the seeds can only resample the
# same 2-4 values: its "95% CI" is about the range of the seeds, not a reliable interval.
MIN_SEEDS_FOR_CI = 5
NO_SPARSE_ENV = "a sparse-reward env"  # what a claim about sparse rewards lacks in an experiment without one
# (the JAX backend's: its maze and navix's MiniGrid tasks)
SPARSE_ENV_PREFIXES = ("reflectrl/GridWorld", "MiniGrid", "BabyAI", "reflectrl:GridWorld", "navix:", "xminigrid:")
# Metrics every PPO run logs; anything else in a run's metrics is a signal's diagnostic.
STANDARD_METRICS = {
    "global_step", "iteration", "episodic_return", "episodic_length", "episodes", "learning_rate",
    "policy_loss", "value_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac",
    "explained_variance", "update_epochs_done", "steps_per_second",
}
# The exploration metrics every control run logs (trainers/exploration_metrics.py), drawn in their own figure.
EXPLORATION_SERIES = ("unique_states_total", "unique_states", "visitation_entropy", "rooms_visited")
STANDARD_METRICS |= {*EXPLORATION_SERIES, "first_reward_step"}


@dataclass
class RunData:
    spec: RunSpec
    rows: list[dict]
    curve: np.ndarray          # (GRID,) true episodic return per bin, nan where nothing was logged yet
    config: dict
    command: list[str]
    status: str
    params_sha256: str | None = None  # the final parameters' hash (run.json), where the trainer wrote one

    @property
    def done(self) -> bool:
        return self.status == "finished"


@dataclass
class Experiment:
    root: Path
    spec: ExperimentSpec
    runs: list[RunData]
    grid: np.ndarray
    missing: list[RunSpec] = field(default_factory=list)

    def select(self, env_id: str, label: str) -> list[RunData]:
        """The finished runs of one (env, algo entry)."""
        return [r for r in self.runs if r.done and r.spec.env_id == env_id and r.spec.entry.label == label]

    @property
    def finished(self) -> list[RunData]:
        return [r for r in self.runs if r.done]

    @property
    def excluded(self) -> list[tuple[RunSpec, str]]:
        """The runs left out of the statistics, with their status ("not started" for a run
        that logged nothing)."""
        return ([(r.spec, r.status) for r in self.runs if not r.done]
                + [(spec, "not started") for spec in self.missing])

    # What summary_table and evaluate_claims read, here from the runs' learning curves; the same
    # methods on report.merge.Merged read the per-run scores of an experiment's parts instead.

    @property
    def seed_list(self) -> list[int]:
        return list(self.spec.seed_numbers)

    def score(self, env_id: str, label: str, seed: int, key: str) -> float:
        """One finished run's score (run_scores' key, or an exploration metric logged last); nan
        where the run did not finish or has none."""
        match = [r for r in self.select(env_id, label) if r.spec.seed == seed]
        if not match:
            return math.nan
        value = run_scores(match[0])[key] if key in SCORE_KEYS else last_logged(match[0], key)
        return math.nan if value is None else float(value)

    def finished_count(self, env_id: str, label: str) -> int:
        return len(self.select(env_id, label))

    def observed_range(self, env_id: str) -> tuple[float, float]:
        """The worst and best return any finished run logged in the env ((0, 0) before any)."""
        values = np.concatenate([_fill(r.curve) for r in self.finished if r.spec.env_id == env_id]
                                or [np.array([0.0])])
        values = values[np.isfinite(values)]
        return (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)

    def threshold(self, env_id: str) -> float | None:
        """80% of the way from the worst to the best return seen in the env; never above the best
        return seen (inf, reached by none, where every return was the same: there is nothing to
        solve, and the widened range used for normalising is no env's range)."""
        lo, hi = self.observed_range(env_id)
        return lo + 0.8 * (hi - lo) if hi > lo else math.inf

    def steps_to_threshold(self, env_id: str, label: str) -> list[float] | None:
        """Each finished run's steps to the env's threshold (inf: never reached)."""
        threshold = self.threshold(env_id)
        return [stats.steps_to_threshold(self.grid, _fill(r.curve), threshold, window=GRID // 10)
                for r in self.select(env_id, label)]

    def calibration_losses(self, label: str) -> list[tuple[list[float], str]] | None:
        """(the calibration_loss of every iteration, env) of each finished run of the entry."""
        return [([row["calibration_loss"] for row in r.rows if row.get("calibration_loss") is not None],
                 r.spec.env_id) for r in self.finished if r.spec.entry.label == label]


def _curve(rows: list[dict], total_steps: int) -> np.ndarray:
    edges = np.linspace(0, total_steps, GRID + 1)
    sums, counts = np.zeros(GRID), np.zeros(GRID)
    for row in rows:
        value = row.get("episodic_return")
        if value is None:
            continue
        b = min(GRID - 1, max(0, int(np.searchsorted(edges, row["global_step"], side="left")) - 1))
        sums[b] += value * row.get("episodes", 1)
        counts[b] += row.get("episodes", 1)
    curve = np.full(GRID, np.nan)
    last = np.nan
    for b in range(GRID):
        if counts[b]:
            last = sums[b] / counts[b]
        curve[b] = last
    return curve


def load_experiment(root: Path) -> Experiment:
    spec = read_spec(root)
    runs, missing = [], []
    for run in spec.runs(root):
        if not has_metrics(run.path):
            missing.append(run)
            continue
        rows = read_logged_rows(run.path)
        status = run_status(run.path) or {}
        config = run_config(run.path) or {}
        runs.append(RunData(run, rows, _curve(rows, spec.total_steps), config, status.get("command", []),
                            live_status(run.path, status) if status else "unknown", status.get("params_sha256")))
    grid = np.linspace(0, spec.total_steps, GRID + 1)[1:]
    return Experiment(root, spec, runs, grid, missing)


def _fill(curve: np.ndarray) -> np.ndarray:
    """Replace the leading nans (nothing logged yet) with the first logged value."""
    c = curve.copy()
    finite = np.flatnonzero(np.isfinite(c))
    if finite.size == 0:
        return c
    c[:finite[0]] = c[finite[0]]
    return c


def identical_entries(exp: Experiment, env_id: str) -> dict[str, str]:
    """The entries whose finished runs on the env are an earlier entry's, seed by seed (the same
    returns logged at the same steps: a signal that changed nothing, or two spellings of one
    algo), each mapped to the first such earlier entry. Their learning curves coincide: drawn
    plainly, the later one hides the earlier."""
    def returns(run: RunData) -> tuple:
        return tuple((row.get("global_step"), row["episodic_return"]) for row in run.rows
                     if row.get("episodic_return") is not None)

    first: dict[tuple, str] = {}
    same = {}
    for label in exp.spec.algos:
        runs = sorted(exp.select(env_id, label), key=lambda r: r.spec.seed)
        data = tuple((r.spec.seed, returns(r)) for r in runs)
        if not any(logged for _, logged in data):
            continue  # nothing drawn
        if data in first:
            same[label] = first[data]
        else:
            first[data] = label
    return same


def last_logged(run: RunData, key: str):
    """The last value of a metric the run logged (None if it logged none)."""
    for row in reversed(run.rows):
        if row.get(key) is not None:
            return row[key]
    return None


def unique_states_matrix(exp: Experiment, label: str, env_id: str) -> np.ndarray:
    """(seeds, 1) distinct exploration state keys each run visited over training (nan: none logged)."""
    return np.array([[exp.score(env_id, label, seed, "unique_states_total") for seed in exp.seed_list]],
                    dtype=float).T


SCORE_KEYS = ("final", "auc", "early_auc")  # run_scores' keys


def run_scores(run: RunData) -> dict:
    c = _fill(run.curve)
    tail = c[int(0.9 * GRID):]
    early = c[:max(1, GRID // 4)]
    return {"final": float(np.nanmean(tail)) if np.isfinite(tail).any() else math.nan,
            "auc": float(np.nanmean(c)) if np.isfinite(c).any() else math.nan,
            "early_auc": float(np.nanmean(early)) if np.isfinite(early).any() else math.nan}


def observed_range(exp: Experiment, env_id: str) -> tuple[float, float]:
    """The worst and best return any finished run logged in the env ((0, 0) before any)."""
    return exp.observed_range(env_id)


def env_range(exp: Experiment, env_id: str) -> tuple[float, float]:
    """The (floor, ceiling) the env's scores are normalised by: its fixed reference
    (references.REFERENCES), else the observed range, widened to 1 where every return was the same."""
    return references.norm_range(env_id, observed_range(exp, env_id))


def solved_count(env_id: str, finals) -> int | None:
    """How many of the runs' final returns reach the env's solved score (the fixed reference's:
    the final policy solves the task); None where the env has no solved score."""
    ref = references.reference_for(env_id)
    if ref is None or ref.solved is None:
        return None
    return int(sum(1 for v in finals if math.isfinite(v) and v >= ref.solved))


def score_matrix(exp: Experiment, label: str, key: str, normalised: bool, envs: list[str] | None = None) -> np.ndarray:
    """(seeds, envs) matrix of one score for one algo entry; runs missing a score give nan."""
    envs = envs or exp.spec.envs
    cols = []
    for env_id in envs:
        lo, hi = env_range(exp, env_id)
        col = [exp.score(env_id, label, seed, key) for seed in exp.seed_list]
        cols.append([(value - lo) / (hi - lo) if normalised else value for value in col])
    return np.array(cols, dtype=float).T


def _complete(m: np.ndarray) -> np.ndarray:
    """Keep the seeds that have a score in every env (stratified bootstrap needs full rows)."""
    return m[np.isfinite(m).all(axis=1)]


def margin_of(exp: Experiment, env_id: str) -> float:
    """The non-inferiority / equivalence margin in the env's return units."""
    lo, hi = env_range(exp, env_id)
    return MARGIN_SHARE * (hi - lo)


# ------------------------------------------------------------------------------- untestable

UNTESTABLE = "untestable"
SUPERIORITY, NON_INFERIORITY, TWO_SIDED, RATIO = "superiority", "non-inferiority", "two-sided", "ratio"
SAME_HASHES = "identical runs (equal parameter hashes)"
SAME_SCORES = "identical runs (equal per-run scores)"  # where the runs keep no parameter hash (older reports)
NO_REWARD = "no run saw a reward (calibration loss)"


def same_runs(a: dict, b: dict) -> bool:
    """Whether two entries' runs are the same runs, seed by seed: {seed: fingerprint} (a parameter
    hash, or a tuple of every per-run score) equal for every seed, each present and on both sides."""
    return bool(a) and a.keys() == b.keys() and all(v is not None and v == b[k] for k, v in a.items())


def untestable_reason(kind: str, envs: list[str], method_raw: np.ndarray | None = None,
                      base_raw: np.ndarray | None = None, identical: str = "", saw_reward: bool = True,
                      margin: float = MARGIN_SHARE) -> str:
    """Why a comparison cannot inform its claim, decided before any test ("" where it can): the
    report's and the ledger's one rule. `kind`: SUPERIORITY (beats, helps, learns faster),
    NON_INFERIORITY (>= within a margin), TWO_SIDED (the summary table's vs ppo) or RATIO (the
    calibration loss's fall). method_raw / base_raw: (seeds, envs) raw returns; `identical`: the
    words of identical runs (SAME_HASHES, decided first; SAME_SCORES, the fallback of runs that keep
    no hash, last) or ""; `saw_reward`: False where no run of
    a calibration-loss claim ever saw a reward. Per env, with the fixed reference's margin
    (`margin` of its ceiling - floor): both IQMs at the floor or at the ceiling; every run of both
    entries scoring the same; the baseline at the floor (non-inferiority) or the ceiling
    (superiority). A claim over several envs is untestable only where every env is."""
    if kind == RATIO:
        return "" if saw_reward else f"{UNTESTABLE}: {NO_REWARD}"
    if identical == SAME_HASHES:
        return f"{UNTESTABLE}: {identical}"
    if method_raw is None or base_raw is None or not len(envs):
        return f"{UNTESTABLE}: {identical}" if identical else ""
    reasons = []
    for j, env_id in enumerate(envs):
        a, b = method_raw[:, j], base_raw[:, j]
        ia, ib = stats.iqm(a), stats.iqm(b)
        ref = references.reference_for(env_id)
        m = margin * (ref.ceiling - ref.floor) if ref is not None else math.nan
        pooled = np.concatenate([a, b])
        if ref is not None and ia <= ref.floor + m and ib <= ref.floor + m:
            reasons.append("both at the floor")
        elif ref is not None and ia >= ref.ceiling - m and ib >= ref.ceiling - m:
            reasons.append("both at the ceiling")
        elif pooled.size and np.ptp(pooled) <= 1e-12 * max(1.0, float(np.abs(pooled).max())):
            reasons.append("no spread in either entry")
        elif ref is not None and kind == NON_INFERIORITY and ib <= ref.floor + m:
            reasons.append("the baseline is at the floor (non-inferiority)")
        elif ref is not None and kind == SUPERIORITY and ib >= ref.ceiling - m:
            reasons.append("the baseline is at the ceiling (superiority)")
        else:  # informative here; equal per-run scores (no hashes kept) still say the runs are the same runs
            return f"{UNTESTABLE}: {identical}" if identical else ""
    unique = list(dict.fromkeys(reasons))
    if len(unique) == 1:
        return f"{UNTESTABLE}: {unique[0]}"
    return f"{UNTESTABLE}: " + "; ".join(f"{r} on {e}" for r, e in zip(reasons, envs))


def _identical_words(exp, label: str, base: str, envs: list[str]) -> str:
    """SAME_HASHES where every finished seed of the two entries ended with the same parameters
    (run.json's params_sha256), else "" (also for a merged experiment: its parts keep no hashes)."""
    if not isinstance(exp, Experiment):
        return ""

    def hashes(entry: str) -> dict:
        return {(r.spec.env_id, r.spec.seed): r.params_sha256 for e in envs for r in exp.select(e, entry)}

    return SAME_HASHES if same_runs(hashes(label), hashes(base)) else ""


def _versus_baseline(final: np.ndarray, base: np.ndarray, margin: float, reps: int, seed: int) -> dict:
    """The IQM difference of final returns (entry - ppo) at one bootstrap seed: its 95% CI,
    the two-sided p-value of "they differ" and the TOST p-value of "equal within margin"."""
    samples = stats.stratified_bootstrap([final, base], stats.iqm_difference, reps, seed)
    lo, hi = np.percentile(samples, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    p_diff = min(1.0, 2 * min(stats.p_value_above(samples, 0.0), stats.p_value_below(samples, 0.0)))
    return {"ci": [float(lo), float(hi)], "p_diff": p_diff, "p_equiv": stats.tost_p_value(samples, margin)}


def _family_verdicts(tests: list[dict], point: list[float]) -> list[str]:
    """better / worse (Holm-corrected two-sided test of the difference), else equivalent
    (Holm-corrected TOST within the margin), else inconclusive; one per test of the family."""
    p_diff, p_equiv = stats.holm([t["p_diff"] for t in tests]), stats.holm([t["p_equiv"] for t in tests])
    return ["better" if pd < ALPHA and d > 0 else "worse" if pd < ALPHA and d < 0 else
            "equivalent" if pe < ALPHA else "inconclusive" for pd, pe, d in zip(p_diff, p_equiv, point)]


def baseline_of(exp: Experiment, label: str) -> str:
    """The entry an entry is compared with: its trainer's plain entry (dqn for dqn+shaping,
    sac for sac+calibration) where the experiment has it, else ppo."""
    try:
        trainer = parse_algo(next(e.algo for e in exp.spec.entries() if e.label == label)).trainer
    except (StopIteration, UserError):
        return BASELINE
    return trainer if trainer not in (BASELINE, label) and trainer in exp.spec.algos else BASELINE


def summary_table(exp: Experiment, reps: int = stats.BOOTSTRAP_REPS) -> list[dict]:
    """One row per (env, algo entry) with finished runs. Entries other than their baseline
    (`baseline_of`: ppo, or the plain dqn / sac entry for an off-policy trainer's signals,
    named in "baseline") also carry their comparison with it ("vs_ppo", the name kept for
    every baseline: better, worse, equivalent within the env's margin, inconclusive, or "too
    few seeds" under MIN_SEEDS_FOR_CI on either side, or "untestable" with the reason in
    vs_ppo_untestable: `untestable_reason`'s two-sided cases, left out of the family),
    Holm-corrected over every comparison in the table and taken at each of stats.VERDICT_SEEDS
    (vs_ppo_stable is False where the seeds disagree). "solved": the seeds whose final return
    reaches the env's solved score (`solved_count`; None without one); "norm_range": the
    (floor, ceiling) the env is normalised by; "reference": where it comes from."""
    rows = []
    family: list[tuple[dict, list[dict]]] = []  # (row, one test per verdict seed)
    for env_id in exp.spec.envs:
        bases: dict[str, np.ndarray | None] = {}
        threshold = exp.threshold(env_id)  # None: not recomputed (an experiment merged from its parts' scores)
        margin = margin_of(exp, env_id)
        norm = env_range(exp, env_id)
        ref = references.reference_for(env_id)
        for label in exp.spec.algos:
            baseline = baseline_of(exp, label)
            if baseline not in bases:
                bases[baseline] = (_complete(score_matrix(exp, baseline, "final", False, [env_id]))
                                   if baseline in exp.spec.algos else None)
            base = bases[baseline]
            final = _complete(score_matrix(exp, label, "final", False, [env_id]))
            auc = _complete(score_matrix(exp, label, "auc", True, [env_id]))
            if final.size == 0:
                finished = exp.finished_count(env_id, label)
                why = f"no episode ended in its {finished} finished run(s)" if finished else "no run finished"
                rows.append({"env": env_id, "algo": label, "seeds": 0, "why": why})
                continue
            f = stats.interval([final], stats.iqm, reps)
            a = stats.interval([auc], stats.iqm, reps) if auc.size else (math.nan,) * 3
            poi = None
            if base is not None and base.size and label != baseline:
                poi = stats.interval([final, base], stats.probability_of_improvement, reps)
            reach = exp.steps_to_threshold(env_id, label)
            unique = _complete(unique_states_matrix(exp, label, env_id))
            u = stats.interval([unique], stats.iqm, reps) if unique.size else (None, None, None)
            row = {
                "env": env_id, "algo": label, "seeds": int(final.shape[0]), "baseline": baseline,
                "final_iqm": f[0], "final_ci": [f[1], f[2]], "final_seeds": final[:, 0].tolist(),
                "auc_iqm": a[0], "auc_ci": [a[1], a[2]],
                "p_improve_over_ppo": None if poi is None else poi[0],
                "p_improve_ci": None if poi is None else [poi[1], poi[2]],
                "threshold": threshold,
                "env_range": list(observed_range(exp, env_id)),
                "norm_range": list(norm), "reference": references.describe(env_id, observed_range(exp, env_id)),
                "solved": solved_count(env_id, final[:, 0]), "solved_score": None if ref is None else ref.solved,
                "margin": margin,
                "steps_to_threshold_median": (None if reach is None else float(np.median(reach)) if reach
                                              else math.inf),
                "reached": None if reach is None else int(np.isfinite(reach).sum()),
                "unique_states_iqm": u[0], "unique_states_ci": None if u[0] is None else [u[1], u[2]],
            }
            rows.append(row)
            if base is not None and base.shape[0] >= 2 and final.shape[0] >= 2 and label != baseline:
                row["vs_ppo_diff"] = f[0] - stats.iqm(base)
                row["vs_ppo_diff_normalised"] = row["vs_ppo_diff"] / (norm[1] - norm[0])
                why = untestable_reason(TWO_SIDED, [env_id], final, base,
                                        _identical_words(exp, label, baseline, [env_id]))
                if min(base.shape[0], final.shape[0]) < MIN_SEEDS_FOR_CI:
                    # a bootstrap over 2-4 seeds would call a difference "significant" that a rank test
                    # over them never could (3 vs 3 seeds: the smallest two-sided p is 0.1)
                    row.update({"vs_ppo": "too few seeds", "vs_ppo_stable": True,
                                "vs_ppo_ci": _versus_baseline(final, base, margin, reps, 0)["ci"]})
                elif why:  # decided before any test: out of the Holm family
                    row.update({"vs_ppo": UNTESTABLE, "vs_ppo_untestable": why, "vs_ppo_stable": True,
                                "vs_ppo_ci": _versus_baseline(final, base, margin, reps, 0)["ci"]})
                else:
                    family.append((row, [_versus_baseline(final, base, margin, reps, seed)
                                         for seed in stats.VERDICT_SEEDS]))
    if family:
        points = [row["vs_ppo_diff"] for row, _ in family]
        by_seed = [_family_verdicts([tests[j] for _, tests in family], points)
                   for j in range(len(stats.VERDICT_SEEDS))]
        p_diff = stats.holm([tests[0]["p_diff"] for _, tests in family])
        p_equiv = stats.holm([tests[0]["p_equiv"] for _, tests in family])
        for i, (row, tests) in enumerate(family):
            verdicts = [v[i] for v in by_seed]
            row.update({"vs_ppo": verdicts[0] if len(set(verdicts)) == 1 else "inconclusive",
                        "vs_ppo_ci": tests[0]["ci"], "vs_ppo_p_holm": p_diff[i],
                        "vs_ppo_p_equiv_holm": p_equiv[i], "vs_ppo_stable": len(set(verdicts)) == 1,
                        "vs_ppo_by_seed": verdicts, "vs_ppo_tests": len(family)})
    return rows


def per_run_scores(exp: Experiment) -> list[dict]:
    """Every run's own scores, from which the summary table is computed (published with it):
    final return, AUC and early AUC (raw returns), steps to the env's threshold, the final
    parameters' hash (params_sha256, from run.json: identical runs have equal hashes) and the
    exploration metrics it logged last (None where it logged none)."""
    out = []
    thresholds = {env_id: exp.threshold(env_id) for env_id in exp.spec.envs}
    for r in exp.runs:
        env_id = r.spec.env_id
        last = {k: last_logged(r, k) for k in ("unique_states_total", "first_reward_step", "rooms_visited")}
        reach = stats.steps_to_threshold(exp.grid, _fill(r.curve), thresholds[env_id], window=GRID // 10)
        out.append({"env": env_id, "algo": r.spec.entry.label, "seed": r.spec.seed, "status": r.status,
                    **run_scores(r), "steps_to_threshold": reach if math.isfinite(reach) else None,
                    "params_sha256": r.params_sha256,
                    "unique_states_total": last.get("unique_states_total"),
                    "first_reward_step": last.get("first_reward_step"), "rooms_visited": last.get("rooms_visited")})
    return out


def few_seed_rows(table: list[dict]) -> list[dict]:
    """The summary rows whose intervals rest on fewer than MIN_SEEDS_FOR_CI seeds."""
    return [r for r in table if 0 < r.get("seeds", 0) < MIN_SEEDS_FOR_CI]


# ------------------------------------------------------------------------------- claims

# The words a claim's verdict is one of (users' scripts read them from stats.json).
VERDICTS = ("supported", "not supported", "equivalent", "inconclusive", "not tested", "untestable")


@dataclass
class Claim:
    statement: str
    verdict: str  # one of VERDICTS: supported | not supported | equivalent | inconclusive | not tested | untestable
    evidence: str
    # what the experiment lacks to test the claim at all ("gear", "a sparse-reward env");
    # "" for a claim it can test (a "not tested" claim with "" lacks data: finished seeds, 5 per entry)
    missing: str = ""
    p_value: float | None = None   # one-sided bootstrap p-value of the claim (bootstrap seed 0)
    p_holm: float | None = None    # the same, Holm-corrected over the claims tested together
    stable: bool = True            # the verdict is the same at every one of stats.VERDICT_SEEDS
    verdicts_by_seed: list[str] = field(default_factory=list)
    p_against: float | None = None       # one-sided p-value of the opposite direction (seed 0)
    p_against_holm: float | None = None  # the same, Holm-corrected over the claims tested together
    p_equiv: float | None = None         # TOST p-value of a tie within the margin (seed 0)
    p_equiv_holm: float | None = None    # the same, Holm-corrected over the claims tested together
    entries: list[str] = field(default_factory=list)  # the entries compared: [method, baseline] or [method]
    envs: list[str] = field(default_factory=list)     # the envs the claim is tested on
    seeds: list[int] = field(default_factory=list)    # finished seeds of each entry in `entries` (runs: a ratio)
    estimate: list[float] | None = None  # [point, 95% CI low, high] at bootstrap seed 0
    untestable: str = ""  # why the data cannot inform the claim ("untestable: both at the floor"); "" where they can
    raw_difference: list[float] | None = None  # per env, the IQM difference of raw returns (method - baseline)

    @property
    def testable(self) -> bool:
        return not self.missing


def _method_label(exp: Experiment, algo: str) -> str | None:
    entries = exp.spec.entries()
    exact = [e.label for e in entries if e.label == algo]
    if exact:
        return exact[0]
    # the same trainer and signals under any name (refgrpo = ppo+calibration), plain entries before ablations
    canonical = parse_algo(algo).name
    same = sorted((e for e in entries if e.canonical == canonical), key=lambda e: bool(e.overrides))
    return same[0].label if same else None


def _method_and_baseline(exp: Experiment, algo: str, any_trainer: bool) -> tuple[str | None, str]:
    """The entry a claim about `algo` (a PPO method: sdrs, gear, ...) is tested on, and the
    entry it is compared with: the method on PPO against ppo where the experiment has them,
    else the same signals on a replay trainer against that trainer's plain entry (sdrs ->
    dqn+shaping vs dqn, as `baseline_of`)."""
    label = _method_label(exp, algo)
    if not any_trainer or (label is not None and BASELINE in exp.spec.algos):
        return label, BASELINE
    signals = parse_algo(algo).signals
    for entry in sorted(exp.spec.entries(), key=lambda e: bool(e.overrides)):
        try:
            parsed = parse_algo(entry.algo)
        except UserError:
            continue
        if parsed.trainer != BASELINE and parsed.signals == signals and baseline_of(exp, entry.label) != BASELINE:
            return entry.label, parsed.trainer
    return label, BASELINE


def _diff_matrices(exp: Experiment, label: str, key: str, envs: list[str], baseline: str = BASELINE):
    """The (seeds, envs) normalised score matrices of the entry and of its baseline, each
    keeping the seeds scored in every env (either may have fewer than 2 rows)."""
    return (_complete(score_matrix(exp, label, key, True, envs)),
            _complete(score_matrix(exp, baseline, key, True, envs)))


def _verdict_greater(ci) -> str:
    """The CI rule of "X beats the baseline" (an IQM difference above 0): supported when the
    whole CI is above 0; not supported when the whole CI is below 0 (the opposite shown);
    inconclusive otherwise, a CI pinned at 0 (every seed tied) included. Each side also
    needs its Holm-corrected p-value (`_rule`)."""
    _, lo, hi = ci
    return "supported" if lo > 0 else "not supported" if hi < 0 else "inconclusive"


def _verdict_non_inferior(ci, margin: float) -> str:
    """"X's score >= the baseline's, within `margin`": the "beats" rule with the zero line
    moved down to -margin. Supported when the whole CI is above -margin (a CI inside
    (-margin, 0) is non-inferior too); not supported when the whole CI is below -margin
    (worse by more than the margin); inconclusive otherwise."""
    _, lo, hi = ci
    return "supported" if lo > -margin else "not supported" if hi < -margin else "inconclusive"


def _verdict_falls(ci) -> str:
    """"The loss falls", on the ratio late / early: supported when the whole CI is below 1;
    not supported when the whole CI is above 1 (the loss rose); inconclusive otherwise, a
    ratio pinned at 1 (no change) included."""
    _, lo, hi = ci
    return "supported" if hi < 1 else "not supported" if lo > 1 else "inconclusive"


def _rule(ci_rule: str, p_for_holm: float, p_against_holm: float, p_equiv_holm: float) -> str:
    """A claim's verdict from its CI rule and its three Holm-corrected p-values: each side
    (supported, not supported) needs the CI on its side and its one-sided p below ALPHA / 2;
    then "equivalent" where the TOST p is below ALPHA, else "inconclusive"."""
    if ci_rule == "supported" and p_for_holm < ALPHA / 2:
        return "supported"
    if ci_rule == "not supported" and p_against_holm < ALPHA / 2:
        return "not supported"
    return "equivalent" if p_equiv_holm < ALPHA else "inconclusive"


def _few_seeds_reason(n: int) -> str:
    return (f"; fewer than {MIN_SEEDS_FOR_CI} seeds per entry: not tested (the interval is the range of the "
            "seeds' bootstrap, not a reliable 95% CI)" if n < MIN_SEEDS_FOR_CI else "")


def _fmt(ci) -> str:
    return f"{ci[0]:+.3f} [{ci[1]:+.3f}, {ci[2]:+.3f}]"


@dataclass
class _Test:
    """A claim under test: its bootstrap at each verdict seed, the CI rule, the line it is
    tested against (`null`: the claim says the statistic is above it, or below it where
    `above` is False) and where a tie lies (`tie`, +-`margin` for the TOST)."""
    statement: str
    point: float
    samples: list[np.ndarray]            # one array of bootstrap samples per verdict seed
    decide: Callable[[tuple], str]       # the CI rule on (point, lo, hi)
    null: float
    above: bool
    evidence: Callable[[tuple], str]
    tie: float = 0.0
    margin: float = MARGIN_SHARE
    entries: list[str] = field(default_factory=list)
    envs: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    raw_difference: list[float] | None = None

    def ci(self, j: int) -> tuple[float, float, float]:
        lo, hi = np.percentile(self.samples[j], [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
        return self.point, float(lo), float(hi)

    def p_for(self, j: int) -> float:
        """One-sided p-value of what the claim asserts."""
        s = self.samples[j]
        return stats.p_value_above(s, self.null) if self.above else stats.p_value_below(s, self.null)

    def p_against(self, j: int) -> float:
        """One-sided p-value of the opposite (a tie at the null line shows neither)."""
        s = self.samples[j]
        return stats.p_value_below(s, self.null) if self.above else stats.p_value_above(s, self.null)

    def p_equiv(self, j: int) -> float:
        """TOST p-value of a tie: the statistic within tie +- margin."""
        return stats.tost_p_value(self.samples[j], self.margin, self.tie)


def _holm_verdicts(tests: list[_Test], j: int) -> tuple[list[str], dict[str, list[float]], dict[str, list[float]]]:
    """Each test's verdict at verdict seed j (`_rule`), with the raw and the Holm-corrected
    p-values of the three families ("for", "against", "equiv"), each corrected over the tests."""
    raw = {"for": [t.p_for(j) for t in tests], "against": [t.p_against(j) for t in tests],
           "equiv": [t.p_equiv(j) for t in tests]}
    adjusted = {k: stats.holm(v) for k, v in raw.items()}
    verdicts = [_rule(t.decide(t.ci(j)), adjusted["for"][i], adjusted["against"][i], adjusted["equiv"][i])
                for i, t in enumerate(tests)]
    return verdicts, raw, adjusted


def _margin_units(exp: Experiment, envs: list[str]) -> str:
    return ", ".join(f"{margin_of(exp, e):.3g} return on {e}" for e in envs)


def claims_intro(claims: list[Claim], reps: int) -> str:
    """How the claims' verdicts are decided (the report's text above its claims table)."""
    tested = [c for c in claims if c.p_value is not None]
    few = [c for c in claims if c.testable and c.verdict == "not tested"]
    text = (f"{len(tested)} claim(s) tested together. 'supported' needs the 95% CI on the claim's side and a "
            f"one-sided p-value below {ALPHA / 2:g} after Holm's correction over the {len(tested)}; 'not supported' "
            f"needs the same on the opposite side (a tie is not); else 'equivalent' where a TOST puts the "
            f"difference within +-{MARGIN_SHARE:.0%} of each env's range (a ratio within +-{MARGIN_SHARE:.0%} of 1) "
            f"at {ALPHA:g} after Holm's correction, else 'inconclusive'. Each verdict is taken at bootstrap seeds "
            f"{list(stats.VERDICT_SEEDS)} ({reps:,} resamples each) and is 'inconclusive' where it changes.")
    if few or not tested:
        text += (f" A claim with fewer than {MIN_SEEDS_FOR_CI} finished seeds of an entry is 'not tested': its "
                 "estimate is shown, no verdict is drawn.")
    untestable = [c for c in claims if c.verdict == UNTESTABLE]
    if untestable:
        text += (f" {len(untestable)} claim(s) 'untestable', decided before any test and left out of the Holm "
                 "families: the data cannot inform them (both entries within the margin of the env's fixed floor or "
                 "ceiling, every run of both scoring the same, the baseline at the floor for a non-inferiority claim "
                 "or at the ceiling for a superiority one, identical runs, or a calibration loss where no run saw a "
                 "reward); each says why.")
    return text


def evaluate_claims(exp: Experiment, reps: int = stats.BOOTSTRAP_REPS, margin: float = MARGIN_SHARE) -> list[Claim]:
    """The seed claims, each tested where the experiment can test it; see the module docstring
    for the verdict rule. `margin`: the non-inferiority and equivalence margin, a share of each
    env's observed return range (the normalised scores' units)."""
    claims: list[Claim] = []
    tests: list[tuple[int, _Test]] = []  # (index in claims, test)
    has_base = BASELINE in exp.spec.algos
    envs = exp.spec.envs

    def untested(statement, why, missing="", **known):
        claims.append(Claim(statement, "not tested", why, missing, **known))

    def pending(test: _Test):
        claims.append(Claim(test.statement, "", ""))
        tests.append((len(claims) - 1, test))

    def bootstrap(matrices, statistic):
        return [stats.stratified_bootstrap(matrices, statistic, reps, seed) for seed in stats.VERDICT_SEEDS]

    def ci_of(samples, point):
        lo, hi = np.percentile(samples, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
        return point, float(lo), float(hi)

    def compare(statement, algo, key, envs_, decide, what, null, units="", any_trainer=False, kind=SUPERIORITY):
        label, base = _method_and_baseline(exp, algo, any_trainer)
        if label is None or base not in exp.spec.algos:
            needs = [a for a, ok in ((algo, label is not None), (BASELINE, has_base)) if not ok]
            return untested(statement, f"needs '{algo}' and '{BASELINE}' in --algos", ", ".join(needs))
        if not envs_:
            return untested(statement, "no sparse-reward env in the experiment (GridWorld, MiniGrid, BabyAI, navix, "
                            "xminigrid, or any env with --wrapper sparse/delayed)", NO_SPARSE_ENV)
        a, b = _diff_matrices(exp, label, key, envs_, base)
        n_a, n_b = a.shape[0], b.shape[0]
        known = {"entries": [label, base], "envs": list(envs_), "seeds": [n_a, n_b]}
        if min(n_a, n_b) < 2:
            return untested(statement, f"needs at least {MIN_SEEDS_FOR_CI} finished seeds of '{label}' and of "
                            f"'{base}' in every env tested (has {n_a} and {n_b})", **known)

        raw_a = _complete(score_matrix(exp, label, key, False, envs_))
        raw_b = _complete(score_matrix(exp, base, key, False, envs_))
        raw = [stats.iqm(raw_a[:, j]) - stats.iqm(raw_b[:, j]) for j in range(len(envs_))]
        known["raw_difference"] = raw
        raw_text = "; raw IQM difference in return: " + ", ".join(
            f"{d:+.4g}" + (f" on {e}" if len(envs_) > 1 else "") for d, e in zip(raw, envs_))

        def evidence(ci, label=label, base=base, n_a=n_a, n_b=n_b):
            return (f"IQM difference in normalised {what}, {label} - {base}: {_fmt(ci)} (95% stratified "
                    f"bootstrap CI; {n_a} vs {n_b} seeds x {len(envs_)} env(s){units}"
                    f"{_few_seeds_reason(min(n_a, n_b))}){raw_text}")

        point = stats.iqm_difference(a, b)
        if min(n_a, n_b) < MIN_SEEDS_FOR_CI:
            ci = ci_of(stats.stratified_bootstrap([a, b], stats.iqm_difference, reps, 0), point)
            return untested(statement, evidence(ci), estimate=list(ci), **known)
        why = untestable_reason(kind, envs_, raw_a, raw_b, _identical_words(exp, label, base, envs_), margin=margin)
        if why:  # decided before any test: no verdict, out of the Holm families
            ci = ci_of(stats.stratified_bootstrap([a, b], stats.iqm_difference, reps, 0), point)
            claims.append(Claim(statement, UNTESTABLE, f"{why}; {evidence(ci)}", estimate=list(ci), untestable=why,
                                **known))
            return
        pending(_Test(statement, point, bootstrap([a, b], stats.iqm_difference), decide, null, True, evidence,
                      0.0, margin, entries=known["entries"], envs=known["envs"], seeds=known["seeds"],
                      raw_difference=raw))

    compare("RefGRPO learns faster early than PPO", "refgrpo", "early_auc", envs, _verdict_greater,
            "area under the first 25% of the learning curve", 0.0)
    compare(f"RefGRPO's final return >= PPO's (margin {margin:.0%} of each env's range)", "refgrpo", "final", envs,
            lambda ci: _verdict_non_inferior(ci, margin), "final return", -margin,
            units=f"; margin: {_margin_units(exp, envs)}" if margin == MARGIN_SHARE else "", kind=NON_INFERIORITY)

    statement = "RefGRPO's calibration loss falls and settles"
    label = _method_label(exp, "refgrpo")
    losses = exp.calibration_losses(label) if label else []
    losses = None if losses is None else [(x, env_id) for x, env_id in losses if len(x) >= 10]
    if label is None:
        untested(statement, "needs 'refgrpo' in --algos", "refgrpo")
    elif losses is None:
        untested(statement, "the per-iteration calibration losses are not kept in a report's scores, so this claim "
                 "is tested in the report of the part holding the refgrpo runs, not across parts",
                 entries=[label])
    elif not losses:
        untested(statement, "no finished refgrpo run logged calibration_loss over 10 or more iterations")
    else:
        ratios = np.array([[np.mean(x[-max(1, len(x) // 10):]) / max(np.mean(x[:max(1, len(x) // 10)]), 1e-12)]
                           for x, _ in losses])
        n_runs = len(losses)
        loss_envs = [e for e in envs if any(env_id == e for _, env_id in losses)]
        n_seeds = min(sum(1 for _, env_id in losses if env_id == e) for e in loss_envs)  # fewest over the envs
        known = {"entries": [label], "envs": loss_envs, "seeds": [n_seeds]}

        def ratio_evidence(ci, n=n_runs, n_seeds=n_seeds):
            return (f"IQM ratio of calibration loss, last 10% / first 10% of training: {ci[0]:.3f} "
                    f"[{ci[1]:.3f}, {ci[2]:.3f}] over {n} runs{_few_seeds_reason(n_seeds)}")

        point = stats.iqm(ratios)
        runs = [r for r in exp.finished if r.spec.entry.label == label]
        saw_reward = any(last_logged(r, "first_reward_step") is not None
                         or any(row.get("episodic_return") for row in r.rows) for r in runs)
        why = untestable_reason(RATIO, loss_envs, saw_reward=saw_reward)
        if n_seeds < MIN_SEEDS_FOR_CI:
            ci = ci_of(stats.stratified_bootstrap([ratios], stats.iqm, reps, 0), point)
            untested(statement, ratio_evidence(ci), estimate=list(ci), **known)
        elif why:
            ci = ci_of(stats.stratified_bootstrap([ratios], stats.iqm, reps, 0), point)
            claims.append(Claim(statement, UNTESTABLE, f"{why}; {ratio_evidence(ci)}", estimate=list(ci),
                                untestable=why, **known))
        else:
            pending(_Test(statement, point, bootstrap([ratios], stats.iqm), _verdict_falls, 1.0, False,
                          ratio_evidence, 1.0, margin, **known))

    sparse = [e for e in envs
              if e.startswith(SPARSE_ENV_PREFIXES) or (exp.spec.wrapper or "").startswith(("sparse", "delayed"))]
    # trainer-neutral: tested as dqn+shaping vs dqn (sac+shaping vs sac) where there is no sdrs vs ppo
    compare("Shaping (SDRS) helps on sparse-reward tasks", "sdrs", "auc", sparse, _verdict_greater,
            "area under the learning curve", 0.0, any_trainer=True)
    compare("GEAR beats the baseline", "gear", "final", envs, _verdict_greater, "final return", 0.0)

    _decide(claims, tests)
    return claims


def _decide(claims: list[Claim], tests: list[tuple[int, _Test]]) -> None:
    """Replace each pending claim (claims[i] for (i, test) in tests) by its verdict: Holm over
    the tests together, at every verdict seed, with the seeds' disagreement flagged."""
    if not tests:
        return
    family = [t for _, t in tests]
    by_seed = [_holm_verdicts(family, j) for j in range(len(family[0].samples))]
    verdicts0, raw, adjusted = by_seed[0]
    n = len(tests)
    for k, (i, t) in enumerate(tests):
        seen = [v[0][k] for v in by_seed]
        tie = f"{t.tie:g} +- {t.margin:g}"
        note = (f"; one-sided p = {raw['for'][k]:.4f}, Holm-corrected over the {n} claims tested: "
                f"{adjusted['for'][k]:.4f}; the opposite direction: p = {raw['against'][k]:.4f}, Holm "
                f"{adjusted['against'][k]:.4f}; a tie ({tie}, TOST): p = {raw['equiv'][k]:.4f}, Holm "
                f"{adjusted['equiv'][k]:.4f}")
        if len(set(seen)) > 1:
            note += (f"; the verdict FLIPS across bootstrap seeds {list(stats.VERDICT_SEEDS)} ({', '.join(seen)}): "
                     "inconclusive")
        ci = t.ci(0)
        claims[i] = Claim(t.statement, verdicts0[k] if len(set(seen)) == 1 else "inconclusive",
                          t.evidence(ci) + note, "", raw["for"][k], adjusted["for"][k], len(set(seen)) == 1, seen,
                          p_against=raw["against"][k], p_against_holm=adjusted["against"][k],
                          p_equiv=raw["equiv"][k], p_equiv_holm=adjusted["equiv"][k],
                          entries=list(t.entries), envs=list(t.envs), seeds=list(t.seeds), estimate=list(ci),
                          raw_difference=t.raw_difference)
