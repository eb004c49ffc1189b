"""Every example model, compiled, equals eager in outputs and gradients (float64 and float32)."""
import pytest
import torch

from examples.data import graph_batch, random_forest
from examples.gcn import ScalarGCN
from examples.tree_lstm import ScalarTreeLSTM
from examples.tree_rnn import ScalarTreeRNN
from tests.helpers import BUILDERS, assert_compiled_matches_eager


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_graph_example_matches_eager(name, dtype):
    torch.manual_seed(0)
    batch = graph_batch("enzymes" if name == "lrnn" else "mutagenesis", graphs=3, dtype=dtype)
    model = BUILDERS[name](batch).to(dtype)
    report = assert_compiled_matches_eager(model, batch.x, inductor=False)
    assert report.nodes_after <= 60 < report.nodes_before
    assert report.groups <= 1.2 * report.lower_bound


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("tree_model", [ScalarTreeLSTM, ScalarTreeRNN])
def test_tree_model_matches_eager(tree_model, dtype):
    torch.manual_seed(0)
    model = tree_model(random_forest(4, 30), 6).to(dtype)
    report = assert_compiled_matches_eager(model, torch.randn(30, 6, dtype=dtype), inductor=False)
    assert report.nodes_after < report.nodes_before / 2
    assert report.groups <= 1.2 * report.lower_bound


def test_gcn_through_inductor_matches_eager():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=4)
    report = assert_compiled_matches_eager(ScalarGCN(batch, 7), batch.x)
    assert "inductor" in report.pass_timings


def test_gcn_grouped_graph_is_small():
    """The grouped 2-layer GCN has O(1) nodes: the count does not grow with the batch."""
    torch.manual_seed(0)
    counts = []
    for graphs in (5, 10):
        batch = graph_batch("mutagenesis", graphs=graphs)
        report = assert_compiled_matches_eager(ScalarGCN(batch, 7), batch.x, inductor=False)
        assert report.nodes_before > 200 * graphs
        counts.append(report.nodes_after)
    assert counts[0] <= 40 and counts[1] <= 42, counts


@pytest.mark.slow
def test_gcn_on_full_mutagenesis_batch_has_at_most_40_nodes():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis")
    report = assert_compiled_matches_eager(ScalarGCN(batch, 7), batch.x)
    assert report.nodes_after <= 40
