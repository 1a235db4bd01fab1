"""Issue 59: the "untestable" verdict (decided before any test, left out of the Holm families, its
reason in words), the fixed references scores are normalised by, "solved" from final returns,
and the claims ledger merging reports that hold the same runs."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_report_claims import make_experiment

from reflectrl.report import claims as ledger
from reflectrl.report import references, stats
from reflectrl.report.analysis import (
    NON_INFERIORITY,
    RATIO,
    SAME_HASHES,
    SUPERIORITY,
    TWO_SIDED,
    evaluate_claims,
    load_experiment,
    solved_count,
    summary_table,
    untestable_reason,
)

GRID = "reflectrl/GridWorld-v0"
REPS = 200


def col(*values):
    return np.array(values, dtype=float)[:, None]


SPREAD = col(0.3, 0.5, 0.4, 0.6, 0.45)


@pytest.mark.parametrize("kind, method, base, identical, reason", [
    (SUPERIORITY, col(0.0, 0.01, 0.0, 0.03, 0.0), col(0, 0, 0, 0, 0.02), "", "both at the floor"),
    (SUPERIORITY, col(0.97, 0.96, 1.0, 0.98, 0.99), col(0.96, 0.97, 0.96, 0.99, 1.0), "", "both at the ceiling"),
    (TWO_SIDED, col(0.5, 0.5, 0.5, 0.5, 0.5), col(0.5, 0.5, 0.5, 0.5, 0.5), "", "no spread in either entry"),
    (NON_INFERIORITY, SPREAD, col(0, 0, 0, 0, 0), "", "the baseline is at the floor (non-inferiority)"),
    (SUPERIORITY, SPREAD, col(1, 1, 0.97, 0.99, 1), "", "the baseline is at the ceiling (superiority)"),
    (SUPERIORITY, SPREAD, SPREAD + 0.1, SAME_HASHES, "identical runs (equal parameter hashes)"),
])
def test_each_untestable_case_is_named_in_words(kind, method, base, identical, reason):
    assert untestable_reason(kind, [GRID], method, base, identical) == f"untestable: {reason}"


def test_an_informative_comparison_is_testable():
    assert untestable_reason(SUPERIORITY, [GRID], SPREAD, SPREAD - 0.2) == ""
    # the baseline at the floor only matters to non-inferiority; at the ceiling only to superiority
    assert untestable_reason(SUPERIORITY, [GRID], SPREAD, col(0, 0, 0, 0, 0)) == ""
    assert untestable_reason(NON_INFERIORITY, [GRID], SPREAD, col(1, 1, 1, 0.98, 1)) == ""
    # two constant entries far apart are a real difference, not "no spread"
    assert untestable_reason(SUPERIORITY, [GRID], col(1, 1, 1, 1, 1), col(0.5, 0.5, 0.5, 0.5, 0.5)) == ""
    # an env with no fixed reference has no floor or ceiling to be at
    assert untestable_reason(SUPERIORITY, ["Acrobot-v1"], col(-500, -500, -499, -500, -500), col(-500) * 0 - 500) == ""
    # several envs: untestable only where every env is
    two = np.hstack([col(0, 0, 0, 0, 0), SPREAD])
    assert untestable_reason(SUPERIORITY, [GRID, "MiniGrid-DoorKey-5x5-v0"], two, two * 0) == ""
    assert untestable_reason(RATIO, [GRID], saw_reward=True) == ""
    assert untestable_reason(RATIO, [GRID], saw_reward=False) == "untestable: no run saw a reward (calibration loss)"


def _hash_runs(root: Path, label: str, same_as: str):
    """Give the entry's runs the parameter hashes of another entry's runs, seed by seed (bit-identical runs)."""
    for run_json in root.glob(f"runs/*/{same_as}/seed*/run.json"):
        for path, entry in ((run_json, same_as), (Path(str(run_json).replace(f"/{same_as}/", f"/{label}/")), label)):
            data = json.loads(path.read_text())
            data["params_sha256"] = f"hash-{run_json.parent.name}"
            path.write_text(json.dumps(data))


def test_untestable_claims_are_left_out_of_holm_and_a_real_effect_keeps_its_verdict(tmp_path):
    rng = np.random.default_rng(0)
    slow = [[0.0] * 10 + list(0.5 + 0.05 * rng.standard_normal(10)) for _ in range(5)]
    fast = [list(0.5 + 0.05 * rng.standard_normal(20)) for _ in range(5)]
    root = make_experiment(tmp_path / "exp", {"ppo": slow, "refgrpo": fast, "gear": slow})
    assert next(root.glob("runs/*/gear/seed1/run.json")).is_file()
    _hash_runs(root, "gear", "ppo")  # gear's runs are ppo's: equal parameter hashes
    claims = {c.statement: c for c in evaluate_claims(load_experiment(root), reps=REPS)}
    gear = claims["GEAR beats the baseline"]
    assert gear.verdict == "untestable" and gear.untestable == "untestable: identical runs (equal parameter hashes)"
    assert gear.p_value is None and gear.p_holm is None and gear.evidence.startswith(gear.untestable)
    early = claims["RefGRPO learns faster early than PPO"]
    final = next(c for s, c in claims.items() if s.startswith("RefGRPO's final return >= PPO's"))
    assert early.verdict == "supported" and final.verdict in ("supported", "inconclusive", "equivalent")
    # Holm over the 2 claims tested, not 3: the untestable one is no part of the family
    assert "Holm-corrected over the 2 claims tested" in early.evidence
    assert [early.p_holm, final.p_holm] == stats.holm([early.p_value, final.p_value])
    assert early.raw_difference is not None and early.raw_difference[0] > 0.1


def test_the_summary_table_leaves_untestable_comparisons_out_of_its_family(tmp_path):
    rng = np.random.default_rng(1)
    zero = [[0.0] * 20] * 5
    some = [list(np.clip(0.02 + 0.01 * rng.standard_normal(20), 0, 1)) for _ in range(5)]
    good = [list(0.9 + 0.02 * rng.standard_normal(20)) for _ in range(5)]
    root = make_experiment(tmp_path / "exp", {"ppo": zero, "ppo+rnd": some, "ppo+count": good})
    rows = {r["algo"]: r for r in summary_table(load_experiment(root), reps=REPS)}
    assert rows["ppo+rnd"]["vs_ppo"] == "untestable"
    assert rows["ppo+rnd"]["vs_ppo_untestable"] == "untestable: both at the floor"
    assert rows["ppo+count"]["vs_ppo"] == "better" and rows["ppo+count"]["vs_ppo_tests"] == 1
    assert rows["ppo+count"]["solved"] == 5 and rows["ppo+rnd"]["solved"] == 0
    assert rows["ppo"]["norm_range"] == [0.0, 1.0] and rows["ppo+count"]["vs_ppo_diff_normalised"] > 0.8


def test_fixed_references_and_solved():
    grid = references.reference_for("MiniGrid-DoorKey-16x16-v0")
    assert (grid.floor, grid.ceiling, grid.solved) == (0.0, 1.0, 0.8)
    for env in ("navix:Navix-DoorKey-Random-8x8-v0", "xminigrid:MiniGrid-DoorKey-5x5", "reflectrl:GridWorld-v0",
                "BabyAI-GoToLocal-v0", GRID):
        assert references.reference_for(env) is grid
    assert references.reference_for("CartPole-v1").range == (0.0, 500.0)
    lunar = references.reference_for("LunarLander-v3")
    assert lunar.ceiling == 200.0 and -200 < lunar.floor < -170
    assert references.reference_for("HalfCheetah-v5").solved is None
    assert references.reference_for("Acrobot-v1") is None
    assert references.norm_range("Acrobot-v1", (-500.0, -80.0)) == (-500.0, -80.0)
    assert references.norm_range("Acrobot-v1", (3.0, 3.0)) == (3.0, 4.0)
    assert references.norm_range("MiniGrid-DoorKey-16x16-v0", (0.0, 0.166)) == (0.0, 1.0)
    assert "no fixed reference" in references.describe("Acrobot-v1", (-500.0, -80.0))
    # solved: final returns at the solved score; a relative threshold would call 0.04 solved on DoorKey-16x16
    assert solved_count("MiniGrid-DoorKey-16x16-v0", [0.04, 0.79, 0.8, 0.95]) == 2
    assert solved_count("HalfCheetah-v5", [5000.0]) is None


def _run(env, algo, seed, final, auc=None, **more):
    return {"env": env, "algo": algo, "seed": seed, "status": "finished", "final": final,
            "auc": final if auc is None else auc, "early_auc": final, **more}


def _report(folder: Path, claims: list[dict], runs: list[dict], algos=("ppo", "gear")) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = {"spec": {"envs": [GRID], "algos": list(algos), "seeds": 5, "total_steps": 1000, "wrapper": None,
                     "sets": []},
            "table": [{"env": GRID, "algo": a, "seeds": 5, "env_range": [0.0, 1.0]} for a in algos],
            "claims": claims, "runs": runs}
    (folder / "stats.json").write_text(json.dumps(data))
    return folder


def _gear_claim(verdict="supported"):
    return {"statement": "GEAR beats the baseline", "verdict": verdict, "p_value": 0.0, "p_holm": 0.0,
            "p_against": 1.0, "p_against_holm": 1.0, "p_equiv": 1.0, "p_equiv_holm": 1.0,
            "entries": ["gear", "ppo"], "envs": [GRID], "seeds": [5, 5], "estimate": [0.01, 0.0, 0.02],
            "evidence": "IQM difference in normalised final return, gear - ppo: +0.010 [+0.000, +0.020] (95% "
                        "stratified bootstrap CI; 5 vs 5 seeds x 1 env(s))"}


def _ratio_claim():
    return {"statement": "RefGRPO's calibration loss falls and settles", "verdict": "supported", "p_value": 0.0,
            "p_holm": 0.0, "p_against": 1.0, "p_against_holm": 1.0, "p_equiv": 1.0, "p_equiv_holm": 1.0,
            "entries": ["refgrpo"], "envs": [GRID], "seeds": [5], "estimate": [0.5, 0.4, 0.6],
            "evidence": "IQM ratio of calibration loss, last 10% / first 10% of training: 0.500 [0.400, 0.600] "
                        "over 5 runs"}


def test_the_ledger_says_why_a_row_is_untestable_and_counts_it(tmp_path):
    floor = [_run(GRID, a, s, 0.01 * (s % 2)) for a in ("ppo", "gear") for s in range(1, 6)]
    floor += [_run(GRID, "refgrpo", s, 0.0) for s in range(1, 6)]  # no reward ever: no first_reward_step, 0s
    _report(tmp_path / "floor", [_gear_claim(), _ratio_claim()], floor, algos=("ppo", "gear", "refgrpo"))
    built = ledger.build_ledger([tmp_path], "reflectrl claims X", reps=500)
    rows = {r.statement: r for r in built.rows}
    gear, ratio = rows["GEAR beats the baseline"], rows["RefGRPO's calibration loss falls and settles"]
    assert (gear.today, gear.today_p) == ("untestable", "untestable: both at the floor")
    assert (ratio.today, ratio.today_p) == ("untestable", "untestable: no run saw a reward (calibration loss)")
    md = ledger.to_markdown(built, [str(tmp_path)], tmp_path)
    assert "2 untestable" in md and "1 both at the floor; 1 no run saw a reward (calibration loss)." in md
    assert "| untestable: both at the floor ≠ |" in md


def test_the_ledger_merges_reports_holding_the_same_runs(tmp_path):
    rng = np.random.default_rng(2)
    runs = [_run(GRID, "ppo", s, float(v)) for s, v in enumerate(0.3 + 0.1 * rng.random(5), 1)]
    runs += [_run(GRID, "gear", s, float(v)) for s, v in enumerate(0.6 + 0.1 * rng.random(5), 1)]
    first = _report(tmp_path / "gear-grid", [_gear_claim()], runs)
    shutil.copytree(first, tmp_path / "gear-grid-recheck")
    other = [{**r, "final": r["final"] + 0.001} if r["algo"] == "gear" else r for r in runs]
    _report(tmp_path / "gear-grid-other", [_gear_claim()], other)
    built = ledger.build_ledger([tmp_path], "reflectrl claims X", reps=500)
    assert len(built.rows) == 2  # the re-check is one row with its first report; different runs stay apart
    (merged,) = [r for r in built.rows if r.also]
    assert Path(merged.folder).name == "gear-grid" and [Path(f).name for f in merged.also] == ["gear-grid-recheck"]
    assert merged.today == "supported" and merged.raw_effect == pytest.approx(
        stats.iqm(np.array([r["final"] for r in runs[5:]])) - stats.iqm(np.array([r["final"] for r in runs[:5]])))
    md = ledger.to_markdown(built, [str(tmp_path)], tmp_path)
    line = next(x for x in md.splitlines() if "gear-grid-recheck" in x)
    assert "[gear-grid](gear-grid), [gear-grid-recheck](gear-grid-recheck) (the same runs: one row)" in line
    assert "2 claims in 3 reports" in md and "1 rows of reports holding the same runs merged" in md
    assert "rows" in built.to_dict() and "runs_key" not in built.to_dict()["rows"][0]
