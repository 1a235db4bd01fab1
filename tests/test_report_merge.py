"""`reflectrl report PART PART ... --out DIR`: the report of an experiment run in parts equals the
one report of the whole experiment (table, vs-ppo verdicts, claims), from the parts' per-run
scores; what it cannot recompute it says; bad input is one line."""

import html
import json
import re
import shutil

import numpy as np
import pytest
from test_report_claims import make_experiment

from reflectrl.errors import UserError
from reflectrl.experiments.spec import SPEC_FILE
from reflectrl.report import render
from reflectrl.report.analysis import evaluate_claims, load_experiment, summary_table
from reflectrl.report.claims import build_ledger
from reflectrl.report.merge import write_merged
from reflectrl.report.render import write_report

REPS = 200
RNG = np.random.default_rng(7)
PPO = [list(RNG.normal(0.2, 0.05, 20)) for _ in range(6)]
GEAR = [list(RNG.normal(0.4, 0.05, 20)) for _ in range(6)]
CAL = [list(np.linspace(0.1, 0.3, 20) + RNG.normal(0, 0.02, 20)) for _ in range(6)]
CAL_ROWS = [[{"calibration_loss": 1.0 - i / 40} for i in range(20)] for _ in range(6)]


def _drop_seeds(root, label, seeds):
    """Remove these seeds' runs of the entry: a part that ran only the others."""
    for path in root.glob(f"runs/*/{label}/seed*"):
        if path.is_dir() and int(path.name[4:]) in seeds:
            shutil.rmtree(path)


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """The whole experiment, and the same runs in three parts: ppo; ppo+gear seeds 1-3 and
    ppo+calibration; ppo+gear seeds 4-6 (each part with its report written)."""
    tmp = tmp_path_factory.mktemp("merge")
    whole = make_experiment(tmp / "whole", {"ppo": PPO, "ppo+gear": GEAR, "ppo+calibration": CAL},
                            extra={"ppo+calibration": CAL_ROWS})
    a = make_experiment(tmp / "a", {"ppo": PPO})
    b = make_experiment(tmp / "b", {"ppo+gear": GEAR, "ppo+calibration": CAL}, extra={"ppo+calibration": CAL_ROWS})
    _drop_seeds(b, "ppo+gear", {4, 5, 6})
    c = make_experiment(tmp / "c", {"ppo+gear": GEAR})
    _drop_seeds(c, "ppo+gear", {1, 2, 3})
    with pytest.warns(UserWarning):  # b's and c's gear entries have 3 seeds each
        for part in (a, b, c):
            write_report(part, reps=REPS)
    return tmp, whole, [a, b / "report", c]  # an experiment directory or its report folder


def test_merged_report_equals_the_whole_experiments(parts):
    tmp, whole, dirs = parts
    path, claims = write_merged([str(d) for d in dirs], tmp / "merged", reps=REPS)
    data = json.loads((tmp / "merged" / "stats.json").read_text())
    exp = load_experiment(whole)
    expected = {(r["env"], r["algo"]): r for r in summary_table(exp, reps=REPS)}
    got = {(r["env"], r["algo"]): r for r in data["table"]}
    assert set(got) == set(expected)
    for key, row in expected.items():
        for field in ("seeds", "final_iqm", "final_ci", "final_seeds", "auc_iqm", "auc_ci", "p_improve_over_ppo",
                      "env_range", "margin", "vs_ppo", "vs_ppo_ci", "vs_ppo_p_holm"):
            want = row.get(field)
            numeric = isinstance(want, float) or (isinstance(want, list) and all(isinstance(x, float) for x in want))
            assert got[key].get(field) == (pytest.approx(want, rel=1e-12) if numeric else want), (key, field)
        assert got[key]["threshold"] is None and got[key]["reached"] is None  # needs the curves
    assert got[(exp.spec.envs[0], "ppo+gear")]["vs_ppo"] == "better"
    by_statement = {c.statement: c for c in evaluate_claims(exp, reps=REPS)}
    for c in claims:
        want = by_statement[c.statement]
        if c.statement.startswith("RefGRPO's calibration loss"):
            assert want.verdict == "supported" and c.verdict == "not tested" and "not kept" in c.evidence
            continue
        assert (c.verdict, c.estimate, c.seeds) == (want.verdict, want.estimate, want.seeds), c.statement
    assert {c.statement: c.verdict for c in claims}["GEAR beats the baseline"] == "supported"
    # every run once, with its part; the parts' own steps to threshold are not carried
    assert len(data["runs"]) == 18 and {r["part"] for r in data["runs"]} == {(dirs[0] / "report").as_posix(),
                                                                            dirs[1].as_posix(),
                                                                            (dirs[2] / "report").as_posix()}
    assert all(r.get("steps_to_threshold") is None for r in data["runs"])
    assert [p["entries"] for p in data["parts"]] == [{"ppo": [1, 2, 3, 4, 5, 6]},
                                                     {"ppo+gear": [1, 2, 3], "ppo+calibration": [1, 2, 3, 4, 5, 6]},
                                                     {"ppo+gear": [4, 5, 6]}]
    text = path.read_text()
    assert "merged from 3 parts" in text and "not recomputed across parts" in text and "| part |" in text
    # one figure per env from the per-run scores, linked from the report; the curves stay in the parts
    env = exp.spec.envs[0]
    figure = tmp / "merged" / f"final_{render._slug(env)}.png"
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({figure.name})" in text
    assert sorted(p.name for p in (tmp / "merged").iterdir()) == sorted(
        ["index.html", "report.md", "stats.json", "runs.csv", "provenance.json", figure.name])
    # the same self-contained page as an experiment's report: tables, claims, the figure embedded, the parts
    page = html.unescape((tmp / "merged" / "index.html").read_text())
    assert "<script" not in page and "http" not in page and "src='data:image/png;base64," in page
    assert "<h2>Parts</h2>" in page and dirs[1].as_posix() in page and "<h2>Claims</h2>" in page
    table_rows = [line for line in text.splitlines() if line.startswith(f"| {env} | ")]
    for row in table_rows:  # every cell of the results and per-run tables
        assert all(f"<td>{cell}</td>" in page for cell in row.strip("| ").split(" | ")), row
    for c in claims:
        assert c.statement in page and c.verdict in page
    prov = json.loads((tmp / "merged" / "provenance.json").read_text())
    assert len(prov["parts"]) == 3 and prov["command"].startswith("reflectrl report ")
    # the ledger recomputes the merged report's verdicts from its runs and ranges: the same
    rows = build_ledger([tmp / "merged"], "reflectrl claims merged", reps=REPS).rows
    assert {r.statement: r.today for r in rows} == {c.statement: c.verdict for c in claims if c.testable}


def test_a_run_unfinished_in_one_part_and_finished_in_another_counts_once(parts, tmp_path):
    tmp, _, dirs = parts
    stale = tmp_path / "stale"
    shutil.copytree(dirs[0] / "report", stale)
    data = json.loads((stale / "stats.json").read_text())
    data["spec"]["algos"].append("ppo+gear")
    data["runs"].append({"env": data["runs"][0]["env"], "algo": "ppo+gear", "seed": 2, "status": "stopped",
                         "final": 0.0, "auc": 0.0, "early_auc": 0.0})
    (stale / "stats.json").write_text(json.dumps(data))
    write_merged([str(stale), str(dirs[1]), str(dirs[2])], tmp_path / "m", reps=REPS)
    merged = json.loads((tmp_path / "m" / "stats.json").read_text())
    assert merged["excluded"] == []
    assert [r["status"] for r in merged["runs"] if r["algo"] == "ppo+gear" and r["seed"] == 2] == ["finished"]


def _with_spec(src, dst, **change):
    shutil.copytree(src, dst)
    data = json.loads((dst / "stats.json").read_text())
    data["spec"].update(change)
    (dst / "stats.json").write_text(json.dumps(data))
    return dst


@pytest.mark.parametrize("case, message", [
    ("twice", "is finished in both"),
    ("one", "give two or more parts"),
    ("steps", "differ in --total-steps"),
    ("sets", "differ in --set"),
    ("out-is-part", "it holds the part"),
    ("out-not-empty", "holds other files"),
    ("no-report", "has no report yet"),
    ("not-a-part", "neither a report folder"),
    ("merged", "is itself a merged report"),
    ("no-range", "keeps no observed return range"),
])
def test_merge_refuses_bad_input_in_one_line(parts, tmp_path, cli, case, message):
    tmp, _, dirs = parts
    a, b = dirs[0] / "report", dirs[1]
    out = tmp_path / "out"
    args = {"twice": [a, a], "one": [a],
            "steps": [a, _with_spec(b, tmp_path / "b2", total_steps=999)],
            "sets": [a, _with_spec(b, tmp_path / "b3", sets=["num_envs=8"])],
            "out-is-part": [a, b], "out-not-empty": [a, b], "no-report": [a, tmp_path / "bare"],
            "not-a-part": [a, tmp_path], "merged": [a, tmp_path / "m"],
            "no-range": [a, _with_spec(b, tmp_path / "b4")]}[case]
    if case == "no-range":
        data = json.loads((tmp_path / "b4" / "stats.json").read_text())
        for row in data["table"]:
            row.pop("env_range", None)
        (tmp_path / "b4" / "stats.json").write_text(json.dumps(data))
    if case == "out-is-part":
        out = dirs[0]
    if case == "out-not-empty":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    if case == "no-report":
        (tmp_path / "bare").mkdir()
        (tmp_path / "bare" / SPEC_FILE).write_text((dirs[0] / SPEC_FILE).read_text())
    if case == "merged":
        write_merged([str(a), str(b)], tmp_path / "m", reps=REPS)
    code, _, err = cli("report", *args, "--out", out, "--reps", REPS)
    assert code == 2 and err.startswith("reflectrl: error: ") and message in err and len(err.strip().splitlines()) == 1
    if case == "out-not-empty":
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # nothing replaced
    elif case != "out-is-part":
        assert not out.exists()


def test_several_folders_without_out_are_refused(parts, cli):
    _, _, dirs = parts
    code, _, err = cli("report", dirs[0], dirs[2])
    assert code == 2 and "add --out FOLDER" in err and len(err.strip().splitlines()) == 1


def test_merge_from_the_command_line_prints_the_claims_and_replaces_its_own_output(parts, tmp_path, cli):
    _, _, dirs = parts
    out = tmp_path / "merged"
    for _ in range(2):  # a second merge replaces the first (a merged report is its own output)
        code, text, _ = cli("report", *dirs, "--out", out, "--reps", REPS)
        assert code == 0 and "merged report of 3 parts" in text and "GEAR beats the baseline" in text
    names = sorted(p.name for p in out.iterdir())
    assert [n for n in names if not n.startswith("final_")] == ["index.html", "provenance.json", "report.md",
                                                                  "runs.csv", "stats.json"] and len(names) == 6
    assert f"report: {out / 'index.html'}" in text
    with pytest.raises(UserError):
        write_merged([str(dirs[0])], out)


def test_the_ledger_sets_a_merged_reports_parts_apart(tmp_path):
    """Parts split by seeds (each with claims rows, not tested under 5 seeds), merged beside them."""
    from reflectrl.report.claims import to_markdown

    halves = []
    for name, drop in (("x", {4, 5, 6}), ("y", {1, 2, 3})):
        root = make_experiment(tmp_path / name, {"ppo": PPO, "ppo+gear": GEAR})
        _drop_seeds(root, "ppo", drop)
        _drop_seeds(root, "ppo+gear", drop)
        with pytest.warns(UserWarning):
            write_report(root, reps=REPS)
        halves.append(root / "report")
    write_merged([str(h) for h in halves], tmp_path / "all", reps=REPS)
    ledger = build_ledger([tmp_path], "reflectrl claims", reps=REPS)
    by_folder = {}
    for row in ledger.rows:
        by_folder.setdefault(row.folder, set()).add(row.part_of)
    shown = (tmp_path / "all").as_posix()
    assert by_folder == {shown: {None}, halves[0].as_posix(): {shown}, halves[1].as_posix(): {shown}}
    gear = [r for r in ledger.rows if r.statement == "GEAR beats the baseline"]
    assert {r.folder: (r.seeds, r.today) for r in gear} == {
        shown: ([6, 6], "supported"), halves[0].as_posix(): ([3, 3], "not tested"),
        halves[1].as_posix(): ([3, 3], "not tested")}
    text = to_markdown(ledger, [str(tmp_path)])
    assert "## Parts of merged reports" in text
    assert text.index(f"]({shown}/report.md)") < text.index("## Parts of merged reports") < text.index(
        f"]({halves[0].as_posix()}/report.md)")


def test_an_inconclusive_verdict_whose_ci_excludes_0_shows_its_holm_p_in_both_reports(tmp_path, monkeypatch):
    """Four entries each about 2.4 above ppo: every CI excludes 0, every raw p is about 0.03,
    and Holm over the 4 comparisons makes each inconclusive. The table said
    "inconclusive (+2.4 [+0.07, +4.73])", not why. (Made-up returns up to 6.4 on a grid world that
    pays at most 1: normalised by the observed range, as an env with no fixed reference.)"""
    from reflectrl.report import references

    monkeypatch.setattr(references, "REFERENCES", ())
    ppo = [0.0, 1.0, 2.0, 3.0, 4.0]
    entries = {f"ppo[ent_coef=0.0{k + 1}]": [v + 2.4 + 0.01 * k for v in ppo] for k in range(4)}
    whole = make_experiment(tmp_path / "whole", {"ppo": ppo, **entries})
    labels = list(entries)
    a = make_experiment(tmp_path / "a", {"ppo": ppo, **{k: entries[k] for k in labels[:2]}})
    b = make_experiment(tmp_path / "b", {k: entries[k] for k in labels[2:]})
    for root in (whole, a, b):
        write_report(root, reps=1000)
    write_merged([str(a), str(b)], tmp_path / "merged", reps=1000)

    def versus_cells(md: str) -> dict[str, str]:
        rows = [line.strip("| ").split(" | ") for line in md.splitlines() if line.startswith("| reflectrl/")]
        return {cells[1]: cells[10] for cells in rows if len(cells) == 11}

    single = versus_cells((whole / "report" / "report.md").read_text())
    merged = versus_cells((tmp_path / "merged" / "report.md").read_text())
    assert single == merged and single["ppo"] == "–"
    for label in labels:
        assert re.fullmatch(r"inconclusive \(\+2\.4\d* \[\+0\.\d+, \+4\.\d+\]; normalised \+0\.\d+; "
                            r"Holm p 0\.1\d* over 4 comparisons\)",
                            single[label]), single[label]
    assert html.escape(single[labels[0]]) in (tmp_path / "merged" / "index.html").read_text()
