"""The gather optimizer passes (postpone, compose, simplify): they fire where they should, stay
put where they must not, can be switched off, and the compiled model always equals eager."""
import pytest
import torch
from torch import nn

from examples.data import graph_batch
from examples.gcn import ScalarGCN
from tests.conftest import assert_compiled_matches_eager


def _stat(report, name):
    return sum(g.stats.get(name, 0) for g in report.graphs)


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
    batch = graph_batch("mutagenesis", graphs=3, dtype=dtype)
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


def test_gcn_with_the_passes_through_inductor_matches_eager():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3)
    report = assert_compiled_matches_eager(ScalarGCN(batch, 7), batch.x)
    assert _stat(report, "gathers_postponed") >= 1


def test_unknown_pass_name_is_a_clear_error():
    with pytest.raises(Exception, match="unknown pass.*'postpone'.*postpone_gathers"):
        torch.compile(nn.Linear(2, 2), backend="relational", options={"disable": ["postpone"]})(torch.ones(1, 2))
