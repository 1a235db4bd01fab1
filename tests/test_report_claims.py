"""The claims of a report: each rule on hand-made intervals (boundaries included), each claim
on small fake experiments with known verdicts, the symmetric verdict rule (Holm on both sides,
a tie "equivalent" only through the TOST), the claims an experiment cannot test, and no claim
verdict under 5 seeds."""

import html
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from reflectrl.experiments.spec import SPEC_FILE, ExperimentSpec
from reflectrl.report.analysis import (
    MIN_SEEDS_FOR_CI,
    _verdict_falls,
    _verdict_greater,
    _verdict_non_inferior,
    evaluate_claims,
    load_experiment,
    summary_table,
)
from reflectrl.report.render import claims_text, write_report

ENV = "reflectrl/GridWorld-v0"
REPS = 200


@pytest.fixture(autouse=True)
def observed_ranges(monkeypatch):
    """These tests check the verdict rule on made-up returns (10 on a grid world that pays at most 1):
    every env is normalised by its observed range, as for an env with no fixed reference
    (tests/test_untestable.py checks the references and the untestable rule)."""
    from reflectrl.report import references

    monkeypatch.setattr(references, "REFERENCES", ())


def make_experiment(root, curves, envs=(ENV,), total_steps=1000, wrapper=None, extra=None):
    """Write a finished experiment without training anything.

    curves: {algo entry: [one curve per seed]}, the same for every env; a curve is a number
    (a flat return) or a list of returns logged at evenly spaced steps. An entry with fewer
    curves than the experiment has seeds misses the last seeds' runs.
    extra: {algo entry: [per seed, a list of dicts merged into that run's rows in order]}."""
    seeds = max(len(c) for c in curves.values())
    spec = ExperimentSpec(envs=list(envs), algos=list(curves), seeds=seeds, total_steps=total_steps, wrapper=wrapper)
    root.mkdir(parents=True, exist_ok=True)
    (root / SPEC_FILE).write_text(json.dumps(spec.to_dict()))
    for run in spec.runs(root):
        per_seed = curves[run.entry.label]
        if run.seed > len(per_seed):
            continue
        curve = per_seed[run.seed - 1]
        curve = [curve] * 20 if isinstance(curve, (int, float)) else list(curve)
        more = (extra or {}).get(run.entry.label, [[]] * seeds)[run.seed - 1]
        rows = []
        for i, value in enumerate(curve):
            row = {"global_step": (i + 1) * total_steps // len(curve), "iteration": i + 1,
                   "episodic_return": float(value), "episodes": 1, "entropy": 1.0 - i / len(curve)}
            if i < len(more):
                row.update(more[i])
            rows.append(row)
        run.path.mkdir(parents=True)
        (run.path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        command = ["reflectrl", "train", *run.argv]
        (run.path / "run.json").write_text(json.dumps({"status": "finished", "command": command}))
        (run.path / "config.json").write_text(json.dumps({"algo": run.entry.algo, "env_id": run.env_id,
                                                          "seed": run.seed}))
    return root


def claims_of(root) -> dict:
    return {c.statement: c for c in evaluate_claims(load_experiment(root), reps=REPS)}


def claim(root, prefix):
    (match,) = [c for s, c in claims_of(root).items() if s.startswith(prefix)]
    return match


# ---------------------------------------------------------------------------- the rules

@pytest.mark.parametrize("ci, verdict", [
    ((0.2, 0.05, 0.3), "supported"),
    ((0.1, 1e-9, 0.2), "supported"),
    ((0.1, 0.0, 0.2), "inconclusive"),       # lower end on 0: not shown to be above
    ((0.0, 0.0, 0.0), "inconclusive"),       # every seed tied: neither side shown (a tie is the TOST's)
    ((-0.1, -0.2, 0.0), "inconclusive"),     # upper end on 0: not shown to be below
    ((-0.1, -0.2, -1e-9), "not supported"),
    ((-0.1, -0.2, 1e-9), "inconclusive"),
    ((-0.2, -0.3, -0.05), "not supported"),
])
def test_verdict_greater_boundaries(ci, verdict):
    assert _verdict_greater(ci) == verdict


@pytest.mark.parametrize("ci, verdict", [
    ((0.0, 0.0, 0.0), "supported"),            # tied: within any margin
    ((0.1, 0.05, 0.2), "supported"),
    ((-0.02, -0.03, -0.01), "supported"),      # worse, but by less than the margin: non-inferior
    ((-0.04, -0.049, 0.01), "supported"),
    ((-0.02, -0.05, 0.01), "inconclusive"),    # lower end on -margin: not shown to be above it
    ((-0.05, -0.2, 0.1), "inconclusive"),
    ((-0.1, -0.2, -0.05), "inconclusive"),     # upper end on -margin: not shown to be below it
    ((-0.1, -0.2, -0.051), "not supported"),
    ((-0.163, -0.254, -0.081), "not supported"),
])
def test_verdict_non_inferior_boundaries(ci, verdict):
    assert _verdict_non_inferior(ci, 0.05) == verdict


def test_verdict_non_inferior_with_zero_margin_is_greater_or_equal():
    assert _verdict_non_inferior((0.1, 1e-9, 0.2), 0.0) == "supported"
    assert _verdict_non_inferior((0.0, 0.0, 0.0), 0.0) == "inconclusive"
    assert _verdict_non_inferior((-0.1, -0.2, -1e-9), 0.0) == "not supported"


@pytest.mark.parametrize("ci, verdict", [
    ((0.5, 0.4, 0.6), "supported"),
    ((0.9, 0.8, 1.0 - 1e-9), "supported"),
    ((0.9, 0.8, 1.0), "inconclusive"),     # upper end on 1: no fall shown
    ((1.0, 1.0, 1.0), "inconclusive"),     # no change at all: neither side shown
    ((1.1, 1.0, 1.2), "inconclusive"),     # lower end on 1: no rise shown
    ((1.1, 1.0 + 1e-9, 1.2), "not supported"),
    ((1.0, 0.95, 1.05), "inconclusive"),
    ((1.3, 1.2, 1.4), "not supported"),
])
def test_verdict_falls_boundaries(ci, verdict):
    assert _verdict_falls(ci) == verdict


# ----------------------------------------------------------- each claim on fake experiments

LOW, HIGH = [0.0, 1.0, 0.5, 0.2, 0.8], [10.0, 9.0, 9.5, 9.8, 9.2]
MIXED_A, MIXED_B = [0.0, 10.0, 0.0, 10.0, 5.0], [10.0, 0.0, 10.0, 0.0, 5.0]
NEAR_5 = [5.0, 5.0, 5.0, 5.0, 5.1]  # a tie with some spread (the margin: 5% of the 0-10 range LOW and HIGH span)


@pytest.mark.parametrize("gear, ppo, verdict", [
    (HIGH, LOW, "supported"),
    (LOW, HIGH, "not supported"),
    (NEAR_5, NEAR_5, "equivalent"),  # tied: a tie is shown by the TOST, it is not "not supported"
    ([5.0] * 5, [5.0] * 5, "untestable"),  # every run the same: no test can tell them apart (issue 59)
    (MIXED_A, MIXED_B, "inconclusive"),
])
def test_gear_claim_verdicts(tmp_path, gear, ppo, verdict):
    root = make_experiment(tmp_path / "exp", {"ppo": ppo, "gear": gear, "ppo+count": LOW[:4] + [10.0]})
    c = claim(root, "GEAR beats the baseline")
    assert c.verdict == verdict and c.testable
    assert "5 vs 5 seeds" in c.evidence and "fewer than" not in c.evidence


def test_refgrpo_early_and_final_claims(tmp_path):
    # refgrpo reaches 10 at once, ppo only in the second half: same final, faster early
    fast = [[10.0] * 20 for _ in range(5)]
    slow = [[0.0] * 10 + [10.0] * 10 for _ in range(5)]
    root = make_experiment(tmp_path / "a", {"ppo": slow, "refgrpo": fast})
    assert claim(root, "RefGRPO learns faster early").verdict == "supported"
    tied = claim(root, "RefGRPO's final return >= PPO's")  # every final 10: untestable (issue 59), not "supported"
    assert tied.verdict == "untestable" and tied.untestable == "untestable: no spread in either entry"

    root = make_experiment(tmp_path / "b", {"ppo": fast, "refgrpo": slow})
    assert claim(root, "RefGRPO learns faster early").verdict == "not supported"
    assert claim(root, "RefGRPO's final return >= PPO's").verdict == "untestable"

    root = make_experiment(tmp_path / "c", {"ppo": HIGH, "refgrpo": LOW})
    assert claim(root, "RefGRPO's final return >= PPO's").verdict == "not supported"


def _losses(start, end, n=20):
    return [{"calibration_loss": start + (end - start) * i / (n - 1)} for i in range(n)]


@pytest.mark.parametrize("start, end, verdict", [(1.0, 0.2, "supported"), (0.5, 1.0, "not supported"),
                                                 (1.0, 1.0, "equivalent")])  # no change: a ratio of 1 is a tie
def test_calibration_claim_verdicts(tmp_path, start, end, verdict):
    root = make_experiment(tmp_path / "exp", {"ppo": [1.0] * 5, "refgrpo": [1.0] * 5},
                           extra={"refgrpo": [_losses(start, end)] * 5})
    c = claim(root, "RefGRPO's calibration loss falls")
    assert c.verdict == verdict and "over 5 runs" in c.evidence


def test_calibration_claim_without_enough_logged_iterations_is_not_tested_but_testable(tmp_path):
    root = make_experiment(tmp_path / "exp", {"ppo": [1.0] * 5, "refgrpo": [1.0] * 5},
                           extra={"refgrpo": [_losses(1.0, 0.2, n=5)] * 5})
    c = claim(root, "RefGRPO's calibration loss falls")
    assert c.verdict == "not tested" and c.testable  # the entry is there; its runs lack the data


def test_sdrs_claim_needs_a_sparse_env(tmp_path):
    curves = {"ppo": [[0.0] * 10 + [10.0] * 10] * 5, "sdrs": [[10.0] * 20] * 5}  # sdrs learns sooner: larger AUC
    assert claim(make_experiment(tmp_path / "grid", curves), "Shaping (SDRS)").verdict == "supported"
    dense = claim(make_experiment(tmp_path / "dense", curves, envs=("CartPole-v1",)), "Shaping (SDRS)")
    assert dense.verdict == "not tested" and dense.missing == "a sparse-reward env" and not dense.testable
    dense_claims = evaluate_claims(load_experiment(tmp_path / "dense"), reps=REPS)
    assert claims_text(dense_claims).splitlines()[-1] == (
        "not testable here (entries or envs missing): RefGRPO learns faster early than PPO (needs refgrpo); "
        "RefGRPO's final return >= PPO's (margin 5% of each env's range) (needs refgrpo); "
        "RefGRPO's calibration loss falls and settles (needs refgrpo); "
        "Shaping (SDRS) helps on sparse-reward tasks (needs a sparse-reward env); GEAR beats the baseline (needs gear)")
    wrapped = make_experiment(tmp_path / "wrapped", curves, envs=("CartPole-v1",), wrapper="delayed:20")
    assert claim(wrapped, "Shaping (SDRS)").verdict == "supported"
    curves = {"ppo": [[10.0] * 20] * 5, "sdrs": [[0.0] * 10 + [10.0] * 10] * 5}
    assert claim(make_experiment(tmp_path / "worse", curves), "Shaping (SDRS)").verdict == "not supported"


def test_sdrs_claim_on_a_replay_trainer_is_tested_against_its_plain_entry(tmp_path):
    slow, fast = [[0.0] * 10 + [10.0] * 10] * 5, [[10.0] * 20] * 5
    better = claim(make_experiment(tmp_path / "a", {"dqn": slow, "dqn+shaping": fast}), "Shaping (SDRS)")
    assert better.verdict == "supported" and "dqn+shaping - dqn:" in better.evidence
    worse = claim(make_experiment(tmp_path / "b", {"sac": fast, "sac+shaping": slow}), "Shaping (SDRS)")
    assert worse.verdict == "not supported" and "sac+shaping - sac:" in worse.evidence
    # sdrs vs ppo where the experiment has both; a replay trainer's shaping without its plain entry is not tested
    both = claim(make_experiment(tmp_path / "c", {"ppo": fast, "sdrs": slow, "dqn": slow, "dqn+shaping": fast}),
                 "Shaping (SDRS)")
    assert both.verdict == "not supported" and "sdrs - ppo:" in both.evidence
    alone = claim(make_experiment(tmp_path / "d", {"dqn+shaping": fast, "ppo+count": slow}), "Shaping (SDRS)")
    assert alone.verdict == "not tested"
    # the other claims name PPO: a replay trainer's calibration does not stand in for refgrpo
    cal = claim(make_experiment(tmp_path / "e", {"dqn": slow, "dqn+calibration": fast}), "RefGRPO learns faster")
    assert cal.verdict == "not tested"


def test_claim_with_one_seed_of_an_entry_is_not_tested(tmp_path):
    root = make_experiment(tmp_path / "exp", {"ppo": LOW, "gear": HIGH[:1]})
    c = claim(root, "GEAR beats the baseline")
    assert c.verdict == "not tested" and c.testable and "at least 5 finished seeds" in c.evidence
    assert "(has 1 and 5)" in c.evidence and c.estimate is None and c.seeds == [1, 5]


# --------------------------------------------------------------- claims it cannot test

def test_only_testable_claims_are_listed(tmp_path):
    root = make_experiment(tmp_path / "exp", {"ppo": LOW, "gear": HIGH})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 5 seeds: no warning
        _, claims = write_report(root, reps=REPS)
    assert [c.statement for c in claims if c.testable] == ["GEAR beats the baseline"]
    text = claims_text(claims)
    lines = text.splitlines()
    assert lines[0].split() == ["claim", "verdict"]
    assert lines[1].split("  ")[0] == "GEAR beats the baseline" and lines[1].endswith("  supported")
    assert lines[2] == ("not testable here (entries missing): RefGRPO learns faster early than PPO (needs refgrpo); "
                        "RefGRPO's final return >= PPO's (margin 5% of each env's range) (needs refgrpo); "
                        "RefGRPO's calibration loss falls and settles (needs refgrpo); "
                        "Shaping (SDRS) helps on sparse-reward tasks (needs sdrs)")
    assert len(lines) == 3 and "not tested" not in text

    md = (root / "report/report.md").read_text()
    claims_md = md[md.index("## Claims"):md.index("## Plots")]
    rows = [x for x in claims_md.splitlines() if x.startswith("| ") and not x.startswith("| claim")]
    assert rows == [x for x in rows if x.startswith("| GEAR beats the baseline | **supported** |")] and len(rows) == 1
    assert lines[2] in claims_md
    page = (root / "report/index.html").read_text()
    claims_html = page[page.index("<h2>Claims</h2>"):page.index("<h2>Plots</h2>")]
    assert claims_html.count("<tr><td>") == 1 and "GEAR beats the baseline" in claims_html
    assert "not testable here (entries missing): RefGRPO learns faster early" in claims_html
    assert "not tested" not in claims_html
    saved = json.loads((root / "report/stats.json").read_text())["claims"]
    assert len(saved) == 5 and [c["missing"] for c in saved].count("") == 1  # stats.json keeps every claim


def test_missing_baseline_is_named(tmp_path):
    root = make_experiment(tmp_path / "exp", {"gear": HIGH, "sdrs": LOW}, envs=("CartPole-v1",))
    claims = evaluate_claims(load_experiment(root), reps=REPS)
    assert all(not c.testable for c in claims)
    text = claims_text(claims)
    assert text.splitlines()[0] == "no claim can be tested by this experiment"
    assert text.splitlines()[1].startswith("not testable here (entries missing): ") and len(text.splitlines()) == 2
    assert "GEAR beats the baseline (needs ppo)" in text
    assert "RefGRPO learns faster early than PPO (needs refgrpo, ppo)" in text
    assert "Shaping (SDRS) helps on sparse-reward tasks (needs ppo)" in text  # the baseline is checked first


# ------------------------------------------------------------------ fewer than 5 seeds

def test_few_seeds_are_flagged_in_tables_claims_and_a_warning(tmp_path):
    root = make_experiment(tmp_path / "exp", {"ppo": LOW[:3], "gear": HIGH})  # ppo: 3 seeds, gear: 5
    with pytest.warns(UserWarning, match=r"fewer than 5 seeds \(ppo on reflectrl/GridWorld-v0: 3\)") as caught:
        write_report(root, reps=REPS)
    assert len(caught) == 1 and "gear on" not in str(caught[0].message)

    note = "With fewer than 5 seeds the interval is the range of the seeds' bootstrap, not a reliable 95% CI"
    md = (root / "report/report.md").read_text()
    assert "> **Warning:** fewer than 5 seeds (ppo on reflectrl/GridWorld-v0: 3)" in md and note in md
    table = [x for x in md.splitlines() if x.startswith(f"| {ENV} |")]
    ppo_row, gear_row = (next(x for x in table if x.startswith(f"| {ENV} | {a} |")) for a in ("ppo", "gear"))
    assert ppo_row.count("] †") == 2  # both CIs of the 3-seed row are marked
    cells = gear_row.split(" | ")  # gear has 5 seeds; only its P(improve over the 3-seed ppo) is marked
    assert "†" not in cells[4] and "†" not in cells[6] and cells[7].endswith("] †")
    page = html.unescape((root / "report/index.html").read_text())
    assert "<b>Warning:</b> fewer than 5 seeds (ppo on reflectrl/GridWorld-v0: 3)" in page and note in page
    assert json.loads((root / "report/stats.json").read_text())["warnings"][0].startswith("fewer than 5 seeds")
    gear = claim(root, "GEAR beats the baseline")
    assert "5 vs 3 seeds" in gear.evidence and "not a reliable 95% CI" in gear.evidence
    assert gear.verdict == "not tested" and gear.testable  # 3 seeds of ppo: no verdict


def test_no_claim_verdict_under_five_seeds(tmp_path):
    # every method seed far from every ppo seed, on 3 seeds each: a bootstrap would call each claim
    fast, slow = [[10.0] * 20] * 3, [[0.0] * 10 + [10.0] * 10] * 3
    root = make_experiment(tmp_path / "exp", {"ppo": slow, "refgrpo": fast, "sdrs": fast, "gear": [[0.0] * 20] * 3},
                           extra={"refgrpo": [_losses(1.0, 0.2)] * 3})
    claims = evaluate_claims(load_experiment(root), reps=REPS)
    assert len(claims) == 5 and all(c.testable and c.verdict == "not tested" for c in claims)
    for c in claims:
        assert "fewer than 5 seeds per entry: not tested" in c.evidence and "one-sided p" not in c.evidence
        assert c.p_value is None and c.p_holm is None and c.estimate is not None and min(c.seeds) == 3
    gear = next(c for c in claims if c.statement.startswith("GEAR"))
    assert gear.entries == ["gear", "ppo"] and gear.envs == [ENV] and gear.estimate[0] < 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_report(root, reps=REPS)
    md = (root / "report/report.md").read_text()
    claims_md = md[md.index("## Claims"):md.index("## Plots")]
    rows = [x for x in claims_md.splitlines() if x.startswith("| ") and not x.startswith("| claim")]
    assert len(rows) == 5 and all(" | **not tested** | " in x and "fewer than 5 seeds per entry" in x for x in rows)
    saved = json.loads((root / "report/stats.json").read_text())["claims"]
    assert [c["verdict"] for c in saved] == ["not tested"] * 5 and saved[4]["seeds"] == [3, 3]


def test_claims_intro_states_the_symmetric_rule(tmp_path):
    from reflectrl.report.analysis import claims_intro

    claims = claims_of(make_experiment(tmp_path / "exp", {"ppo": LOW, "gear": HIGH})).values()
    text = claims_intro(list(claims), REPS)
    assert text.startswith("1 claim(s) tested together.")
    assert "'not supported' needs the same on the opposite side" in text
    assert "'equivalent' where a TOST" in text and "fewer than 5" not in text
    few = claims_of(make_experiment(tmp_path / "few", {"ppo": LOW[:3], "gear": HIGH[:3]})).values()
    assert "fewer than 5 finished seeds of an entry is 'not tested'" in claims_intro(list(few), REPS)


def test_enough_seeds_give_no_warning_or_note(tmp_path):
    root = make_experiment(tmp_path / "exp", {"ppo": LOW, "gear": HIGH})
    assert all(r["seeds"] == MIN_SEEDS_FOR_CI for r in summary_table(load_experiment(root), reps=REPS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        write_report(root, reps=REPS)
    md = (root / "report/report.md").read_text()
    assert "Warning" not in md and "†" not in md and "not a reliable" not in md
    assert json.loads((root / "report/stats.json").read_text())["warnings"] == []


@pytest.mark.slow
def test_report_command_prints_the_few_seeds_warning(tmp_path):
    root = make_experiment(tmp_path / "exp", {"ppo": LOW[:2], "gear": HIGH[:2]})
    done = subprocess.run([sys.executable, "-m", "reflectrl", "report", str(root), "--reps", "100"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert ("reflectrl: warning: fewer than 5 seeds (every env and algo entry: 2): "
            "their 95% CIs are the range of the seeds' bootstrap, not reliable intervals") in done.stderr
    (row,) = [x for x in done.stdout.splitlines() if x.startswith("GEAR beats the baseline")]
    assert row.endswith("  not tested")  # 2 seeds each: no verdict, however far apart


def test_claims_find_a_method_under_its_composed_name(tmp_path):
    # refgrpo written as ppo+calibration, with an ablation beside it: the plain entry is the method
    fast = [[10.0] * 20 for _ in range(5)]
    slow = [[0.0] * 10 + [10.0] * 10 for _ in range(5)]
    root = make_experiment(tmp_path / "a", {"ppo": slow, "ppo+calibration[alpha=0]": slow, "ppo+calibration": fast})
    c = claim(root, "RefGRPO learns faster early")
    assert c.testable and c.verdict == "supported"


def test_solved_text_counts_final_returns_at_the_solved_score():
    from reflectrl.report.render import solved_text

    def row(algo, solved, seeds=5):  # "reached" (once, during training) is not solving
        return {"env": "E", "algo": algo, "seeds": seeds, "solved": solved, "solved_score": 0.8, "reached": seeds,
                "threshold": 0.1, "env_range": [0, 1]}

    text = solved_text([row("ppo", 0), row("ppo+count", 5), row("ppo+rnd", 3)])
    lines = text.splitlines()
    assert lines[0] == "E: final return >= 0.8 (the solved score of its fixed reference) reached by"
    assert lines[1:] == ["  every seed: ppo+count (5/5)", "  some seeds: ppo+rnd (3/5)", "  no seed: ppo (0/5)"]
    none = [{**row("ppo", None), "solved_score": None}]
    assert solved_text(none) == "E: no solved score (no fixed reference with one): no entry is counted as solving it"
    assert solved_text([{"env": "E", "algo": "ppo", "seeds": 5, "reached": 5, "threshold": 0.8}]) == ""  # an old table


def test_per_run_scores_are_published_with_the_table(tmp_path):
    curves = {"ppo": [0.0, 0.0, 1.0], "ppo+count": [[0.0] * 10 + [1.0] * 10, 1.0, 1.0]}
    extra = {"ppo": [[{"unique_states_total": 40 + s}] * 20 for s in range(3)],
             "ppo+count": [[{"unique_states_total": 90, "first_reward_step": 500}] * 20] * 3}
    root = make_experiment(tmp_path / "exp", curves, extra=extra)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 seeds
        write_report(root, reps=REPS)
    runs = json.loads((root / "report/stats.json").read_text())["runs"]
    assert [(r["algo"], r["seed"]) for r in runs] == [("ppo", 1), ("ppo", 2), ("ppo", 3),
                                                      ("ppo+count", 1), ("ppo+count", 2), ("ppo+count", 3)]
    by = {(r["algo"], r["seed"]): r for r in runs}
    assert by[("ppo", 1)]["final"] == 0.0 and by[("ppo", 3)]["final"] == 1.0
    assert by[("ppo+count", 1)]["auc"] == pytest.approx(0.5, abs=0.06) and by[("ppo+count", 1)]["final"] == 1.0
    assert by[("ppo", 2)]["unique_states_total"] == 41 and by[("ppo", 1)]["first_reward_step"] is None
    assert by[("ppo", 1)]["steps_to_threshold"] is None and by[("ppo+count", 2)]["steps_to_threshold"] is not None
    md = (root / "report/report.md").read_text()
    assert "## Per-run scores" in md
    assert "| reflectrl/GridWorld-v0 | ppo+count | 1 | finished | 1 | " in md and "| 90 | 500 |" in md


def test_summary_table_gives_the_iqm_of_unique_states_and_report_md_shows_it(tmp_path):
    from reflectrl.report.analysis import load_experiment, summary_table
    from reflectrl.report.render import write_report

    # each seed's last logged unique_states_total: 10, 20, 30, 40, 1000 (the last row carrying it counts)
    counts = [10, 20, 30, 40, 1000]
    extra = {"ppo": [[{"unique_states_total": c // 2}, {"unique_states_total": c}] for c in counts],
             "ppo+count": [[] for _ in counts]}
    root = make_experiment(tmp_path / "exp", {"ppo": [1.0] * 5, "ppo+count": [1.0] * 5}, extra=extra)
    table = {r["algo"]: r for r in summary_table(load_experiment(root), reps=200)}
    # IQM of 5 values: the mean of the middle 50% (scipy's trimmed mean with 25% cut each side: 20, 30, 40)
    assert table["ppo"]["unique_states_iqm"] == pytest.approx(30.0)
    lo, hi = table["ppo"]["unique_states_ci"]
    assert 10 <= lo <= 30 <= hi <= 1000
    assert table["ppo+count"]["unique_states_iqm"] is None  # logged none
    write_report(root, reps=200)
    md = (root / "report" / "report.md").read_text()
    header = [x for x in md.splitlines() if x.startswith("| env | algo | seeds |")][0]
    assert header.endswith("| unique states IQM [95% CI] | vs ppo (final) |")
    results = md[md.index(header):md.index("## Claims")].splitlines()  # the summary, not the per-run table
    (ppo_row,) = [x for x in results if x.startswith(f"| {ENV} | ppo | 5 |")]
    assert ppo_row.split(" | ")[-2].startswith("30 [")
    assert ppo_row.rstrip(" |").endswith("–")  # no comparison of ppo with itself
    (count_row,) = [x for x in results if x.startswith(f"| {ENV} | ppo+count | 5 |")]
    assert count_row.split(" | ")[-2] == "–"
    # every seed of both returned 1.0: nothing can be told apart, decided before any test (issue 59)
    assert count_row.split(" | ")[-1].startswith("untestable: no spread in either entry (+0 [+0, +0]")


# ------------------------------------------- unfinished runs, per-run CSV, Holm, seed flips

def _run_path(root, label, seed):
    from reflectrl.experiments.spec import read_spec

    (run,) = [r for r in read_spec(root).runs(root) if r.entry.label == label and r.seed == seed]
    return run.path


def test_unfinished_runs_are_excluded_from_the_statistics_and_listed(tmp_path):
    import csv

    root = make_experiment(tmp_path / "exp", {"ppo": [0.2, 0.3, 0.4], "gear": [0.5, 0.6, 9.0]})
    run_json = _run_path(root, "gear", 3) / "run.json"
    assert run_json.exists()
    run_json.write_text(json.dumps({"status": "interrupted", "command": []}))
    exp = load_experiment(root)
    table = {r["algo"]: r for r in summary_table(exp, reps=REPS)}
    assert table["gear"]["seeds"] == 2 and sorted(table["gear"]["final_seeds"]) == [0.5, 0.6]
    assert table["gear"]["env_range"] == [0.2, 0.6]  # the unfinished run's 9.0 is not in the range either
    assert [(s.seed, st) for s, st in exp.excluded] == [(3, "interrupted")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_report(root, reps=REPS)
    out = root / "report"
    assert "1 run(s) excluded from the statistics (not finished)" in (out / "report.md").read_text()
    assert json.loads((out / "stats.json").read_text())["excluded"] == [
        {"env": ENV, "algo": "gear", "seed": 3, "status": "interrupted"}]
    rows = list(csv.DictReader((out / "runs.csv").read_text().splitlines()))
    assert len(rows) == 6  # every run, finished or not, with its status
    (gear3,) = [r for r in rows if r["algo"] == "gear" and r["seed"] == "3"]
    assert gear3["status"] == "interrupted" and float(gear3["final"]) == 9.0
    # the table recomputes from the finished rows of the CSV
    finals = sorted(float(r["final"]) for r in rows if r["algo"] == "gear" and r["status"] == "finished")
    assert finals == sorted(table["gear"]["final_seeds"])


def test_a_report_with_no_finished_run_says_so(tmp_path):
    from reflectrl.errors import UserError

    root = make_experiment(tmp_path / "exp", {"ppo": [0.2, 0.3]})
    for seed in (1, 2):
        (_run_path(root, "ppo", seed) / "run.json").write_text(json.dumps({"status": "running"}))
    with pytest.raises(UserError, match="no run in .* has finished yet"):
        write_report(root, reps=REPS)


def _pending(statement, samples):
    from reflectrl.report.analysis import _Test

    return _Test(statement, float(np.mean(samples[0])), samples, _verdict_greater, 0.0, True, lambda ci: "")


def test_holm_turns_a_lone_supported_claim_inconclusive_when_two_are_tested():
    from reflectrl.report.analysis import Claim, _decide

    # 1000 resamples, 15 at or below 0: p = 0.015 < 0.025 and the CI's lower end is above 0
    samples = np.concatenate([np.full(15, -0.1), np.linspace(0.05, 1.0, 985)])
    alone = [Claim("a", "", "")]
    _decide(alone, [(0, _pending("a", [samples] * 5))])
    assert alone[0].verdict == "supported" and alone[0].p_value == pytest.approx(0.015)
    two = [Claim("a", "", ""), Claim("b", "", "")]
    _decide(two, [(0, _pending("a", [samples] * 5)), (1, _pending("b", [samples] * 5))])
    assert [c.verdict for c in two] == ["inconclusive", "inconclusive"]  # Holm: 2 x 0.015 = 0.03
    assert two[0].p_holm == pytest.approx(0.03)


def test_an_opposite_effect_is_not_supported_only_after_holm():
    from reflectrl.report.analysis import Claim, _decide

    # 1000 resamples, 15 at or above 0: the opposite direction's p = 0.015 < 0.025, the CI wholly below 0
    samples = np.concatenate([np.full(15, 0.1), np.linspace(-1.0, -0.05, 985)])
    alone = [Claim("a", "", "")]
    _decide(alone, [(0, _pending("a", [samples] * 5))])
    assert alone[0].verdict == "not supported" and alone[0].p_against == pytest.approx(0.015)
    two = [Claim("a", "", ""), Claim("b", "", "")]
    _decide(two, [(0, _pending("a", [samples] * 5)), (1, _pending("b", [samples] * 5))])
    assert [c.verdict for c in two] == ["inconclusive", "inconclusive"]  # Holm: 2 x 0.015 = 0.03 >= 0.025
    assert two[0].p_against_holm == pytest.approx(0.03) and two[0].p_holm == pytest.approx(1.0)
    assert "the opposite direction: p = 0.0150, Holm 0.0300" in two[0].evidence


def test_a_tie_is_not_not_supported(tmp_path):
    from reflectrl.report.analysis import Claim, _decide

    tied = np.zeros(1000)  # every seed tied: the CI pinned at 0
    claims = [Claim("tie", "", "")]
    _decide(claims, [(0, _pending("tie", [tied] * 5))])
    (c,) = claims
    assert c.verdict == "equivalent" and c.p_against == 1.0 and c.p_equiv_holm == 0.0  # shown by the TOST
    # a spread around 0 wider than the margin: neither side nor a tie is shown
    spread = np.linspace(-0.5, 0.5, 1001)
    claims = [Claim("wide", "", "")]
    _decide(claims, [(0, _pending("wide", [spread] * 5))])
    assert claims[0].verdict == "inconclusive"
    # on a fake experiment: a tie with some spread -> equivalent, not "not supported"
    c = claim(make_experiment(tmp_path / "near", {"ppo": NEAR_5, "gear": NEAR_5, "ppo+count": [0.0, 10.0]}),
              "GEAR beats")
    assert c.verdict == "equivalent" and c.estimate[0] == 0.0
    # both entries never reach the goal (every score 0): untestable (issue 59), neither equivalent nor not supported
    c = claim(make_experiment(tmp_path / "flat", {"ppo": [0.0] * 5, "gear": [0.0] * 5}), "GEAR beats")
    assert c.verdict == "untestable" and c.estimate == [0.0, 0.0, 0.0] and c.p_equiv is None


def test_a_verdict_that_changes_with_the_bootstrap_seed_is_flagged_and_inconclusive():
    from reflectrl.report.analysis import Claim, _decide

    above = np.linspace(0.05, 1.0, 1000)
    straddles = np.linspace(-0.5, 1.0, 1000)
    claims = [Claim("c", "", "")]
    _decide(claims, [(0, _pending("c", [above, above, straddles, above, above]))])
    (c,) = claims
    assert c.verdicts_by_seed == ["supported", "supported", "inconclusive", "supported", "supported"]
    assert not c.stable and c.verdict == "inconclusive" and "FLIPS" in c.evidence


def test_versus_ppo_column_separates_better_worse_equivalent_and_inconclusive(tmp_path):
    root = make_experiment(tmp_path / "exp", {
        "ppo": [0.50, 0.52, 0.48, 0.51, 0.49],
        "gear": [0.90, 0.92, 0.88, 0.91, 0.89],          # clearly above
        "ppo+count": [0.10, 0.12, 0.08, 0.11, 0.09],     # clearly below
        "ppo+rnd": [0.50, 0.52, 0.48, 0.51, 0.49],       # the same scores: inside the margin
        "ppo+calibration": [0.0, 1.0, 0.1, 0.9, 0.5],   # too spread to say
    })
    table = {r["algo"]: r for r in summary_table(load_experiment(root), reps=2000)}
    assert table["ppo"].get("vs_ppo") is None
    assert {k: table[k]["vs_ppo"] for k in ("gear", "ppo+count", "ppo+rnd", "ppo+calibration")} == {
        "gear": "better", "ppo+count": "worse", "ppo+rnd": "equivalent", "ppo+calibration": "inconclusive"}
    # the margin is 5% of the observed range (0 to 1) in return units
    assert table["gear"]["margin"] == pytest.approx(0.05)
    assert table["gear"]["vs_ppo_tests"] == 4 and len(table["gear"]["vs_ppo_by_seed"]) == 5


def test_versus_ppo_draws_no_verdict_from_fewer_than_five_seeds(tmp_path):
    # every gear seed above every ppo seed: a bootstrap over 3 seeds would call it better
    root = make_experiment(tmp_path / "exp", {"ppo": [0.1, 0.2, 0.3], "gear": [0.7, 0.8, 0.9]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table = {r["algo"]: r for r in summary_table(load_experiment(root), reps=REPS)}
        write_report(root, reps=REPS)
    assert table["gear"]["vs_ppo"] == "too few seeds"
    assert table["gear"]["vs_ppo_diff"] == pytest.approx(0.6)
    assert "too few seeds (+0.6 [" in (root / "report" / "report.md").read_text()


def test_an_off_policy_trainer_s_signals_are_compared_with_its_plain_entry(tmp_path):
    root = make_experiment(tmp_path / "exp", {
        "ppo": [0.10, 0.12, 0.08, 0.11, 0.09],
        "dqn": [0.50, 0.52, 0.48, 0.51, 0.49],
        "dqn+shaping": [0.90, 0.92, 0.88, 0.91, 0.89],
        "ppo+shaping": [0.50, 0.52, 0.48, 0.51, 0.49],
    })
    table = {r["algo"]: r for r in summary_table(load_experiment(root), reps=2000)}
    assert table["dqn+shaping"]["baseline"] == "dqn" and table["ppo+shaping"]["baseline"] == "ppo"
    assert table["dqn+shaping"]["vs_ppo_diff"] == pytest.approx(0.4)  # against dqn, not ppo (+0.8)
    assert table["dqn+shaping"]["vs_ppo"] == "better" and table["ppo+shaping"]["vs_ppo"] == "better"
    assert table["dqn"]["baseline"] == "ppo" and table["dqn"]["vs_ppo"] == "better"
    assert table["dqn"].get("vs_ppo") is not None and table["ppo"].get("vs_ppo") is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_report(root, reps=REPS)
    text = (root / "report" / "report.md").read_text()
    assert "vs baseline (final)" in text and "better vs dqn (+0.4 [" in text
    assert "applied to the transitions sampled from the replay buffer at learning time" in text


def test_a_report_with_an_equivalent_claim_writes_both_pages(tmp_path):
    root = make_experiment(tmp_path / "exp", {"ppo": NEAR_5, "gear": NEAR_5, "ppo+count": [0.0, 10.0]})
    out, claims = write_report(root, reps=REPS)
    (c,) = [c for c in claims if c.testable]
    assert c.verdict == "equivalent"
    assert "class='equivalent'>equivalent<" in out.read_text()  # write_report gives the HTML page
    text = (out.parent / "report.md").read_text()
    assert "| **equivalent** |" in text and "a tie is not" in text
