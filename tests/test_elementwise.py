"""The elementwise family beyond arithmetic: comparisons, logical and bitwise ops, ``masked_fill`` and dtype
casts group like arithmetic, through both front-ends, and match eager."""
import pytest
import torch
import torch.fx as fx
from torch import nn

import dynamo_relational
from dynamo_relational.passes.inplace import is_in_place, target_in_place
from tests.test_frontend import assert_fast_compile_matches_eager, report_matching_eager

ROWS, WIDTH = 16, 4


class Masks(nn.Module):
    """Per neuron: a mask from comparisons and logical ops selects, fills and is cast back to floats."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)

    def forward(self, x, counts):
        out = []
        for v in range(ROWS):
            h = self.lin(x[v])
            mask = (h > 0) & (x[v] < 1) | ~(h != h.abs()) ^ torch.logical_not(h <= -0.5)
            count = counts[v].long()
            bits = (count & 3) | torch.bitwise_not(count ^ 1)
            out.append(torch.where(mask, h, -h).clamp(min=-1.0) * mask.to(h.dtype) + h.masked_fill(~mask, 0.5)
                       + bits.double() + (bits > 2).long().type_as(h) + torch.eq(h, x[v]).to(torch.float64))
        return torch.stack(out)


def _inputs():
    torch.manual_seed(0)
    return torch.randn(ROWS, WIDTH, dtype=torch.float64), torch.randint(0, 8, (ROWS, WIDTH)).double()


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_masks_comparisons_and_casts_group_and_match_eager(front_end):
    model = Masks()
    report = report_matching_eager(front_end, model, *_inputs(), inductor=front_end == "backend")
    assert not report.ungrouped, report.ungrouped   # (``&`` was taken for an in-place op: nothing grouped)
    assert report.nodes_after < report.nodes_before / 10


class PerNeuronScalars(nn.Module):
    """A threshold, exponent, bound and fill value of its own for each neuron (Python floats)."""

    def __init__(self, dtype):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, dtype=dtype)
        self.t = [round(0.1 * v - 0.8, 1) for v in range(ROWS)]   # 0.1 steps: exact ties with float32 rows

    def forward(self, x):
        out = []
        for v in range(ROWS):
            h, t = self.lin(x[v]), self.t[v]
            above = (h > t) & torch.le(h, t + 1) | (x[v] == t)
            out.append(torch.where(above, h, t) + h.clamp(min=t) + torch.clamp(h, -1.0, t + 1) + h.abs() ** (1 + abs(t))
                       + h.masked_fill(h < t, t) + (2.0 + t) ** h + above.to(h.dtype))
        return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_scalars_that_differ_per_neuron_group_and_match_eager(front_end, dtype):
    torch.manual_seed(0)
    x = (torch.randn(ROWS, WIDTH, dtype=torch.float64) * 10).round() / 10   # values on the thresholds too
    report = report_matching_eager(front_end, PerNeuronScalars(dtype), x.to(dtype), inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 10   # one group per op, not one per threshold


def test_operators_and_or_not_are_not_in_place():
    """Their names end in ``_`` like in-place methods (``add_``); the in-place ``&=`` is ``iand``."""
    import operator

    assert not any(target_in_place("call_function", f) for f in (operator.and_, operator.or_, operator.not_))
    assert target_in_place("call_function", operator.iand) and target_in_place("call_method", "masked_fill_")


def test_masked_fill_with_a_tensor_value_per_neuron_is_left_ungrouped_and_right():
    """Batched, a value that differs per neuron would no longer be one 0-d tensor."""
    class PerNeuronFill(nn.Module):
        def forward(self, x):
            return torch.stack([x[v].masked_fill(x[v] > 0, x[v, 0]) for v in range(ROWS)])

    report = assert_fast_compile_matches_eager(PerNeuronFill(), _inputs()[0], inductor=False).report.graphs[0]
    assert "masked_fill with a tensor value" in report.ungrouped


def test_an_out_argument_of_none_is_not_in_place():
    """``F.normalize`` passes ``out=None`` on: it writes no output, so the graph may still be grouped."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    assert not is_in_place(graph.call_function(torch.nn.functional.normalize, (x,), {"dim": 0, "out": None}))
    assert is_in_place(graph.call_function(torch.add, (x, 1.0), {"out": x}))


class InPlaceActivations(nn.Module):
    """``nn.ReLU(inplace=True)`` and friends on fresh values, and dropout, per neuron."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.act = nn.ReLU(inplace=True)
        self.leaky = nn.LeakyReLU(0.1, inplace=True)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        out = []
        for v in range(ROWS):
            h = self.drop(self.act(self.lin(x[v])))
            h = self.leaky(h + self.lin(x[(v + 1) % ROWS])) + torch.relu_(self.lin(x[v]) * 2)
            out.append(h + (self.lin(x[v]) - 1).sigmoid_() + torch.nn.functional.elu(self.lin(x[v]), inplace=True))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_in_place_activations_on_fresh_values_and_eval_dropout_group_and_match_eager(front_end):
    """They used to keep the whole graph in its order (nothing grouped); dropout outside training is the identity."""
    model = InPlaceActivations().eval()
    x = _inputs()[0]
    report = report_matching_eager(front_end, model, x, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


def test_an_in_place_activation_of_an_input_row_keeps_the_graph_in_order_and_right():
    """``relu_`` on ``x[v]`` writes into the input: grouping would copy the row first, so nothing is grouped."""
    class IntoTheInput(nn.Module):
        def forward(self, x):
            return torch.stack([torch.relu_(x[v]) * 2 for v in range(ROWS)])

    x = _inputs()[0]
    compiled = torch.compile(IntoTheInput(), backend="relational")
    got, want = x.clone(), x.clone()
    torch.testing.assert_close(compiled(got), IntoTheInput()(want))
    torch.testing.assert_close(got, want)   # the input was changed in the same way


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("alias", ["detach", "to", "double", "type_as", "dropout"])
def test_an_in_place_activation_through_an_op_that_may_return_its_input_writes_into_the_input(alias, front_end):
    """``x[v].double().relu_()`` on a float64 ``x`` (or ``detach``, ``to``, ``type_as``, eval dropout):
    the cast returns ``x[v]`` itself, so ``relu_`` writes into ``x``, which later neurons read. (For
    eval dropout, torch 2.13's own ``aot_eager`` and ``inductor`` backends miss the write; the
    ``inplace`` pass reads the dropout's input instead.)"""
    import torch.nn.functional as F

    class ThroughAnAlias(nn.Module):
        def forward(self, x):
            out = []
            for v in range(ROWS):
                row = x[v]
                same = {"detach": row.detach, "to": lambda: row.to(torch.float64), "double": row.double,
                        "type_as": lambda: row.type_as(x), "dropout": lambda: F.dropout(row, 0.5, False)}[alias]()
                out.append(same.relu_() + x[(v + 1) % ROWS])
            return torch.stack(out)

    x = _inputs()[0]
    got, want = x.clone(), x.clone()
    compiled = torch.compile(ThroughAnAlias(), backend="relational") if front_end == "backend" else \
        dynamo_relational.compile(ThroughAnAlias(), x.clone(), inductor=False)
    torch.testing.assert_close(compiled(got), ThroughAnAlias()(want))
    torch.testing.assert_close(got, want)   # the input was changed in the same way
