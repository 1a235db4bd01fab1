"""Imagination distillation (issue 21 item 4, seed 002 section 6.2): the world model and the
imagined labels."""

import json

import torch

from reflectrl.estimators import compute_gae
from reflectrl.signals.shaping._world_model import WorldModel, imagined_advantages


def test_world_model_learns_a_deterministic_system_and_its_error_falls():
    g = torch.Generator().manual_seed(0)
    obs = torch.rand(2000, 3, generator=g)
    actions = torch.nn.functional.one_hot(torch.randint(2, (2000,), generator=g), 2).float()
    next_obs = obs + 0.1 * (actions[:, :1] - actions[:, 1:])  # action 0 moves +0.1, action 1 moves -0.1
    rewards, terms = next_obs.sum(1), torch.zeros(2000)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = WorldModel(3, 2, ensemble=2, hidden_sizes=(32,), lr=3e-3, buffer=5000)
    model.add(obs[:1500], actions[:1500], next_obs[:1500], rewards[:1500], terms[:1500])
    model.fit(5, 256, g)
    before = model.heldout_error(obs[1500:], actions[1500:], next_obs[1500:], rewards[1500:])
    model.fit(400, 256, g)
    after = model.heldout_error(obs[1500:], actions[1500:], next_obs[1500:], rewards[1500:])
    assert after[0] < 0.2 * before[0] and after[0] < 1e-3


def test_imagined_steps_after_a_predicted_termination_are_masked():
    rollout = {"obs": torch.zeros(3, 2, 1), "next_obs": torch.zeros(3, 2, 1), "rewards": torch.ones(3, 2),
               "terminations": torch.tensor([[False, True], [True, False], [False, False]])}
    adv, alive = imagined_advantages(rollout, lambda x: torch.zeros(len(x)),
                                     lambda r, v, nv, te, tr: compute_gae(r, v, nv, te, tr, 0.9, 1.0))
    assert alive.tolist() == [[True, True], [True, False], [False, False]]
    assert adv[1, 0].item() == 1.0  # the termination drops the bootstrap


def test_sdrs_with_imagination_logs_the_model_and_held_out_r2(cli, tmp_path):
    code, _, err = cli("train", "--algo", "sdrs", "--env", "reflectrl/GridWorld-v0", "--total-steps", 2048,
                       "--no-progress", "--out", tmp_path / "r", "--set", "env.size=5", "num_envs=2", "num_steps=128",
                       "shaping.imagined_fraction=0.5", "shaping.update_every=1", "shaping.model_steps=10")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "imagined_share" in r]
    assert rows and all(0.3 < r["imagined_share"] < 0.6 and "label_r2_heldout" in r for r in rows)
    assert rows[-1]["model_error"] >= 0


def test_imagined_labels_are_normalised_on_their_own_so_they_cannot_shift_the_real_ones():
    from reflectrl.trainers.replay.dqn import DQNTrainer
    from reflectrl.trainers.resolve import new_run_config

    cfg = new_run_config(algo="dqn+shaping", env_id="CartPole-v1", total_steps=1000,
                         overrides=["learning_starts=200", "log_every=100", "train_frequency=2", "batch_size=32",
                                    "buffer_size=2000", "target_network_frequency=100",
                                    "shaping.minibatch_size=32", "shaping.update_every=1"])
    trainer = DQNTrainer(cfg)
    for _ in range(3):
        trainer.run_iteration()
    shaping = trainer.signal
    real = lambda obs, actions, rewards, next_obs, terms: obs[:, 0] * 3.0 + 1.0  # noqa: E731
    g = torch.Generator().manual_seed(0)
    item = shaping.buffer[-1]
    n = len(item["obs"])
    extra = (item["obs"][:n], item["actions"][:n], item["next_obs"][:n], torch.zeros(n),
             torch.randn(n, generator=g) - 100.0)  # imagined advantages with a large bias
    obs, _, _, _, target = shaping.distillation_set(None, None, real, extra=extra)
    x = obs[:-n, 0] * 3.0 + 1.0
    assert torch.allclose(target[:-n], shaping.cfg.scale * (x - x.mean()) / (x.std() + 1e-8))  # as without extra
    assert abs(target[-n:].mean().item()) < 1e-5 and abs(target[-n:].std().item() - shaping.cfg.scale) < 1e-4
    trainer.close()


def test_imagination_runs_on_continuous_actions(cli, tmp_path):
    code, _, err = cli("train", "--algo", "sdrs", "--env", "Pendulum-v1", "--total-steps", 1024, "--no-progress",
                       "--out", tmp_path / "r", "--set", "num_envs=2", "num_steps=128", "shaping.imagined_fraction=0.5",
                       "shaping.update_every=1", "shaping.model_steps=5")
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "imagined_share" in r]
    assert rows and rows[-1]["model_error"] >= 0 and 0.3 < rows[-1]["imagined_share"] < 0.6
