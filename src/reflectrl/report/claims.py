"""`reflectrl claims DIR...`: one ledger of every claim in the reports under the folders.

A report is a `stats.json` holding "claims" anywhere under a DIR (searched recursively: the
`reflectrl report` of an experiment writes DIR/report/stats.json; a published one lies in
docs/results/NAME/). The report's folder is the results folder of its rows. Each claim the
report could test is one row: the claim, its env(s), the two entries compared (one for the
calibration-loss ratio), their finished seeds, whether the entries were tuned, the effect with
its 95% CI, the Holm-corrected p-value, the verdict, and the results folder. The claims a
report could not test (an entry or a sparse-reward env missing) are listed after the table.

What a row shows, and where it comes from:
* claim, effect [95% CI], Holm p, verdict: as the report stored them (claims[...] in
  stats.json: the estimate, p_holm and verdict fields, else read from the evidence text that
  older reports kept). The verdict is the one of its time: `rule` says which rule made it,
  "before Holm" (no p-values stored: 2,000 resamples, one bootstrap seed, no correction),
  "Holm on 'supported' only" (p_holm but no p_against_holm: 'not supported' was not
  Holm-corrected and covered exact ties) or "today's" (the rule of `reflectrl.report.analysis`).
* env(s), entries, seeds: the claim's own fields where stored, else the spec's envs (the
  sparse-reward ones for the shaping claim) and the evidence text's "N vs M seeds" / "over N
  runs".
* today: the verdict under today's rule, recomputed from the per-run scores the report keeps
  ("runs" in stats.json, else runs.csv beside it) with the env ranges of its table, at
  stats.BOOTSTRAP_REPS resamples and every one of stats.VERDICT_SEEDS, Holm over the claims
  the report tests together. Fewer than MIN_SEEDS_FOR_CI seeds of an entry is "not tested"
  with or without per-run scores. The calibration-loss ratio cannot be recomputed (the report
  keeps no per-iteration losses): its stored p-values stand in for it in the Holm families (1
  where none is stored, which only makes the others' correction stricter) and its cell is
  empty. A report with no per-run scores gets no recomputed verdicts; the ledger says why.
* tuned: decided from files, not from the knobs' values: an entry is tuned where a
  `sweeps/*/best.json` (examples/experiments/tuned_vs_tuned.py: one sweep per entry, its "algo" the entry)
  lies in the results folder, its experiment folder (the folder above a `report/`) or the
  folder above that (tuned_vs_tuned's OUT beside OUT/rerun), or where the experiment is the
  re-run of a `reflectrl sweep` (an experiment folder named `best` beside the sweep's
  best.json and sweep.json: every entry of it carries tuned knobs). "yes" where every entry
  of the claim is tuned, "only X" where some are, "no" otherwise.
The reports that are parts of a merged report found beside them (`reflectrl report PART... --out
MERGED`: its stats.json lists its "parts") are listed in a section of their own, after the
table: their claims over all the parts are the merged report's rows.
Reports under a folder named `archive` inside a DIR are left out (docs/results/archive/ holds
superseded or withdrawn results, kept for history); given an archive folder itself as DIR, its
reports are listed, in a section of their own.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from reflectrl.errors import UserError
from reflectrl.report import references, stats
from reflectrl.report.analysis import (
    MARGIN_SHARE,
    MIN_SEEDS_FOR_CI,
    NON_INFERIORITY,
    RATIO,
    SAME_HASHES,
    SAME_SCORES,
    SPARSE_ENV_PREFIXES,
    SUPERIORITY,
    UNTESTABLE,
    Claim,
    _decide,
    _Test,
    _verdict_greater,
    _verdict_non_inferior,
    same_runs,
    untestable_reason,
)

STATS_FILE = "stats.json"
RUNS_FILE = "runs.csv"
ARCHIVE = "archive"
NONE = "–"
DIFFERS = "≠"
RULES = {"old": "before Holm", "holm": "Holm on 'supported' only", "today": "today's"}

_NUM = r"[+-]?\d+\.\d+"
_DIFF = re.compile(rf"IQM difference in normalised (?P<what>[^,]+), (?P<a>.+?) - (?P<b>[^:]+): (?P<pt>{_NUM}) "
                   rf"\[(?P<lo>{_NUM}), (?P<hi>{_NUM})\] \(95% stratified bootstrap CI; (?P<na>\d+) vs (?P<nb>\d+) "
                   r"seeds x (?P<ne>\d+) env")
_RATIO = re.compile(rf"IQM ratio of calibration loss, [^:]*: (?P<pt>{_NUM}) \[(?P<lo>{_NUM}), (?P<hi>{_NUM})\] "
                    r"over (?P<n>\d+) runs")
_MARGIN = re.compile(r"margin (\d+(?:\.\d+)?)% of each env")
_KEYS = {"final return": "final", "area under the learning curve": "auc",
         "area under the first 25% of the learning curve": "early_auc"}
_UNTESTABLE = ("needs '", "no sparse-reward env")  # the old reports' words for a claim they could not test


@dataclass
class Row:
    folder: str                   # the results folder (the one holding stats.json), as found under DIR
    statement: str
    envs: list[str]
    entries: list[str]
    seeds: list[int]              # finished seeds of each entry (runs, for an old ratio claim)
    tuned: str                    # yes | no | only X
    estimate: list[float] | None  # [point, lo, hi] as stored
    ratio: bool                   # the estimate is a ratio (the calibration loss), not a difference
    p_holm: float | None          # as stored
    verdict: str                  # as stored
    rule: str                     # the rule the stored verdict was made under (RULES)
    today: str | None = None      # today's verdict; None where it cannot be recomputed
    today_p: str = ""             # the Holm-corrected p-value that decided it
    archived: bool = False
    part_of: str | None = None    # the merged report (`reflectrl report PART... --out`) this report is a part of
    raw_effect: float | None = None  # today's IQM difference of raw returns (one env), method - baseline
    also: list[str] = field(default_factory=list)  # the other reports holding this row's very runs (merged here)
    runs_key: tuple | None = field(default=None, repr=False, compare=False)  # the row's per-run scores, for merging


@dataclass
class Ledger:
    command: str
    rows: list[Row] = field(default_factory=list)
    untestable: dict[str, list[str]] = field(default_factory=dict)  # folder -> "statement (needs X)"
    not_recomputed: dict[str, str] = field(default_factory=dict)    # folder -> why today's verdicts are missing

    def to_dict(self) -> dict:
        rows = [{k: v for k, v in asdict(r).items() if k != "runs_key"} for r in self.rows]
        return {"command": self.command, "rows": rows, "untestable": self.untestable,
                "not_recomputed": self.not_recomputed}


# ------------------------------------------------------------------------------- reading

def find_reports(dirs: list[Path]) -> list[Path]:
    """Every stats.json holding claims under the folders (recursively, leaving out any under a
    folder named `archive` inside the folder given), sorted; one line of error for a folder that
    is missing or holds none."""
    found: list[Path] = []
    for d in dirs:
        if not d.exists():
            raise UserError(f"{d} does not exist; give folders holding reports (the --out of 'reflectrl compare', "
                            "or docs/results)")
        if not d.is_dir():
            raise UserError(f"{d} is not a folder; give folders holding reports")
        every = sorted(p for p in d.rglob(STATS_FILE) if p.is_file())
        here = [p for p in every if not _archived(p, d) and _has_claims(p)]
        if not here:
            archived = any(_archived(p, d) for p in every)
            left_out = f" (those under an '{ARCHIVE}' folder are left out)" if archived else ""
            raise UserError(f"no report under {d}: no {STATS_FILE} with claims{left_out} "
                            "(run 'reflectrl report' first)")
        found += [p for p in here if p not in found]
    return found


def _archived(path: Path, d: Path) -> bool:
    """Whether a report lies under a folder named `archive` inside the folder given."""
    return ARCHIVE in path.relative_to(d).parts[:-1]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path}: {err}") from None


def _has_claims(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return True  # said in one line when read
    return isinstance(data, dict) and isinstance(data.get("claims"), list)


def _display(path: Path, dirs: list[Path]) -> str:
    """A folder as found under the DIR given (that DIR's spelling, then the path inside it)."""
    for d in dirs:
        try:
            rel = path.relative_to(d)
        except ValueError:
            continue
        return (d / rel).as_posix()
    return path.as_posix()


def _per_run_scores(data: dict, folder: Path) -> list[dict] | None:
    runs = data.get("runs")
    if isinstance(runs, list) and runs:
        return runs
    path = folder / RUNS_FILE
    if not path.is_file():
        return None
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return rows or None


def stored_ranges(data: dict) -> dict[str, tuple[float, float]]:
    """{env: the observed return range its report stored} (the summary table's env_range)."""
    ranges: dict[str, tuple[float, float]] = {}
    for row in data.get("table", []):
        if isinstance(row, dict) and isinstance(row.get("env_range"), list) and row.get("env") not in ranges:
            ranges[row["env"]] = (float(row["env_range"][0]), float(row["env_range"][1]))
    return ranges


def _float(x) -> float:
    try:
        return float(x) if x not in (None, "") else math.nan
    except (TypeError, ValueError):
        return math.nan


# ------------------------------------------------------------------------------- tuned

def _tuned_algos(folder: Path) -> set[str] | None:
    """The algos tuned for the report in `folder`; None for "every entry" (a sweep's re-run)."""
    exp = folder.parent if folder.name == "report" else folder
    if exp.name == "best" and (exp.parent / "best.json").is_file() and (exp.parent / "sweep.json").is_file():
        return None
    algos: set[str] = set()
    for where in dict.fromkeys((folder, exp, exp.parent)):
        for best in sorted(where.glob("sweeps/*/best.json")):
            data = _read_json(best)
            if isinstance(data, dict) and data.get("algo"):
                algos.add(str(data["algo"]))
    return algos


def _tuned_text(entries: list[str], tuned: set[str] | None) -> str:
    if tuned is None:
        return "yes"
    hit = [e for e in entries if e in tuned]
    return "no" if not hit else "yes" if len(hit) == len(entries) else "only " + ", ".join(hit)


# ------------------------------------------------------------------------------- one report

@dataclass
class _Parsed:
    index: int              # the claim's place in stats.json's list
    claim: dict
    envs: list[str]
    entries: list[str]
    seeds: list[int]
    estimate: list[float] | None
    ratio: bool
    key: str | None         # the per-run score a difference is of (final, auc, early_auc)
    margin: float | None    # non-inferiority's margin (a share of each env's range)


def _canonical(algo: str) -> str | None:
    from reflectrl.registry import parse_algo

    try:
        return parse_algo(algo).name
    except UserError:
        return None


def _testable(claim: dict, spec: dict) -> bool:
    if "missing" in claim:
        return not claim["missing"]
    if claim.get("verdict") != "not tested":
        return True
    evidence = str(claim.get("evidence", ""))
    if evidence.startswith(_UNTESTABLE):
        return False
    if evidence.startswith("no refgrpo run logged"):  # the old words; untestable where there is no refgrpo
        return _has(spec, "refgrpo")
    return True


def _has(spec: dict, algo: str) -> bool:
    from reflectrl.experiments.spec import parse_algos

    want = _canonical(algo)
    try:
        return any(e.label == algo or e.canonical == want for e in parse_algos(",".join(spec.get("algos", []))))
    except UserError:
        return False


def _old_needs(claim: dict, spec: dict) -> str:
    """What an old report's untestable claim lacked, in today's words ("refgrpo, ppo")."""
    evidence = str(claim.get("evidence", ""))
    if evidence.startswith("no sparse-reward env"):
        return "a sparse-reward env"
    wanted = re.findall(r"'([^']+)'", evidence) if evidence.startswith("needs '") else ["refgrpo"]
    return ", ".join(a for a in wanted if not _has(spec, a)) or ", ".join(wanted)


def _parse(index: int, claim: dict, spec: dict) -> _Parsed:
    evidence = str(claim.get("evidence", ""))
    envs_all = list(spec.get("envs", []))
    statement = str(claim.get("statement", ""))
    margin = None
    m = _MARGIN.search(statement)
    if ">=" in statement:
        margin = float(m.group(1)) / 100 if m else 0.0
    diff, ratio = _DIFF.search(evidence), _RATIO.search(evidence)
    estimate = claim.get("estimate")
    if ratio:
        envs = claim.get("envs") or envs_all
        seeds = claim.get("seeds") or [min(int(ratio.group("n")), int(spec.get("seeds", 0)) or int(ratio.group("n")))]
        entries = claim.get("entries") or [_refgrpo_label(spec)]
        est = estimate or [float(ratio.group(g)) for g in ("pt", "lo", "hi")]
        return _Parsed(index, claim, list(envs), [e for e in entries if e], list(seeds), est, True, None, margin)
    if diff:
        key = _KEYS.get(diff.group("what"))
        sparse = statement.startswith("Shaping (SDRS)")
        wrapper = str(spec.get("wrapper") or "")
        envs = claim.get("envs") or [e for e in envs_all if not sparse or e.startswith(SPARSE_ENV_PREFIXES)
                                     or wrapper.startswith(("sparse", "delayed"))]
        if not claim.get("envs") and len(envs) != int(diff.group("ne")):
            envs = []  # the spec does not say which envs: not recomputed
        entries = claim.get("entries") or [diff.group("a"), diff.group("b")]
        seeds = claim.get("seeds") or [int(diff.group("na")), int(diff.group("nb"))]
        est = estimate or [float(diff.group(g)) for g in ("pt", "lo", "hi")]
        return _Parsed(index, claim, list(envs), list(entries), list(seeds), est, False, key, margin)
    named = re.search(r"seeds of '(.+?)' and of '(.+?)'", evidence)  # a claim without enough seeds then
    entries = claim.get("entries") or (list(named.groups()) if named else [])
    return _Parsed(index, claim, list(claim.get("envs") or []), list(entries), list(claim.get("seeds") or []),
                   estimate, False, None, margin)


def _refgrpo_label(spec: dict) -> str:
    from reflectrl.experiments.spec import parse_algos

    want = _canonical("refgrpo")
    try:
        entries = parse_algos(",".join(spec.get("algos", [])))
    except UserError:
        return ""
    same = sorted((e for e in entries if e.canonical == want), key=lambda e: bool(e.overrides))
    return same[0].label if same else ""


def _rule_of(claim: dict) -> str:
    if "p_against_holm" in claim:
        return RULES["today"]
    return RULES["holm"] if "p_holm" in claim else RULES["old"]


class _Stored(_Test):
    """A claim in the Holm families whose data the report does not keep: its stored p-values."""

    def __init__(self, statement: str, p: tuple[float, float, float]):
        super().__init__(statement, math.nan, [None] * len(stats.VERDICT_SEEDS), lambda ci: "inconclusive",
                         0.0, True, lambda ci: "")
        self.fixed = p

    def ci(self, j):
        return math.nan, math.nan, math.nan

    def p_for(self, j):
        return self.fixed[0]

    def p_against(self, j):
        return self.fixed[1]

    def p_equiv(self, j):
        return self.fixed[2]


def _stored_p(claim: dict) -> tuple[float, float, float]:
    p = claim.get("p_value")
    against = claim.get("p_against", None if p is None else 1.0 - p)
    equiv = claim.get("p_equiv")
    return (1.0 if p is None else p, 1.0 if against is None else against, 1.0 if equiv is None else equiv)


def _matrix(runs: list[dict], label: str, key: str, envs: list[str], ranges: dict[str, tuple[float, float]] | None):
    """(seeds, envs) scores of one entry, the seeds finished and scored in every env: normalised by
    each env's fixed reference, else its stored observed range (analysis.env_range); raw where
    `ranges` is None."""
    per_env = []
    for env in envs:
        lo, hi = references.norm_range(env, ranges[env]) if ranges is not None else (0.0, 1.0)
        values = {}
        for r in runs:
            if r.get("env") == env and r.get("algo") == label and r.get("status") == "finished":
                v = _float(r.get(key))
                if math.isfinite(v):
                    values[int(_float(r.get("seed")))] = (v - lo) / (hi - lo)
        per_env.append(values)
    seeds = sorted(set.intersection(*(set(v) for v in per_env))) if per_env else []
    return np.array([[v[s] for v in per_env] for s in seeds], dtype=float).reshape(len(seeds), len(envs))


SCORE_COLUMNS = ("final", "auc", "early_auc", "unique_states_total", "first_reward_step")  # a run's fingerprint


def _entry_runs(runs: list[dict], label: str, envs: list[str]) -> list[dict]:
    return [r for r in runs if r.get("algo") == label and r.get("env") in envs and r.get("status") == "finished"]


def _identical(runs: list[dict], entries: list[str], envs: list[str]) -> str:
    """The words of identical runs where the two entries' runs are the same seed by seed: equal
    params_sha256 where every run keeps one, else equal per-run scores (every score column); "" otherwise."""
    a, b = (_entry_runs(runs, label, envs) for label in entries)
    if all(r.get("params_sha256") for r in a + b):
        def hashes(rs):
            return {(r["env"], str(r.get("seed"))): r["params_sha256"] for r in rs}
        return SAME_HASHES if same_runs(hashes(a), hashes(b)) else ""

    def scores(rs):
        return {(r["env"], str(r.get("seed"))): tuple(_round(r.get(k)) for k in SCORE_COLUMNS) for r in rs}
    return SAME_SCORES if same_runs(scores(a), scores(b)) else ""


def _round(x):
    v = _float(x)
    return None if not math.isfinite(v) else round(v, 9)


def _saw_reward(runs: list[dict], label: str, envs: list[str]) -> bool:
    """Whether any finished run of the entry saw a reward (a first reward step, or a non-zero
    return); True where the report keeps no runs of it (nothing to decide from)."""
    mine = _entry_runs(runs, label, envs)
    if not mine:
        return True
    return any(_float(r.get("first_reward_step")) >= 0 or _float(r.get("auc")) != 0 or _float(r.get("final")) != 0
               for r in mine)


def _raw_effect(runs: list[dict], p: _Parsed) -> float | None:
    """The IQM difference of raw returns, method - baseline, on a one-env claim (None otherwise)."""
    if p.ratio or p.key is None or len(p.entries) != 2 or len(p.envs) != 1:
        return None
    a, b = (_matrix(runs, label, p.key, p.envs, None) for label in p.entries)
    return stats.iqm(a) - stats.iqm(b) if a.size and b.size else None


def _runs_key(runs: list[dict], p: _Parsed) -> tuple | None:
    """The row's claim with its entries' per-run scores: equal keys are one comparison reported twice."""
    if not p.entries or not p.envs:
        return None
    rows = sorted((r["algo"], r["env"], str(r.get("seed")), tuple(_round(r.get(k)) for k in SCORE_COLUMNS))
                  for label in p.entries for r in _entry_runs(runs, label, p.envs))
    return (p.claim["statement"], tuple(p.entries), tuple(p.envs), tuple(rows)) if rows else None


def _today(parsed: list[_Parsed], data: dict, folder: Path, reps: int) -> tuple[dict[int, tuple[str, str]], str]:
    """Today's verdict of each testable claim ({claim index: (verdict, deciding Holm p)}) and,
    where some or all cannot be recomputed, why."""
    out: dict[int, tuple[str, str]] = {}
    few = [p for p in parsed if p.seeds and min(p.seeds) < MIN_SEEDS_FOR_CI]
    for p in few:
        out[p.index] = ("not tested", f"{min(p.seeds)} seeds")
    for p in parsed:
        if p.claim.get("verdict") == "not tested" and p.index not in out:
            out[p.index] = ("not tested", "")  # lacked data then; the seeds asked for only grew
    runs = _per_run_scores(data, folder)
    ranges = stored_ranges(data)
    if runs is None:
        return out, "no per-run scores stored (stats.json has no \"runs\", no runs.csv beside it)"
    if not ranges:
        return out, "the report stored no env ranges to normalise its per-run scores with"
    tests: list[tuple[int, _Test]] = []
    family: list[Claim] = []
    indices: list[int | None] = []  # the claim each test is (None: a stored stand-in)
    why = ""
    for p in parsed:
        if p.index in out:
            continue
        if p.ratio and p.entries and not _saw_reward(runs, p.entries[0], p.envs):
            out[p.index] = (UNTESTABLE, untestable_reason(RATIO, p.envs, saw_reward=False))  # out of the family
            continue
        if p.ratio:
            tests.append((len(family), _Stored(p.claim["statement"], _stored_p(p.claim))))
            family.append(Claim(p.claim["statement"], "", ""))
            indices.append(None)
            why = ("its calibration-loss ratio claim: a report does not keep the runs' per-iteration losses (its "
                   "stored p-values stand in for it in the report's Holm families)")
            continue
        if p.key is None or len(p.entries) != 2 or not p.envs or any(e not in ranges for e in p.envs):
            why = "a claim's entries or envs could not be read from the report"
            continue
        a, b = (_matrix(runs, label, p.key, p.envs, ranges) for label in p.entries)
        if min(a.shape[0], b.shape[0]) < MIN_SEEDS_FOR_CI:
            out[p.index] = ("not tested", f"{min(a.shape[0], b.shape[0])} seeds")
            continue
        raw_a, raw_b = (_matrix(runs, label, p.key, p.envs, None) for label in p.entries)
        kind = NON_INFERIORITY if p.margin is not None else SUPERIORITY
        reason = untestable_reason(kind, p.envs, raw_a, raw_b, _identical(runs, p.entries, p.envs),
                                   margin=p.margin or MARGIN_SHARE)
        if reason:  # decided before any test: out of the report's Holm families
            out[p.index] = (UNTESTABLE, reason)
            continue
        if p.margin is not None:
            decide, null = (lambda ci, m=p.margin: _verdict_non_inferior(ci, m)), -p.margin
        else:
            decide, null = _verdict_greater, 0.0
        samples = [stats.stratified_bootstrap([a, b], stats.iqm_difference, reps, s) for s in stats.VERDICT_SEEDS]
        test = _Test(p.claim["statement"], stats.iqm_difference(a, b), samples, decide, null, True, lambda ci: "")
        tests.append((len(family), test))
        family.append(Claim(p.claim["statement"], "", ""))
        indices.append(p.index)
    _decide(family, tests)
    for c, index in zip(family, indices):
        if index is None:
            continue
        p_text = {"supported": f"p_Holm {c.p_holm:.4f}", "not supported": f"opposite p_Holm {c.p_against_holm:.4f}",
                  "equivalent": f"TOST p_Holm {c.p_equiv_holm:.4f}"}.get(c.verdict, f"p_Holm {c.p_holm:.4f}")
        if not c.stable:
            p_text = "changes with the bootstrap seed"
        out[index] = (c.verdict, p_text)
    return out, why


def _report_rows(path: Path, dirs: list[Path], reps: int) -> tuple[list[Row], list[str], str]:
    data = _read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("claims"), list):
        raise UserError(f"{path} is not a report's stats.json (no claims)")
    folder = path.parent
    spec = data.get("spec") if isinstance(data.get("spec"), dict) else {}
    shown = _display(folder, dirs)
    archived = ARCHIVE in Path(shown).parts
    tuned = _tuned_algos(folder)
    parsed, untestable = [], []
    for i, claim in enumerate(data["claims"]):
        if not isinstance(claim, dict) or "statement" not in claim:
            raise UserError(f"{path}: claim {i + 1} has no statement")
        if _testable(claim, spec):
            parsed.append(_parse(i, claim, spec))
        else:
            untestable.append(f"{claim['statement']} (needs {claim.get('missing') or _old_needs(claim, spec)})")
    today, why = _today(parsed, data, folder, reps)
    runs = _per_run_scores(data, folder) or []
    rows = []
    for p in parsed:
        verdict, p_text = today.get(p.index, (None, ""))
        rows.append(Row(shown, p.claim["statement"], p.envs, p.entries, p.seeds, _tuned_text(p.entries, tuned),
                        p.estimate, p.ratio, p.claim.get("p_holm"), str(p.claim.get("verdict", "")),
                        _rule_of(p.claim), verdict, p_text, archived, raw_effect=_raw_effect(runs, p),
                        runs_key=_runs_key(runs, p)))
    return rows, untestable, why


def _merged_parts(paths: list[Path], dirs: list[Path]) -> dict[Path, str]:
    """{a part's folder (resolved): the merged report's folder as shown} for the merged reports
    among `paths` (their stats.json lists "parts": the folders as given to the merge, relative to
    where it ran; a part is also looked for beside the merged report, by name)."""
    out: dict[Path, str] = {}
    for path in paths:
        data = _read_json(path)
        parts = data.get("parts") if isinstance(data, dict) else None
        if not isinstance(parts, list):
            continue
        for part in parts:
            folder = Path(str(part.get("folder", ""))) if isinstance(part, dict) else None
            if folder is None or not folder.name:
                continue
            for where in (folder, path.parent.parent / folder.name):
                if where.is_dir():
                    out[where.resolve()] = _display(path.parent, dirs)
                    break
    return out


def build_ledger(dirs: list[Path], command: str, reps: int = stats.BOOTSTRAP_REPS) -> Ledger:
    dirs = [Path(d) for d in dirs]
    ledger = Ledger(command)
    paths = find_reports(dirs)
    merged = _merged_parts(paths, dirs)
    for path in paths:
        rows, untestable, why = _report_rows(path, dirs, reps)
        part_of = merged.get(path.parent.resolve())
        for row in rows:
            row.part_of = part_of
        ledger.rows += rows
        shown = _display(path.parent, dirs)
        if untestable:
            ledger.untestable[shown] = untestable
        if why and rows:
            ledger.not_recomputed[shown] = why
    ledger.rows = merge_duplicates(ledger.rows)
    return ledger


def merge_duplicates(rows: list[Row]) -> list[Row]:
    """One row for a claim that several reports test on the very same runs (identical per-run
    scores of its entries: a report re-made, or re-run with the same seeds and code), the first
    report's, naming the others in `also`; rows of different sections (current, parts, archived)
    are not merged with each other."""
    first: dict[tuple, Row] = {}
    out = []
    for row in rows:
        key = None if row.runs_key is None else (row.archived, row.part_of, row.runs_key)
        if key is not None and key in first:
            first[key].also.append(row.folder)
            continue
        if key is not None:
            first[key] = row
        out.append(row)
    return out


# ------------------------------------------------------------------------------- writing

def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _effect(row: Row) -> str:
    if not row.estimate or any(x is None for x in row.estimate):
        return NONE
    pt, lo, hi = row.estimate
    return f"{pt:.3f} [{lo:.3f}, {hi:.3f}]" if row.ratio else f"{pt:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _seeds(row: Row) -> str:
    return " / ".join(str(s) for s in row.seeds) or NONE


def _today_cell(row: Row) -> str:
    if row.today is None:
        return NONE
    mark = f" {DIFFERS}" if row.today != row.verdict else ""
    if row.today == UNTESTABLE:
        return f"{row.today_p}{mark}"  # the reason in words: "untestable: both at the floor"
    return f"{row.today}{mark}" + (f" ({row.today_p})" if row.today_p else "")


def _raw(row: Row) -> str:
    return NONE if row.raw_effect is None or not math.isfinite(row.raw_effect) else f"{row.raw_effect:+.4g}"


def _link(folder: str, base: Path | None) -> str:
    """The results folder, linked to its report.md where it has one."""
    name = Path(folder).name
    target = Path(folder) / "report.md" if (Path(folder) / "report.md").is_file() else Path(folder)
    return f"[{name}]({Path(os.path.relpath(target, base) if base is not None else target).as_posix()})"


HEADER = """# Claims ledger

Generated by `{command}`: every claim of every report (`stats.json`) under {dirs}, one row each.
Do not edit it by hand; a test regenerates it and compares. Reports under a folder named
`archive` (results withdrawn or superseded, kept for history) are left out.

Stats from old reports were made under the statistics of their time, as their provenance says
(the report's `provenance.json`, and the *rule* column): **verdict**, **Holm p** and **effect**
are the report's own. *before Holm*: 2,000 bootstrap resamples, one bootstrap seed, no
correction for testing several claims (no p-values stored); *Holm on 'supported' only*:
50,000 resamples, each verdict re-taken at bootstrap seeds 0-4, 'supported' Holm-corrected
but 'not supported' not, and given to exact ties too; *today's*: the rule below.

**today**: the verdict under today's rule, recomputed from the per-run scores the report
keeps (`runs` in stats.json, or runs.csv) at 50,000 resamples and bootstrap seeds 0-4, Holm
over the claims its report tests together. Today's rule (`reflectrl.report.analysis`,
docs/evidence.md): *supported* and *not supported* (the opposite shown) each need the 95% CI
on their side and their own one-sided p below 0.025 after Holm's correction; a difference
that is neither is *equivalent* only where a TOST puts it within +-5% of each env's range
(a ratio within +-5% of 1) at 0.05 after Holm, else *inconclusive*; fewer than 5 seeds of
an entry is *not tested*. {differs} marks a verdict that differs from the stored one; {none}
where it cannot be recomputed (the reports without per-run scores, and the calibration-loss
ratio, whose per-iteration losses a report does not keep: its stored p-values stand in for
it in its report's Holm families). Under 5 seeds a claim is *not tested* today whether or
not its per-run scores are kept. Today's scores are normalised by each env's fixed reference
(0 at its floor, 1 at its ceiling: `reflectrl.report.references`, docs/evidence.md's "Fixed
references"), by the report's observed return range only for an env with none.

*untestable* (today): decided from the per-run scores before any test, and left out of the
Holm families and of the supported / equivalent counts, where the data cannot inform the
claim; the cell says why: *both at the floor* / *both at the ceiling* (both entries' IQMs
within the margin, 5% of ceiling - floor, of the reference's floor or ceiling), *no spread in either entry*
(every run of both scores the same), *the baseline is at the floor (non-inferiority)*, *the
baseline is at the ceiling (superiority)*, *identical runs* (equal parameter hashes, or,
where a report keeps none, equal per-run scores), *no run saw a reward (calibration loss)*.
Rows of reports holding the very same runs (the same per-run scores of the claim's entries)
are one row naming every such report.

**effect [95% CI]**: the IQM difference of normalised scores, method - baseline, as the report
stored it (an older report normalised each env by its observed return range; final return,
AUC or early AUC as the claim says), or the calibration loss's ratio, last 10% / first 10% of
training. **raw effect**: the IQM difference of raw returns, from the per-run scores (one-env
claims). **seeds**: finished seeds
of each entry (runs, for an older report's ratio). **tuned**: from files beside the report:
*yes* where each entry's knobs came from a sweep (a `sweeps/*/best.json` per entry, as
examples/experiments/tuned_vs_tuned.py leaves, or a `reflectrl sweep` re-run), *only X* where some did, *no*
otherwise.
"""

COLUMNS = ["claim", "env(s)", "entries", "seeds", "tuned", "effect [95% CI]", "raw effect", "Holm p", "verdict",
           "rule", "today", "results"]


def _table(rows: list[Row], base: Path | None) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [r.statement, ", ".join(r.envs) or NONE,
                 (" vs ".join(r.entries) if len(r.entries) == 2 else ", ".join(r.entries)) or NONE,
                 _seeds(r), r.tuned, _effect(r), _raw(r), NONE if r.p_holm is None else f"{r.p_holm:.4f}",
                 f"**{r.verdict}**", r.rule, _today_cell(r),
                 ", ".join(_link(f, base) for f in [r.folder, *r.also])
                 + (" (the same runs: one row)" if r.also else "")]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _counts(rows: list[Row], attr: str) -> str:
    words = [getattr(r, attr) for r in rows if getattr(r, attr) is not None]
    order = ["supported", "not supported", "equivalent", "inconclusive", "not tested", UNTESTABLE]
    return ", ".join(f"{words.count(w)} {w}" for w in order if words.count(w))


def to_markdown(ledger: Ledger, dirs: list[str], base: Path | None = None) -> str:
    """The ledger as Markdown; links relative to `base` (the --out file's folder), else as found."""
    md = [HEADER.format(command=ledger.command, dirs=", ".join(f"`{d}`" for d in dirs), differs=DIFFERS,
                        none=NONE).rstrip(), ""]
    current = [r for r in ledger.rows if not r.archived and r.part_of is None]
    parts = [r for r in ledger.rows if not r.archived and r.part_of is not None]
    archived = [r for r in ledger.rows if r.archived]
    reports = len({f for r in current for f in [r.folder, *r.also]})
    merged = sum(len(r.also) for r in current)
    untestable = [r for r in current if r.today == UNTESTABLE]
    reasons = {}
    for r in untestable:
        reasons[r.today_p] = reasons.get(r.today_p, 0) + 1
    md += [f"{len(current)} claims in {reports} reports (the claims each report could test"
           + (f"; {merged} rows of reports holding the same runs merged into the rows that name them" if merged
              else "") + "). "
           f"Stored: {_counts(current, 'verdict')}. "
           f"Today: {_counts(current, 'today')}; {sum(r.today is None for r in current)} not recomputed; "
           f"{sum(r.today is not None and r.today != r.verdict for r in current)} differ ({DIFFERS}).", ""]
    if untestable:
        md += [f"{len(untestable)} untestable today, decided before any test and left out of the Holm families and "
               "of the supported / equivalent counts: "
               + "; ".join(f"{n} {reason.removeprefix(UNTESTABLE + ': ')}" for reason, n in reasons.items()) + ".", ""]
    md += _table(current, base)
    if parts:
        merged = ", ".join(_link(m, base) for m in dict.fromkeys(r.part_of for r in parts))
        md += ["", "## Parts of merged reports", "",
               f"The reports of experiments run in parts, each on its own share of the runs; their claims over "
               f"all the parts are the rows of the merged report ({merged}) above.", ""] + _table(parts, base)
    if archived:
        md += ["", "## Archived reports (superseded or withdrawn)", ""] + _table(archived, base)
    if ledger.not_recomputed:
        md += ["", "## Where today's verdict is not recomputed", ""]
        md += [f"- {_link(folder, base)}: {why}" for folder, why in ledger.not_recomputed.items()]
    if ledger.untestable:
        md += ["", "## Claims a report could not test (an entry or env missing)", ""]
        md += [f"- {_link(folder, base)}: " + "; ".join(items) for folder, items in ledger.untestable.items()]
    return "\n".join(md) + "\n"


def command_line(dirs: list[str], out: str | None, as_json: bool) -> str:
    argv = ["reflectrl", "claims", *dirs] + (["--json"] if as_json else []) + (["--out", out] if out else [])
    return shlex.join(argv)


def run(dirs: list[str], out: str | None = None, as_json: bool = False) -> str:
    """`reflectrl claims`: the ledger's text (Markdown, or JSON with as_json); with `out`, also
    written there atomically (the folder must exist)."""
    from reflectrl.outputs import check_writable
    from reflectrl.runs.jsonfile import dumps
    from reflectrl.runs.rundir import atomic_write_bytes

    target = check_writable(out, "--out") if out else None
    if target is not None and target.suffix.lower() != (".json" if as_json else ".md"):
        raise UserError(f"--out {out}: give a {'.json' if as_json else '.md'} file")
    ledger = build_ledger([Path(d) for d in dirs], command_line(dirs, out, as_json))
    if as_json:
        text = dumps(ledger.to_dict(), indent=2, ensure_ascii=False) + "\n"
    else:
        text = to_markdown(ledger, dirs, target.parent if target is not None else None)
    if target is not None:
        atomic_write_bytes(target, text.encode())
    return text
