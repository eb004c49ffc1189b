"""passes/fuse_linear.py: consecutive linear maps (also through a sum/mean gather) become one product
where that multiplies less, and the compiled model equals eager."""
import pytest
import torch
from torch import nn

from examples.data import graph_batch
from examples.gcn import ScalarGCN
from tests.helpers import assert_fast_compile_matches_eager


class TwoLinears(nn.Module):
    """``lin2(lin1(x[v]))`` per node: nothing nonlinear between the two maps."""

    def __init__(self, features: int, hidden: int, out: int, bias: bool = True):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(features, hidden, bias=bias), nn.Linear(hidden, out)

    def forward(self, x):
        return torch.stack([torch.tanh(self.lin2(self.lin1(x[v]))) for v in range(x.shape[0])])


class LinearGCN(nn.Module):
    """Two message-passing layers without an activation between them (SGC style). The self-loop
    counts twice, so every sum has two terms or more and each layer is one sum of gathered rows."""

    def __init__(self, batch, hidden: int = 10):
        super().__init__()
        self.nbrs = [[v, v, *nbrs] for v, nbrs in enumerate(batch.in_neighbors())]
        self.w1 = nn.Parameter(torch.randn(hidden, batch.x.shape[1]) / 3)
        self.lin2 = nn.Linear(hidden, 4)

    def forward(self, x):
        h = [sum(self.w1 @ x[u] for u in nbrs) for nbrs in self.nbrs]
        return torch.stack([torch.sigmoid(self.lin2(sum(h[u] for u in nbrs))) for nbrs in self.nbrs])


def _fused(compiled) -> list:
    return compiled.report.graphs[0].stats["linears_fused"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_consecutive_linears_become_one(dtype, bias):
    torch.manual_seed(0)
    model = TwoLinears(7, 10, 3, bias).to(dtype)
    compiled = assert_fast_compile_matches_eager(model, torch.randn(200, 7, dtype=dtype), autotune=False)
    assert [f["features"] for f in _fused(compiled)] == ["7->10->3"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_linears_fuse_through_a_sum_of_gathered_rows(dtype):
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=dtype)
    model = LinearGCN(batch).to(dtype)
    compiled = assert_fast_compile_matches_eager(model, batch.x, autotune=False)
    assert [f["through"] for f in _fused(compiled)] == [["sum", "sum"]], _fused(compiled)


def test_a_bottleneck_or_an_activation_between_is_left_alone():
    torch.manual_seed(0)
    # 64 -> 2 -> 64: the two thin products cost less than one 64 x 64 product
    compiled = assert_fast_compile_matches_eager(TwoLinears(64, 2, 64).double(),
                                                 torch.randn(100, 64, dtype=torch.float64), autotune=False)
    assert _fused(compiled) == []
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    compiled = assert_fast_compile_matches_eager(ScalarGCN(batch, 7).double(), batch.x, autotune=False)
    assert _fused(compiled) == []   # relu between the layers
