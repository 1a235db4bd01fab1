"""The rollout's numpy sampler (trainers/policies.NumpySampler) against ActorCritic.act: the same
draws from the generator, the same actions, log-probabilities equal to float32 rounding."""

import numpy as np
import pytest
import torch

from reflectrl.trainers.cnn import CNNActorCritic
from reflectrl.trainers.policies import ActorCritic


@pytest.mark.parametrize("continuous", [False, True])
def test_numpy_sampler_matches_act(continuous):
    torch.manual_seed(0)
    agent = ActorCritic(5, 3, continuous)
    if continuous:
        with torch.no_grad():
            agent.actor_logstd.copy_(torch.tensor([[-0.5, 0.0, 0.3]]))
    sampler = agent.numpy_sampler()
    obs = np.random.default_rng(1).normal(size=(64, 5)).astype(np.float32)
    g_torch, g_numpy = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    for _ in range(20):
        with torch.no_grad():
            action, logprob = agent.act(torch.from_numpy(obs), g_torch)
        np_action, np_logprob = sampler(obs, g_numpy)
        assert np_logprob.dtype == np.float32 and np_action.shape == tuple(action.shape)
        if continuous:
            assert np_action.dtype == np.float32
            np.testing.assert_allclose(np_action, action.numpy(), rtol=0, atol=1e-5)
        else:
            assert np_action.dtype == np.int64
            np.testing.assert_array_equal(np_action, action.numpy())
        np.testing.assert_allclose(np_logprob, logprob.numpy(), rtol=0, atol=1e-5)
    # the same draws: both generators are at the same point of their streams
    assert torch.equal(g_torch.get_state(), g_numpy.get_state())


def test_numpy_sampler_reads_the_parameters_in_place():
    """A sampler holds views: an optimiser's in-place step is what it samples with next."""
    torch.manual_seed(0)
    agent = ActorCritic(4, 2, False)
    sampler = agent.numpy_sampler()
    obs = np.ones((8, 4), dtype=np.float32)
    with torch.no_grad():
        last = agent.actor._modules_list[-1]
        last.bias.copy_(torch.tensor([50.0, -50.0]))  # action 0 almost surely
    action, logprob = sampler(obs, torch.Generator().manual_seed(0))
    assert (action == 0).all() and np.allclose(logprob, 0.0, atol=1e-6)


def test_cnn_policies_act_in_torch():
    assert ActorCritic.numpy_acting and not CNNActorCritic.numpy_acting


# ---------------------------------------------------------------------------- deterministic_action from Python

def _policies():
    """Every policy kind with a deterministic_action `reflectrl eval` loads (hppo's agent: tests/test_hppo.py),
    each with the shape of one observation."""
    from reflectrl.trainers.replay.dqn import QNetwork
    from reflectrl.trainers.replay.sac import Actor

    return {
        "ppo-discrete": (lambda: ActorCritic(4, 2, False), (4,)),
        "ppo-continuous": (lambda: ActorCritic(3, 2, True), (3,)),
        "ppo-cnn": (lambda: CNNActorCritic((7, 7, 3), 3, False), (7, 7, 3)),
        "dqn-mlp": (lambda: QNetwork((4,), 2, "mlp"), (4,)),
        "dqn-cnn": (lambda: QNetwork((7, 7, 3), 3, "cnn"), (7, 7, 3)),
        "sac": (lambda: Actor(3, np.array([-2.0]), np.array([2.0])), (3,)),
    }


@pytest.mark.parametrize("kind", list(_policies()))
def test_deterministic_action_takes_numpy_and_lists(kind):
    """From Python, with what an env returns: one observation gives its action alone (an int for a
    discrete space), a batch an array; both the actions of the tensor path, which stays as it was."""
    make, shape = _policies()[kind]
    torch.manual_seed(0)
    policy = make()
    batch = np.random.default_rng(0).normal(size=(5, *shape)).astype(np.float32)
    with torch.no_grad():
        expected = policy.deterministic_action(torch.from_numpy(batch))
    assert isinstance(expected, torch.Tensor)
    expected = expected.numpy()

    got = policy.deterministic_action(batch)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, expected)
    one = policy.deterministic_action(batch[0])
    as_list = policy.deterministic_action(batch[0].tolist())
    if expected.ndim == 1:  # discrete
        assert type(one) is int and one == expected[0] and as_list == one
    else:
        assert isinstance(one, np.ndarray) and one.shape == expected[0].shape
        np.testing.assert_allclose(one, expected[0], rtol=0, atol=1e-6)  # a batch of 1 may round apart
        np.testing.assert_array_equal(as_list, one)
