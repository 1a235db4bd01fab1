"""The one fit helper of the signals (DESIGN: "signals ... one fit helper").

Every signal's head (the calibration bonus's reflection net, SDRS's shaper, GEAR's value
head) is a small network fit by minibatch MSE with Adam onto a target the trainer already
computed. `HeadFitter` owns that: the head's parameters re-homed into one flat tensor
(`flatten_parameters`), one fused Adam on it, the minibatch loop and the optimiser's
checkpoint state.

The fit is a handful of steps per iteration on a few hundred rows, so per-operation
overhead is most of its cost. For a plain ReLU MLP with a scalar output (`relu_mlp`) the
fitter runs the forward and backward passes itself instead of through autograd: the
kernels autograd would run (addmm, relu, mse_loss_backward, mm, sum, threshold_backward),
in its order, each gradient written into its view of the flat gradient, and the fused
Adam kernel without `Optimizer.step`'s Python around it. The weights are bit-identical to
an autograd fit's. Heads with forward hooks (a spy, a profiler) and any other head (SDRS's
shaper, with its tanh and potential difference, passes `forward`) go through autograd.

One-hot inputs (`OneHotRows`: a tabular observation, a discrete action) are not
multiplied: the first layer's output is the sum of the k weight columns a row's ones pick,
in column order, then the bias (the dense product's nonzero terms; bit-identical to it with
the MKL GEMM here). A batch of them repeats rows (512 steps in a 12x12 grid world visit
~200 state-actions), so the fit runs one pass per distinct row and weights its gradient by
the row's count. That gradient equals the dense fit's up to floating-point summation order:
such a fit's weights match a dense fit's to rounding, not bit for bit, and Adam, which
divides each coordinate's step by its gradient's scale, lets those roundings grow over many
steps where gradients are near zero.

Randomness: the minibatch order is `torch.randperm(n, generator=...)` per epoch, drawn
from the caller's generator; `shuffle="when_split"` (the calibration bonus) draws nothing
and uses the rows in order when one minibatch holds them all, `"always"` (SDRS, GEAR)
draws a permutation every epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules import module as _torch_module

from reflectrl.nets import flatten_parameters

SHUFFLES = ("always", "when_split")
_MEAN = 1  # at::Reduction::Mean
# the aten kernels autograd runs for mse_loss and relu, called directly
_mse_loss = torch.ops.aten.mse_loss.default
_mse_loss_backward = torch.ops.aten.mse_loss_backward.default
_threshold_backward = torch.ops.aten.threshold_backward.default
# Adam's fused kernel, private to torch: where it is missing or its signature changed, the
# fitter falls back to Optimizer.step
_fused_adam = getattr(torch, "_fused_adam_", None)


PREDICT_CHUNK = 2048  # rows per forward pass of a module head's predictions


def predict_in_chunks(forward: Callable, x, chunk: int = PREDICT_CHUNK) -> torch.Tensor:
    """forward(x) (x a tensor, or a tuple of row-aligned tensors), run on at most `chunk`
    rows at a time when there are more (fewer rows: one call, as before)."""
    parts = x if isinstance(x, (tuple, list)) else (x,)
    n = parts[0].shape[0]
    call = (lambda p: forward(p)) if isinstance(x, (tuple, list)) else (lambda p: forward(p[0]))
    if n <= chunk:
        return call(parts)
    return torch.cat([call(tuple(t[i:i + chunk] for t in parts)) for i in range(0, n, chunk)])


# ----------------------------------------------------------------------------- one-hot rows

@dataclass
class OneHotRows:
    """n rows of a 0/1 matrix of `width` columns with k ones each, kept as the ones'
    columns: `columns[j][i]` is the column of row i's j-th one (ascending in j).

    With `grouped()`, also the distinct rows: `distinct` (k tensors of U columns),
    `inverse` (n,: each row's distinct row) and `counts` (U,)."""

    columns: list[torch.Tensor]
    width: int
    distinct: list[torch.Tensor] | None = None
    inverse: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    grouping_tried: bool = False  # grouped() found too few repeats to be worth it

    @property
    def shape(self) -> tuple[int, int]:
        return (self.columns[0].shape[0], self.width)

    @property
    def pass_columns(self) -> list[torch.Tensor]:
        """The columns of the rows a pass runs on: the distinct ones when grouped."""
        return self.columns if self.distinct is None else self.distinct

    def __getitem__(self, rows: torch.Tensor) -> OneHotRows:
        columns = [c[rows] for c in self.columns]
        if self.distinct is not None and rows.dtype != torch.bool and rows.shape[0] == self.shape[0]:
            return OneHotRows(columns, self.width, self.distinct, self.inverse[rows], self.counts)  # a permutation
        return OneHotRows(columns, self.width)

    def to_dense(self) -> torch.Tensor:
        return torch.zeros(self.shape).scatter_(1, torch.stack(self.columns, 1), 1.0)

    def append(self, categories: torch.Tensor, n_categories: int) -> OneHotRows:
        """These rows followed by a one-hot block of `n_categories` columns (a discrete action)."""
        return OneHotRows([*self.columns, categories.reshape(-1).long() + self.width], self.width + n_categories)

    def grouped(self, max_share: float = 0.75) -> OneHotRows:
        """With its distinct rows, when there are at most `max_share` of n of them."""
        if self.width ** len(self.columns) >= 2**62:  # a row's key would overflow int64
            return OneHotRows(self.columns, self.width, grouping_tried=True)
        key = self.columns[0]
        for c in self.columns[1:]:
            key = key * self.width + c
        keys, inverse, counts = torch.unique(key, return_inverse=True, return_counts=True)
        if keys.shape[0] > max_share * key.shape[0]:
            return OneHotRows(self.columns, self.width, grouping_tried=True)
        distinct = []
        for _ in self.columns[1:]:
            distinct.append(keys % self.width)
            keys = keys // self.width
        distinct.append(keys)
        return OneHotRows(self.columns, self.width, distinct[::-1], inverse, counts.float())


def one_hot_rows(x: torch.Tensor, max_share: float = 0.25) -> OneHotRows | None:
    """`x` (n, width) as OneHotRows when every row is 0/1 with the same number k >= 1 of
    ones, k at most `max_share` of the width; else None (dense data is turned down on its
    first row)."""
    if x.dim() != 2 or x.shape[0] == 0 or x.shape[1] < 4 or not x.is_floating_point():
        return None
    n, width = x.shape
    k = int(torch.count_nonzero(x[0]))
    if k < 1 or k > max_share * width:
        return None
    nz = x.nonzero()  # row-major: with n*k entries, row i's are i*k .. i*k+k-1 iff every row has k
    if nz.shape[0] != n * k:
        return None
    rows, arange = nz[:, 0], _arange(n)
    if not (torch.equal(rows[::k], arange) and (k == 1 or torch.equal(rows[k - 1::k], arange))):
        return None
    if not bool((x[rows, nz[:, 1]] == 1).all()):
        return None
    return OneHotRows([nz[j::k, 1].contiguous() for j in range(k)], width)


_ARANGES: dict[int, torch.Tensor] = {}


def _arange(n: int) -> torch.Tensor:
    if n not in _ARANGES:
        _ARANGES.clear()
        _ARANGES[n] = torch.arange(n)
    return _ARANGES[n]


def mse(predictions: torch.Tensor, targets: torch.Tensor) -> float:
    """F.mse_loss(predictions, targets).item() for same-shaped tensors, without its wrapper."""
    return _mse_loss(predictions, targets, _MEAN).item()


# ----------------------------------------------------------------------------- the fitter

def _plain_adam(group: dict) -> bool:
    """Adam options the direct fused call covers (the fitter's own optimiser always)."""
    return not (group["amsgrad"] or group["maximize"] or group["differentiable"] or group.get("decoupled_weight_decay")
                or isinstance(group["lr"], torch.Tensor))


def mlp_linears(module: nn.Module) -> list[nn.Linear] | None:
    """The Linear layers of a Linear-ReLU-...-Linear stack with a scalar output and biases
    (`relu_mlp`'s shape), or None if `module` is anything else."""
    if not isinstance(module, nn.Sequential) or len(module) % 2 == 0:
        return None
    layers = list(module)
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Linear if i % 2 == 0 else nn.ReLU):
            return None
    linears = layers[::2]
    if linears[-1].out_features != 1 or any(lin.bias is None for lin in linears):
        return None
    return linears


@dataclass
class FitResult:
    steps: int                  # optimiser steps taken
    loss_before: float | None   # MSE on the whole set before the first step (when asked for)
    loss_after: float | None    # MSE on the whole set after the last step (when asked for)


class HeadFitter:
    """Fits `head` by minibatch MSE: one flat parameter, one fused Adam.

    forward: None for a `relu_mlp` head (prediction = head(x).squeeze(-1)); else a function
    of the input tensors returning (B,) predictions, fit through autograd. `x` in `fit` and
    `predict` is a tensor, OneHotRows (MLP heads), or a tuple of tensors passed to
    `forward` as separate arguments and indexed together by row.
    """

    def __init__(self, head: nn.Module, lr: float, forward: Callable[..., torch.Tensor] | None = None):
        self.head = head
        self.flat = flatten_parameters(head)
        self.optimizer = torch.optim.Adam([self.flat], lr=lr, fused=True)
        self.forward = forward
        self.linears = mlp_linears(head) if forward is None else None
        if forward is None and self.linears is None:
            raise TypeError("HeadFitter: give `forward` for a head that is not a relu_mlp")
        self._modules = list(head.modules())
        self._direct_adam = True
        self._one = torch.ones(())  # d loss / d loss

    def _own_passes(self) -> bool:
        """Run the MLP's passes here rather than through its modules? Not when anything
        hooks them: hooks must see every forward."""
        if self.linears is None:
            return False
        if _torch_module._global_forward_hooks or _torch_module._global_forward_pre_hooks:
            return False
        return not any(m._forward_hooks or m._forward_pre_hooks for m in self._modules)

    # -------------------------------------------------------------------------- inputs

    def prepare(self, x):
        """`x` as `fit` and `predict` run it fastest: one-hot rows (given, or found in a
        tensor) grouped into their distinct rows. Give the result to several calls to do
        this once."""
        if not self._own_passes():
            return x.to_dense() if isinstance(x, OneHotRows) else x
        if isinstance(x, torch.Tensor):
            x = one_hot_rows(x) or x
        if isinstance(x, OneHotRows) and x.distinct is None and not x.grouping_tried:
            x = x.grouped()
        return x

    @staticmethod
    def _rows(x, idx):
        if idx is None:
            return x
        if isinstance(x, (tuple, list)):
            return tuple(t[idx] for t in x)
        return x[idx]

    @staticmethod
    def _count(x) -> int:
        return (x[0] if isinstance(x, (tuple, list)) else x).shape[0]

    # -------------------------------------------------------------------------- forward

    def _module_forward(self, x) -> torch.Tensor:
        if self.forward is not None:
            return self.forward(*x) if isinstance(x, (tuple, list)) else self.forward(x)
        return self.head(x).squeeze(-1)

    def _layers(self) -> list[tuple]:
        """(W, W^T, b, W's gradient, b's gradient) of each Linear: views, valid for a fit."""
        return [(lin.weight, lin.weight.t(), lin.bias, lin.weight.grad, lin.bias.grad) for lin in self.linears]

    @staticmethod
    def _mlp_forward(layers: list[tuple], x) -> list:
        """[x, h1, ..., h_{L-1}, z_L]: each layer's input, then the output (B, 1), B being the
        distinct rows for grouped one-hot rows."""
        acts = [x]
        _, weight_t, bias = layers[0][:3]
        if isinstance(x, OneHotRows):
            # the dense product's nonzero terms, in column order, then the bias
            rows = weight_t.contiguous()
            columns = x.pass_columns
            z = rows.index_select(0, columns[0])
            for c in columns[1:]:
                z.add_(rows.index_select(0, c))
            z.add_(bias)
        else:
            z = torch.addmm(bias, x, weight_t)  # F.linear on a 2-D input
        for _, weight_t, bias, _, _ in layers[1:]:
            acts.append(z.relu_())
            z = torch.addmm(bias, acts[-1], weight_t)
        acts.append(z)
        return acts

    @torch.no_grad()
    def predict(self, x) -> torch.Tensor:
        """The head's (B,) predictions, without gradient (a module's, in chunks of
        `PREDICT_CHUNK` rows: a CNN's activations over a whole buffer at once are large)."""
        x = self.prepare(x)
        if not self._own_passes():
            with torch.no_grad():
                return predict_in_chunks(self._module_forward, x)
        out = self._mlp_forward(self._layers(), x)[-1].view(-1)
        return out.index_select(0, x.inverse) if isinstance(x, OneHotRows) and x.distinct is not None else out

    @torch.no_grad()
    def predict_many(self, xs: list) -> list[torch.Tensor]:
        """`predict` on each of `xs`; one-hot row sets of one width share one pass, and so do dense
        rows of one width (a row's prediction does not depend on the rows beside it: the same numbers)."""
        xs = [self.prepare(x) for x in xs]
        if (self._own_passes() and len(xs) > 1 and all(isinstance(x, torch.Tensor) and x.dim() == 2 for x in xs)
                and len({x.shape[1] for x in xs}) == 1):
            return list(self._mlp_forward(self._layers(), torch.cat(xs))[-1].view(-1).split([x.shape[0] for x in xs]))
        if not (self._own_passes() and len(xs) > 1 and all(isinstance(x, OneHotRows) for x in xs)
                and len({(x.width, len(x.columns)) for x in xs}) == 1):
            return [self.predict(x) for x in xs]
        together = OneHotRows([torch.cat(c) for c in zip(*(x.pass_columns for x in xs))], xs[0].width)
        outs = self._mlp_forward(self._layers(), together)[-1].view(-1).split([x.pass_columns[0].shape[0] for x in xs])
        return [out.index_select(0, x.inverse) if x.distinct is not None else out for out, x in zip(outs, xs)]

    def loss(self, x, targets: torch.Tensor) -> float:
        """MSE of the head's predictions on `targets`."""
        return mse(self.predict(x), targets)

    # -------------------------------------------------------------------------- fit

    def fit(self, x, targets: torch.Tensor, *, epochs: int, minibatch_size: int, generator: torch.Generator,
            shuffle: str = "always", after_step: Callable[[], None] | None = None,
            loss_before: bool = False, loss_after: bool = False) -> FitResult:
        """`epochs` passes over (x, targets) in minibatches of `minibatch_size`, one Adam
        step each; `after_step` runs after every step (SDRS's target update).
        loss_before / loss_after: also measure the MSE on the whole set before the first
        step (free when that step sees the whole set in order) / after the last."""
        if shuffle not in SHUFFLES:
            raise ValueError(f"shuffle={shuffle!r}: use one of {SHUFFLES}")
        x = self.prepare(x)
        own = self._own_passes()
        n = self._count(x)
        size = min(n, minibatch_size)
        whole_in_order = size >= n and shuffle == "when_split"
        before = self.loss(x, targets) if loss_before and not whole_in_order else None
        layers = self._layers() if own else None
        grouped = own and isinstance(x, OneHotRows) and x.distinct is not None and size >= n
        if grouped:
            # d/d out_u of mean_i (out_u(i) - y_i)^2 = 2 (count_u out_u - sum of u's targets) / n,
            # as slope * out + offset; a whole batch in any order gives the same step (the
            # permutations are still drawn, so the generator advances as ever)
            slope = (x.counts * (2.0 / n)).view(-1, 1)
            offset = torch.zeros_like(x.counts).index_add_(0, x.inverse, targets).mul_(-2.0 / n).view(-1, 1)
        steps = 0
        for _ in range(epochs):
            order = None if whole_in_order else torch.randperm(n, generator=generator)
            for start in range(0, n, size):
                want_loss = loss_before and whole_in_order and steps == 0
                if grouped:
                    loss = self._grouped_step(layers, x, targets, slope, offset, want_loss)
                else:
                    idx = None if order is None else order[start:start + size]
                    xi, yi = self._rows(x, idx), self._rows(targets, idx)
                    loss = self._mlp_step(layers, xi, yi, want_loss) if own else self._autograd_step(xi, yi)
                if want_loss:
                    before = loss.item()  # the first step saw the whole set, in order, before any update
                self._adam_step()
                if after_step is not None:
                    after_step()
                steps += 1
        after = self.loss(x, targets) if loss_after else None
        return FitResult(steps, before, after)

    def _autograd_step(self, x, y) -> torch.Tensor:
        loss = F.mse_loss(self._module_forward(x), y)
        self.flat.grad.zero_()
        loss.backward()
        return loss.detach()

    @torch.no_grad()
    def _mlp_step(self, layers, x, y, want_loss: bool) -> torch.Tensor | None:
        acts = self._mlp_forward(layers, x)
        out, y = acts[-1], y.reshape(-1, 1)  # (B, 1): the same elementwise loss and gradient as on (B,)
        loss = _mse_loss(out, y, _MEAN) if want_loss else None
        self._backward(layers, acts, _mse_loss_backward(self._one, out, y, _MEAN))
        return loss

    @torch.no_grad()
    def _grouped_step(self, layers, x: OneHotRows, y, slope, offset, want_loss: bool) -> torch.Tensor | None:
        """One step on the distinct rows of a whole one-hot batch, weighted by their counts."""
        acts = self._mlp_forward(layers, x)
        out = acts[-1]
        loss = _mse_loss(out.view(-1).index_select(0, x.inverse), y, _MEAN) if want_loss else None
        self._backward(layers, acts, torch.addcmul(offset, slope, out))
        return loss

    @staticmethod
    def _backward(layers: list[tuple], acts: list, grad: torch.Tensor) -> None:
        """Backpropagate the output gradient (B, 1); each gradient is written into its view
        of the flat gradient, and every one is written, so nothing needs zeroing."""
        for i in range(len(layers) - 1, -1, -1):
            weight, _, _, weight_grad, bias_grad = layers[i]
            inp = acts[i]
            if isinstance(inp, OneHotRows):
                rows_grad = torch.zeros(inp.width, grad.shape[1])
                for c in inp.pass_columns:
                    rows_grad.index_add_(0, c, grad)
                weight_grad.copy_(rows_grad.t())
            else:
                torch.mm(grad.t(), inp, out=weight_grad)  # AddmmBackward0's kernel for the weight
            torch.sum(grad, 0, out=bias_grad)
            if i > 0:
                grad = _threshold_backward(grad.mm(weight), inp, 0)  # ReluBackward0

    def _adam_step(self) -> None:
        """optimizer.step(), without the ~100 us of Python around its one fused kernel: the
        same kernel on the same state tensors (bit-identical weights and state)."""
        group = self.optimizer.param_groups[0]
        state = self.optimizer.state.get(self.flat)
        if not (self._direct_adam and _fused_adam is not None and state and _plain_adam(group)):
            self.optimizer.step()  # the first step builds the state
            return
        step = state["step"]
        step.add_(1)
        try:
            _fused_adam([self.flat.detach()], [self.flat.grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [step],
                        amsgrad=False, lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
                        weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
        except (AttributeError, TypeError, RuntimeError):  # a torch without this private op: the public path
            step.sub_(1)
            self._direct_adam = False
            self.optimizer.step()

    # -------------------------------------------------------------------------- checkpoints

    def state_dict(self, head_key: str = "head") -> dict:
        """The head's weights under `head_key` and the optimiser's state under "optimizer"."""
        return {head_key: self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict, head_key: str = "head") -> None:
        self.head.load_state_dict(state[head_key])  # copies into the flat parameter's views
        self.optimizer.load_state_dict(state["optimizer"])
