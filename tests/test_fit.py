"""The signals' one fit helper: the same weights, optimiser state and random stream as the
autograd loop it replaced, one-hot rows found and fit to rounding, checkpoints that resume
bit for bit."""

import io

import pytest
import torch
from torch.nn import functional as F

from reflectrl.nets import flatten_parameters, relu_mlp
from reflectrl.signals import fit as fit_module
from reflectrl.signals.fit import HeadFitter, OneHotRows, one_hot_rows


def reference_fit(head, x, y, *, epochs, minibatch_size, generator, lr, shuffle, forward=None, after_step=None):
    """The loop each signal had before the helper: flat parameter, fused Adam, autograd."""
    flat = flatten_parameters(head)
    optimizer = torch.optim.Adam([flat], lr=lr, fused=True)
    forward = forward or (lambda inp: head(inp).squeeze(-1))
    inputs = x if isinstance(x, tuple) else (x,)
    n = y.shape[0]
    size = min(n, minibatch_size)
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator) if shuffle == "always" or size < n else None
        for start in range(0, n, size):
            idx = slice(None) if order is None else order[start:start + size]
            loss = F.mse_loss(forward(*(t[idx] for t in inputs)), y[idx])
            flat.grad.zero_()
            loss.backward()
            optimizer.step()
            if after_step is not None:
                after_step()
    return flat, optimizer


def twin_heads(width, hidden=(16, 16), seed=3):
    torch.manual_seed(seed)
    a = relu_mlp(width, hidden, near_zero_output=False)
    torch.manual_seed(seed)
    b = relu_mlp(width, hidden, near_zero_output=False)
    return a, b


def data(n=96, width=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, width, generator=g)
    return x, torch.sin(x[:, 0]) + x[:, 1] * x[:, 2]


def same_optimizer_state(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    sa, sb = a.state_dict()["state"][0], b.state_dict()["state"][0]
    return all(torch.equal(sa[k], sb[k]) for k in ("step", "exp_avg", "exp_avg_sq"))


@pytest.mark.parametrize("shuffle, minibatch_size", [("when_split", 512), ("when_split", 40), ("always", 512),
                                                    ("always", 40)])
def test_mlp_fit_is_bit_identical_to_the_autograd_loop(shuffle, minibatch_size):
    x, y = data()
    ref_head, head = twin_heads(x.shape[1])
    g_ref, g = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    flat, optimizer = reference_fit(ref_head, x, y, epochs=4, minibatch_size=minibatch_size, generator=g_ref,
                                    lr=3e-3, shuffle=shuffle)
    fitter = HeadFitter(head, lr=3e-3)
    result = fitter.fit(x, y, epochs=4, minibatch_size=minibatch_size, generator=g, shuffle=shuffle)
    assert result.steps == 4 * -(-x.shape[0] // min(minibatch_size, x.shape[0]))
    assert torch.equal(fitter.flat, flat)
    assert same_optimizer_state(fitter.optimizer, optimizer)
    assert torch.equal(g.get_state(), g_ref.get_state())  # the same permutations, drawn the same way


def test_shuffle_modes_draw_from_the_generator_as_the_signals_did():
    x, y = data()
    fitter = HeadFitter(relu_mlp(x.shape[1], (8,)), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    before = g.get_state()
    fitter.fit(x, y, epochs=3, minibatch_size=512, generator=g, shuffle="when_split")
    assert torch.equal(g.get_state(), before)  # one whole minibatch, in order: nothing drawn
    fitter.fit(x, y, epochs=3, minibatch_size=512, generator=g, shuffle="always")
    expected = torch.Generator().manual_seed(1)
    for _ in range(3):
        torch.randperm(x.shape[0], generator=expected)
    assert torch.equal(g.get_state(), expected.get_state())  # one permutation per epoch
    with pytest.raises(ValueError, match="shuffle"):
        fitter.fit(x, y, epochs=1, minibatch_size=8, generator=g, shuffle="sometimes")


@pytest.mark.parametrize("minibatch_size", [512, 32])
def test_losses_before_and_after_are_the_whole_set_mse(minibatch_size):
    x, y = data()
    fitter = HeadFitter(relu_mlp(x.shape[1], (16,)), lr=1e-2)
    with torch.no_grad():
        expected_before = F.mse_loss(fitter.head(x).squeeze(-1), y).item()
    result = fitter.fit(x, y, epochs=5, minibatch_size=minibatch_size, generator=torch.Generator().manual_seed(0),
                        shuffle="when_split", loss_before=True, loss_after=True)
    with torch.no_grad():
        expected_after = F.mse_loss(fitter.head(x).squeeze(-1), y).item()
    assert result.loss_before == expected_before  # free from the first step, or measured: the same number
    assert result.loss_after == expected_after
    assert result.loss_after < result.loss_before


def test_custom_forward_with_several_inputs_is_bit_identical_and_calls_after_step():
    """SDRS's shape: F(s, a, s') through a tanh, fit through autograd, a callback per step."""
    g = torch.Generator().manual_seed(2)
    s, a, s2 = torch.randn(70, 3, generator=g), torch.randn(70, 2, generator=g), torch.randn(70, 3, generator=g)
    y = 0.1 * torch.tanh(s[:, 0] - s2[:, 1])
    ref_head, head = twin_heads(8)

    def forward_of(module):
        return lambda obs, act, nxt: 0.1 * torch.tanh(module(torch.cat([obs, act, nxt], -1)).squeeze(-1))

    calls = []
    flat, _ = reference_fit(ref_head, (s, a, s2), y, epochs=3, minibatch_size=32,
                            generator=torch.Generator().manual_seed(4), lr=1e-2, shuffle="always",
                            forward=forward_of(ref_head))
    fitter = HeadFitter(head, lr=1e-2, forward=forward_of(head))
    result = fitter.fit((s, a, s2), y, epochs=3, minibatch_size=32, generator=torch.Generator().manual_seed(4),
                        after_step=lambda: calls.append(1), loss_after=True)
    assert torch.equal(fitter.flat, flat)
    assert len(calls) == result.steps == 3 * 3
    with torch.no_grad():
        assert result.loss_after == F.mse_loss(forward_of(head)(s, a, s2), y).item()


def test_a_head_that_is_not_an_mlp_needs_a_forward():
    with pytest.raises(TypeError, match="forward"):
        HeadFitter(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)), lr=1e-3)


def test_hooked_head_runs_as_a_module_with_the_same_result():
    """A forward hook (a test's spy, a profiler) sees every pass, and the weights do not change."""
    x, y = data()
    plain_head, hooked_head = twin_heads(x.shape[1])
    seen = []
    hooked_head.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    plain, hooked = HeadFitter(plain_head, lr=1e-2), HeadFitter(hooked_head, lr=1e-2)
    for fitter in (plain, hooked):
        fitter.fit(x, y, epochs=2, minibatch_size=64, generator=torch.Generator().manual_seed(5), loss_after=True)
    assert seen == [64, 32, 64, 32, 96]  # every minibatch of both epochs, then the final loss
    assert torch.equal(plain.flat, hooked.flat)


def test_direct_adam_falls_back_to_the_optimiser_with_the_same_result(monkeypatch):
    x, y = data()
    direct_head, fallback_head = twin_heads(x.shape[1])
    direct, fallback = HeadFitter(direct_head, lr=1e-2), HeadFitter(fallback_head, lr=1e-2)
    direct.fit(x, y, epochs=4, minibatch_size=512, generator=torch.Generator(), shuffle="when_split")

    def missing(*args, **kwargs):
        raise TypeError("no such op in this torch")

    monkeypatch.setattr(fit_module, "_fused_adam", missing)
    fallback.fit(x, y, epochs=4, minibatch_size=512, generator=torch.Generator(), shuffle="when_split")
    assert not fallback._direct_adam
    assert torch.equal(direct.flat, fallback.flat)
    assert same_optimizer_state(direct.optimizer, fallback.optimizer)  # the failed call left no step behind


def test_checkpoint_round_trip_resumes_bit_for_bit():
    x, y = data()
    head_a, head_b = twin_heads(x.shape[1])
    a = HeadFitter(head_a, lr=1e-2)
    a.fit(x, y, epochs=3, minibatch_size=40, generator=torch.Generator().manual_seed(0))
    state = a.state_dict(head_key="net")
    assert set(state) == {"net", "optimizer"}  # the keys the signals' checkpoints have always had
    buffer = io.BytesIO()
    torch.save(state, buffer)  # as a checkpoint does: no tensor shared with the live fitter
    buffer.seek(0)
    b = HeadFitter(head_b, lr=1e-2)
    b.load_state_dict(torch.load(buffer), head_key="net")
    assert torch.equal(a.flat, b.flat)
    for fitter in (a, b):
        fitter.fit(x, y, epochs=2, minibatch_size=40, generator=torch.Generator().manual_seed(9))
    assert torch.equal(a.flat, b.flat)
    assert same_optimizer_state(a.optimizer, b.optimizer)


# ----------------------------------------------------------------------------- one-hot rows

def one_hot_batch(n=300, cells=30, actions=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    obs, act = torch.randint(0, cells, (n,), generator=g), torch.randint(0, actions, (n,), generator=g)
    x = torch.zeros(n, cells + actions)
    x[torch.arange(n), obs] = 1.0
    x[torch.arange(n), cells + act] = 1.0
    return x, obs, act


def test_one_hot_rows_are_found_exactly():
    x, obs, act = one_hot_batch()
    rows = one_hot_rows(x)
    assert rows is not None and rows.width == 34
    assert rows.columns[0].tolist() == obs.tolist() and rows.columns[1].tolist() == (30 + act).tolist()
    assert torch.equal(rows.to_dense(), x)
    tabular = one_hot_rows(x[:, :30])  # an observation alone, then its action appended
    assert torch.equal(tabular.append(act, 4).to_dense(), x)

    assert one_hot_rows(torch.randn(50, 8)) is None  # dense
    almost = x.clone()
    almost[7, obs[7]] = 0.5
    assert one_hot_rows(almost) is None  # a value other than 1
    extra = x.clone()
    extra[11, (obs[11] + 1) % 30] = 1.0
    assert one_hot_rows(extra) is None  # one row with three ones
    shifted = x.clone()
    shifted[3, obs[3]] = 0.0
    shifted[4, (obs[4] + 1) % 30] = 1.0
    assert one_hot_rows(shifted) is None  # the right total, but rows with one and three ones


def test_grouped_rows_are_the_distinct_rows_with_counts():
    x, _, _ = one_hot_batch()
    rows = one_hot_rows(x).grouped()
    distinct = OneHotRows(rows.distinct, rows.width).to_dense()
    assert torch.equal(distinct[rows.inverse], x)
    assert torch.equal(torch.unique(x, dim=0), torch.unique(distinct, dim=0))
    assert distinct.shape[0] == torch.unique(x, dim=0).shape[0]
    assert torch.equal(rows.counts, torch.bincount(rows.inverse).float())
    unique_rows = one_hot_rows(torch.eye(40)).grouped()  # nothing repeats: not worth grouping
    assert unique_rows.distinct is None and unique_rows.grouping_tried


@pytest.mark.parametrize("minibatch_size", [512, 64])
def test_one_hot_fit_matches_the_dense_fit_to_rounding(minibatch_size):
    x, obs, act = one_hot_batch()
    y = torch.sin(obs.float()) + 0.3 * act.float()
    dense_head, onehot_head = twin_heads(x.shape[1], hidden=(32, 32))
    dense_flat, _ = reference_fit(dense_head, x, y, epochs=5, minibatch_size=minibatch_size,
                                  generator=torch.Generator().manual_seed(0), lr=1e-3, shuffle="always")
    fitter = HeadFitter(onehot_head, lr=1e-3)
    prepared = fitter.prepare(x)
    assert isinstance(prepared, OneHotRows) and prepared.distinct is not None
    fitter.fit(prepared, y, epochs=5, minibatch_size=minibatch_size, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(fitter.flat.detach(), dense_flat.detach(), rtol=0, atol=1e-5)
    with torch.no_grad():
        dense_prediction = fitter.head(x).squeeze(-1)  # the same weights through the dense module
    torch.testing.assert_close(fitter.predict(prepared), dense_prediction, rtol=0, atol=1e-6)
    together = fitter.predict_many([prepared, fitter.prepare(x[:50])])
    torch.testing.assert_close(together[0], dense_prediction, rtol=0, atol=1e-6)
    torch.testing.assert_close(together[1], dense_prediction[:50], rtol=0, atol=1e-6)


def test_dense_rows_of_one_width_share_one_prediction_pass_with_the_same_numbers():
    torch.manual_seed(0)
    fitter = fit_module.HeadFitter(relu_mlp(12, (64, 64), near_zero_output=False), lr=1e-3)
    current, previous = torch.randn(512, 12), torch.randn(300, 12)
    calls = []
    original = fitter._mlp_forward
    fitter._mlp_forward = lambda layers, x: calls.append(x.shape[0]) or original(layers, x)
    together = fitter.predict_many([current, previous])
    assert calls == [812]  # one pass over both (issue 61: fewer, larger kernels in the calibration bonus)
    for got, alone in zip(together, (current, previous)):
        torch.testing.assert_close(got, fitter.predict(alone), rtol=0, atol=0)  # bit for bit


def test_the_signals_fit_their_heads_with_it_and_keep_their_checkpoint_keys():
    from reflectrl.signals.base import SignalContext
    from reflectrl.signals.calibration.torch import CalibrationBonus, CalibrationConfig
    from reflectrl.signals.gear.torch import GEARConfig, GEARReweighting
    from reflectrl.signals.shaping.torch import SelfDistilledShaping, ShapingConfig

    ctx = SignalContext(obs_dim=3, action_dim=2, discrete=True, feature_dim=4, learning_rate=1e-3, gamma=0.99,
                        gae_lambda=0.95, seed=0, total_iterations=10)
    signals = ((CalibrationBonus(CalibrationConfig()), "net"), (SelfDistilledShaping(ShapingConfig()), "shaper"),
               (GEARReweighting(GEARConfig()), "head"))
    for signal, key in signals:
        signal.bind(ctx)
        assert isinstance(signal.fitter, fit_module.HeadFitter)
        state = signal.state_dict()
        head_state = signal.fitter.head.state_dict()
        assert state[key].keys() == head_state.keys()
        assert all(torch.equal(state[key][k], head_state[k]) for k in head_state)
        assert state["optimizer"] == signal.fitter.optimizer.state_dict()
