"""The merge_gathers pass: on a union, the gathers of one value become one gather split into each reader's
rows, which a batch restricts reader by reader. Batches equal eager; compiled graphs keep their gathers."""
import pytest
import torch
from torch import nn

from examples.per_sample import TreeLSTM, dataset
from tests.helpers import assert_batches_match_eager, assert_compiled_matches_eager, traced_per_sample


def _splits(batched) -> int:
    return sum(n.target is torch.split for n in batched._cache.unions[0].plan.graph.graph.nodes)


def _joined_index_inputs(batched) -> int:
    """``torch.cat`` nodes of the batch graph that join its inputs (index tensors assembled apart)."""
    return sum(n.target is torch.cat and all(a.op == "placeholder" for a in n.args[0])
               for n in batched._cache.unions[0].plan.graph.graph.nodes)


@pytest.mark.parametrize("kind", ["treelstm", "childsum", "treernn"])
def test_a_unions_gathers_of_one_value_are_one_gather_split_for_every_batch(kind):
    """Every level gathers its rows of ``W x``: one gather, split. Batches of other samples, subsets, a repeated
    sample and one shallow tree equal eager."""
    data, model, batched = traced_per_sample(kind, 12)
    assert_batches_match_eager(batched, model, data[::-1])
    assert _splits(batched) >= 1
    assert _joined_index_inputs(batched) == 0   # a merged gather's index tensors come assembled as one input
    shallow = min(data, key=lambda sample: len(sample[0]))
    for batch in (data[:3], data[5:], [data[4]] * 2, [shallow]):
        assert_batches_match_eager(batched, model, batch)
    _, _, disabled = traced_per_sample(kind, 12, disable=("merge_gathers",))
    disabled(data)
    assert _splits(disabled) == 0


class OneTree(nn.Module):
    """A per-sample model over one tree that it holds."""

    def __init__(self, model: nn.Module, children: list[list[int]]):
        super().__init__()
        self.model, self.children_lists = model, children

    def forward(self, x):
        return self.model(self.children_lists, x)


def test_compiled_graphs_keep_each_gather():
    """Inductor fuses a gather into its reader: the pass runs on unions only."""
    (children, x), = dataset("treelstm", 1, features=4, dtype=torch.float64)
    report = assert_compiled_matches_eager(OneTree(TreeLSTM(4).double(), children), x, inductor=False)
    assert report.graphs[0].stats.get("gathers_composed") is not None   # (the gather passes ran)
    assert "gathers_merged" not in report.graphs[0].stats
