"""Provenance at run time (issue 59): every run records in run.json's `sessions`, when it starts and at every
resume, the commit of the reflectrl source, whether that tree had uncommitted changes and the versions of the
packages that change its numbers; a report made from runs of several commits (or a dirty tree, or other
package versions) says which runs came from which, in provenance.json and in one line of the report."""

import json
import subprocess
import sys
from importlib import metadata

import pytest

from reflectrl.report import provenance
from reflectrl.runs import provenance as run_provenance
from reflectrl.runs.rundir import RunDir

TINY_SETS = ["env.size=5", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1"]
A, B = "a" * 40, "b" * 40  # two commits


def git_head() -> str | None:
    done = subprocess.run(["git", "-C", str(run_provenance.SOURCE_DIR), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def check_session(entry: dict, from_step: int, heads: set) -> None:
    """A session as this process records it: its commit (the checkout's, or "unknown" outside one), whether the
    tree was dirty, and the installed versions of every package that changes a run's numbers."""
    assert entry["from_step"] == from_step and entry["started"]
    git = entry["git"]
    if heads:  # the checkout is shared: a commit may land while the test runs
        assert git["commit"] in heads and git["uncommitted_changes"] in (True, False)
    else:
        assert git == {"commit": "unknown", "uncommitted_changes": None, "source": str(run_provenance.SOURCE_DIR)}
    found = entry["versions"]
    for name in ("torch", "gymnasium", "numpy"):
        assert found[name] == metadata.version(name)
    for name in ("jax", "jaxlib", "navix", "gymnax", "xminigrid", "craftax", "transformers", "trl", "envpool",
                 "minigrid"):
        assert name in run_provenance.OPTIONAL_PACKAGES
        try:
            assert found[name] == metadata.version(name)
        except metadata.PackageNotFoundError:
            assert name not in found


def test_a_run_records_a_session_at_start_and_another_at_resume(cli, tmp_path, sigterm_after_rows):
    run_provenance._this_process.cache_clear()  # the git state is looked up once per process: from now
    out = tmp_path / "run"
    before = git_head()
    sigterm_after_rows(2)
    code, _, err = cli("train", "--env", "reflectrl/GridWorld-v0", "--total-steps", "512", "--out", out,
                       "--no-progress", "--set", *TINY_SETS, "checkpoint_every=128")
    assert code == 143, err  # stopped mid-run, checkpointed
    status = json.loads((out / "run.json").read_text())
    heads = {h for h in (before, git_head()) if h}
    (started,) = status["sessions"]
    check_session(started, 0, heads)
    resumes = status["global_step"]
    assert status["status"] == "interrupted" and 0 < resumes < 512

    code, _, err = cli("train", "--resume", out, "--no-progress")
    assert code == 0, err
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "finished"
    first, resumed = status["sessions"]
    assert first == started  # the start's entry is kept as it was
    check_session(resumed, resumes, heads)
    assert resumed["started"] >= first["started"]


def test_git_is_asked_once_per_process(tmp_path, monkeypatch):
    """The git state is looked up at the first session of a process (a JAX group starts all its runs at once)."""
    calls = []
    git = run_provenance._git
    monkeypatch.setattr(run_provenance, "_git", lambda *args: calls.append(args) or git(*args))
    run_provenance._this_process.cache_clear()
    try:
        first = RunDir.create(tmp_path / "one", {"seed": 1}, command=["test"])
        asked = len(calls)
        assert 1 <= asked <= 3  # rev-parse, ls-files, status: one git_state
        others = [RunDir.create(tmp_path / name, {"seed": 2}, command=["test"]) for name in ("two", "three")]
        others[0].set_status("running")  # a resume records a session too
        assert len(calls) == asked
        sessions = [s for run in (first, *others) for s in run.status()["sessions"]]
        assert len(sessions) == 4 and len({json.dumps(s["git"]) for s in sessions}) == 1
        assert [s["from_step"] for s in sessions] == [0, 0, None, 0]  # two resumed with no checkpoint loaded: not known
        for run in (first, *others):
            run.unlock()
    finally:
        run_provenance._this_process.cache_clear()


def test_recording_a_session_imports_no_torch():
    code = ("import sys; from reflectrl.runs import provenance; provenance.session(from_step=0); "
            "assert 'torch' not in sys.modules and 'jax' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- the report says which runs came from which


def session(commit: str, dirty: bool | None = False, **versions: str) -> dict:
    return {"started": "2026-12-07T04:00:00+0000", "from_step": 0,
            "git": {"commit": commit, "uncommitted_changes": dirty, "source": "/src/reflectrl"},
            "versions": {"reflectrl": "0.1.0", "torch": "2.5.1", **versions}}


def runs_of(**sessions_by_run: list[dict]) -> dict[str, dict]:
    return {name: {"status": "finished", "sessions": found} for name, found in sessions_by_run.items()}


def test_runs_of_one_clean_commit_and_the_same_versions_need_no_line():
    sources = provenance.run_sources(runs_of(r1=[session(A)], r2=[session(A), session(A)]))
    assert sources["commits"] == [{"commit": A, "uncommitted_changes": False, "runs": 2}]
    assert sources["versions_differ"] == {} and sources["mixed_runs"] == [] and sources["runs_without_sessions"] == 0
    assert provenance.sources_line(sources) is None


@pytest.mark.parametrize("runs, line", [
    (runs_of(r1=[session(A)], r2=[session(B)], r3=[session(B)]),
     "Runs from 2 commits: bbbbbbb (2 runs), aaaaaaa (1 run)."),
    (runs_of(r1=[session(A, dirty=True)], r2=[session(A, dirty=True)]),
     "Runs from 1 commit: aaaaaaa with uncommitted changes (2 runs)."),
    (runs_of(r1=[session("unknown", dirty=None)], r2=[session(A)]),
     "Runs from 2 commits: aaaaaaa (1 run), unknown (1 run)."),
    (runs_of(r1=[session(A, jax="0.4.30")], r2=[session(A, jax="0.4.35")]),
     "Runs from 1 commit: aaaaaaa (2 runs); jax versions differ: 0.4.30 (1 run), 0.4.35 (1 run)."),
    (runs_of(r1=[session(A), session(B)], r2=[session(A)]),
     "Runs from 2 commits: aaaaaaa (2 runs), bbbbbbb (1 run); 1 run resumed under another commit or other package "
     "versions."),
    ({"r1": {"status": "finished"}, "r2": {"status": "finished", "sessions": [session(A)]}},
     "Runs from 1 commit: aaaaaaa (1 run); 1 run recorded no commit (made before runs recorded one)."),
])
def test_runs_of_several_sources_are_told_apart(runs, line):
    sources = provenance.run_sources(runs)
    assert provenance.sources_line(sources) == line
    if len(sources["commits"]) + bool(sources["runs_without_sessions"]) > 1:  # which runs: named
        named = [d for c in sources["commits"] for d in c["run_dirs"]] + sources.get("runs_without_sessions_dirs", [])
        assert set(named) == set(runs)


def test_a_report_from_runs_of_two_commits_says_which(cli, tmp_path):
    from test_report_claims import make_experiment

    root = make_experiment(tmp_path / "exp", {"ppo": [0.0, 1.0, 0.5, 0.2, 0.8], "gear": [1.0, 0.9, 0.8, 0.7, 0.6]})
    for path in sorted(root.glob("runs/*/*/seed*")):  # as the runs record them, the gear runs at a second commit
        status = json.loads((path / "run.json").read_text())
        status["sessions"] = [session(B if "gear" in path.parts[-2] else A, jax="0.4.30")]
        (path / "run.json").write_text(json.dumps(status))
    code, _, err = cli("report", root, "--reps", "200")
    assert code == 0, err

    sources = json.loads((root / "report" / "provenance.json").read_text())["runs_recorded"]["sources"]
    assert [(c["commit"], c["runs"]) for c in sources["commits"]] == [(A, 5), (B, 5)]
    gear = sorted(f"runs/{p.parts[-3]}/{p.parts[-2]}/{p.name}" for p in root.glob("runs/*/gear/seed*"))
    assert len(gear) == 5 and sorted(sources["commits"][1]["run_dirs"]) == gear
    line = "Runs from 2 commits: aaaaaaa (5 runs), bbbbbbb (5 runs)."
    md = (root / "report" / "report.md").read_text().splitlines()
    assert sum(line in m for m in md) == 1 and sum("provenance.json" in m for m in md) == 1
    assert line in (root / "report" / "index.html").read_text()


@pytest.mark.slow
def test_a_jax_group_records_a_session_at_start_and_at_resume(tmp_path):
    """The JAX backend's group of seeds, trained as one program: each run records its start, and its resume
    from the checkpoint's step."""
    pytest.importorskip("jax")
    from test_jax_backend import tiny_config

    from reflectrl.trainers.ppo_jax.trainer import train_group

    run_provenance._this_process.cache_clear()
    heads = {h for h in (git_head(),) if h}
    paths = [str(tmp_path / f"seed{seed}") for seed in (1, 2)]
    assert train_group([(p, tiny_config(seed), []) for p, seed in zip(paths, (1, 2), strict=True)]) == 0
    for path in paths:  # as if stopped at its last checkpoint: the resume loads it and has nothing left to train
        status = json.loads((tmp_path / path / "run.json").read_text())
        (tmp_path / path / "run.json").write_text(json.dumps({**status, "status": "interrupted"}))
    assert train_group([(p, None, []) for p in paths]) == 0
    heads |= {h for h in (git_head(),) if h}
    for path in paths:
        status = json.loads((tmp_path / path / "run.json").read_text())
        first, resumed = status["sessions"]
        check_session(first, 0, heads)
        check_session(resumed, 256, heads)
