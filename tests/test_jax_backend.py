"""backend=jax (issue 39): the compiled PPO's run directories, resume, seeds vectorised, and the
one-line refusals. Shapes are tiny and the compiled programs shared within the module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata

import numpy as np
import pytest

jax = pytest.importorskip("jax")
pytest.importorskip("gymnax")

from reflectrl.cli import main  # noqa: E402
from reflectrl.runs.rundir import RunDir, read_metrics  # noqa: E402
from reflectrl.trainers.ppo_jax.trainer import JaxGroup, chunk_length  # noqa: E402
from reflectrl.trainers.resolve import new_run_config  # noqa: E402

TINY = ["backend=jax", "num_envs=2", "num_steps=16", "num_minibatches=2", "update_epochs=2", "hidden_sizes=8,8"]


def tiny_config(seed: int, algo: str = "ppo", total: int = 256, extra=()):
    return new_run_config(algo=algo, env_id="gymnax:CartPole-v1", seed=seed, total_steps=total,
                          overrides=[*TINY, "checkpoint_every=64", *extra])


@pytest.mark.parametrize("argv, says", [
    (["--env", "gymnax:CartPole-v1"], "is a JAX env: add --set backend=jax"),
    (["--env", "CartPole-v1", "--set", "backend=jax"], "backend=jax takes gymnax:<id>"),
    (["--algo", "dqn", "--env", "gymnax:CartPole-v1", "--set", "backend=jax"],
     "dqn trains on backend=gymnasium or envpool"),
    (["--algo", "ppo+lagrangian", "--env", "gymnax:CartPole-v1", "--set", "backend=jax"],
     "signal 'lagrangian' has no JAX implementation"),
    (["--env", "gymnax:CartPole-v1", "--set", "backend=jax", "target_kl=0.01"], "target_kl=0.01 is torch-only"),
    (["--env", "gymnax:CartPole-v1", "--set", "backend=jax", "norm_obs=true", "clip_obs=0"],
     "clip_obs=0.0: must be > 0"),
    (["--env", "gymnax:NoSuchEnv-v0", "--set", "backend=jax"], "gymnax has no such env"),
    (["--env", "navix:Navix-NoSuch-v0", "--set", "backend=jax"], "navix has no such env"),
    (["--env", "gymnax:CartPole-v1", "--wrapper", "sparse", "--set", "backend=jax"], "--wrapper sparse is torch-only"),
    (["--env", "xminigrid:MiniGrid-LockedRoom"], "is a JAX env: add --set backend=jax"),
    (["--env", "xminigrid:MiniGrid-NoSuch", "--set", "backend=jax"], "xland-minigrid has no such task"),
    (["--env", "xminigrid:XLand-MiniGrid-R1-9x9", "--set", "backend=jax"], "need a benchmark of rulesets"),
    (["--env", "xminigrid:MiniGrid-MemoryS64", "--set", "backend=jax"], "grids up to 64 x 32 cells"),
    (["--env", "xminigrid:MiniGrid-Empty-5x5", "--set", "backend=jax", "env.colour=1"], "its settings: height"),
])
def test_refusals_are_one_line_and_leave_no_run(tmp_path, capsys, argv, says):
    out = tmp_path / "run"
    assert main(["train", *argv, "--total-steps", "1024", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_navix_key_corridor_is_refused_while_it_cannot_be_solved(tmp_path, capsys):
    """navix 0.7.4's KeyCorridor puts its doors in walls and its goal is a Ball that never pays: a run
    there learns nothing whatever the algorithm (envs.key_corridor_defects). The check finds that on
    KeyCorridor and nothing on DoorKey, whose door is a gap in its wall and whose goal pays."""
    from reflectrl.envs.jax_envs import import_navix, key_corridor_defects

    navix = import_navix()
    assert key_corridor_defects(navix.make("Navix-DoorKey-Random-5x5-v0")) == []
    found = key_corridor_defects(navix.make("Navix-KeyCorridorS3R3-v0"))
    if not found:
        pytest.skip(f"navix {metadata.version('navix')}'s KeyCorridor can be solved: run it "
                    "(examples/experiments/jax_device.py)")
    assert any("walls" in f for f in found)
    out = tmp_path / "run"
    argv = ["train", "--env", "navix:Navix-KeyCorridorS3R3-v0", "--set", "backend=jax", "--total-steps", "1024",
            "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "KeyCorridor cannot be solved" in err and "--env MiniGrid-KeyCorridorS3R3-v0 --set backend=envpool" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err and not out.exists()


@pytest.mark.slow
def test_gymnax_imports_without_its_renderers_and_leaves_them_importable():
    """import_gymnax stands in for seaborn and pyplot while gymnax loads, then takes the stand-ins
    out: the env works, nothing of theirs was loaded, and a later real import gets the real ones."""
    code = ("import sys; from reflectrl.envs.jax_envs import import_gymnax, make_env\n"
            "import_gymnax(); env = make_env('gymnax:CartPole-v1')\n"
            "assert not {'seaborn', 'matplotlib.pyplot', 'scipy.stats'} & set(sys.modules)\n"
            "import seaborn, matplotlib.pyplot as plt\n"
            "assert callable(seaborn.color_palette) and callable(plt.subplots)\n"
            "print(env.id)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gymnax:CartPole-v1"


def test_chunks_divide_the_run_where_they_can():
    assert chunk_length(196, 64) == 49
    assert chunk_length(10, 64) == 10
    assert chunk_length(97, 64) == 64  # a prime: the last chunk is masked (computed, not applied)
    assert chunk_length(1, 1) == 1


def test_the_returns_of_the_last_episodes_are_taken_in_the_program():
    """Issue 57 item 8: the end-of-run summary meant "the last 20 episodes" on torch and "the last 92
    iterations' episodes" (a mean of iteration means) on JAX. The program now hands out each iteration's
    last episodes' returns, in the order they ended, as the torch trainers keep them."""
    from reflectrl.trainers.ppo_jax.ppo import last_ended

    rng = np.random.default_rng(0)
    for count, p in ((20, 0.1), (20, 0.01), (5, 0.5)):
        done = rng.random((16, 3)) < p  # (T, N)
        returns = rng.normal(size=(16, 3)).astype(np.float32)
        ended = [float(r) for r, d in zip(returns.reshape(-1), done.reshape(-1), strict=True) if d][-count:]
        got = np.asarray(last_ended(jax.numpy.asarray(done), jax.numpy.asarray(returns), count))
        assert got.shape == (count,) and np.isnan(got[:count - len(ended)]).all()
        np.testing.assert_array_equal(got[count - len(ended):], np.asarray(ended, np.float32))


@pytest.mark.slow
def test_the_end_of_run_summary_means_the_last_20_episodes(tmp_path, capsys):
    from reflectrl.runs.progress import RECENT_EPISODES

    out = tmp_path / "run"
    assert main(["train", "--env", "gymnax:CartPole-v1", "--total-steps", "1024", "--out", str(out), "--no-progress",
                 "--set", *TINY]) == 0
    rows = read_metrics(out)
    assert sum(r["episodes"] for r in rows if r.get("episodes")) > RECENT_EPISODES  # a random policy: ~20 steps each
    assert f"mean return of the last {RECENT_EPISODES} episodes " in capsys.readouterr().out
    assert len(RunDir.open(out).load_checkpoint()["recent_returns"]) == RECENT_EPISODES  # episodes, not iterations


@pytest.fixture(scope="module")
def group_and_single():
    """Seeds 1 and 2 as one program, and seed 2 alone; trained in process (no run directories)."""
    group = JaxGroup([tiny_config(1), tiny_config(2)], [None, None])
    group.train(progress=False)
    single = JaxGroup([tiny_config(2)], [None])
    single.train(progress=False)
    return group, single


def assert_same_params(group, i, other, j):
    """Run i of `group` and run j of `other` end with the same parameters (to float rounding: a seed
    vmapped among others runs batched matrix products where alone it runs plain ones)."""
    a = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x[i], group.states["params"]))
    b = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x: x[j], other.states["params"]))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)


def test_a_seed_in_a_group_trains_as_it_would_alone(group_and_single):
    group, single = group_and_single
    assert_same_params(group, 1, single, 0)
    assert group.params_sha256(0) != group.params_sha256(1)  # the seeds differ
    assert group.global_step == single.global_step == 256


def test_the_exploration_metrics_are_computed_in_the_program(group_and_single):
    group, _ = group_and_single
    state = jax.tree_util.tree_map(lambda x: np.asarray(x[0]), group.states)
    seen = int(state["seen"].sum())
    assert 0 < seen <= 2 ** 16
    assert state["first_reward_step"] > 0  # CartPole pays a reward on every step


@pytest.mark.slow
def test_run_directories_and_kill_9_resume_give_the_same_parameters(tmp_path):
    """An uninterrupted run and one killed (SIGKILL) after a checkpoint, then resumed, end with the same
    parameters; both directories hold what `report` reads."""
    base = ["train", "--env", "gymnax:CartPole-v1", "--seed", "3", "--total-steps", "8192", "--no-progress",
            "--set", *TINY, "checkpoint_every=512"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run([sys.executable, "-m", "reflectrl", *base, "--out", str(whole)], check=True, env=env,
                   capture_output=True)
    proc = subprocess.Popen([sys.executable, "-m", "reflectrl", *base, "--out", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        rows = read_metrics(killed) if (killed / "metrics.jsonl").exists() else []
        if rows and rows[-1]["global_step"] >= 1024:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert RunDir(killed).load_checkpoint()["global_step"] < 8192
    subprocess.run([sys.executable, "-m", "reflectrl", "train", "--resume", str(killed), "--no-progress"],
                   check=True, env=env, capture_output=True)
    a, b = (json.loads((d / "run.json").read_text()) for d in (whole, killed))
    assert a["status"] == b["status"] == "finished"
    assert a["params_sha256"] == b["params_sha256"]
    rows = read_metrics(killed)
    steps = [r["global_step"] for r in rows]
    assert steps == sorted(set(steps)) and steps == [r["global_step"] for r in read_metrics(whole)]
    assert rows[-1]["global_step"] == 8192
    for key in ("episodic_return", "unique_states", "unique_states_total", "visitation_entropy", "loss"):
        assert key in rows[-1]
    # `reflectrl eval` takes the run: the checkpoint's policy, the parameters the run finished with
    done = subprocess.run([sys.executable, "-m", "reflectrl", "eval", str(killed), "--episodes", "3", "--json"],
                          check=True, env=env, capture_output=True, text=True)
    result = json.loads(done.stdout)
    assert result["episodes"] == 3 and len(result["returns"]) == 3
    assert result["params_sha256"] == b["params_sha256"]


@pytest.mark.slow
@pytest.mark.parametrize("times", [1, 2])
def test_ctrl_c_stops_as_on_torch(tmp_path, capsys, ctrl_c_after_rows, monkeypatch, times):
    """As the torch trainers: Ctrl-C once stops where the chunk of iterations ends, checkpointed there; twice,
    at once, and run.json records the step of the checkpoint it resumes from. Either way run.json and the
    checkpoint agree, and the resumed run ends with the parameters of one never stopped."""
    # 16 iterations of 32 steps, checkpoints (and chunks) every 2 iterations
    base = ["train", "--env", "gymnax:CartPole-v1", "--total-steps", "512", "--no-progress",
            "--set", *TINY, "checkpoint_every=64"]
    assert main([*base, "--out", str(tmp_path / "whole")]) == 0
    out = tmp_path / "run"
    ctrl_c_after_rows(5, times)  # step 160, in the chunk of iterations 5-6
    assert main([*base, "--out", str(out)]) == 130
    monkeypatch.undo()
    err = capsys.readouterr().err
    status = json.loads((out / "run.json").read_text())
    resumes = 192 if times == 1 else 128  # the chunk's end, checkpointed; else the last checkpoint
    assert status["status"] == "interrupted" and status["global_step"] == resumes
    assert RunDir(out).load_checkpoint()["global_step"] == resumes
    # the second Ctrl-C comes while the chunk's rows are logged, before the group counts the chunk as done
    assert f"interrupted at step {resumes}, checkpointed there; continue with: reflectrl train --resume" in err
    assert main(["train", "--resume", str(out), "--no-progress"]) == 0
    a, b = (json.loads((d / "run.json").read_text()) for d in (tmp_path / "whole", out))
    assert a["params_sha256"] == b["params_sha256"]

@pytest.mark.slow
def test_compare_trains_an_entrys_seeds_as_one_program(tmp_path):
    out = tmp_path / "cmp"
    code = main(["compare", "--env", "gymnax:CartPole-v1", "--algos", "ppo,ppo+count", "--seeds", "2",
                 "--total-steps", "512", "--out", str(out), "--set", *TINY, "--no-progress"])
    assert code == 0
    logs = sorted(out.rglob("*.log"))
    assert len(logs) == 4
    groups = [p for p in logs if "train-group" in p.read_text()]
    assert len(groups) == 2  # one program per entry, its seeds together
    for run_json in out.rglob("run.json"):
        status = json.loads(run_json.read_text())
        assert status["status"] == "finished" and status["jax_version"] == metadata.version("jax")
    assert (out / "report" / "report.md").exists()
    recorded = json.loads((out / "report" / "provenance.json").read_text())["runs_recorded"]
    assert recorded["jax_version"] == {metadata.version("jax"): 4}


@pytest.mark.slow
def test_a_kill_between_a_groups_checkpoint_commits_resumes_from_one_iteration(tmp_path, monkeypatch, capsys):
    """A group's checkpoints are staged for every seed before any is put in place: a kill after seed 1's
    checkpoint was put in place and before seed 2's leaves seed 2's staged, and the resume completes the
    set, so the group resumes from one iteration and ends with the parameters of a run never killed.
    Without the staged checkpoint (a group checkpointed before staging existed) each iteration's seeds
    resume as a group of their own, after a one-line warning."""
    import shutil

    from reflectrl.trainers.ppo_jax.trainer import train_group

    cfgs = [tiny_config(seed, total=512) for seed in (1, 2)]
    whole = [str(tmp_path / f"whole{c.seed}") for c in cfgs]
    assert train_group([(path, c, []) for path, c in zip(whole, cfgs, strict=True)]) == 0

    commits = {"n": 0}
    commit = RunDir.commit_checkpoint

    def killed_at_the_eighth_commit(self):
        commits["n"] += 1
        if commits["n"] == 8:  # the 4th checkpoint (the first is taken before training): seed 2's commit
            raise KeyboardInterrupt
        commit(self)

    monkeypatch.setattr(RunDir, "commit_checkpoint", killed_at_the_eighth_commit)
    killed = [str(tmp_path / f"killed{c.seed}") for c in cfgs]
    with pytest.raises(KeyboardInterrupt):
        train_group([(path, c, []) for path, c in zip(killed, cfgs, strict=True)])
    monkeypatch.undo()
    first, second = (RunDir(p).load_checkpoint()["iteration"] for p in killed)
    assert first == second + 2  # 64 steps between checkpoints, 32 per iteration
    assert RunDir(killed[1]).staged_checkpoint()["iteration"] == first
    legacy = [str(tmp_path / f"legacy{c.seed}") for c in cfgs]
    for src, dst in zip(killed, legacy, strict=True):
        shutil.copytree(src, dst)
    RunDir(legacy[1]).discard_staged_checkpoint()

    assert train_group([(path, None, ["--resume", path]) for path in killed]) == 0
    for a, b in zip(whole, killed, strict=True):
        ra, rb = (json.loads((RunDir(p).path / "run.json").read_text()) for p in (a, b))
        assert rb["status"] == "finished" and ra["params_sha256"] == rb["params_sha256"]
        assert [r["global_step"] for r in read_metrics(a)] == [r["global_step"] for r in read_metrics(b)]
        assert not (RunDir(b).path / "checkpoint.pt.staged").exists()
    capsys.readouterr()

    assert train_group([(path, None, ["--resume", path]) for path in legacy]) == 0
    err = capsys.readouterr().err
    assert f"seeds 2 at iteration {second}; seeds 1 at iteration {first}" in err and "warning" in err
    for path in legacy:
        status = json.loads((RunDir(path).path / "run.json").read_text())
        assert status["status"] == "finished" and status["global_step"] == 512
        steps = [r["global_step"] for r in read_metrics(path)]
        assert steps == list(range(32, 513, 32))


@pytest.mark.slow
def test_a_group_vectorises_ppos_knobs_and_each_run_trains_as_it_would_alone():
    """Runs that differ in PPO's vectorisable knobs (a sweep's trials) train as one program, each
    seed reading its own values: the same seed with other knobs ends elsewhere, and a run trained
    in the group ends with the parameters it reaches alone."""
    a = tiny_config(1, extra=["ent_coef=0.0", "learning_rate=0.001"])
    b = tiny_config(1, extra=["ent_coef=0.05", "learning_rate=0.0003", "clip_coef=0.1"])
    group = JaxGroup([a, b], [None, None])
    assert group.setup.varying == ("learning_rate", "ent_coef", "clip_coef")
    group.train(progress=False)
    alone = JaxGroup([b], [None])
    assert alone.setup.varying == ()
    alone.train(progress=False)
    assert_same_params(group, 1, alone, 0)
    assert group.params_sha256(0) != group.params_sha256(1)


@pytest.mark.parametrize("extra, algo, says", [
    (["gamma=0.9"], "ppo", "must differ only in their seed and in learning_rate"),
    (["learning_rate=0.001"], "ppo+calibration", "calibration fit their networks at lr_multiplier"),
    (["rnd.int_coef=0"], "ppo+rnd", "rnd.int_coef is 0 in some runs of this JAX group"),
])
def test_a_group_refuses_runs_it_cannot_vectorise(extra, algo, says):
    from reflectrl.errors import UserError

    with pytest.raises(UserError, match=says):
        JaxGroup([tiny_config(1, algo=algo), tiny_config(2, algo=algo, extra=extra)], [None, None])


def test_an_entrys_resumed_seeds_stay_one_job_whatever_steps_their_metrics_reached(tmp_path):
    """A kill can cut a group's metrics logging short after some seeds' rows: the steps their
    metrics reached differ, and they still resume as one program (train-group settles their
    checkpoints); fresh and resumed runs, and other entries, are separate jobs."""
    from types import SimpleNamespace

    from reflectrl.config import new_config
    from reflectrl.experiments.local import seed_groups

    def run(label, seed, rows):
        path = tmp_path / label / f"seed{seed}"
        path.mkdir(parents=True)
        (path / "metrics.jsonl").write_text("".join(json.dumps({"global_step": 32 * (i + 1)}) + "\n"
                                                    for i in range(rows)))
        return SimpleNamespace(env_id="gymnax:CartPole-v1", entry=SimpleNamespace(label=label), path=path,
                               overrides=("backend=jax",), given_config=lambda: new_config(
                                   algo=label, env_id="gymnax:CartPole-v1", overrides=["backend=jax"]))

    a1, a2, a3, b1 = run("ppo", 1, 5), run("ppo", 2, 4), run("ppo", 3, 0), run("ppo+count", 1, 5)
    jobs = seed_groups([(a1, "resume"), (a2, "resume"), (a3, "fresh"), (b1, "resume")])
    assert [[r.path for r, _ in job] for job in jobs] == [[a1.path, a2.path], [a3.path], [b1.path]]


@pytest.mark.slow
def test_a_group_vectorises_the_signals_knobs_and_each_run_trains_as_it_would_alone():
    """count.beta, calibration.alpha and calibration.beta differ between the runs of one program (with a
    PPO knob): a run trained in the group ends with the parameters it reaches alone, where its knobs are
    the program's constants."""
    algo = "ppo+count+calibration"
    a = tiny_config(1, algo=algo, extra=["count.beta=0.01", "calibration.alpha=0.1"])
    b = tiny_config(1, algo=algo, extra=["count.beta=0.05", "calibration.alpha=0.5", "calibration.beta=2.0",
                                         "ent_coef=0.02"])
    group = JaxGroup([a, b], [None, None])
    assert group.setup.varying == ("ent_coef", "count.beta", "calibration.alpha", "calibration.beta")
    group.train(progress=False)
    alone = JaxGroup([b], [None])
    alone.train(progress=False)
    assert_same_params(group, 1, alone, 0)
    assert group.params_sha256(0) != group.params_sha256(1)


@pytest.mark.slow
def test_a_group_vectorises_shaping_gear_and_rnd_knobs_and_each_run_trains_as_it_would_alone(tmp_path):
    """shaping.eta, gear.temperature (inf in one run: w = 1, the shortcut a run alone takes) and RND's
    stream coefficients differ between the runs of one program: each run ends with the parameters it
    reaches alone, and logs the shaping terms and GEAR weights it logs alone (the terms' effect on a
    tiny CartPole policy is below the parameters' float tolerance; their metrics are not)."""
    algo = "ppo+rnd+gear+shaping"
    # gear on the total advantage reads the RND stream weighted by k_s (the Batch's intrinsic_* fields)
    shaping = ["shaping.mode=potential", "shaping.update_every=1", "gear.advantage=total"]
    a = tiny_config(1, algo=algo, extra=[*shaping, "shaping.eta=0.5", "gear.temperature=inf"])
    b = tiny_config(1, algo=algo, extra=[*shaping, "shaping.eta=2.0", "gear.temperature=0.3", "rnd.int_coef=0.5",
                                         "rnd.ext_coef=1.5"])
    runs = [RunDir.create(tmp_path / "group" / name, cfg.to_dict()) for name, cfg in (("a", a), ("b", b))]
    group = JaxGroup([a, b], runs)
    assert group.setup.varying == ("rnd.int_coef", "rnd.ext_coef", "gear.temperature", "shaping.eta")
    group.train(progress=False)
    keys = ("shaping_mean", "shaping_std", "weights_mean", "weights_std", "value_loss")
    for i, (name, cfg) in enumerate((("a", a), ("b", b))):
        run = RunDir.create(tmp_path / "alone" / name, cfg.to_dict())
        alone = JaxGroup([cfg], [run])
        assert alone.setup.varying == ()
        alone.train(progress=False)
        assert_same_params(group, i, alone, 0)
        together, apart = read_metrics(runs[i].path), read_metrics(run.path)
        assert len(together) == len(apart) > 4
        for key in keys:
            np.testing.assert_allclose([r[key] for r in together], [r[key] for r in apart], rtol=1e-3, atol=1e-6,
                                       err_msg=f"run {name}: {key}")
    assert group.params_sha256(0) != group.params_sha256(1)


def test_a_knob_vectorised_groups_checkpoint_loads_in_a_group_of_its_run_alone(tmp_path):
    """The knobs that differ between a group's runs are not saved (they come from each run's config):
    a checkpoint of a sweep batch's run resumes alone (`train --resume`, `eval`) or in any other group."""
    cfgs = [tiny_config(1, extra=["ent_coef=0.0"]), tiny_config(2, extra=["ent_coef=0.05"])]
    runs = [RunDir.create(tmp_path / f"r{c.seed}", c.to_dict()) for c in cfgs]
    group = JaxGroup(cfgs, runs)
    assert group.setup.varying == ("ent_coef",)
    group.save_checkpoints()
    alone = JaxGroup([cfgs[1]], [None])
    alone.load_seed_states([runs[1].load_checkpoint()])
    assert alone.params_sha256(0) == group.params_sha256(1)
    assert "hyper" not in alone.states and float(group.states["hyper"]["ent_coef"][1]) == pytest.approx(0.05)


def test_a_kill_while_the_first_checkpoints_are_put_in_place_resumes_as_one_group(tmp_path):
    """Killed after seed 1's first checkpoint was put in place and before seed 2's: seed 2 has only a
    staged checkpoint; it counts as a run to resume (not one to start afresh) and the staged one is
    put in place, so both resume from iteration 0 together."""
    from types import SimpleNamespace

    from reflectrl.experiments.state import run_state
    from reflectrl.trainers.ppo_jax.trainer import settle_checkpoints

    cfgs = [tiny_config(1), tiny_config(2)]
    runs = [RunDir.create(tmp_path / f"r{c.seed}", c.to_dict()) for c in cfgs]
    group = JaxGroup(cfgs, runs)
    leaves = group.host_leaves()
    for i, run in enumerate(runs):
        run.stage_checkpoint(group.seed_state(i, leaves))
    runs[0].commit_checkpoint()
    assert not runs[1].has_checkpoint()
    assert run_state(SimpleNamespace(path=runs[1].path)) == "resume"
    settled = settle_checkpoints(runs, [runs[0].load_checkpoint(), None])
    assert [s["iteration"] for s in settled] == [0, 0]
    assert runs[1].has_checkpoint() and runs[1].staged_checkpoint() is None
