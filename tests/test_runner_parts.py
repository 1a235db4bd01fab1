"""The parts of `reflectrl compare` that need no training: what a run directory says about a
run (finished / resume / fresh), the progress read from a metrics file being written, the
archives the Ray backend sends, the experiment lock and the progress display; and the
layering (run-directory file names spelled only in runs/, nothing importing the CLI)."""

import ast
import json
from pathlib import Path

import pytest

import reflectrl
from reflectrl.errors import UserError
from reflectrl.experiments.progress import Progress
from reflectrl.experiments.ray_backend import pack, unpack
from reflectrl.experiments.spec import ExperimentSpec
from reflectrl.experiments.state import ExperimentResult, exclusive, run_state
from reflectrl.runs.files import last_logged_step, read_logged_rows, run_config, run_status
from reflectrl.runs.rundir import CHECKPOINT, CONFIG, METRICS, STATUS, TENSORBOARD

SRC = Path(reflectrl.__file__).parent


def make_runs(root, seeds=1, total_steps=1000):
    spec = ExperimentSpec(envs=["reflectrl/GridWorld-v0"], algos=["ppo"], seeds=seeds, total_steps=total_steps)
    return spec, spec.runs(root)


def write_run(path: Path, status=None, checkpoint=False, config=True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if config:
        (path / CONFIG).write_text(json.dumps({"algo": "ppo", "seed": 1}))
    if status is not None:
        (path / STATUS).write_text(status if isinstance(status, str) else json.dumps(status))
    if checkpoint:
        (path / CHECKPOINT).write_bytes(b"not read by run_state")
    return path


# ------------------------------------------------------------------ run_state

def test_run_state_of_hand_made_run_directories(tmp_path):
    _, runs = make_runs(tmp_path / "exp", seeds=8)
    cases = {
        # a finished run is finished even when its checkpoint is gone
        0: (dict(status={"status": "finished"}, checkpoint=False), "finished"),
        1: (dict(status={"status": "finished"}, checkpoint=True), "finished"),
        # interrupted or killed after a checkpoint: resume from it
        2: (dict(status={"status": "interrupted"}, checkpoint=True), "resume"),
        3: (dict(status={"status": "running"}, checkpoint=True), "resume"),
        # a run.json cut by a kill, or one that is not an object, does not stop a resume
        4: (dict(status='{"status": "fini', checkpoint=True), "resume"),
        5: (dict(status="[1, 2]", checkpoint=True), "resume"),
        # killed before its first checkpoint, or a checkpoint without a config: train afresh
        6: (dict(status={"status": "running"}, checkpoint=False), "fresh"),
        7: (dict(status='{"status": "fini', checkpoint=True, config=False), "fresh"),
    }
    for i, (kwargs, expected) in cases.items():
        write_run(runs[i].path, **kwargs)
        assert run_state(runs[i]) == expected, (kwargs, expected)


def test_run_state_fresh_without_a_directory_or_a_status(tmp_path):
    _, (run,) = make_runs(tmp_path / "exp")
    assert run_state(run) == "fresh"
    run.path.mkdir(parents=True)
    assert run_state(run) == "fresh"
    write_run(run.path, checkpoint=True)  # config and checkpoint, no run.json at all
    assert run_state(run) == "resume"


def test_status_and_config_readers_tolerate_missing_and_corrupt_files(tmp_path):
    run = tmp_path / "run"
    assert run_status(run) is None and run_config(run) is None
    write_run(run, status={"status": "finished", "command": ["reflectrl", "train"]})
    assert run_status(run) == {"status": "finished", "command": ["reflectrl", "train"]}
    assert run_config(run) == {"algo": "ppo", "seed": 1}
    (run / STATUS).write_bytes(b'{"status": "runn')
    (run / CONFIG).write_bytes(b"\xff\xfe not utf-8")
    assert run_status(run) is None and run_config(run) is None


# ------------------------------------------------------------------ metrics read while being written

def rows_text(steps, pad=0) -> str:
    return "".join(json.dumps({"global_step": s, "episodic_return": 1.0, "pad": "x" * pad}) + "\n" for s in steps)


def test_last_logged_step_skips_a_torn_last_line(tmp_path):
    assert last_logged_step(tmp_path) == 0  # no metrics yet
    (tmp_path / METRICS).write_text("")
    assert last_logged_step(tmp_path) == 0
    (tmp_path / METRICS).write_text('{"global_step": 12')  # only a torn line
    assert last_logged_step(tmp_path) == 0
    (tmp_path / METRICS).write_text(rows_text([10, 20, 30]) + '{"global_step": 40, "episodic_ret')
    assert last_logged_step(tmp_path) == 30
    (tmp_path / METRICS).write_text(rows_text([10, 20, 30]) + '{"note": "no step"}\n')
    assert last_logged_step(tmp_path) == 30
    (tmp_path / METRICS).write_text(rows_text([10, 20, 30]))
    assert last_logged_step(tmp_path) == 30


def test_last_logged_step_reads_only_the_tail_of_a_long_file(tmp_path):
    steps = list(range(64, 64 * 500, 64))
    (tmp_path / METRICS).write_text(rows_text(steps, pad=200) + '{"global_step": 99999, "pad": "xx')
    assert (tmp_path / METRICS).stat().st_size > 4096 * 10
    assert last_logged_step(tmp_path) == steps[-1]


def test_read_logged_rows_stops_at_the_first_damaged_line(tmp_path):
    assert read_logged_rows(tmp_path) == []
    (tmp_path / METRICS).write_text(rows_text([1, 2]) + '{"global_step": 3, "epi\n' + rows_text([4]))
    assert [r["global_step"] for r in read_logged_rows(tmp_path)] == [1, 2]


# ------------------------------------------------------------------ Ray archives

def tree(path: Path) -> dict:
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


def test_pack_unpack_round_trip_replaces_the_destination(tmp_path):
    src = write_run(tmp_path / "src", status={"status": "interrupted"}, checkpoint=True)
    (src / METRICS).write_text(rows_text([64, 128]))
    (src / TENSORBOARD).mkdir()
    (src / TENSORBOARD / "events.out.tfevents.1").write_bytes(bytes(range(256)) * 8)
    (src / TENSORBOARD / "empty").mkdir()
    data = pack(src)
    assert isinstance(data, bytes) and data[:2] == b"\x1f\x8b"  # gzip

    dest = tmp_path / "exp" / "runs" / "seed1"  # parents do not exist yet
    unpack(data, dest)
    assert tree(dest) == tree(src)

    # over an existing directory: its old contents are gone, not merged
    (dest / "stale.txt").write_text("from an earlier attempt")
    (dest / METRICS).write_text(rows_text([64, 128, 192, 256]))
    unpack(data, dest)
    assert tree(dest) == tree(src)
    assert [p.name for p in dest.parent.iterdir()] == ["seed1"]  # no temporary directory left behind


def test_unpack_of_a_damaged_archive_leaves_the_destination(tmp_path):
    dest = write_run(tmp_path / "exp" / "seed1", status={"status": "interrupted"}, checkpoint=True)
    before = tree(dest)
    data = pack(dest)
    with pytest.raises(Exception):
        unpack(data[: len(data) // 2], dest)
    assert tree(dest) == before
    assert [p.name for p in dest.parent.iterdir()] == ["seed1"]


# ------------------------------------------------------------------ the experiment lock

def test_a_second_lock_on_an_experiment_fails_with_one_line(tmp_path):
    pytest.importorskip("fcntl")
    root = tmp_path / "exp"
    with exclusive(root):
        assert root.is_dir()  # the lock creates the experiment directory
        with pytest.raises(UserError) as err:
            with exclusive(root):
                pytest.fail("a second compare got the lock")
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"another 'reflectrl compare' is running on {root}")
    with exclusive(root):  # released when the first holder is done
        pass


# ------------------------------------------------------------------ the progress display

def test_progress_never_goes_backwards_and_caps_at_total_steps(tmp_path):
    spec, runs = make_runs(tmp_path / "exp", seeds=3, total_steps=1000)
    result = ExperimentResult(skipped=[runs[0]])
    bar = Progress(spec, runs, result, enabled=False)
    try:
        a, b = runs[1].path, runs[2].path
        assert bar.steps == {runs[0].path: 1000, a: 0, b: 0}  # a finished run counts in full
        bar.set_step(a, 512)
        bar.set_step(a, 256)  # a resumed run's metrics were cut back to its checkpoint
        assert bar.steps[a] == 512
        bar.set_step(a, 0)  # the metrics file is being replaced and reads as empty
        assert bar.steps[a] == 512
        bar.set_step(a, 1024)  # runs end on a whole batch, past the budget
        assert bar.steps[a] == 1000
        bar.set_step(b, 768)
        assert bar.steps == {runs[0].path: 1000, a: 1000, b: 768}
        assert sum(bar.steps.values()) <= bar.bar.total == 3000
    finally:
        bar.close()


def test_progress_bar_counts_what_set_step_adds(tmp_path, capsys):
    spec, runs = make_runs(tmp_path / "exp", seeds=2, total_steps=100)
    result = ExperimentResult()
    bar = Progress(spec, runs, result, enabled=True)
    try:
        for step in (30, 10, 60, 250, 90):
            bar.set_step(runs[0].path, step)
        bar.set_step(runs[1].path, 40)
        assert bar.bar.n == 100 + 40
        result.finished.append(runs[0])
        result.failed.append((runs[1], "boom"))
        bar.set_running(0)
        assert bar.bar.postfix == "runs 1/2 done, 0 running, 1 failed"
    finally:
        bar.close()


# ------------------------------------------------------------------ layering

RUN_FILES = (CONFIG, STATUS, METRICS, CHECKPOINT)


def _strings(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def test_runner_and_report_spell_no_run_directory_file_names():
    spelled = []
    for package in ("experiments", "report"):
        for path in sorted((SRC / package).glob("*.py")):
            spelled += [f"{path.name}: {s}" for s in _strings(path)
                        if s in RUN_FILES or any(s.endswith("/" + name) for name in RUN_FILES)]
    assert spelled == []


def test_nothing_below_the_cli_imports_it():
    importers = []
    for path in sorted(SRC.rglob("*.py")):
        if path.relative_to(SRC).as_posix() in ("cli.py", "__main__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if "reflectrl.cli" in names:
                importers.append(str(path.relative_to(SRC)))
    assert importers == []
