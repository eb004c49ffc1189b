"""Per-graph tensor code over an edge index, run once for all the samples of a union on their rows joined
(``dynamo_relational/collation.py``): each trace stays a few tensor ops, the union runs them as PyG runs a
batch, and every sample's results and gradients are eager's."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from tests.helpers import assert_batches_match_eager, assert_shuffled_batches_match_eager


class EdgeConv(nn.Module):
    """One message-passing layer over ``edges`` (``[2, E]``: ``src, dst``) and a readout: ``h[src] @ W.t()``
    summed into the targets, written as per-graph code writes it (``style``)."""

    def __init__(self, style: str = "index_add", readout: str = "mean"):
        super().__init__()
        self.style, self.readout = style, readout
        self.lin, self.msg = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x, edges):
        src, dst = edges
        h = self.lin(x)
        m = (h.index_select(0, src) if self.style == "index_select" else h[src]) @ self.msg.weight.t()
        if self.style == "scatter_add_":   # (PyG's sum of messages)
            out = h.new_zeros(h.shape).scatter_add_(0, dst.view(-1, 1).expand_as(m), m)
        elif self.style == "onto h":
            out = h.index_add(0, dst, m)
        else:
            out = torch.zeros_like(h).index_add(0, dst, m)
        return getattr(torch.relu(out + self.msg.bias), self.readout)(0)


def _graphs(sizes=(3, 4, 2, 5, 3, 4, 1), seed: int = 0) -> list[tuple]:
    """Graphs of ``sizes`` nodes with random edges (one of a single edge, one of none)."""
    generator = torch.Generator().manual_seed(seed)
    graphs = []
    for k, n in enumerate(sizes):
        edges = n + 1 if k % 3 else 1
        graphs.append((torch.randn(n, 3, dtype=torch.float64, generator=generator),
                       torch.randint(0, n, (2, edges if n > 1 else 0), generator=generator)))
    return graphs


def _collated(batched) -> list[bool]:
    return [bool(s.graph.collated) for s in batched._cache.structures.values() if s.graph is not None]


@pytest.mark.parametrize("style", ["index_add", "index_select", "scatter_add_", "onto h"])
@pytest.mark.parametrize("readout", ["mean", "amax"])
def test_per_graph_code_over_an_edge_index_runs_each_tensor_op_once_for_all_samples(style, readout):
    """Each trace keeps its tensor ops (no per-edge nodes), and the union runs each once on all samples' rows:
    the gather of the sources, the segment sum into the targets, the readout of each sample's rows."""
    batched = assert_shuffled_batches_match_eager(EdgeConv(style, readout), _graphs())
    assert all(_collated(batched)), batched.report
    assert batched.report.kept_nodes <= 20 * batched.report.structures, batched.report
    # (a program per pattern of sizes: a graph without edges, and one whose only edge loops, run their own)
    programs = {s.graph.program for s in batched._cache.structures.values()}
    assert batched.report.union_code[2] <= 11 * len(programs) <= 33, batched.report


def test_samples_whose_sizes_coincide_otherwise_are_programs_of_their_own():
    """A graph with as many edges as nodes (a ring) runs another program than graphs without that coincidence
    (an op may pair its edges' rows with its nodes' rows); both run from one union, the maximum over each
    sample's rows grouped across the two."""
    ring = (torch.randn(4, 3, dtype=torch.float64), torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]]))
    batched = assert_shuffled_batches_match_eager(EdgeConv(readout="amax"), _graphs() + [ring])
    programs = {s.graph.program for s in batched._cache.structures.values()}
    assert len(programs) > 1 and all(_collated(batched))


def test_targets_beside_collated_values_are_read_as_their_rows():
    """A loss of the collated values and the sample's per-node targets (another tensor argument) reads both as
    rows of one layout."""
    class NodeLoss(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)

        def forward(self, x, edges, y):
            src, dst = edges
            out = x + torch.zeros_like(x).index_add(0, dst, self.lin(x)[src])
            return F.mse_loss(out, y)

    graphs = [(x, edges, torch.randn(len(x), 3, dtype=torch.float64)) for x, edges in _graphs()]
    batched = assert_shuffled_batches_match_eager(NodeLoss(), graphs)
    assert all(_collated(batched))


def test_code_that_reads_the_collated_values_otherwise_runs_per_edge_and_per_node():
    """A softmax over a sample's rows (an attention readout) reads them as a whole: the trace becomes per-edge
    reads and per-node sums instead, which group as per-node code does."""
    class Attention(EdgeConv):
        def forward(self, x, edges):
            src, dst = edges
            out = torch.zeros_like(x).index_add(0, dst, x[src])
            return (torch.softmax(out.sum(1, keepdim=True), 0) * out).sum(0)

    batched = assert_shuffled_batches_match_eager(Attention(), _graphs()[:-1])   # (the per-edge form needs edges)
    assert not any(_collated(batched))


def test_an_index_of_another_shape_is_left_to_eager():
    """``h[edges]`` by a ``[2, E]`` index reads a row pair per entry: not a read of rows, so the samples run
    with the model, as eager."""
    class Pairs(nn.Module):
        def forward(self, x, edges):
            return x[edges].prod(0).sum(0)

    batched = dynamo_relational.batch(Pairs(), progress=False)
    graphs = _graphs()[1:4]
    for _ in range(3):
        assert_batches_match_eager(batched, Pairs(), graphs, through_union=False)
    assert not any(_collated(batched))


def test_samples_that_collate_and_samples_that_do_not_run_from_one_union():
    """Code that branches on a graph's size: the larger graphs' attention readout runs per edge, the others'
    mean collates; one union runs both kinds."""
    class Branching(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)

        def forward(self, x, edges):
            src, dst = edges
            out = torch.zeros_like(x).index_add(0, dst, self.lin(x)[src])
            if len(x) > 3:
                return (torch.softmax(out.sum(1, keepdim=True), 0) * out).sum(0)
            return out.mean(0)

    batched = assert_shuffled_batches_match_eager(Branching(), _graphs()[:-1])
    assert any(_collated(batched)) and not all(_collated(batched))


def test_an_edge_list_of_one_edge_read_by_columns():
    """``edges[:, 0]`` of an ``[E, 2]`` list of one edge is a one-element constant with a stride, which the merging
    of equal constants reads as bytes."""
    class Columns(nn.Module):
        def forward(self, x, edges):
            src, dst = edges[:, 0], edges[:, 1]
            return torch.zeros_like(x).index_add(0, dst, x[src] * 2).sum(0)

    graphs = [(x, torch.tensor([[0, 1]] if k % 2 else [[0, 1], [1, 0]])) for k, (x, _) in enumerate(_graphs()[:4])]
    batched = assert_shuffled_batches_match_eager(Columns(), graphs)
    assert all(_collated(batched))


class DenseGCN(nn.Module):
    """Two convolutions over a dense adjacency ``A``, ``relu(A @ h W^T + b)``, and a mean readout, as per-graph
    code over an adjacency matrix writes them: ``A`` given (``"argument"``; ``"spmm"``: a sparse one, multiplied by
    ``torch.spmm`` as in Kipf and Welling's GCN code), filled from the edges in forward (``"filled"``; ``"put"``: by
    ``index_put_``, counting repeated edges), or that normalized, ``D^-1/2 (A + I) D^-1/2`` (``"normalized"``)."""

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.lin, self.msg = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x, graph):
        a = graph
        if self.style == "put":
            a = torch.zeros(len(x), len(x), dtype=x.dtype).index_put_(
                (graph[1], graph[0]), torch.ones(graph.shape[1], dtype=x.dtype), accumulate=True)
        elif self.style not in ("argument", "spmm"):
            a = torch.zeros(len(x), len(x), dtype=x.dtype)
            a[graph[1], graph[0]] = 1.0
        if self.style == "normalized":
            a = a + torch.eye(len(x), dtype=x.dtype)
            degree = a.sum(1).rsqrt()
            a = degree[:, None] * a * degree[None, :]
        product = torch.spmm if self.style == "spmm" else torch.matmul
        h = torch.relu(product(a, self.lin(x)))
        return torch.relu(product(a, self.msg(h))).mean(0)


def _adjacency(x: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    a = torch.zeros(len(x), len(x), dtype=x.dtype)
    a[edges[1], edges[0]] = 1.0
    return a


@pytest.mark.parametrize("style", ["argument", "spmm", "filled", "put", "normalized"])
def test_an_adjacency_matrix_multiplies_as_a_sum_over_its_nonzeros(style):
    """``A @ h`` by the sample's adjacency (its structure: read by value) runs as one gather of the joined rows by
    the nonzeros' columns, a product by their values and one segment sum, as over an edge index."""
    graphs = _graphs()
    if style == "argument":
        graphs = [(x, _adjacency(x, edges)) for x, edges in graphs]
    elif style == "spmm":
        graphs = [(x, _adjacency(x, edges).to_sparse()) for x, edges in graphs]
    batched = assert_shuffled_batches_match_eager(DenseGCN(style), graphs, constant=(1,))
    assert all(_collated(batched)) and batched._by_value == {"argument 1"}, batched.report
    programs = {s.graph.program for s in batched._cache.structures.values()}
    assert batched.report.union_code[2] <= 16 * len(programs), batched.report


@pytest.mark.parametrize("style", ["argument", "spmm"])
def test_an_adjacency_that_requires_gradients_stays_an_input(style):
    """A learned adjacency is not structure: its samples (of other sizes, or sparse: no union joins them) run
    with the model, and its gradient is eager's."""
    model = DenseGCN(style)
    graphs = [(x, (_adjacency(x, edges).to_sparse() if style == "spmm" else _adjacency(x, edges)).requires_grad_())
              for x, edges in _graphs()[:3]]
    batched = dynamo_relational.batch(model, progress=False)
    for _ in range(2):
        outputs = batched(graphs)
    reason = "not a dense tensor of static shape" if style == "spmm" else "has shapes"
    assert not batched._by_value and reason in batched.report.unbatched_reason, batched.report
    sum(o.sum() for o in outputs).backward()
    for x, a in graphs:
        want = torch.autograd.grad(model(x, a).sum(), a)[0]
        torch.testing.assert_close(a.grad, want)


def test_a_matrix_of_the_features_stays_an_input():
    """``(x @ x.t()) @ lin(x)`` multiplies values of the features by a matrix of the features: not a structure's
    matrix, so ``x`` stays an input (without gradients too)."""
    class Gram(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)

        def forward(self, x, edges):
            return ((x @ x.t()) @ self.lin(x)).sum(0)

    batched = dynamo_relational.batch(Gram(), progress=False)
    batched(_graphs())
    assert not batched._by_value


@pytest.mark.parametrize("reduce", ["mean", "amax", "amin"])
@pytest.mark.parametrize("call", ["scatter_reduce_", "index_reduce"])
def test_a_reduction_of_messages_into_each_node_is_one_segment_reduction(reduce, call):
    """``z.scatter_reduce_(0, dst.view(-1, 1).expand_as(m), m, reduce, include_self=False)`` into new zeros (as
    PyTorch Geometric aggregates messages), or ``index_reduce``: each node's mean, maximum or minimum of its
    messages, zeros where none come, for all samples at once."""
    class Aggregation(EdgeConv):
        def forward(self, x, edges):
            src, dst = edges
            m = self.lin(x)[src]
            if call == "index_reduce":
                out = torch.zeros(len(x), 4, dtype=x.dtype).index_reduce(0, dst, m, reduce, include_self=False)
            else:
                out = m.new_zeros(len(x), 4).scatter_reduce_(0, dst.view(-1, 1).expand_as(m), m, reduce,
                                                             include_self=False)
            return torch.relu(out + self.msg.bias).sum(0)

    batched = assert_shuffled_batches_match_eager(Aggregation(), _graphs())
    assert all(_collated(batched)), batched.report


def test_a_maximum_that_includes_the_zeros_it_starts_from_runs_as_eager():
    """With ``include_self=True`` a node's maximum also counts the zero it starts from (and shares its gradient
    with it at a tie): not a segment maximum of the messages, so it is left as the sample's own op."""
    class WithSelf(EdgeConv):
        def forward(self, x, edges):
            src, dst = edges
            m = torch.relu(self.lin(x))[src]
            return torch.zeros(len(x), 4, dtype=x.dtype).scatter_reduce(
                0, dst.view(-1, 1).expand_as(m), m, "amax").sum(0)

    model = WithSelf()
    batched = dynamo_relational.batch(model, progress=False)
    for _ in range(2):
        assert_batches_match_eager(batched, model, _graphs(), through_union=False)
    assert not any(_collated(batched))


def test_an_edge_index_that_writes_into_a_new_tensor_in_place_is_structure():
    """``torch.zeros(n).scatter_add_(0, dst, ones)`` (in-degrees counted from the edges, as PyG's normalizations
    count them) writes into a tensor made in forward by the sample's edges: they are its structure, read by
    value, although the first call's recording stops at that write."""
    class Degrees(EdgeConv):
        def forward(self, x, edges):
            src, dst = edges
            degree = torch.zeros(len(x), dtype=x.dtype).scatter_add_(
                0, dst, torch.ones(dst.shape[0], dtype=x.dtype)).clamp(min=1)
            h = torch.zeros(len(x), 4, dtype=x.dtype).index_add(0, dst, self.lin(x)[src])
            return (h / degree[:, None]).sum(0)

    batched = assert_shuffled_batches_match_eager(Degrees(), _graphs())
    assert batched._by_value == {"argument 1"} and all(_collated(batched)), batched.report


def test_an_edge_index_joined_with_self_loops_is_structure():
    """``torch.cat([edges, torch.stack([loops, loops])], 1)`` (PyG's ``add_self_loops``) holds the edges' values
    as they are: reads by it read the edges by value, and the layer collates."""
    class SelfLoops(EdgeConv):
        def forward(self, x, edges):
            loops = torch.arange(len(x))
            src, dst = torch.cat([edges, torch.stack([loops, loops])], 1)
            h = self.lin(x)
            return torch.zeros_like(h).index_add(0, dst, h[src]).sum(0)

    batched = assert_shuffled_batches_match_eager(SelfLoops(), _graphs())
    assert batched._by_value == {"argument 1"} and all(_collated(batched)), batched.report
