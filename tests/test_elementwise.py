"""The elementwise family beyond arithmetic: comparisons, logical and bitwise ops, ``masked_fill`` and dtype
casts group like arithmetic, through both front-ends, and match eager."""
import pytest
import torch
import torch.fx as fx
from torch import nn

from dynamo_relational.passes.inplace import is_in_place, target_in_place
from tests.conftest import assert_compiled_matches_eager
from tests.test_frontend import assert_fast_compile_matches_eager

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
    if front_end == "backend":
        report = assert_compiled_matches_eager(model, *_inputs()).graphs[0]
    else:
        report = assert_fast_compile_matches_eager(model, *_inputs(), inductor=False).report.graphs[0]
    assert not report.ungrouped, report.ungrouped   # (``&`` was taken for an in-place op: nothing grouped)
    assert report.nodes_after < report.nodes_before / 10


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
