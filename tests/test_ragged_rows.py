"""ragged_rows: a node's inputs joined as rows (``torch.cat(children, 0)``), run through row-wise ops and
reduced over the rows, group by the structure's depth, not by its child counts; compiled equal to eager."""
import operator
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from dynamo_relational.options import Options
from dynamo_relational.passes import ragged_rows
from dynamo_relational.passes.context import PassContext
from dynamo_relational.tracing import trace
from examples.per_sample import ChildSumTreeLSTM, Forest
from tests.helpers import assert_fast_compile_matches_eager, assert_rows_batch_as_eager, report_matching_eager

FEATURES, HIDDEN = 3, 4


def level_tree(depth: int, child_counts: list[int]) -> list[list[int]]:
    """Children lists of a tree whose leaves are all at ``depth``; the inner nodes of a level take their child
    counts from ``child_counts`` in turn. Parents are numbered before their children."""
    children: list[list[int]] = [[]]
    level = [0]
    for _ in range(depth):
        below = []
        for i, v in enumerate(level):
            for _ in range(child_counts[i % len(child_counts)]):
                children.append([])
                children[v].append(len(children) - 1)
                below.append(len(children) - 1)
        level = below
    return children


def child_sum_forest(child_counts: list[int], trees: int = 2, depth: int = 3):
    torch.manual_seed(0)
    structures = [level_tree(depth, child_counts[t:] + child_counts[:t]) for t in range(trees)]
    model = Forest(ChildSumTreeLSTM(FEATURES, HIDDEN).double(), structures)
    return model, torch.randn(sum(map(len, structures)), FEATURES, dtype=torch.float64)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_child_sum_tree_lstm_groups_as_many_children_as_a_binary_tree_and_matches_eager(front_end):
    mixed = report_matching_eager(front_end, *child_sum_forest([1, 2, 3]), inductor=False)
    binary = report_matching_eager(front_end, *child_sum_forest([2]), inductor=False)
    assert mixed.stats["ragged_reductions"] > 0
    # joined as [k, d] rows, each k would be a shape, and groups, of its own
    assert mixed.groups <= 1.1 * binary.groups


def test_child_sum_tree_lstm_of_float32_through_inductor():
    model, x = child_sum_forest([1, 3, 2], depth=2)
    compiled = assert_fast_compile_matches_eager(model.float(), x.float())
    assert compiled.report.graphs[0].stats["ragged_reductions"] > 0


ROWS = 6
CHILDREN = [[1, 2], [3], [3, 4, 5], [], [0, 1], [2]]


class RowOps(nn.Module):
    """Per node: the neighbours' rows joined, then row-wise ops of every kind the pass splits, reduced over the
    rows (or, ``every_dim``, over all dims)."""

    def __init__(self, reduce: str, keepdim: bool, rows: int = 1, every_dim: bool = False):
        super().__init__()
        self.reduce, self.keepdim, self.rows, self.every_dim = reduce, keepdim, rows, every_dim
        self.lin = nn.Linear(HIDDEN, HIDDEN, dtype=torch.float64)
        self.w = nn.Parameter(torch.randn(HIDDEN, HIDDEN, dtype=torch.float64))

    def forward(self, x):
        out = []
        for v, nbrs in enumerate(CHILDREN + [[0, 5]]):
            if not nbrs:
                continue
            h = torch.cat([x[u:u + self.rows] for u in nbrs], 0)       # [k * rows, HIDDEN]
            own = x[v % ROWS:v % ROWS + 1]
            z = torch.tanh(self.lin(h) + own.expand(len(h), HIDDEN)) * torch.sigmoid(h @ self.w)
            z = torch.where(h > 0, z, 0.5 * z) - x[v % ROWS]             # a 1-d operand broadcasts too
            dims = (0, 1) if self.every_dim else 0
            out.append(getattr(z, self.reduce)(dims, keepdim=self.keepdim).reshape(-1))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("reduce, keepdim, rows", [("sum", True, 1), ("mean", False, 1), ("amax", True, 1),
                                                   ("sum", False, 2), ("mean", True, 2)])
def test_row_wise_ops_over_joined_rows_become_ops_on_each_part(front_end, reduce, keepdim, rows):
    torch.manual_seed(0)
    x = torch.randn(ROWS + 1, HIDDEN, dtype=torch.float64)
    report = report_matching_eager(front_end, RowOps(reduce, keepdim, rows), x, inductor=False)
    assert report.stats["ragged_reductions"] == len(CHILDREN)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("reduce, keepdim, rows", [("sum", False, 1), ("mean", True, 2)])
def test_a_sum_or_mean_over_every_dim_of_joined_rows_becomes_one_over_each_part(front_end, reduce, keepdim, rows):
    torch.manual_seed(0)
    x = torch.randn(ROWS + 1, HIDDEN, dtype=torch.float64)
    report = report_matching_eager(front_end, RowOps(reduce, keepdim, rows, every_dim=True), x, inductor=False)
    assert report.stats["ragged_reductions"] == len(CHILDREN)


def test_joined_rows_read_otherwise_too_are_joined_again_for_that_reader():
    class Returned(nn.Module):
        def forward(self, x):
            h = torch.sigmoid(torch.cat([x[0:1], x[2:3], x[1:2]], 0))
            return torch.cat([h.sum(0, keepdim=True), h, h.t() @ h])   # h itself is also an output's rows

    torch.manual_seed(0)
    compiled = assert_fast_compile_matches_eager(Returned(), torch.randn(3, 3, dtype=torch.float64), inductor=False)
    assert compiled.report.graphs[0].stats["ragged_reductions"] == 1


class Joined(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(torch.cat([x[0:1], x[1:2], x[2:3]], 0))


@pytest.mark.parametrize("body", [
    lambda h: torch.cat([h, h.flip(0)], 1).sum(0),   # joined along columns with rows in another order
    lambda h: h.cumsum(0).sum(0),                 # not row-wise
    lambda h: h.sum(1),                           # reduces within rows
    lambda h: (h * h.flip(0)).sum(0),             # another order of the rows
    lambda h: h.topk(1, dim=1).values.sum(0),     # rows read by an op not known to be row-wise
])
def test_what_is_not_row_wise_keeps_the_join(body):
    torch.manual_seed(0)
    compiled = assert_fast_compile_matches_eager(Joined(body), torch.randn(3, 2, dtype=torch.float64),
                                                 inductor=False)
    assert compiled.report.graphs[0].stats["ragged_reductions"] == 0


@pytest.mark.parametrize("body", [
    lambda h: torch.cat([h, torch.sigmoid(h)], 1).sum(0),      # joined along columns
    lambda h: (h.unsqueeze(2) * h[:, None]).sum(0),           # new axes of each row
    lambda h: (h * h[:, :1]).sum(0),                          # constant indices within each row
    lambda h: h.norm(dim=1).sum(),                            # an op along each row's own dim, then every dim
])
def test_rows_joined_along_columns_given_new_axes_or_indexed_within_stay_row_wise(body):
    torch.manual_seed(0)
    compiled = assert_fast_compile_matches_eager(Joined(body), torch.randn(3, 2, dtype=torch.float64),
                                                 inductor=False)
    assert compiled.report.graphs[0].stats["ragged_reductions"] == 1


def test_rows_that_draw_random_numbers_keep_the_join():
    dropped = Joined(lambda h: torch.nn.functional.dropout(h, 0.5, True).sum(0))
    compiled = dynamo_relational.compile(dropped, (torch.randn(3, 2),), inductor=False)
    assert compiled.report.graphs[0].stats["ragged_reductions"] == 0


class RandomRowProgram(nn.Module):
    """Per node: 1-3 neighbours' rows (one or two each) joined, a random chain of row-wise ops (with operands
    broadcast, expanded and repeated along the rows), a reduction over the rows; sometimes the rows are also
    returned themselves."""

    _OPS = ("sigmoid", "tanh", "linear", "matmul", "times_own", "plus_expanded", "plus_repeated", "relu", "where",
            "square")

    def __init__(self, seed: int):
        super().__init__()
        rng = random.Random(seed)
        self.lin = nn.Linear(HIDDEN, HIDDEN, dtype=torch.float64)
        self.w = nn.Parameter(torch.randn(HIDDEN, HIDDEN, dtype=torch.float64))
        self.neighbours = [[rng.randrange(ROWS) for _ in range(rng.randrange(1, 4))] for _ in range(ROWS)]
        self.ops = [rng.choice(self._OPS) for _ in range(rng.randrange(1, 4))]
        self.rows = rng.choice([1, 1, 2])
        self.reduce = rng.choice(["sum", "mean", "amax", "amin"] if self.rows == 1 else ["sum", "mean"])
        self.keepdim, self.returns_rows = rng.random() < 0.5, rng.random() < 0.3

    def forward(self, x):
        out = []
        for v, nbrs in enumerate(self.neighbours):
            h, own = torch.cat([x[u:u + self.rows] for u in nbrs], 0), x[v:v + 1]
            for op in self.ops:
                h = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "linear": self.lin, "relu": torch.relu,
                     "matmul": lambda h: h @ self.w, "times_own": lambda h: h * own,
                     "plus_expanded": lambda h: h + own.expand(len(h), HIDDEN),
                     "plus_repeated": lambda h: h + own.repeat(len(h), 1),
                     "where": lambda h: torch.where(h > 0, h, 0.1 * h), "square": lambda h: h * h}[op](h)
            out.append(getattr(h, self.reduce)(0, keepdim=self.keepdim).reshape(-1))
            if self.returns_rows:
                out.append(h.reshape(-1)[:HIDDEN])
        return torch.cat(out)


@pytest.mark.fuzz
@pytest.mark.parametrize("seed", range(40))
def test_random_row_programs_match_eager(seed):
    torch.manual_seed(seed)
    x = torch.randn(ROWS + 1, HIDDEN, dtype=torch.float64)   # (two rows from the last neighbour)
    compiled = assert_fast_compile_matches_eager(RandomRowProgram(seed), x, inductor=False)
    assert compiled.report.graphs[0].stats["ragged_reductions"] == ROWS


class NeighbourAttention(nn.Module):
    """Attention over each node's neighbours as per-node code writes it (graph attention), in several styles:
    ``"scores"``, a score per neighbour, stacked; ``"joined scores"``, a one-element score per neighbour (a
    linear layer's output), joined with ``torch.cat``; ``"pairs"``, the pairs of states stacked and scored by one
    product; ``"unsqueeze"`` and ``"new axis"``, the neighbours' states stacked, each paired with the node's own
    (``expand``, ``cat`` along dim 1), the weights applied to the stack as ``alpha.unsqueeze(1)`` or
    ``alpha[:, None]``; ``"squeezed"``, scored by a one-column product, ``.squeeze(-1)``. Then a softmax over
    them, each neighbour's state weighted by its part. Node ``v`` has ``degree(v)`` neighbours."""

    def __init__(self, degree, style: str = "scores", log: bool = False):
        super().__init__()
        self.degree, self.style, self.log = degree, style, log
        self.W = nn.Linear(HIDDEN, HIDDEN, bias=False, dtype=torch.float64)
        self.a = nn.Parameter(torch.randn(2 * HIDDEN, dtype=torch.float64))

    def forward(self, x):
        n = x.shape[0]
        h = [self.W(x[v]) for v in range(n)]
        out = []
        for v in range(n):
            nbrs = [(v + d) % n for d in range(self.degree(v))]
            if self.style == "scores":
                scores = torch.stack([F.leaky_relu(self.a @ torch.cat([h[v], h[u]]), 0.2) for u in nbrs])
            elif self.style == "joined scores":
                scores = torch.cat([F.leaky_relu(self.a[None] @ torch.cat([h[v], h[u]]), 0.2) for u in nbrs])
            elif self.style == "pairs":
                scores = F.leaky_relu(torch.stack([torch.cat([h[v], h[u]]) for u in nbrs]) @ self.a, 0.2)
            elif self.style == "squeezed":
                states = torch.stack([h[u] for u in nbrs])
                scores = F.leaky_relu(torch.cat([h[v].expand(len(nbrs), -1), states], 1) @ self.a[:, None], 0.2)
                scores = scores.squeeze(-1)
            else:
                states = torch.stack([h[u] for u in nbrs])
                scores = F.leaky_relu(torch.cat([h[v].expand(len(nbrs), -1), states], 1) @ self.a, 0.2)
            alpha = torch.log_softmax(scores, 0).exp() if self.log else torch.softmax(scores, dim=0)
            if self.style in ("unsqueeze", "squeezed"):
                out.append(torch.relu((alpha.unsqueeze(1) * states).sum(0)))
            elif self.style == "new axis":
                out.append(torch.relu((alpha[:, None] * states).sum(0)))
            else:
                out.append(torch.relu(sum(alpha[i] * h[u] for i, u in enumerate(nbrs))))
        return torch.stack(out)


STYLES = ["scores", "joined scores", "pairs", "unsqueeze", "new axis", "squeezed"]


@pytest.mark.parametrize("style, log", [*((style, False) for style in STYLES), ("scores", True)])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_attention_over_neighbours_groups_as_many_neighbours_as_a_fixed_degree(front_end, style, log):
    """The softmax over a node's stacked scores becomes the n-ary max and sum of its parts: the groups no
    longer follow the degrees."""
    torch.manual_seed(0)
    x = torch.randn(24, HIDDEN, dtype=torch.float64)
    mixed = report_matching_eager(front_end, NeighbourAttention(lambda v: v % 4 + 1, style, log), x,
                                  inductor=False)
    fixed = report_matching_eager(front_end, NeighbourAttention(lambda v: 2, style, log), x, inductor=False)
    assert mixed.stats["ragged_reductions"] >= 24
    assert mixed.groups <= fixed.groups + 1, (mixed.groups, fixed.groups)   # (degree 1: a softmax of one part)


@pytest.mark.parametrize("style", STYLES)
def test_attention_over_neighbours_batches_through_the_union(style):
    torch.manual_seed(0)
    assert_rows_batch_as_eager(NeighbourAttention(lambda v: v % 3 + 1, style), width=HIDDEN)


@pytest.mark.parametrize("body", [
    lambda s: torch.softmax(s, 1)[0].sum(0),                          # along another dimension
    lambda s: torch.softmax(s, 0, dtype=torch.float32)[1].sum(0),     # in another dtype
    lambda s: torch.softmax(s.reshape(-1), 0)[2],                     # of a reshaped value
])
def test_a_softmax_the_pass_cannot_split_keeps_the_stack(body):
    class Stacked(nn.Module):
        def forward(self, x):
            return body(torch.stack([x[0] * 2, x[1], x[2] + 1]))

    compiled = assert_fast_compile_matches_eager(Stacked(), torch.randn(3, 2, dtype=torch.float64), inductor=False)
    assert compiled.report.graphs[0].stats["ragged_reductions"] == 0


def test_a_union_samples_stack_beside_its_own_value_is_split_into_parts_only_in_batch():
    """``states + states.mean(0)`` returned as it is: in a sample of a union each row's op becomes its own (the
    union's rows each read their own sample's mean); a compiled graph keeps the op on the stack."""
    class Centered(nn.Module):
        def forward(self, x):
            states = torch.stack([torch.tanh(x[v] * 2) for v in range(x.shape[0])])
            return states + states.mean(0)

    x = torch.randn(3, 2, dtype=torch.float64)
    for in_union in (False, True):
        gm = trace(Centered(), [x], ["x"]).graph
        gm = ragged_rows.run(gm, PassContext(Options(), in_union=in_union))
        gm.recompile()
        adds = [n for n in gm.graph.nodes if n.target in (torch.add, operator.add)]
        output = next(iter(gm.graph.find_nodes(op="output"))).args[0][0]
        assert (output.target is torch.stack) == in_union and len(adds) == (x.shape[0] if in_union else 1)
        torch.testing.assert_close(gm(x)[0], Centered()(x))
