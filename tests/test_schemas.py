"""Compiled code shared across groundings: a new batch with the same grouped schema skips Inductor."""
import pytest
import torch
from torch import fx, nn

import dynamo_relational
from dynamo_relational.schemas import SCHEMAS, lift
from examples.data import graph_batch
from examples.gcn import ScalarGCN
from tests.helpers import assert_fast_compile_matches_eager, warnings_logged


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


def test_groundings_with_the_same_schema_share_code_from_the_second_on():
    """The first grounding gets static code; the second compiles code with dynamic sizes;
    the third reuses it, skipping Inductor. Every one equals eager, outputs and gradients."""
    torch.manual_seed(0)
    batches = [graph_batch("mutagenesis", graphs=g, seed=g, dtype=torch.float64) for g in (3, 5, 4)]
    assert len({b.num_nodes for b in batches}) == 3   # other sizes and indices
    first = ScalarGCN(batches[0], 7).double()
    reports = []
    for batch in batches:
        model = ScalarGCN(batch, 7).double()
        model.load_state_dict(first.state_dict())
        reports.append(assert_fast_compile_matches_eager(model, batch.x).report.graphs[0])
    assert ["inductor" in r.timings for r in reports] == [True, True, False]
    assert len(SCHEMAS) == 1
    assert reports[2].stats["executor"] == reports[1].stats["executor"]


def test_a_model_compiled_again_reuses_its_static_code():
    """The same model and grounding compiled a second time in the process: the first code serves it (no code for
    dynamic sizes). Another model of the same schema and sizes, whose parameters are other objects, does not."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    first, again = (assert_fast_compile_matches_eager(model, batch.x).report.graphs[0] for _ in range(2))
    assert "inductor" in first.timings and "inductor" not in again.timings and "reused" in again.stats
    twin = ScalarGCN(batch, 7).double()
    twin.load_state_dict(model.state_dict())
    other = assert_fast_compile_matches_eager(twin, batch.x).report.graphs[0]
    assert "reused" not in other.stats and "inductor" in other.timings


class SquaredMessages(nn.Module):
    """``h_v = 2 x_v + sum over in-neighbours u of (W x_u) ** 2``: an int operand of an elementwise op."""

    def __init__(self, edges, nodes):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)
        self.incoming = [[u for u, w in edges if w == v] for v in range(nodes)]

    def forward(self, x):
        return torch.stack([sum((self.lin(x[u]) ** 2 for u in us), x[v] * 2) for v, us in
                            enumerate(self.incoming)])


def test_int_operands_of_elementwise_ops_stay_literal_and_the_code_is_shared():
    """``h ** 2`` keeps its int: lifted as a symbolic size, Inductor's backward of pow failed ("NYI
    SymInt equality"), and the grounding fell back to static code with a warning (no sharing)."""
    reports = []
    for nodes in (5, 7, 6):
        edges = [(u, (u * 3 + 1) % nodes) for u in range(nodes)] + [(u, (u + 2) % nodes) for u in range(nodes)]
        torch.manual_seed(0)
        model = SquaredMessages(edges, nodes)
        with warnings_logged() as warnings:
            compiled = assert_fast_compile_matches_eager(model, torch.randn(nodes, 3, dtype=torch.float64))
        assert not warnings
        reports.append(compiled.report.graphs[0])
    assert ["inductor" in r.timings for r in reports] == [True, True, False]
    assert "** 2" in lift(compiled.graph).key


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
