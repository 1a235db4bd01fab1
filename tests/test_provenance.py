"""Provenance and per-run data (issue 40): `reflectrl compare` / `report` write report/provenance.json
with every field, the statistics settings equal to the report code's constants, and commit "unknown"
outside a git checkout; every published report under docs/results carries runs.csv (or is on the
commented allow-list of folders with no per-run data) and provenance.json; a folder moved under
docs/results/archive/ is not checked so, but says why in its ARCHIVED.md and is listed in the archive's
README.md."""

import csv
import datetime
import io
import json
import shlex
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

import reflectrl
from reflectrl.report import BOOTSTRAP_REPS, provenance, stats
from reflectrl.report.analysis import ALPHA, MARGIN_SHARE, MIN_SEEDS_FOR_CI

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
TINY_SETS = ["env.size=5", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1"]

# Published reports with no per-run scores at all: no runs.csv, and a stats.json without "runs"
# (they were published before reports kept each run's scores, and their run directories are gone).
# Each needs a re-run with today's code, or a move under docs/results/archive/ (issue 40), as
# refgrpo-halfcheetah, sdrs-halfcheetah-delayed and sdrs-ant-delayed were (2026-12-05).
NO_PER_RUN_DATA: set[str] = set()  # every published folder has its per-run scores now (issue 40)
STATISTICS_KEYS = {"bootstrap_resamples", "default_bootstrap_resamples", "interval_bootstrap_seed",
                   "verdict_bootstrap_seeds", "ci_level", "alpha", "holm_correction", "equivalence_margin_share",
                   "min_seeds_for_ci"}


def expected_statistics(reps: int) -> dict:
    return {"bootstrap_resamples": reps, "default_bootstrap_resamples": BOOTSTRAP_REPS,
            "interval_bootstrap_seed": 0, "verdict_bootstrap_seeds": list(stats.VERDICT_SEEDS), "ci_level": 0.95,
            "alpha": ALPHA, "holm_correction": True, "equivalence_margin_share": MARGIN_SHARE,
            "min_seeds_for_ci": MIN_SEEDS_FOR_CI}


def git_head(path: Path) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def spec_of_command(command: str):
    """The ExperimentSpec and --out of a `reflectrl compare ...` command line, parsed as the CLI parses it."""
    from reflectrl.cli import build_parser
    from reflectrl.experiments.spec import ExperimentSpec, parse_algos

    argv = shlex.split(command)
    assert argv[:2] == ["reflectrl", "compare"], command
    args = build_parser().parse_args(argv[1:])
    spec = ExperimentSpec(envs=args.env.split(","), algos=[e.label for e in parse_algos(args.algos)],
                          seeds=args.seeds, total_steps=args.total_steps, wrapper=args.wrapper,
                          sets=[item for group in args.set or [] for item in group], first_seed=args.first_seed)
    return spec, Path(args.out)


@pytest.mark.slow
def test_compare_writes_provenance_with_every_field(cli, tmp_path):
    from reflectrl.experiments.spec import read_spec

    out = tmp_path / "exp"
    before = git_head(provenance.SOURCE_DIR)  # the checkout is shared: a commit may land meanwhile
    code, _, err = cli("compare", "--env", "reflectrl/GridWorld-v0", "--algos", "ppo,ppo[ent_coef=0]",
                       "--seeds", "1", "--first-seed", "3", "--total-steps", "1024", "--set", *TINY_SETS,
                       "--out", out, "--no-progress")
    assert code == 0, err
    data = json.loads((out / "report" / "provenance.json").read_text())
    assert set(data) == {"recorded", "experiment", "date", "git", "command", "command_note", "report_command",
                         "written_by", "versions", "machine", "statistics", "runs_recorded"}
    assert data["recorded"] is True and data["experiment"] == "exp"

    # the git commit of the reflectrl source that wrote it, and whether it had uncommitted changes
    head = git_head(provenance.SOURCE_DIR)
    assert data["git"]["commit"] in ({before, head} if head else {"unknown"})
    assert data["git"]["uncommitted_changes"] in ((True, False) if head else (None,))
    assert data["git"]["source"] == str(provenance.SOURCE_DIR)

    # the command that makes the runs: the same experiment when parsed back; the one that wrote the report
    spec, root = spec_of_command(data["command"])
    assert spec == read_spec(out) and root == out and "--first-seed 3" in data["command"]
    assert data["report_command"] == f"reflectrl report {shlex.quote(str(out))} --reps {BOOTSTRAP_REPS}"
    assert data["written_by"]

    # versions (the installed ones, nothing imported to find them), machine, date
    versions = data["versions"]
    assert versions["reflectrl"] == reflectrl.__version__ and versions["python"].split()[-1].count(".") == 2
    for name in ("torch", "gymnasium", "numpy"):
        assert versions[name] == metadata.version(name)
    for name in provenance.OPTIONAL_PACKAGES:
        try:
            assert versions[name] == metadata.version(name)
        except metadata.PackageNotFoundError:
            assert name not in versions
    assert set(data["machine"]) >= {"platform", "arch", "cpu_count", "hostname"} and data["machine"]["cpu_count"] >= 1
    date = datetime.datetime.fromisoformat(data["date"])
    assert date.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - date).total_seconds()) < 3600

    # the statistics settings are the report code's own constants
    assert data["statistics"] == expected_statistics(BOOTSTRAP_REPS)
    stated, settings = json.loads((out / "report" / "stats.json").read_text())["bootstrap"], data["statistics"]
    assert stated == {"reps": settings["bootstrap_resamples"], "verdict_seeds": settings["verdict_bootstrap_seeds"],
                      "alpha": settings["alpha"], "margin_share": settings["equivalence_margin_share"]}

    # what the runs recorded when they started
    assert data["runs_recorded"]["runs"] == 2
    assert data["runs_recorded"]["reflectrl_version"] == {reflectrl.__version__: 2}
    assert len(data["runs_recorded"]["created"]) == 2
    assert "jax_version" not in data["runs_recorded"]  # torch runs; a JAX run's: tests/test_jax_backend.py
    # and which commit each came from: both started at this checkout's (tests/test_run_provenance.py: several)
    sources = data["runs_recorded"]["sources"]
    assert sources["runs_with_sessions"] == 2 and sources["runs_without_sessions"] == 0
    assert [c["runs"] for c in sources["commits"]] == [2]
    assert sources["commits"][0]["commit"] in ({before, head} if head else {"unknown"})

    # report.md says in one line where its provenance is
    md = (out / "report" / "report.md").read_text()
    assert sum("provenance.json" in line for line in md.splitlines()) == 1


def test_statistics_settings_are_the_code_constants():
    assert provenance.statistics(BOOTSTRAP_REPS) == expected_statistics(BOOTSTRAP_REPS)
    assert provenance.statistics(200)["bootstrap_resamples"] == 200


def test_outside_a_git_checkout_the_commit_is_unknown(cli, tmp_path, monkeypatch):
    """A reflectrl tree in no git checkout, one git does not track, or no git at all: commit "unknown",
    and the report is written all the same."""
    from test_report_claims import make_experiment

    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # no checkout above tmp_path is looked at
    lone = tmp_path / "installed" / "reflectrl"
    lone.mkdir(parents=True)
    assert provenance.git_state(lone) == {"commit": "unknown", "uncommitted_changes": None, "source": str(lone)}

    if git_head(provenance.SOURCE_DIR) is not None:  # git is here: a checkout that does not track the tree
        repo = tmp_path / "checkout"
        (repo / "venv" / "reflectrl").mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
        (repo / "README").write_text("x\n")
        subprocess.run(["git", "-C", str(repo), "add", "README"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                       check=True)
        assert git_head(repo / "venv" / "reflectrl")  # git answers there, yet the tree is not its
        assert provenance.git_state(repo / "venv" / "reflectrl")["commit"] == "unknown"

    root = make_experiment(tmp_path / "exp", {"ppo": [0.0, 1.0, 0.5, 0.2, 0.8], "gear": [1.0, 0.9, 0.8, 0.7, 0.6]})
    monkeypatch.setattr(provenance, "SOURCE_DIR", lone)
    code, _, err = cli("report", root, "--reps", "200")
    assert code == 0, err
    data = json.loads((root / "report" / "provenance.json").read_text())
    assert data["git"]["commit"] == "unknown" and data["git"]["uncommitted_changes"] is None
    assert data["statistics"] == expected_statistics(200)

    monkeypatch.setattr(provenance, "SOURCE_DIR", Path(reflectrl.__file__).resolve().parent)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no git at all
    assert provenance.git_state()["commit"] == "unknown"


# ---------------------------------------------------------------- the published results


def _reports(folder: Path) -> list[tuple[Path, str]]:
    """(report file, prefix) of a results folder: report.md, or NAME-report.md (several in one folder)."""
    return [(p, p.name[:-len("report.md")]) for p in sorted(folder.glob("*report.md"))
            if p.name == "report.md" or p.name.endswith("-report.md")]


ARCHIVE = RESULTS / "archive"  # withdrawn or superseded results, kept for history: not checked as published
FOLDERS = sorted(p for p in RESULTS.iterdir() if p.is_dir() and p != ARCHIVE)


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_every_published_result_has_runs_and_provenance(folder):
    from reflectrl.report.merge import EXTRA_COLUMNS
    from reflectrl.report.render import runs_csv

    for report, prefix in _reports(folder):
        runs = folder / f"{prefix}runs.csv"
        stats_file = folder / f"{prefix}stats.json"
        stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
        per_run = stats.get("runs")
        if folder.name in NO_PER_RUN_DATA:
            assert not runs.exists() and not per_run, f"{folder.name} has per-run data now: take it off the list"
            continue
        assert runs.is_file(), f"{report.relative_to(ROOT)} has no {runs.name}"
        rows = list(csv.DictReader(io.StringIO(runs.read_text())))
        assert rows and {"env", "algo", "seed", "status", "final", "auc"} <= set(rows[0])
        if per_run:  # the same scores as stats.json, in the columns the report writes today
            extra = EXTRA_COLUMNS if "parts" in stats else None  # a merged report's runs name their part
            assert runs.read_bytes() == runs_csv(per_run, extra=extra)

    path = folder / "provenance.json"
    assert path.is_file(), f"{folder.relative_to(ROOT)} has no provenance.json"
    data = json.loads(path.read_text())
    assert isinstance(data.get("recorded"), bool)
    if data["recorded"]:
        assert {"git", "command", "versions", "machine", "date", "statistics"} <= set(data)
        assert STATISTICS_KEYS <= set(data["statistics"])
    else:  # written afterwards: says so, and invents no commit or version
        assert "before" in data["note"] and data["git"]["commit"] == "unknown" and data["versions"] == "unknown"
        assert "statistics" in data


def test_the_allow_list_names_published_folders():
    assert NO_PER_RUN_DATA <= {p.name for p in FOLDERS}


def test_every_archived_folder_says_why_and_is_listed():
    """docs/results/archive/NAME: an ARCHIVED.md (why, what superseded it, the re-run command), and a
    line in the archive's README.md linking it."""
    archived = sorted(p for p in ARCHIVE.iterdir() if p.is_dir()) if ARCHIVE.is_dir() else []
    readme = (ARCHIVE / "README.md").read_text() if archived else ""
    for folder in archived:
        assert (folder / "ARCHIVED.md").is_file(), f"{folder.relative_to(ROOT)} has no ARCHIVED.md"
        assert f"]({folder.name}/ARCHIVED.md)" in readme, f"docs/results/archive/README.md does not list {folder.name}"
