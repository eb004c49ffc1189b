"""The gather optimizer passes (postpone, compose, simplify): they fire where they should, stay
put where they must not, can be switched off, and the compiled model always equals eager."""
import dataclasses

import pytest
import torch
from torch import nn

from examples.data import graph_batch
from examples.gcn import ScalarGCN
from tests.helpers import assert_compiled_matches_eager, assert_fast_compile_matches_eager


def _stat(report, name):
    return sum(g.stats.get(name, 0) for g in report.graphs)


def _with_self_loops(batch):
    """Every node also sends to itself (as ``GCNConv`` adds): each layer's messages read every node's row,
    which lets the linear map move below the gather (``postpone_gathers`` needs every row read)."""
    return dataclasses.replace(batch, edges=batch.edges + [(v, v) for v in range(batch.num_nodes)])


class RangeReads(nn.Module):
    """Reads the rows ``range(*bounds)``: a strided or contiguous run is a slice, not a gather."""

    def __init__(self, bounds):
        super().__init__()
        self.bounds = bounds

    def forward(self, x):
        return torch.stack([x[i] * 2.0 for i in range(*self.bounds)]).sum(0)


class PairwiseProducts(nn.Module):
    """``x[u] * x[v]`` per edge: no row-wise op follows a gather, so nothing is postponed."""

    def __init__(self, edges):
        super().__init__()
        self.edges = edges

    def forward(self, x):
        return torch.stack([x[u] * x[v] for u, v in self.edges])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gcn_linear_moves_before_the_gather_and_composes(dtype):
    torch.manual_seed(0)
    batch = _with_self_loops(graph_batch("mutagenesis", graphs=3, dtype=dtype))
    report = assert_compiled_matches_eager(ScalarGCN(batch, 7).to(dtype), batch.x, inductor=False)
    assert _stat(report, "gathers_postponed") >= 1
    assert _stat(report, "gathers_composed") >= 1


def test_passes_can_be_disabled_and_the_result_is_the_same():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    off = ("postpone_gathers", "compose_gathers", "simplify_gathers")
    report = assert_compiled_matches_eager(model, batch.x, inductor=False, disable=off)
    for name in ("gathers_postponed", "gathers_composed", "gathers_simplified"):
        assert _stat(report, name) == 0
    assert all(name not in report.pass_timings for name in off)


@pytest.mark.parametrize("bounds", [(0, 8, 2), (2, 6), (1, 8, 3)], ids=["strided", "contiguous", "strided-3"])
def test_range_reads_become_slices(bounds):
    torch.manual_seed(0)
    report = assert_compiled_matches_eager(RangeReads(bounds).double(), torch.randn(8, 3, dtype=torch.float64),
                                           inductor=False)
    assert _stat(report, "gathers_simplified") == 1
    assert "gather_rows" not in report.graphs[0].after


def test_no_row_wise_op_no_postponing():
    torch.manual_seed(0)
    edges = [(0, 1), (1, 2), (2, 0), (0, 2), (3, 1)]
    report = assert_compiled_matches_eager(PairwiseProducts(edges).double(), torch.randn(4, 5, dtype=torch.float64),
                                           inductor=False)
    assert _stat(report, "gathers_postponed") == 0


class SumsOfPairs(nn.Module):
    """``f(x_j)`` for the rows ``j`` in ``pairs``, summed pair by pair: ``f``'s group reads those rows of ``x``
    once each, and the sums read ``f``'s rows through gathers (which the moved gather would compose with)."""

    def __init__(self, f, pairs):
        super().__init__()
        self.f, self.pairs = f, pairs

    def forward(self, x):
        y = {j: self.f(x[j]) for pair in self.pairs for j in pair}
        return torch.stack([y[p] + y[q] for p, q in self.pairs])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("f, unread", [("sqrt", -1.0), ("sigmoid", float("nan")), ("linear", float("inf"))])
def test_a_gather_that_leaves_rows_unread_stays_above_a_row_wise_op(front_end, f, unread):
    """Moved below the gather, ``f`` would run on rows of ``x`` that eager never gives it: their gradient,
    0 times ``f``'s derivative there (``sqrt`` at -1, ``sigmoid`` at NaN) or 0 times the row itself (a linear
    map's weight gradient of a row of infs), is NaN, and it would reach ``x`` and the weights."""
    torch.manual_seed(0)
    fn = nn.Linear(3, 2).double() if f == "linear" else getattr(torch, f)
    x = torch.rand(6, 3, dtype=torch.float64) + 0.5
    x[[1, 3, 5]] = unread
    check = assert_compiled_matches_eager if front_end == "backend" else assert_fast_compile_matches_eager
    result = check(SumsOfPairs(fn, [(0, 4), (4, 2), (2, 0)]), x, inductor=False)
    assert _stat(result if front_end == "backend" else result.report, "gathers_postponed") == 0
    # Where the gather reads every row, the move is made.
    result = check(SumsOfPairs(fn, [(0, 4), (4, 2), (2, 0), (1, 3), (5, 1)]), x.abs().nan_to_num(1.0, 1.0),
                   inductor=False)
    assert _stat(result if front_end == "backend" else result.report, "gathers_postponed") == 1


def test_gcn_with_the_passes_through_inductor_matches_eager():
    torch.manual_seed(0)
    batch = _with_self_loops(graph_batch("mutagenesis", graphs=3))
    report = assert_compiled_matches_eager(ScalarGCN(batch, 7), batch.x)
    assert _stat(report, "gathers_postponed") >= 1


def test_unknown_pass_name_is_a_clear_error():
    with pytest.raises(Exception, match="unknown pass.*'postpone'.*postpone_gathers"):
        torch.compile(nn.Linear(2, 2), backend="relational", options={"disable": ["postpone"]})(torch.ones(1, 2))
