"""The hoist_gathers pass: a row-wise op of gathered rows whose readers are all gathers runs once per reader
on the rows it reads, and a reader that reads a whole part needs no gather. It leaves the graph alone where a
row would be computed twice or more than one reader would still gather; the results equal the original's."""
import pytest
import torch
import torch.fx as fx
from torch import nn

from dynamo_relational.passes import PassContext, hoist_gathers
from dynamo_relational.options import Options
from dynamo_relational.row_plan import _propagate_shapes
from tests.helpers import assert_batches_match_eager, traced_per_sample


class GatedReads(nn.Module):
    """``sigmoid(cat([a, b])[P])``, read by one gather per index of ``readers``."""

    def __init__(self, P: list[int], readers: list[list[int]]):
        super().__init__()
        self.register_buffer("P", torch.tensor(P))
        self.readers = len(readers)
        for k, index in enumerate(readers):
            self.register_buffer(f"I{k}", torch.tensor(index))

    def forward(self, a, b):
        s = torch.sigmoid(torch.index_select(torch.cat([a, b]), 0, self.P))
        return tuple(torch.index_select(s, 0, getattr(self, f"I{k}")) for k in range(self.readers))


def _graph(model: GatedReads, a: torch.Tensor, b: torch.Tensor) -> fx.GraphModule:
    """``model``'s graph, written node by node (a library may have wrapped ``torch.index_select``, which
    symbolic tracing then cannot trace)."""
    graph = fx.Graph()
    inputs = [graph.placeholder(name) for name in "ab"]
    for node, value in zip(inputs, (a, b)):
        node.meta["val"] = value
    joined = graph.call_function(torch.cat, (inputs,))
    s = graph.call_function(torch.sigmoid, (graph.call_function(torch.index_select, (joined, 0, graph.get_attr("P"))),))
    graph.output(tuple(graph.call_function(torch.index_select, (s, 0, graph.get_attr(f"I{k}")))
                       for k in range(model.readers)))
    return fx.GraphModule(model, graph)


def _hoisted(model: GatedReads, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int]:
    """(rewrites, gathers left) of the pass on ``model``'s graph, checked against ``model`` on ``a``, ``b``
    (values and gradients)."""
    gm = _graph(model, a, b)
    _propagate_shapes(gm)
    ctx = PassContext(Options())
    gm = hoist_gathers.run(gm, ctx)
    gm.graph.lint()
    gm.recompile()
    inputs = [t.clone().requires_grad_() for t in (a, b)]
    got, want = gm(*inputs), model(a.requires_grad_(), b.requires_grad_())
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    weights = [torch.randn_like(w) for w in want]
    grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights)), inputs)
    expected = torch.autograd.grad(sum((g * w).sum() for g, w in zip(want, weights)), (a, b))
    for g, w in zip(grads, expected):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    gathers = sum(n.target is torch.index_select for n in gm.graph.nodes)
    return ctx.stats["gathers_hoisted"], gathers


def _inputs():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(3, 2, dtype=torch.float64, generator=generator), \
        torch.randn(4, 2, dtype=torch.float64, generator=generator)


def test_a_reader_of_a_whole_part_reads_the_part_and_the_other_gathers_from_the_join():
    # rows of sigmoid: a's three in order, then b's rows 1 and 3; one reader takes a's, the other b's rows
    model = GatedReads([0, 1, 2, 4, 6], [[0, 1, 2], [4, 3]])
    assert _hoisted(model, *_inputs()) == (1, 1)


def test_readers_of_whole_parts_need_no_gather():
    model = GatedReads([3, 4, 5, 6, 0, 1, 2], [[4, 5, 6], [0, 1, 2, 3]])
    assert _hoisted(model, *_inputs()) == (1, 0)


@pytest.mark.parametrize("P, readers", [([0, 1, 2, 4], [[0, 1, 2], [3, 3]]), ([0, 1, 2, 4, 5], [[3, 0], [1, 4]])],
                         ids=["a row read twice", "two readers still gathering"])
def test_left_alone(P, readers):
    assert _hoisted(GatedReads(P, readers), *_inputs()) == (0, 1 + len(readers))


@pytest.mark.parametrize("kind", ["treelstm", "childsum"])
def test_a_tree_lstm_unions_gates_are_read_without_gathers_in_every_batch(kind):
    """Each level's sigmoid of the gates is one group; its readers take their gates from the groups that
    computed them. Batches of other samples and subsets equal eager."""
    unions = {}
    for options in ({}, {"disable": ("hoist_gathers",)}):
        data, model, batched = traced_per_sample(kind, 12, **options)
        assert_batches_match_eager(batched, model, data[::-1])
        for batch in (data[:3], data[5:], [data[4]] * 2):
            assert_batches_match_eager(batched, model, batch)
        unions[bool(options)] = batched._cache.unions[0].plan.graph.graph
    gathers = {off: sum(n.target is torch.index_select for n in graph.nodes) for off, graph in unions.items()}
    assert gathers[False] < gathers[True]
