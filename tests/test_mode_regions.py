"""``with`` blocks that switch a global mode inside ``forward`` (passes/mode_regions.py): ``no_grad``
blocks are grouped and give eager's gradients; autocast keeps the graph in order (Dynamo) or is a
clear error (fast front-end). Autocast around the call is compiled in, as eager applies it."""
import contextlib

import pytest
import torch
from torch import nn

import dynamo_relational
from dynamo_relational.frontend import FrontendError
from tests.helpers import (TOLERANCE, assert_as_close_to_float64_as_eager, assert_compiled_matches_eager,
                           assert_fast_compile_matches_eager)

NEIGHBORS = [[1, 2], [0, 3], [0, 1, 3], [2], [0, 4]]


class OneWeight(nn.Module):
    """A model whose neurons share one weight ``W`` (a subclass writes ``forward``)."""

    def __init__(self, dtype=torch.float64):
        super().__init__()
        self.W = nn.Parameter(torch.randn(4, 4, dtype=dtype) / 2)


class NoGradTargets(OneWeight):
    """Per neuron, a target computed under ``no_grad`` (no gradient reaches ``V``) scales a message."""

    def __init__(self, tuple_item: bool = False):
        super().__init__()
        self.V = nn.Parameter(torch.randn(4, 4, dtype=torch.float64) / 2)
        self.tuple_item = tuple_item

    def forward(self, x):
        rows = []
        for nbrs in NEIGHBORS:
            with torch.no_grad():
                target = sum(self.V @ x[u] for u in nbrs)
                if self.tuple_item:   # an item of a tuple made without gradients, read with them
                    target = torch.max(torch.stack([target, -target]), 0).values
            rows.append(torch.tanh(sum(self.W @ x[u] for u in nbrs)) * target)
        return torch.stack(rows)


def _input():
    torch.manual_seed(0)
    return torch.randn(len(NEIGHBORS), 4, dtype=torch.float64)


def _assert_no_gradient_reaches_v(compiled, model, x):
    x = x.clone().requires_grad_()
    grad = torch.autograd.grad(compiled(x).sum(), model.V, allow_unused=True)[0]
    assert grad is None or torch.count_nonzero(grad) == 0


@pytest.mark.parametrize("tuple_item", [False, True])
def test_no_grad_blocks_through_the_backend_are_grouped_and_match_eager(tuple_item):
    torch.manual_seed(0)
    model = NoGradTargets(tuple_item)
    report = assert_compiled_matches_eager(model, _input(), inductor=False)
    (graph,) = report.graphs
    assert graph.stats["grad_mode_switches"] == 2 * len(NEIGHBORS)
    assert not any("keeps its order" in reason for reason in graph.ungrouped), graph.ungrouped
    assert graph.nodes_after < graph.nodes_before
    if not tuple_item:   # one detach per neuron where its target is read, vectorized as one node
        assert any(sig.startswith("detach") and size == len(NEIGHBORS) for _, size, sig in graph.group_sizes)
    _assert_no_gradient_reaches_v(report.compiled, model, _input())


@pytest.mark.parametrize("tuple_item", [False, True])
def test_no_grad_blocks_through_the_fast_front_end_are_grouped_and_match_eager(tuple_item):
    torch.manual_seed(0)
    model = NoGradTargets(tuple_item)
    compiled = assert_fast_compile_matches_eager(model, _input(), inductor=False)
    assert compiled.report.graphs[0].stats["grad_mode_switches"] == 2 * len(NEIGHBORS)
    _assert_no_gradient_reaches_v(compiled, model, _input())


def test_no_grad_blocks_through_inductor_match_eager():
    torch.manual_seed(0)
    model = NoGradTargets()
    assert_compiled_matches_eager(model, _input())
    assert_fast_compile_matches_eager(model, _input())


def test_fast_front_end_compiled_without_gradients_then_trained_keeps_no_grad_blocks():
    torch.manual_seed(0)
    model = NoGradTargets()
    with torch.no_grad():   # the graph is traced with gradients on all the same, and serves both
        compiled = dynamo_relational.compile(model, _input(), inductor=False)
    x = _input().requires_grad_()
    got = torch.autograd.grad(compiled(x).sum(), [model.W, x])
    want = torch.autograd.grad(model(x).sum(), [model.W, x])
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    _assert_no_gradient_reaches_v(compiled, model, _input())


class EnableGradInside(OneWeight):
    def forward(self, x):
        rows = []
        for nbrs in NEIGHBORS:
            with torch.enable_grad():
                rows.append(torch.tanh(sum(self.W @ x[u] for u in nbrs)))
        return torch.stack(rows)


def test_gradients_switched_on_in_a_graph_without_them_keep_the_order():
    torch.manual_seed(0)
    model, x = EnableGradInside(), _input()
    with torch.no_grad():
        report = dynamo_relational.explain(model, x, inductor=False)
        got = report.compiled(x)
    torch.testing.assert_close(got, model(x), rtol=1e-9, atol=1e-12)
    assert any("grad mode switched on" in reason for reason in report.graphs[0].ungrouped)


class InPlaceInNoGrad(OneWeight):
    def forward(self, x):
        with torch.no_grad():
            scales = torch.ones_like(x)
        rows = []
        for v, nbrs in enumerate(NEIGHBORS):
            with torch.no_grad():
                scales[nbrs[0]].mul_(0.5)   # changes what later neurons read
            rows.append(sum(self.W @ x[u] for u in nbrs) * scales[v].sum())
        return torch.stack(rows)


def test_in_place_ops_in_a_no_grad_block_keep_the_order_and_match_eager():
    torch.manual_seed(0)
    report = assert_compiled_matches_eager(InPlaceInNoGrad(), _input(), inductor=False)
    assert any("in-place" in reason for reason in report.graphs[0].ungrouped)


class AutocastInside(OneWeight):
    def __init__(self):
        super().__init__(torch.float32)

    def forward(self, x):
        rows = []
        for v, nbrs in enumerate(NEIGHBORS):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                low = sum(self.W @ x[u] for u in nbrs)   # AUTOCAST
            rows.append(torch.tanh(low.float()) + self.W @ x[v])
        return torch.stack(rows)


@pytest.mark.parametrize("inductor", [False, True])
def test_autocast_blocks_through_the_backend_keep_the_order(inductor):
    torch.manual_seed(0)
    model, x = AutocastInside(), torch.randn(len(NEIGHBORS), 4)
    report = dynamo_relational.explain(model, x, inductor=inductor)
    got = report.compiled(x)
    want = model(x)
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)   # bfloat16 rounding, summed in another order
    reasons = report.graphs[0].ungrouped
    assert any("mode switch _enter_autocast" in reason for reason in reasons), reasons


@pytest.mark.parametrize("outer", [None, torch.float16])
def test_autocast_in_the_fast_front_end_is_a_clear_error_naming_the_line(outer):
    """Entered inside ``forward``, with no autocast around the compile or another one."""
    around = contextlib.nullcontext() if outer is None else torch.autocast("cpu", dtype=outer)
    with around, pytest.raises(FrontendError, match=r"autocast at .*test_mode_regions.py:\d+ in .*# AUTOCAST"):
        dynamo_relational.compile(AutocastInside(), torch.randn(len(NEIGHBORS), 4), inductor=False)


class InferenceModeInside(OneWeight):
    def forward(self, x):
        rows = []
        for nbrs in NEIGHBORS:
            with torch.inference_mode():
                target = sum(self.W @ x[u] for u in nbrs)
            rows.append(torch.tanh(sum(self.W @ x[u] for u in nbrs)) * target.clone())
        return torch.stack(rows)


def test_inference_mode_blocks_through_the_backend_keep_the_order_and_match_eager():
    """The exits of inference mode have no users: cleanup keeps them (fx does not count them impure).
    Without Inductor: AOT autograd fails on inference tensors in a training graph, stock Inductor too."""
    torch.manual_seed(0)
    report = assert_compiled_matches_eager(InferenceModeInside(), _input(), inductor=False)
    assert any("inference_mode" in reason for reason in report.graphs[0].ungrouped)


def test_inference_mode_blocks_through_the_fast_front_end_match_eager():
    torch.manual_seed(0)
    assert_fast_compile_matches_eager(InferenceModeInside(), _input(), inductor=False)


@pytest.mark.parametrize("inductor", [False, True])
def test_autocast_around_the_backend_call_is_as_accurate_as_eager(inductor):
    """Under an outer autocast the graph runs in bfloat16 where eager does; the segment products keep
    their source's dtype (autocast would hand MKL a bfloat16 product) and land as close to the float64
    model as eager does, or closer."""
    from examples.data import graph_batch
    from examples.gcn import ScalarGCN

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", 4, dtype=torch.float64)
    exact = ScalarGCN(batch, batch.x.shape[1]).double()
    model = ScalarGCN(batch, batch.x.shape[1])
    model.load_state_dict(exact.state_dict())
    compiled = torch.compile(model, backend="relational", options={"inductor": inductor})
    assert_as_close_to_float64_as_eager(compiled, model, exact, batch.x.float(), batch.x,
                                        under=lambda: torch.autocast("cpu", dtype=torch.bfloat16))


class SummedMessages(nn.Module):
    """Each neuron's linear layer reads a sum of messages: grouped, its bias is added after the
    aggregation (``fold_bias``), an addition that autocast leaves in float32 unless traced in autocast."""

    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.message = nn.Linear(4, 4, dtype=dtype)
        self.out = nn.Linear(4, 2, dtype=dtype)

    def forward(self, x):
        h = [torch.relu(self.message(x[v])) for v in range(x.shape[0])]
        return torch.stack([self.out(sum(h[u] for u in nbrs)) for nbrs in NEIGHBORS])


@pytest.mark.parametrize("compiled_in", ["float32", "autocast"])
@pytest.mark.parametrize("inductor", [False, True])
def test_autocast_around_the_fast_front_end_call_is_applied_as_in_eager(inductor, compiled_in):
    """The fast front-end traces and compiles per autocast state around the call (Dynamo guards on it):
    compiled outside autocast and called in it, the model runs in bfloat16 where eager does (the float32
    graph used to run, returning float32), as close to the float64 model as eager; outside, in float32."""
    torch.manual_seed(0)
    exact = SummedMessages(torch.float64)
    model = SummedMessages()
    model.load_state_dict(exact.state_dict())
    x64 = torch.randn(len(NEIGHBORS), 4, dtype=torch.float64)
    x = x64.float()

    def bfloat16():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    with bfloat16() if compiled_in == "autocast" else contextlib.nullcontext():
        compiled = dynamo_relational.compile(model, x, inductor=inductor)
    torch.testing.assert_close(compiled(x), model(x), **TOLERANCE[torch.float32])
    with bfloat16():
        assert compiled(x).dtype == model(x).dtype == torch.bfloat16
    assert_as_close_to_float64_as_eager(compiled, model, exact, x, x64, under=bfloat16)
    torch.testing.assert_close(compiled(x), model(x), **TOLERANCE[torch.float32])
