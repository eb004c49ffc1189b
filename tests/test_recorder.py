"""The recorder: a live trace is the eager call itself, recorded as it runs; its graph is the tracer's, and
where it cannot see the call in full it gives up and the tracer traces from copies."""
from __future__ import annotations

import collections
import copy
import operator
import types

import pytest
import torch
from torch import nn

from dynamo_relational.batching import _SampleCall
from dynamo_relational.errors import FrontendError
from dynamo_relational.ops import tensor_info
from dynamo_relational.options import Options
from dynamo_relational.passes import cse
from dynamo_relational.passes.context import PassContext
from dynamo_relational.recorder import record
from dynamo_relational.tracing import trace
from dynamo_relational.tracing_patches import patches_installed
from dynamo_relational.union import prepare
from examples.per_sample import MODELS, dataset
from tests.helpers import Comparisons


def _ops(graph) -> collections.Counter:
    """The graph's calls as a multiset of (kind, target, shape, user line): the tracer's and the recorder's
    graphs may list the operands of a commutative op in another order (``0 + h`` reaches the recorder as
    ``h + 0``). An item of a multi-result op's results (``i, o, u = torch.split(...)``) has its op's line in
    the recorder, which does not see Python unpack the results, and its own line in the tracer."""
    def line(n):
        item = n.target is operator.getitem and tensor_info(n.args[0]) is None
        return None if item else n.meta.get("stack_trace")
    return collections.Counter((n.op, str(n.target), n.meta["rel_info"].shape if n.meta.get("rel_info") else None,
                                line(n)) for n in graph.graph.nodes if n.op in ("call_function", "call_method"))


def _both_traces(kind: str, samples: int):
    """For each of ``samples`` samples of ``kind`` (float64): the model, the sample, and its call recorded live
    and traced by the tracer."""
    torch.manual_seed(0)
    model = MODELS[kind][0](4).double()
    for children, x in dataset(kind, samples, features=4, dtype=torch.float64):
        call = _SampleCall(model, (children, x))
        with patches_installed():
            assert record(call, [x], ["arg0"]).unusable is None
            yield model, (children, x), trace(call, [x], ["arg0"], live=True), trace(call, [x], ["arg0"])


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_recorded_call_is_the_eager_call_and_its_graph_the_tracers(kind):
    for model, (children, x), recorded, traced in _both_traces(kind, 3):
        torch.testing.assert_close(recorded.result[0], model(children, x), rtol=0, atol=0)
        assert recorded.result[0].grad_fn is not None
        torch.testing.assert_close(recorded.graph(x)[0], recorded.result[0], rtol=0, atol=0)
        # (the recorder merges equal pure calls as it goes, which cse merges in the tracer's graph)
        assert len(recorded.graph.graph.nodes) <= len(traced.graph.graph.nodes)
        assert _ops(_merged(recorded.graph)) == _ops(_merged(traced.graph))


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_recorded_sample_leaves_the_per_sample_passes_the_graph_a_traced_one_does(kind):
    # (they run before cse: aggregation opens up a partial sum that feeds one addition, and one merged while
    # recording would feed several)
    for _, _, recorded, traced in _both_traces(kind, 4):
        kept = [prepare(t.graph, t.out_spec, t.constants, Options()).records for t in (recorded, traced)]
        assert len(kept[0]) == len(kept[1])


def _merged(gm):
    return cse.run(gm, PassContext(Options()))


def test_comparison_operators_are_recorded_as_the_tracer_records_them():
    """``h == b`` reaches the mode as ``TensorBase.__eq__`` (which the catalog does not know), ``h > 0`` as
    ``TensorBase.gt``: each is recorded as the ``operator`` function fx's proxies record."""
    model, x = Comparisons(), torch.randn(3, 3, dtype=torch.float64)
    recorded, traced = trace(model, [x], ["x"], live=True), trace(model, [x], ["x"])
    torch.testing.assert_close(recorded.graph(x)[0], model(x), rtol=0, atol=0)
    assert _ops(_merged(recorded.graph)) == _ops(_merged(traced.graph))


class _Straight(torch.autograd.Function):
    """Rounds forward; its gradient passes straight through (not the gradient of its forward's ops)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 2)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Case(nn.Module):
    def __init__(self, case: str):
        super().__init__()
        self.case, self.lin = case, nn.Linear(3, 3)
        self.box = types.SimpleNamespace()

    def forward(self, x):
        h = self.lin(x)
        if self.case == "a Python read of a value":
            return h if h.sum().item() > -1e9 else -h
        if self.case == "a tensor attribute":
            return h.T
        if self.case == "a write into a tensor made without a traced value":
            out = torch.zeros(2, 3, dtype=h.dtype)
            out[1] = h[0]
            return out
        if self.case == "a write after a recorded read into a tensor made without a traced value":
            t = torch.arange(3, dtype=h.dtype)
            a = h + t
            t.add_(1)   # (the graph would read t as written everywhere)
            return a + h * t
        if self.case == "random numbers drawn without a traced argument":
            return h * torch.rand((), dtype=h.dtype)
        if self.case == "a custom autograd Function":
            return _Straight.apply(h)
        if self.case == "a value stored in the model":
            self.last = h
            return h
        if self.case == "a value stored on an object the model holds":
            self.box.h = h
            return h
        if self.case == "an output shape that depends on values":
            return h[torch.nonzero(h > -1e9, as_tuple=True)]
        if self.case == "a shape read from a traced number":
            return h.sum() + torch.zeros((h > -1e9).sum(), dtype=h.dtype).sum()
        if self.case == "a write into one of equal results":
            a, b = h * h, h * h
            b[0].add_(1)   # (b, distinct from a in eager, is a's node in the graph)
            return a + b
        raise AssertionError(self.case)


_REASONS = {"a Python read of a value": "item has a value-dependent output", "a tensor attribute": "attribute T",
            "a write into a tensor made without a traced value": "writes into a tensor made without",
            "a write after a recorded read into a tensor made without a traced value":
                "written in place after a recorded op read it",
            "random numbers drawn without a traced argument": "draws random numbers without a traced argument",
            "a custom autograd Function": "custom autograd Function",
            "a value stored in the model": "stored a traced value in the model",
            "a value stored on an object the model holds": "stored a traced value in the model",
            "an output shape that depends on values": "nonzero has a value-dependent output",
            "a shape read from a traced number": "zeros has a value-dependent output",
            "a write into one of equal results": "writes into the result of calls recorded as one"}


_REFUSED = {"a Python read of a value": "data-dependent control flow",
            "a value stored in the model": "assigned a traced tensor",
            "a value stored on an object the model holds": "stores a traced value",
            "an output shape that depends on values": "value-dependent",
            "a shape read from a traced number": "value-dependent"}


@pytest.mark.parametrize("case", sorted(_REASONS))
def test_the_recording_gives_up_where_it_cannot_see_the_call_in_full_and_the_tracer_traces_from_copies(case):
    torch.manual_seed(0)
    model = _Case(case).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    with patches_installed():
        assert _REASONS[case] in record(model, [x], ["x"]).unusable
        if case in _REFUSED:   # refused by the tracer, naming the line, as before there was a recorder
            with pytest.raises(FrontendError, match=_REFUSED[case]):
                trace(model, [x], ["x"], live=True)
            assert not hasattr(model, "last") and not vars(model.box)   # the call's stores are undone
            return
        state = torch.get_rng_state()
        recorded = trace(model, [x], ["x"], live=True)
        after = torch.get_rng_state()
    torch.set_rng_state(state)
    want = model(x)
    assert torch.equal(after, torch.get_rng_state())   # the call drew as eager's, once
    torch.testing.assert_close(recorded.result[0], want, rtol=0, atol=0)
    if case == "a custom autograd Function":   # the tracer records the Function's call, keeping its backward
        assert any("_Straight_apply" in str(n.target) for n in recorded.graph.graph.nodes)


def test_a_tensor_made_in_forward_and_written_after_a_read_is_read_as_eager_reads_it():
    model = _Case("a write after a recorded read into a tensor made without a traced value").double()
    x, y = torch.randn(2, 2, 3, dtype=torch.float64)
    with patches_installed():
        recorded = trace(model, [x], ["x"], live=True)
    torch.testing.assert_close(recorded.graph(y)[0], model(y))


def test_an_input_given_twice_is_traced_as_two_inputs():
    model = nn.Bilinear(3, 3, 1).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    assert "given twice" in record(model, [x, x], ["a", "b"]).unusable
    with patches_installed():
        recorded = trace(model, [x, x], ["a", "b"], live=True)
    assert [n.name for n in recorded.graph.graph.nodes if n.op == "placeholder"] == ["a", "b"]
    y = torch.randn(2, 3, dtype=torch.float64)
    torch.testing.assert_close(recorded.graph(x, y)[0], model(x, y))


def test_random_ops_and_buffer_updates_are_recorded_as_the_call_makes_them():
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Dropout(0.5)).double()
    twin = copy.deepcopy(model)
    x = torch.randn(4, 3, dtype=torch.float64)
    torch.manual_seed(3)
    with patches_installed():
        recorded = trace(model, [x], ["x"], live=True)
    torch.manual_seed(3)
    torch.testing.assert_close(recorded.result[0], twin(x), rtol=0, atol=0)
    torch.testing.assert_close(model[1].running_mean, twin[1].running_mean, rtol=0, atol=0)
    assert model[1].num_batches_tracked == 1
    assert {"dropout", "add_"} <= {getattr(n.target, "__name__", n.target) for n in recorded.graph.graph.nodes}


def _nested_sum(groups):
    """A function that torch's overrides dispatch, taking tensors in lists of lists."""
    flat = tuple(t for group in groups for t in group)
    if torch.overrides.has_torch_function(flat):
        return torch.overrides.handle_torch_function(_nested_sum, flat, groups)
    return sum(flat)


class _Linear(nn.Module):
    """A linear layer, then ``then`` of its result."""

    def __init__(self, then, features: int = 3):
        super().__init__()
        self.lin, self.then = nn.Linear(3, features), then

    def forward(self, x):
        return self.then(self.lin(x))


def _assert_recorded_and_replayed(model: nn.Module, rows: int) -> None:
    """``model``'s call is recorded in full, and its graph computes the model on other inputs too."""
    x = torch.randn(rows, 3, dtype=torch.float64)
    assert record(model, [x], ["x"]).unusable is None
    with patches_installed():
        recorded = trace(model, [x], ["x"], live=True)
    other = torch.randn(rows, 3, dtype=torch.float64)
    torch.testing.assert_close(recorded.graph(other)[0], model(other))


def _plus_nested_sum(h):
    with torch.no_grad():   # (no gradient would tell a frozen value)
        s = _nested_sum([[h[0]], [h[1]]])
    return h + s


def test_a_call_on_traced_tensors_nested_in_its_arguments_is_recorded_not_frozen():
    _assert_recorded_and_replayed(_Linear(_plus_nested_sum).double(), rows=2)


def _maxima(h):
    a, b = torch.split(h, 2, dim=1)
    return h.max(0).values + torch.min(a * b, dim=1)[0].sum()


def test_ops_returning_several_tensors_record_a_getitem_per_result():
    _assert_recorded_and_replayed(_Linear(_maxima, features=4).double(), rows=5)


class _SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` without its weights: ``multi_head_attention_forward`` returns ``(out, None)``."""

    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(3, 1, dtype=torch.float64)

    def forward(self, x):
        out, weights = self.attention(x, x, x, need_weights=False)
        assert weights is None
        return out


def test_a_function_returning_tensors_and_none_records_a_getitem_per_tensor():
    """An attention layer's weights it was not asked for are None (as ``nn.TransformerEncoderLayer`` calls it):
    the call is recorded, not given up on as a result that Python code reads."""
    _assert_recorded_and_replayed(_SelfAttention(), rows=4)


class _Program(nn.Module):
    """A model holding a long program of Python data (tuples of numbers, as the NeuraLogic bridge's steps), a
    plain object reached through a tuple among them, and a list of lists; ``forward`` stores its value in one
    of them, as ``store`` says."""

    def __init__(self, store: str):
        super().__init__()
        self.store, self.lin = store, nn.Linear(3, 3)
        self.box = types.SimpleNamespace()
        self.steps = [("neuron", (i, i + 1), None, (3,)) for i in range(5000)] + [("box", self.box)]
        self.buffers_ = [[], []]

    def forward(self, x):
        h = self.lin(x)
        if self.store == "on the plain object":
            self.box.h = h
        elif self.store == "as an item of the program":
            self.steps[7] = ("value", h)
        elif self.store == "into an inner list":
            self.buffers_[1].append(h)
        return h


@pytest.mark.parametrize("store", ["on the plain object", "as an item of the program", "into an inner list"])
def test_a_value_stored_in_long_python_data_of_the_model_is_found_on_every_call(store):
    """The walk over the model's Python data skips what cannot have changed (tuples of numbers, items still in
    their place) and still finds every store, on the first call and on later ones."""
    x = torch.randn(2, 3)
    for _ in range(3):   # (later walks skip the tuples seen before)
        assert record(_Program("nothing"), [x], ["x"]).unusable is None
    model = _Program(store)
    for _ in range(3):
        steps = list(model.steps)
        assert "stored a traced value in the model" in record(model, [x], ["x"]).unusable
        assert model.steps == steps and model.buffers_ == [[], []] and not vars(model.box)   # undone


def _count(gm, target) -> int:
    return sum(n.target is target for n in gm.graph.nodes)


def _squares_twice(h):
    return h * h + h * h


def _doubles_around_a_write(h):
    a = h * 2
    h.add_(1)
    return a + h * 2


def _squares_with_and_without_gradients(h):
    a = h * h
    with torch.no_grad():
        b = h * h
    return a + b


def _row_by_int_and_by_bool(h):
    return h[1] + h[True]


@pytest.mark.parametrize("then, muls", [(_squares_twice, 1), (_doubles_around_a_write, 2),
                                        (_squares_with_and_without_gradients, 2)])
def test_equal_pure_calls_are_recorded_once_between_writes_and_grad_mode_changes(then, muls):
    model = _Linear(then).double()
    _assert_recorded_and_replayed(model, rows=2)
    x = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    with patches_installed():
        recorded = trace(model, [x], ["x"], live=True)
    assert _count(recorded.graph, operator.mul) == muls
    other = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    got, want = recorded.graph(other)[0], model(other)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    gradients = [torch.autograd.grad(y.sum(), [other, *model.parameters()]) for y in (got, want)]
    torch.testing.assert_close(*gradients, rtol=0, atol=1e-12)


def test_calls_merge_on_equal_ints_only():
    model = _Linear(_row_by_int_and_by_bool).double()
    _assert_recorded_and_replayed(model, rows=2)
    with patches_installed():
        recorded = trace(model, [torch.randn(2, 3, dtype=torch.float64)], ["x"], live=True)
    assert _count(recorded.graph, operator.getitem) == 2


def test_equal_calls_return_distinct_tensors_as_in_eager():
    model = _Linear(lambda h: (h * h, h * h)).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    with patches_installed():
        recorded = trace(model, [x], ["x"], live=True)
    a, b = recorded.result[0]
    assert a is not b and a.data_ptr() != b.data_ptr()
    assert _count(recorded.graph, operator.mul) == 1

