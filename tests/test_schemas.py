"""Compiled code shared across groundings: a new batch with the same grouped schema skips Inductor."""
import pytest
import torch
from torch import fx, nn

import dynamo_relational
from dynamo_relational.schemas import SCHEMAS, lift
from examples.data import graph_batch
from examples.gcn import ScalarGCN
from tests.test_frontend import assert_fast_compile_matches_eager


@pytest.fixture(autouse=True)
def _empty_cache():
    SCHEMAS.clear()
    yield
    SCHEMAS.clear()


def test_lifted_graph_is_the_grouped_graph_as_a_pure_function():
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    grouped = dynamo_relational.compile(model, batch.x, inductor=False).graph
    lifted = lift(grouped)
    assert not [n for n in lifted.graph.graph.nodes if n.op == "get_attr"]
    assert any(type(v) is int for v in lifted.values)   # sizes are inputs too
    torch.testing.assert_close(lifted.graph(batch.x, *lifted.values), grouped(batch.x))


def test_a_new_grounding_with_the_same_schema_reuses_the_compiled_code():
    first = graph_batch("mutagenesis", graphs=3, seed=0, dtype=torch.float64)
    second = graph_batch("mutagenesis", graphs=5, seed=1, dtype=torch.float64)   # other sizes and indices
    assert second.num_nodes != first.num_nodes
    torch.manual_seed(0)
    model = ScalarGCN(first, 7).double()
    compiled = assert_fast_compile_matches_eager(model, first.x)
    assert "inductor" in compiled.report.graphs[0].timings and len(SCHEMAS) == 1

    other = ScalarGCN(second, 7).double()
    other.load_state_dict(model.state_dict())
    reused = assert_fast_compile_matches_eager(other, second.x)
    assert "inductor" not in reused.report.graphs[0].timings   # no compilation for the new grounding
    assert len(SCHEMAS) == 1
    assert reused.report.graphs[0].stats["executor"] == compiled.report.graphs[0].stats["executor"]


def test_another_schema_or_reuse_off_compiles_its_own_code():
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    dynamo_relational.compile(ScalarGCN(batch, 7, layers=2).double(), batch.x)
    deeper = dynamo_relational.compile(ScalarGCN(batch, 7, layers=3).double(), batch.x)
    assert "inductor" in deeper.report.graphs[0].timings and len(SCHEMAS) == 2
    again = dynamo_relational.compile(ScalarGCN(batch, 7, layers=3).double(), batch.x, reuse_compiled=False)
    assert "inductor" in again.report.graphs[0].timings and len(SCHEMAS) == 2


def test_graphs_calling_submodules_are_not_lifted():
    gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2)))
    assert lift(gm) is None
