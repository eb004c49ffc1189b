"""The fold_bias pass: ``add(linear(x, W), b)`` becomes ``linear(x, W, b)`` where ``b`` is a bias (one
entry per output feature) and the linear has no other reader; elsewhere the add stays. Compiled
models equal eager, outputs and gradients, either way."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from examples.data import graph_batch
from examples.styles import AccumulatorGCN
from tests.conftest import assert_compiled_matches_eager


class BiasAfterProduct(nn.Module):
    """One product per row, the bias added afterwards (``W @ x + b`` written out)."""

    def __init__(self, rows: int = 12, width: int = 5, out: int = 4):
        super().__init__()
        self.rows = rows
        self.weight = nn.Parameter(torch.randn(out, width))
        self.bias = nn.Parameter(torch.randn(out))

    def forward(self, x):
        return torch.stack([torch.tanh(F.linear(x[i], self.weight) + self.bias) for i in range(self.rows)])


class ProductAlsoReturned(BiasAfterProduct):
    """The product without the bias is an output too: folding would lose it."""

    def forward(self, x):
        products = [F.linear(x[i], self.weight) for i in range(self.rows)]
        return torch.cat([torch.stack(products), torch.stack([p + self.bias for p in products])])


class RowAddend(BiasAfterProduct):
    """Each row gets its own addend (a second input), not one bias for all rows."""

    def forward(self, x, y):
        return torch.stack([torch.tanh(F.linear(x[i], self.weight) + y[i]) for i in range(self.rows)])


def _fold_count(report) -> int:
    return sum(g.stats.get("fold_bias", 0) for g in report.graphs)


def _adds(report) -> int:
    return sum(1 for g in report.graphs for n in g.graph_module.graph.nodes
               if n.op == "call_function" and n.target is torch.add)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_bias_added_after_the_product_is_folded_into_it(dtype):
    report = assert_compiled_matches_eager(BiasAfterProduct().to(dtype), torch.randn(12, 5, dtype=dtype),
                                           inductor=False)
    assert _fold_count(report) == 1 and _adds(report) == 0
    assert "biases folded into linear" in str(report)


def test_the_accumulator_gcn_bias_folds_after_the_sum_commutes_with_the_weight():
    batch = graph_batch("mutagenesis", 2, seed=0)
    torch.manual_seed(0)
    model = AccumulatorGCN(batch, hidden=10).double()   # widens the 7 features: the sum goes first
    report = assert_compiled_matches_eager(model, batch.x.double())
    assert _fold_count(report) == 1 and _adds(report) == 0


def test_a_product_with_another_reader_keeps_its_add():
    report = assert_compiled_matches_eager(ProductAlsoReturned().double(), torch.randn(12, 5, dtype=torch.float64),
                                           inductor=False)
    assert _fold_count(report) == 0 and _adds(report) == 1


def test_a_per_row_addend_is_not_a_bias():
    report = assert_compiled_matches_eager(RowAddend().double(), torch.randn(12, 5, dtype=torch.float64),
                                           torch.randn(12, 4, dtype=torch.float64), inductor=False)
    assert _fold_count(report) == 0


def test_disabled_it_leaves_the_add():
    report = assert_compiled_matches_eager(BiasAfterProduct().double(), torch.randn(12, 5, dtype=torch.float64),
                                           inductor=False, disable=("fold_bias",))
    assert _fold_count(report) == 0 and _adds(report) == 1
