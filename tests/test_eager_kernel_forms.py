"""The eager forms of the gather kernels (what the ATen executor runs) equal the custom ops:
outputs, gradients and gradients of gradients, for sums, means, transposes and gathers."""
import importlib

import pytest
import torch

from dynamo_relational.backend import aten_executor
from dynamo_relational.kernels.gather_reduce import (
    EAGER_FORMS, gather_reduce, gather_reduce_eager, gather_rows, gather_rows_eager, pack_csr)


def _csr(rows: int, columns: int, seed: int = 0):
    """A random packed CSR with empty segments, repeated columns and unread columns."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 4, (rows,), generator=g)
    offsets = torch.zeros(rows + 1, dtype=torch.long)
    torch.cumsum(counts, 0, out=offsets[1:])
    index = torch.randint(0, columns, (int(offsets[-1]),), generator=g)
    return pack_csr(offsets, index, columns)


def _grads(fn, source, weights):
    """Output, gradient, and the gradient of that gradient with respect to the upstream one
    (the backward is itself differentiable: double backward)."""
    weights = weights.detach().requires_grad_()
    out = fn(source)
    (first,) = torch.autograd.grad((out * weights).sum(), source, create_graph=True)
    (second,) = torch.autograd.grad((first * first).sum(), weights)
    return out, first, second


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", [(5,), (2, 3)], ids=["rows", "matrices"])
def test_gather_reduce_eager_equals_op(reduce, transpose, shape):
    rows, columns = 7, 9
    csr = _csr(columns, rows) if transpose else _csr(rows, columns)
    source = torch.randn(columns, *shape, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(rows, *shape, dtype=torch.float64)
    want = _grads(lambda s: gather_reduce(s, csr, rows, reduce, transpose), source, weights)
    got = _grads(lambda s: gather_reduce_eager(s, csr, rows, reduce, transpose), source, weights)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_gather_rows_eager_equals_op():
    index = torch.tensor([3, 0, 3, 5, 1])
    csr = pack_csr(torch.arange(len(index) + 1), index, 6)
    source = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(len(index), 4, dtype=torch.float64)
    want = _grads(lambda s: gather_rows(s, csr), source, weights)
    got = _grads(lambda s: gather_rows_eager(s, csr), source, weights)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("form", ["gather_reduce", "gather_rows"])
def test_eager_forms_use_the_autograd_function_only_when_a_gradient_is_recorded(form, monkeypatch):
    """Inference calls skip the autograd function (it costs as much as a small product per call);
    the values are the op's either way."""
    calls = []
    function = importlib.import_module("dynamo_relational.kernels.gather_reduce")._Product
    apply = function.apply
    monkeypatch.setattr(function, "apply", lambda *args: calls.append(1) or apply(*args))
    csr = pack_csr(torch.arange(6), torch.tensor([3, 0, 3, 5, 1]), 6) if form == "gather_rows" else _csr(7, 6)
    eager = {"gather_reduce": lambda s: gather_reduce_eager(s, csr, 7, "mean"),
             "gather_rows": lambda s: gather_rows_eager(s, csr)}[form]
    op = {"gather_reduce": lambda s: gather_reduce(s, csr, 7, "mean"),
          "gather_rows": lambda s: gather_rows(s, csr)}[form]
    source = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        inference = eager(source)
    constant = eager(source.detach())
    assert not calls
    recorded = eager(source)
    assert calls == [1] and recorded.grad_fn is not None
    for out in (inference, constant, recorded):
        torch.testing.assert_close(out, op(source.detach()))


def test_eager_forms_reject_bad_input_as_the_ops_do():
    csr = _csr(3, 4)
    with pytest.raises(ValueError, match="reduce must be one of"):
        gather_reduce_eager(torch.randn(4, 2), csr, 3, "max")
    with pytest.raises(ValueError, match="0-d"):
        gather_rows_eager(torch.tensor(1.0), csr)


def test_aten_executor_swaps_every_custom_kernel_and_leaves_the_graph_alone():
    csr = _csr(3, 4)

    class Grouped(torch.nn.Module):
        def forward(self, x):
            return torch.relu(gather_reduce(x, csr, 3, "mean")) + 1

    gm = torch.fx.symbolic_trace(Grouped())
    executor = aten_executor(gm)
    assert {n.target for n in executor.graph.nodes} & set(EAGER_FORMS.values())
    assert not {n.target for n in executor.graph.nodes} & set(EAGER_FORMS)
    assert gather_reduce in {n.target for n in gm.graph.nodes}   # the original keeps its ops
    x = torch.randn(4, 2)
    torch.testing.assert_close(executor(x), gm(x))


@pytest.mark.parametrize("rows, columns", [(0, 5), (3, 0)], ids=["no_rows_read", "no_source_rows"])
def test_gathers_of_matrices_with_no_rows_and_their_gradients(rows, columns):
    """Rows of ``[1, 4]`` matrices, none written or none to read: the width comes from the shape, not the data."""
    csr = _csr(rows, columns) if columns else pack_csr(torch.zeros(rows + 1, dtype=torch.long),
                                                       torch.zeros(0, dtype=torch.long), 0)
    source = torch.randn(columns, 1, 4, dtype=torch.float64, requires_grad=True)
    out = gather_reduce_eager(source, csr, rows, "sum")
    assert out.shape == (rows, 1, 4) and not out.any()
    (grad,) = torch.autograd.grad(out.sum(), source)
    assert grad.shape == source.shape and not grad.any()
