"""simplify_gathers on repetitions: a gather whose index is an arithmetic run repeated
("dimension-1 repetition", ``run.repeat(k)``) or with each element repeated ("dimension-2
repetition", ``run.repeat_interleave(k)``) becomes unsqueeze + expand + reshape of a slice; the
compiled model still equals eager, outputs and gradients; near misses stay gathers."""
import pytest
import torch
import torch.fx as fx
from torch import nn

from dynamo_relational.ops import TensorInfo
from dynamo_relational.options import Options
from dynamo_relational.passes import simplify_gathers
from dynamo_relational.passes.context import PassContext
from dynamo_relational.passes.simplify_gathers import repetition_of
from tests.helpers import assert_compiled_matches_eager


def _stat(report, name):
    return sum(g.stats.get(name, 0) for g in report.graphs)


class AllPairs(nn.Module):
    """``x[i] * z[j]`` for every pair: ``x`` is read with each row repeated (dimension 2), ``z``
    with the whole run repeated (dimension 1)."""

    def forward(self, x, z):
        return torch.stack([x[i] * z[j] for i in range(x.shape[0]) for j in range(z.shape[0])])


class EdgeProducts(nn.Module):
    """``x[i] * y[j]`` for the ``j``-th entry ``i`` of ``reads``: one gather of ``x`` by ``reads``."""

    def __init__(self, reads):
        super().__init__()
        self.reads = reads

    def forward(self, x, y):
        return torch.stack([x[i] * y[j] for j, i in enumerate(self.reads)])


RUN = torch.arange(1, 8, 3)   # [1, 4, 7]: a strided run, so the inner slice is not the identity
REPETITIONS = {
    "dim1": RUN.repeat(3).tolist(),                    # [1, 4, 7, 1, 4, 7, 1, 4, 7]
    "dim2": RUN.repeat_interleave(2).tolist(),         # [1, 1, 4, 4, 7, 7]
    "dim1-all-rows": torch.arange(8).repeat(2).tolist(),
}   # (a single row read k times never reaches the pass: CSE merges the reads, the vectorizer broadcasts)


# --- detection on index tensors ------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_detects_repeat_and_repeat_interleave(dtype):
    run = torch.arange(2, 11, 3, dtype=dtype)          # start 2, step 3, 3 rows
    assert repetition_of(run.repeat(4)) == (1, 4, (2, 3, 3))
    assert repetition_of(run.repeat_interleave(3)) == (2, 3, (2, 3, 3))
    assert repetition_of(torch.arange(5, dtype=dtype).repeat(2)) == (1, 2, (0, 1, 5))
    assert repetition_of(torch.arange(5, dtype=dtype).repeat_interleave(2)) == (2, 2, (0, 1, 5))


def test_single_row_repeated_is_dimension_2_with_one_row():
    assert repetition_of(torch.tensor([5, 5, 5, 5])) == (2, 4, (5, 1, 1))
    assert repetition_of(torch.tensor([0, 0])) == (2, 2, (0, 1, 1))


@pytest.mark.parametrize("index", [
    [], [3],                                  # empty, one element
    [0, 1, 2, 3], [0, 2, 4],                  # k == 1: a plain run (a slice, not a repetition)
    [0, 1, 2, 0, 1, 3, 0, 1, 2],              # one element of the repeated run differs
    [0, 1, 2, 0, 1, 2, 0, 1],                 # the last repetition is cut short
    [0, 1, 0, 1, 0],                          # not a whole number of repetitions
    [0, 0, 1, 1, 2],                          # dimension 2, last block short
    [0, 0, 1, 1, 1, 1],                       # dimension 2, blocks of unequal length
    [0, 0, 1, 1, 3, 3],                       # dimension 2, the run breaks
    [0, 2, 3, 0, 2, 3],                       # dimension 1, the inner sequence is not a run
    [2, 1, 2, 1], [1, 1, 0, 0],               # decreasing runs (no negative-step slices)
    [0, 0, 1, 1, 0, 0, 1, 1],                 # nested repetition: not rewritten
    [0, 1, 1, 0],
], ids=repr)
def test_near_misses_are_not_repetitions(index):
    assert repetition_of(torch.tensor(index, dtype=torch.int64)) is None


def test_near_miss_at_every_position_is_rejected():
    for good in (RUN.repeat(4), RUN.repeat_interleave(4)):
        assert repetition_of(good) is not None
        for position in range(good.shape[0]):
            bad = good.clone()
            bad[position] += 1
            assert repetition_of(bad) is None, bad.tolist()


# --- the pass in the pipeline ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kind", list(REPETITIONS))
def test_repetition_gathers_become_broadcasts(kind, dtype):
    torch.manual_seed(0)
    reads = REPETITIONS[kind]
    model = EdgeProducts(reads)
    x, y = torch.randn(8, 3, dtype=dtype), torch.randn(len(reads), 3, dtype=dtype)
    report = assert_compiled_matches_eager(model, x, y, inductor=False)
    assert _stat(report, "gathers_broadcast") == 1
    after = report.graphs[0].after
    assert "gather_rows" not in after and "index_select" not in after
    assert ".expand(" in after and ".unsqueeze(" in after


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_all_pairs_broadcast_both_sides(dtype):
    torch.manual_seed(0)
    x, z = torch.randn(3, 5, dtype=dtype), torch.randn(4, 5, dtype=dtype)
    report = assert_compiled_matches_eager(AllPairs(), x, z, inductor=False)
    assert _stat(report, "gathers_broadcast") == 2
    assert "gather_rows" not in report.graphs[0].after


@pytest.mark.parametrize("kind", ["dim1", "dim2"])
def test_repetition_gathers_through_inductor_match_eager(kind):
    torch.manual_seed(0)
    reads = REPETITIONS[kind]
    x, y = torch.randn(8, 3), torch.randn(len(reads), 3)
    report = assert_compiled_matches_eager(EdgeProducts(reads), x, y, autotune=False)
    assert _stat(report, "gathers_broadcast") == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rows_of_higher_rank_are_broadcast(dtype):
    torch.manual_seed(0)
    reads = REPETITIONS["dim2"]
    x, y = torch.randn(8, 2, 3, dtype=dtype), torch.randn(len(reads), 2, 3, dtype=dtype)
    report = assert_compiled_matches_eager(EdgeProducts(reads), x, y, inductor=False)
    assert _stat(report, "gathers_broadcast") == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_broken_repetition_stays_a_gather(dtype):
    torch.manual_seed(0)
    reads = [1, 4, 7, 1, 4, 6, 1, 4, 7]   # dim1 with one element changed
    x, y = torch.randn(8, 3, dtype=dtype), torch.randn(len(reads), 3, dtype=dtype)
    report = assert_compiled_matches_eager(EdgeProducts(reads), x, y, inductor=False)
    assert _stat(report, "gathers_broadcast") == 0
    assert "gather_rows" in report.graphs[0].after


def test_disabled_pass_leaves_the_gather():
    torch.manual_seed(0)
    reads = REPETITIONS["dim1"]
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(len(reads), 3, dtype=torch.float64)
    report = assert_compiled_matches_eager(EdgeProducts(reads), x, y, inductor=False,
                                           disable=("simplify_gathers",))
    assert _stat(report, "gathers_broadcast") == 0
    assert "gather_rows" in report.graphs[0].after


# --- the pass on a hand-built graph: index_select (integer rows) ----------------------------

def _index_select_graph(index: torch.Tensor) -> fx.GraphModule:
    """``torch.index_select(x, 0, index)`` with ``index`` a buffer, built node by node (symbolic_trace
    would trace into the wrapper that torch_geometric, once imported, puts around ``torch.index_select``)."""
    root = nn.Module()
    root.register_buffer("index", index)
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.index_select, (x, 0, graph.get_attr("index"))))
    return fx.GraphModule(root, graph)


@pytest.mark.parametrize("index, fires", [
    (RUN.repeat(3), True), (RUN.repeat_interleave(2), True), (torch.tensor([5, 5, 5, 5]), True),
    (torch.arange(8).repeat_interleave(2), True), (torch.tensor([0, 1, 2, 0, 1, 3]), False),
], ids=["dim1", "dim2", "one-row", "dim2-all-rows", "near-miss"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
def test_index_select_repetitions_on_a_hand_built_graph(index, fires, dtype):
    x = (torch.arange(8 * 2 * 3).reshape(8, 2, 3) * 7 % 11).to(dtype)
    gm = _index_select_graph(index)
    (placeholder,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    placeholder.meta["rel_info"] = TensorInfo(tuple(x.shape), dtype, x.device)
    ctx = PassContext(Options.from_mapping({}))
    gm = simplify_gathers.run(gm, ctx)
    gm.graph.lint()
    gm.recompile()
    assert ctx.stats["gathers_broadcast"] == int(fires)
    assert any(n.target is torch.index_select for n in gm.graph.nodes) != fires
    (out,) = [n for n in gm.graph.nodes if n.op == "output"][0].args
    if fires:
        assert out.meta["rel_info"] == TensorInfo((index.shape[0], 2, 3), dtype, x.device)
    torch.testing.assert_close(gm(x), x[index], rtol=0, atol=0)
