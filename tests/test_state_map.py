"""State maps (issue 15 item 7): the samples a run keeps, and `reflectrl plot state-map`."""

import json

import numpy as np
import pytest
import torch

from reflectrl.runs.state_samples import StateSampler, load_samples
from reflectrl.signals.base import SignalOutput, merge_terms, snapshot_iterations, terms_from

FAST = ["--no-progress", "--set", "num_envs=2", "num_steps=64", "num_minibatches=2", "update_epochs=1"]


def test_terms_by_signal_and_kind():
    r1, r2, adv, w = (torch.full((3, 2), v) for v in (1.0, 2.0, 3.0, 4.0))
    terms = terms_from("cal", r1, SignalOutput(reward=r2, advantage=adv, weights=w, streams={"intrinsic": r1}))
    assert sorted(terms) == ["cal advantage", "cal intrinsic", "cal reward", "cal weight"]
    assert torch.equal(terms["cal reward"], r1 + r2)  # before- and after-advantage reward terms sum
    merged = merge_terms({"cal reward": r1}, {"cal reward": r2, "gear weight": w})
    assert torch.equal(merged["cal reward"], r1 + r2) and torch.equal(merged["gear weight"], w)


def test_sampler_keeps_the_snapshots_and_reloads_them(tmp_path):
    total, k = 10, 4
    assert snapshot_iterations(total, k) == [1, 4, 7, 10]  # k points, the first and the last among them
    sampler = StateSampler(tmp_path, seed=3, total_iterations=total, snapshots=k)
    assert [it for it in range(1, total + 1) if sampler.wants(it)] == [1, 4, 7, 10]
    obs = torch.arange(4096 * 2 * 3, dtype=torch.float32).reshape(4096, 2, 3)  # T=4096 steps of N=2 envs
    keys = torch.arange(8192).reshape(4096, 2)
    rewards = (keys % 7 == 0).float()
    sampler.record(4, 100, obs, keys, rewards, {"x reward": keys.float() * 2})
    kept = load_samples(tmp_path / "state_samples.npz")[4]
    assert kept["state_keys"].shape == (2048,) and len(set(kept["state_keys"].tolist())) == 2048
    # each kept row's values belong together: obs row, key, reward and term of the same step
    k_ = kept["state_keys"]
    assert np.array_equal(kept["obs"][:, 0], k_ * 3) and np.array_equal(kept["term:x reward"], k_ * 2.0)
    assert np.array_equal(kept["rewards"], (k_ % 7 == 0).astype(np.float32)) and int(kept["global_step"]) == 100
    # the same seed and iteration pick the same rows (a resumed run rewrites the same snapshot)
    again = StateSampler(tmp_path, seed=3, total_iterations=total, snapshots=k)
    assert np.array_equal(again.kept[4]["state_keys"], k_)
    again.record(4, 100, obs, keys, rewards, {"x reward": keys.float() * 2})
    assert np.array_equal(load_samples(tmp_path / "state_samples.npz")[4]["state_keys"], k_)
    # no run directory: nothing is kept
    assert not StateSampler(None, 3, total, k).wants(1)


def test_binned_counts_and_means_by_hand():
    from reflectrl.report.state_map import binned

    x = np.array([0, 0, 1, 1, 1])
    y = np.array([0, 0, 0, 1, 1])
    values = np.array([1.0, 3.0, 5.0, 2.0, 4.0])
    edges = np.array([-0.5, 0.5, 1.5])
    counts, mean = binned(x, y, values, edges, edges)
    assert counts.tolist() == [[2, 1], [0, 2]]  # rows are y, columns x
    assert mean[0, 0] == 2.0 and mean[0, 1] == 5.0 and mean[1, 1] == 3.0 and np.isnan(mean[1, 0])


@pytest.mark.slow
def test_grid_world_run_draws_its_state_map(cli, tmp_path):
    out = tmp_path / "gw"
    code, _, err = cli("train", "--algo", "ppo+calibration+count", "--total-steps", 1024, *FAST,
                       "state_map_snapshots=3", "--out", out)
    assert code == 0, err
    samples = load_samples(out / "state_samples.npz")
    assert sorted(samples) == [1, 4, 8]
    assert {"term:calibration reward", "term:count reward"} <= set(samples[8])
    code, stdout, err = cli("plot", "state-map", out)
    assert code == 0, err
    pictures = out / "state_map"
    assert sorted(p.name for p in pictures.iterdir()) == [
        "state_map.gif", "state_map.png", "step_000000128.png", "step_000000512.png", "step_000001024.png"]
    from PIL import Image

    from reflectrl.config import RunConfig
    from reflectrl.envs.gridworld import GridWorldEnv
    from reflectrl.report.state_map import state_maps

    assert Image.open(pictures / "state_map.gif").n_frames == 3
    # the whole grid is drawn, the cells the short run never reached included
    _, rows, extent, _ = state_maps(out)
    size = GridWorldEnv(**RunConfig.from_dict(json.loads((out / "config.json").read_text())).env).size
    assert rows[-1][2]["visits (log10 1+n)"].shape == (size, size)
    assert extent == (-0.5, size - 0.5, size - 0.5, -0.5)
    assert (rows[0][2]["visits (log10 1+n)"] == 0).any()


def test_vector_observation_projects_on_two_dims(cli, tmp_path):
    out = tmp_path / "ll"
    code, _, err = cli("train", "--env", "LunarLander-v3", "--total-steps", 256, *FAST, "--out", out)
    assert code == 0, err
    from reflectrl.config import RunConfig
    from reflectrl.report.state_map import state_maps

    _, rows, _, labels = state_maps(out)
    assert labels[:2] == ("obs[0]", "obs[1]") and list(rows[0][2]) == ["visits (log10 1+n)", "mean env reward"]
    assert rows[0][2]["visits (log10 1+n)"].shape == (40, 40)
    code, _, err = cli("plot", "state-map", out, "--dims", "0,9")
    assert code == 2 and "the observation has 8 dimensions" in err and "Traceback" not in err
    code, _, err = cli("plot", "state-map", out, "--dims", "x")
    assert code == 2 and "--dims x" in err
    assert RunConfig.from_dict(json.loads((out / "config.json").read_text())).state_map_snapshots == 5


def test_a_run_without_samples_says_so(cli, tmp_path):
    out = tmp_path / "none"
    assert cli("train", "--total-steps", 256, *FAST, "state_map_snapshots=0", "--out", out)[0] == 0
    code, _, err = cli("plot", "state-map", out)
    assert code == 2 and "kept no state samples" in err and len(err.strip().splitlines()) == 1
    code, _, err = cli("train", "--total-steps", 256, *FAST, "state_map_snapshots=-1", "--out", tmp_path / "bad")
    assert code == 2 and "state_map_snapshots=-1" in err


@pytest.mark.parametrize("env_id", ["MiniGrid-Empty-5x5-v0"])
def test_minigrid_projects_on_the_agent_position(cli, tmp_path, env_id):
    out = tmp_path / "mg"
    assert cli("train", "--env", env_id, "--total-steps", 256, *FAST, "--out", out)[0] == 0
    from reflectrl.report.state_map import state_maps

    _, rows, extent, labels = state_maps(out)
    assert labels == ("x", "y", True)
    visits = rows[-1][2]["visits (log10 1+n)"]
    assert visits.sum() > 0 and extent[0] >= 0.5  # positions inside the walls (x, y >= 1)
