"""The pair_sums pass: a sum of one row of each of two joined values, ``gather_reduce(cat([a, b]))`` where
``b`` has a row per segment in order, becomes ``a[I] + b``; sums of more terms stay. Compiled and batched
models equal eager, outputs and gradients, either way."""
from operator import getitem

import pytest
import torch
from torch import nn

import dynamo_relational
from tests.helpers import assert_batches_match_eager, assert_compiled_matches_eager, traced_per_sample


class TwoTerms(nn.Module):
    """``tanh(W x_i + U y_j)``: row ``i`` of one term, a row read elsewhere of the other."""

    def __init__(self, rows: int = 7):
        super().__init__()
        self.rows = rows
        self.W = nn.Linear(4, 3)
        self.U = nn.Linear(5, 3, bias=False)

    def forward(self, x, y):
        return torch.stack([torch.tanh(self.W(x[i]) + self.U(y[(3 * i) % self.rows])) for i in range(self.rows)])


class ThreeTerms(TwoTerms):
    def forward(self, x, y):
        return torch.stack([torch.tanh(self.W(x[i]) + self.U(y[(3 * i) % self.rows]) + self.U(y[i]))
                            for i in range(self.rows)])


def _inputs(dtype):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(7, 4, dtype=dtype, generator=generator), torch.randn(7, 5, dtype=dtype, generator=generator)


def _rewritten(report) -> int:
    return sum(g.stats.get("pair_sums", 0) for g in report.graphs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("inductor", [False, True])
def test_a_sum_of_two_terms_is_a_gather_and_an_add(dtype, inductor):
    report = assert_compiled_matches_eager(TwoTerms().to(dtype), *_inputs(dtype), inductor=inductor)
    assert _rewritten(report) == 1
    gm = report.graphs[0].graph_module
    assert not any(n.target is torch.ops.dynamo_relational.gather_reduce.default for n in gm.graph.nodes)


def test_the_fast_front_end_rewrites_it_too():
    model, (x, y) = TwoTerms().double(), _inputs(torch.float64)
    compiled = dynamo_relational.compile(model, (x, y), inductor=False)
    assert compiled.report.graphs[0].stats["pair_sums"] == 1
    torch.testing.assert_close(compiled(x, y), model(x, y), rtol=1e-12, atol=1e-12)


def test_sums_of_more_terms_and_the_disabled_pass_keep_the_gather_reduce():
    assert _rewritten(assert_compiled_matches_eager(ThreeTerms().double(), *_inputs(torch.float64),
                                                    inductor=False)) == 0
    assert _rewritten(assert_compiled_matches_eager(TwoTerms().double(), *_inputs(torch.float64), inductor=False,
                                                    disable=("pair_sums",))) == 0


def test_a_tree_lstm_union_adds_each_levels_two_terms_for_every_batch():
    """``W x + U h`` of every level of the union; batches of other samples equal eager."""
    data, model, batched = traced_per_sample("treelstm", 12)
    assert_batches_match_eager(batched, model, data[::-1])
    nodes = batched._cache.unions[0].plan.graph.graph.nodes
    # (the gather, or its part of the gathers merged for the union)
    assert any(n.target is torch.add and n.args[0].target in (torch.index_select, getitem) for n in nodes)
    for batch in (data[:3], data[5:], [data[4]] * 2):
        assert_batches_match_eager(batched, model, batch)
