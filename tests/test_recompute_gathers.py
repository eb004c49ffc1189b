"""passes/recompute_gathers.py: edge-sized gathers are tagged, AOT's partitioner recomputes them in the
backward pass instead of saving them, and the compiled model still equals eager."""
import pytest
import torch

import dynamo_relational
from examples.data import graph_batch
from examples.gcn import ScalarGCN
from examples.styles import STYLES
from tests.helpers import assert_fast_compile_matches_eager


def _saved_numel(compiled, x) -> int:
    """Elements of the tensors that ``compiled(x)`` saves for its backward pass."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = compiled(x)
    out.sum().backward()
    return sum(saved)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_expanding_gather_is_recomputed_and_matches_eager(dtype):
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=6, dtype=dtype)
    model = STYLES["edge_weights"](batch).to(dtype)
    compiled = assert_fast_compile_matches_eager(model, batch.x, autotune=False)
    assert compiled.report.graphs[0].stats["gathers_recomputed"] == 1


def test_recomputing_saves_the_edge_sized_rows_for_every_grounding():
    """The gathered [edges, features] rows are not saved; the source [nodes, features] is. Also for
    groundings that share code compiled for dynamic sizes (the tags survive Dynamo's re-trace)."""
    torch.manual_seed(0)
    for graphs in (6, 7, 8):   # the first compiles static code; the second and third share dynamic code
        batch = graph_batch("mutagenesis", graphs=graphs)
        model = STYLES["edge_weights"](batch)
        x = batch.x.clone().requires_grad_()
        tagged = dynamo_relational.compile(model, [x], autotune=False)
        plain = dynamo_relational.compile(model, [x], autotune=False, disable=("recompute_gathers",))
        edges, features = len(batch.edges), batch.x.shape[1]
        # one [edges, features] tensor less, one [nodes, features] more (the input, itself saved)
        assert _saved_numel(plain, x) - _saved_numel(tagged, x) == (edges - batch.num_nodes) * features
        torch.testing.assert_close(tagged(x), model(x), rtol=1e-4, atol=1e-5)


def test_gathers_that_reduce_or_do_not_expand_are_not_tagged():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model = ScalarGCN(batch, batch.x.shape[1]).double()   # gather_reduce only, and row-selecting gathers
    compiled = assert_fast_compile_matches_eager(model, batch.x, autotune=False)
    graph = compiled.report.graphs[0]
    assert graph.stats["gathers_recomputed"] == 0
