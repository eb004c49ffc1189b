"""The fold_bias pass: ``add(linear(x, W), b)`` becomes ``linear(x, W, b)`` where ``b`` is a bias (one
entry per output feature) and the linear has no other reader; elsewhere the add stays. Compiled
models equal eager, outputs and gradients, either way."""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from dynamo_relational.options import Options
from dynamo_relational.passes import PassContext, fold_bias
from examples.data import graph_batch
from examples.styles import AccumulatorGCN
from tests.helpers import assert_compiled_matches_eager


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


class _Recorder(fx.Interpreter):
    """Runs a traced graph and records each node's value in its meta, as Dynamo's graphs carry them."""

    def run_node(self, node):
        node.meta["val"] = value = super().run_node(node)
        return value


def _folded(fn, *inputs):
    """``fn`` traced, run once to record values, then passed through fold_bias: (graph module, folds)."""
    gm = fx.symbolic_trace(fn)
    _Recorder(gm).run(*inputs)
    ctx = PassContext(Options())
    gm = fold_bias.run(gm, ctx)
    gm.graph.lint()
    gm.recompile()
    return gm, ctx.stats["fold_bias"]


def test_on_a_graph_the_add_of_a_bias_folds_and_the_add_of_the_product_to_itself_does_not():
    x, w, b = (torch.randn(*shape, dtype=torch.float64) for shape in ((3, 4), (4, 4), (4,)))
    gm, folds = _folded(lambda x, w, b: torch.add(F.linear(x, w), b), x, w, b)
    assert folds == 1
    torch.testing.assert_close(gm(x, w, b), F.linear(x, w) + b)
    # a 1-D product has the bias's shape, and is the other operand: folding it would read itself
    gm, folds = _folded(_self_sum, x[0], w)
    assert folds == 0
    torch.testing.assert_close(gm(x[0], w), 2 * F.linear(x[0], w))
    # a float64 bias promotes the sum of a float32 product: the linear's own dtype would be wrong
    gm, folds = _folded(lambda x, w, b: F.linear(x, w) + b, x.float(), w.float(), b)
    assert folds == 0


def _self_sum(x, w):
    h = F.linear(x, w)
    return h + h


def test_a_linear_called_with_keywords_folds_alike():
    x, w, b = (torch.randn(*shape, dtype=torch.float64) for shape in ((3, 4), (2, 4), (2,)))
    gm, folds = _folded(lambda x, w, b: F.linear(input=x, weight=w) + b, x, w, b)
    assert folds == 1
    torch.testing.assert_close(gm(x, w, b), F.linear(x, w) + b)
