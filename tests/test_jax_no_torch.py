"""The JAX backend's path imports no torch (issue 61): its checkpoints, TensorBoard events and state-map
samples are written and read without it. A torch import in a checked process fails it: a `sitecustomize`
on PYTHONPATH refuses `import torch` in every Python process of the command (compare's train-group
children too) and prints who asked, so the test names the importer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reflectrl.errors import UserError
from reflectrl.runs.rundir import PICKLE_HEADER, MetricsLogger, RunDir, ScalarEvents, read_metrics

TINY = ["backend=jax", "num_envs=2", "num_steps=16", "num_minibatches=2", "update_epochs=2", "hidden_sizes=8,8"]
REFUSED = "torch imported on the JAX path"
NO_TORCH = f"""
import sys, traceback

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            traceback.print_stack()
            raise ImportError("{REFUSED} (tests/test_jax_no_torch.py)")

sys.meta_path.insert(0, NoTorch())
"""


def no_torch_env(tmp_path: Path) -> dict:
    """The environment of a process (and its children) in which `import torch` fails loudly."""
    folder = tmp_path / "no_torch"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(NO_TORCH)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def test_the_guard_fails_a_process_that_imports_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import torch"], env=no_torch_env(tmp_path),
                          capture_output=True, text=True)
    assert done.returncode != 0 and REFUSED in done.stderr


PLUMBING = """
import sys
import numpy as np
from reflectrl.runs.rundir import MetricsLogger, RunDir
from reflectrl.runs.state_samples import StateSampler

run = RunDir.create(sys.argv[1], {"env_id": "gymnax:CartPole-v1"}, command=["test"])
state = {"format": "test", "global_step": 64, "leaves": [np.arange(6, dtype=np.uint32), np.ones((2, 3))]}
run.stage_checkpoint(state)
run.commit_checkpoint()
assert run.load_checkpoint()["global_step"] == 64 and run.staged_checkpoint() is None
logger = MetricsLogger(run, resume_step=None)
logger.log({"global_step": 64, "loss": 0.5, "episodes": 3})
logger.close()
rng = np.random.default_rng(0)
StateSampler(run.path, 1, 4, 2).record(4, 64, rng.normal(size=(16, 2, 4)), np.arange(32).reshape(16, 2),
                                       rng.normal(size=(16, 2)).astype(np.float32), {"bonus": np.ones((16, 2))})
run.unlock()
print("torch" in sys.modules)
"""


def test_checkpoints_events_and_state_samples_are_written_and_read_without_torch(tmp_path):
    done = subprocess.run([sys.executable, "-c", PLUMBING, str(tmp_path / "run")], env=no_torch_env(tmp_path),
                          capture_output=True, text=True)
    assert done.returncode == 0 and REFUSED not in done.stderr, done.stderr
    assert done.stdout.split() == ["False"]
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes().startswith(PICKLE_HEADER)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["torch_version"]  # read without importing it


def test_a_checkpoint_of_numpy_leaves_is_a_pickle_and_a_torch_ones_is_torch_saves(tmp_path):
    torch = pytest.importorskip("torch")
    run = RunDir(tmp_path)
    leaves = [np.arange(5, dtype=np.uint32), np.linspace(0, 1, 7, dtype=np.float32), np.array(3, np.int64)]
    run.save_checkpoint({"global_step": 7, "leaves": leaves, "config": {"seed": 1}, "recent_returns": [1.5]})
    assert run.checkpoint_path.read_bytes().startswith(PICKLE_HEADER)
    back = run.load_checkpoint()
    assert back["config"] == {"seed": 1} and back["recent_returns"] == [1.5] and run.checkpoint_step == 7
    for a, b in zip(leaves, back["leaves"], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    # a torch trainer's state (tensors anywhere in it) keeps torch.save's file
    run.save_checkpoint({"global_step": 8, "model": {"w": torch.ones(2)}})
    assert run.checkpoint_path.read_bytes()[:2] == b"PK"
    assert torch.equal(run.load_checkpoint()["model"]["w"], torch.ones(2))


def test_a_jax_checkpoint_written_by_torch_save_still_loads(tmp_path):
    """Before PICKLE_HEADER, a JAX run's checkpoint (numpy leaves) was torch.save's file: told apart by content."""
    torch = pytest.importorskip("torch")
    run = RunDir(tmp_path)
    old = {"format": "reflectrl-jax-ppo-1", "global_step": 96, "iteration": 3, "leaves": [np.arange(4.0)]}
    for name in ("checkpoint.pt", "checkpoint.pt.staged"):
        torch.save(old, tmp_path / name)
    for state in (run.load_checkpoint(), run.staged_checkpoint()):
        assert state["iteration"] == 3 and np.array_equal(state["leaves"][0], np.arange(4.0))


def test_a_damaged_pickle_checkpoint_is_one_line(tmp_path):
    run = RunDir(tmp_path)
    run.save_checkpoint({"global_step": 1, "leaves": [np.zeros(3)]})
    data = run.checkpoint_path.read_bytes()
    run.checkpoint_path.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="is corrupt .*train again"):
        run.load_checkpoint()
    (tmp_path / "checkpoint.pt.staged").write_bytes(data[: len(PICKLE_HEADER) + 3])
    assert run.staged_checkpoint() is None  # a damaged staged checkpoint is as good as none


def _events(folder: Path) -> list[dict]:
    """Every event of a folder's event files, as dicts without their wall time."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            d = MessageToDict(event)
            d.pop("wallTime")
            out.append(d)
    return out


def test_the_event_file_is_the_one_torchs_summary_writer_writes(tmp_path):
    """Same events (tags, steps, values, the purge marks of a resume) as torch.utils.tensorboard's writer."""
    pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter

    for purge in (None, 65):
        ours, theirs = ScalarEvents(tmp_path / f"ours{purge}", purge_step=purge), SummaryWriter(
            str(tmp_path / f"theirs{purge}"), purge_step=purge)
        for step, value in ((64, 0.25), (128, -1.0), (192, 3)):
            for writer in (ours, theirs):
                writer.add_scalar("loss", value, step)
                writer.add_scalar("episodic_return", value * 2, step)
        ours.close()
        theirs.close()
        assert _events(tmp_path / f"ours{purge}") == _events(tmp_path / f"theirs{purge}")
        assert len(_events(tmp_path / f"ours{purge}")) == 7 + (2 if purge else 0)


def test_a_resumed_runs_events_hide_what_the_killed_process_logged_past_the_checkpoint(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = RunDir(tmp_path)
    first = MetricsLogger(run)
    for step in (32, 64, 96, 128):
        first.log({"global_step": step, "loss": float(step)})
    first.close()
    time.sleep(1.1)  # event files are named by the second they were opened in
    second = MetricsLogger(run, resume_step=64)  # the checkpoint was at 64: 96 and 128 come again
    for step in (96, 128):
        second.log({"global_step": step, "loss": -float(step)})
    second.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(32, 32.0), (64, 64.0), (96, -96.0), (128, -128.0)]
    assert [r["global_step"] for r in read_metrics(tmp_path)] == [32, 64, 96, 128]


def test_a_run_resumed_from_step_0_keeps_none_of_what_the_killed_process_logged(tmp_path):
    """The step-0 checkpoint comes before anything runs: a row logged at step 0 after it (the
    untrained policy's evaluation) is logged again by the resumed run, so it is not kept twice."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = RunDir(tmp_path)
    first = MetricsLogger(run, resume_step=0)  # a fresh run
    first.log({"global_step": 0, "eval_accuracy": 0.25})
    first.close()
    time.sleep(1.1)  # event files are named by the second they were opened in
    second = MetricsLogger(run, resume_step=0)  # killed before its first periodic checkpoint
    second.log({"global_step": 0, "eval_accuracy": 0.25})
    second.log({"global_step": 1, "eval_accuracy": 0.5})
    second.close()
    assert [r["global_step"] for r in read_metrics(tmp_path)] == [0, 1]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("eval_accuracy")] == [(0, 0.25), (1, 0.5)]


def test_state_samples_from_numpy_and_from_torch_are_the_same_file(tmp_path):
    torch = pytest.importorskip("torch")
    from reflectrl.runs.state_samples import StateSampler, load_samples

    rng = np.random.default_rng(3)
    obs, keys = rng.normal(size=(32, 4, 6)).astype(np.float32), rng.integers(0, 99, size=(32, 4))
    rewards, term = rng.normal(size=(32, 4)).astype(np.float32), rng.normal(size=(32, 4))
    for name, convert in (("numpy", np.asarray), ("torch", torch.from_numpy)):
        (tmp_path / name).mkdir()
        StateSampler(tmp_path / name, 5, 10, 2).record(10, 640, convert(obs), convert(keys), convert(rewards),
                                                       {"bonus": convert(term)})
    a, b = (load_samples(tmp_path / name / "state_samples.npz")[10] for name in ("numpy", "torch"))
    assert sorted(a) == sorted(b) == ["global_step", "obs", "rewards", "state_keys", "term:bonus"]
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key])
    # a bfloat16 term (numpy has no bfloat16) is kept as float32, as before
    (tmp_path / "bf16").mkdir()
    StateSampler(tmp_path / "bf16", 5, 10, 2).record(10, 640, obs, keys, rewards,
                                                     {"bonus": torch.from_numpy(term).bfloat16()})
    assert load_samples(tmp_path / "bf16" / "state_samples.npz")[10]["term:bonus"].dtype == np.float32


@pytest.mark.slow
def test_a_gymnax_env_is_made_without_gymnaxs_renderers(tmp_path):
    """make_env (what a run's resolve calls first) imports gymnax with the stand-ins of envs/jax_envs.import_gymnax:
    seaborn and pyplot (and scipy.stats, pandas under them) are seconds of a JAX run's start-up."""
    pytest.importorskip("gymnax")
    code = ("import sys; from reflectrl.envs.jax_envs import make_env; make_env('gymnax:CartPole-v1'); "
            "print(sorted({'seaborn', 'matplotlib.pyplot', 'scipy.stats', 'pandas'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], env=no_torch_env(tmp_path), capture_output=True, text=True)
    assert done.returncode == 0 and REFUSED not in done.stderr, done.stderr
    assert done.stdout.split() == ["[]"]


def _reflectrl(env: dict, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "reflectrl", *argv], env=env, capture_output=True, text=True)
    assert REFUSED not in done.stderr, done.stderr
    if check:
        assert done.returncode == 0, done.stderr
    return done


@pytest.mark.slow
def test_train_stop_and_resume_on_backend_jax_import_no_torch(tmp_path):
    """`reflectrl train --set backend=jax`, stopped by SIGTERM at a chunk's end and resumed, in processes that
    cannot import torch; the checkpoint is the torch-free file, and the events hide the steps trained again."""
    pytest.importorskip("gymnax")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env, out = no_torch_env(tmp_path), tmp_path / "run"
    argv = ["train", "--env", "gymnax:CartPole-v1", "--total-steps", "65536", "--no-progress", "--out", str(out),
            "--set", *TINY, "checkpoint_every=512"]
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").exists() and read_metrics(out):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    assert REFUSED not in err, err
    assert proc.returncode == 143, err
    stopped = json.loads((out / "run.json").read_text())
    assert stopped["status"] == "interrupted" and 0 < stopped["global_step"] < 65536
    assert (out / "checkpoint.pt").read_bytes().startswith(PICKLE_HEADER)

    _reflectrl(env, "train", "--resume", str(out), "--no-progress")
    status = json.loads((out / "run.json").read_text())
    assert status["status"] == "finished" and status["global_step"] == 65536
    steps = [r["global_step"] for r in read_metrics(out)]
    assert steps == list(range(32, 65536 + 1, 32))
    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == steps
    # and `reflectrl eval` of the run, in a process that cannot import torch either
    shown = _reflectrl(env, "eval", str(out), "--episodes", "2", "--json")
    assert json.loads(shown.stdout)["episodes"] == 2


@pytest.mark.slow
def test_compare_on_backend_jax_imports_no_torch(tmp_path):
    """`reflectrl compare --set backend=jax`: the command, its train-group children and its report."""
    pytest.importorskip("gymnax")
    out = tmp_path / "cmp"
    _reflectrl(no_torch_env(tmp_path), "compare", "--env", "gymnax:CartPole-v1", "--algos", "ppo", "--seeds", "2",
               "--total-steps", "256", "--out", str(out), "--no-progress", "--set", *TINY)
    logs = list(out.rglob("*.log"))
    assert logs and not any(REFUSED in p.read_text() for p in logs)
    for run_json in out.rglob("run.json"):
        assert json.loads(run_json.read_text())["status"] == "finished"
    for checkpoint in out.rglob("checkpoint.pt"):
        with open(checkpoint, "rb") as f:
            assert f.read(len(PICKLE_HEADER)) == PICKLE_HEADER
    assert (out / "report" / "report.md").exists()
