"""dynamo_relational/ops/losses.py: a loss at every node (the cross entropy of a node's scores and its label,
an elementwise loss of its output and its target) groups into one loss per group, as eager computes it."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from tests.helpers import assert_shuffled_batches_match_eager, report_matching_eager


class NodeLosses(nn.Module):
    """The sum of a loss of every kind at every node (row ``v`` of ``x``, ``labels`` and ``targets``; a target
    and a label that every node shares)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x, labels, targets):
        total = x.new_zeros(())
        for v in range(x.shape[0]):
            scores, label, target = self.lin(x[v]), labels[v], targets[v]
            total = total + F.cross_entropy(scores, label) \
                + F.cross_entropy(scores.unsqueeze(0), label.unsqueeze(0), reduction="sum", label_smoothing=0.1) \
                + F.nll_loss(F.log_softmax(scores, 0), label) + F.cross_entropy(scores, torch.softmax(target, 0)) \
                + F.mse_loss(scores, target) + F.l1_loss(scores, target, reduction="sum") \
                + F.mse_loss(scores, x.new_zeros(3)) + F.cross_entropy(scores, x.new_ones((), dtype=torch.long)) \
                + F.smooth_l1_loss(scores, target, beta=0.5) \
                + F.binary_cross_entropy_with_logits(scores, torch.sigmoid(target), reduction="none").sum()
        return total


def _sample(rows: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, 4, generator=generator, dtype=torch.float64),
            torch.randint(0, 3, (rows,), generator=generator),
            torch.randn(rows, 3, generator=generator, dtype=torch.float64))


@pytest.mark.parametrize("front_end", ["fast", "backend"])
def test_a_loss_at_every_node_groups_and_matches_eager(front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, NodeLosses(), *_sample(6))
    assert not [reason for reason in report.ungrouped if "loss" in reason or "entropy" in reason], report.ungrouped


def test_a_label_that_eager_ignores_gives_its_nan_in_the_group_too():
    """``F.cross_entropy`` of one row whose label is ``ignore_index`` is ``0 / 0`` in eager."""
    class Ignoring(nn.Module):
        def forward(self, scores, labels):
            return torch.stack([F.cross_entropy(scores[v] * 2, labels[v], ignore_index=1)
                                for v in range(scores.shape[0])])

    scores, labels = torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0])
    got = dynamo_relational.compile(Ignoring(), (scores, labels), strict=True)(scores, labels)
    torch.testing.assert_close(got, Ignoring()(scores, labels), equal_nan=True)
    assert got.isnan().tolist() == [False, True, False, True, False]


def test_a_loss_at_every_node_batches_over_samples_of_other_sizes():
    torch.manual_seed(0)
    data = [_sample(rows, seed) for seed, rows in enumerate((3, 5, 2, 4, 3))]
    assert_shuffled_batches_match_eager(NodeLosses(), data)


class _TreeOutputs(nn.Module):
    """Every node's output of a tree, stacked: ``out(tanh(W x_v + the children's states))``."""

    def __init__(self, outputs: int, style: str):
        super().__init__()
        self.W, self.out = nn.Linear(4, 5, dtype=torch.float64), nn.Linear(5, outputs, dtype=torch.float64)
        self.style = style

    def outputs(self, children, x):
        h = [torch.zeros(5, dtype=torch.float64)] * len(children)
        for v in reversed(range(len(children))):
            h[v] = torch.tanh(self.W(x[v]) + sum((h[c] for c in children[v]), torch.zeros(5, dtype=torch.float64)))
        return self.out(torch.stack(h))


class TreeLoss(_TreeOutputs):
    """A per-tree loss over every node's scores and label, as one call on the stacked scores."""

    def __init__(self, style: str):
        super().__init__(3, style)

    def forward(self, children, x, labels):
        scores = self.outputs(children, x)
        if self.style == "nll":
            return F.nll_loss(F.log_softmax(scores, dim=1), labels, ignore_index=2)
        return F.cross_entropy(scores, labels, reduction=self.style, label_smoothing=0.2)


@pytest.mark.parametrize("style", ["mean", "sum", "none", "nll"])
def test_a_loss_over_a_samples_stacked_scores_batches_as_each_nodes_loss(style):
    """The loss of each part and their sum (over the labels that count, for a mean; without reduction, each
    node's loss as a row of the result): the nodes' losses group across samples; a sample's labels are rows of
    its argument."""
    from examples.per_sample import dataset
    torch.manual_seed(0)
    data = [(children, x, torch.randint(0, 3, (x.shape[0],)))
            for children, x in dataset("treernn", 8, features=4, dtype=torch.float64)]
    assert_shuffled_batches_match_eager(TreeLoss(style), data)


class TreeRegression(_TreeOutputs):
    """A per-tree regression of every node's output on its target row (``targets[j]``: a ``[nodes, 2]``
    argument), by a loss or written out."""

    def __init__(self, style: str):
        super().__init__(2, style)

    def forward(self, children, x, targets):
        predictions = self.outputs(children, x)
        if self.style == "mse":
            return F.mse_loss(predictions, targets)
        if self.style == "l1 sum":
            return F.l1_loss(predictions, targets, reduction="sum")
        errors = predictions - targets   # (a row per part: part j reads targets[j])
        return (errors ** 2).sum(0) if self.style == "written out" else errors.abs()


@pytest.mark.parametrize("style", ["mse", "l1 sum", "written out", "per node"])
def test_a_regression_on_a_samples_target_rows_batches(style):
    from examples.per_sample import dataset
    generator = torch.Generator().manual_seed(0)
    data = [(children, x, torch.randn(x.shape[0], 2, generator=generator, dtype=torch.float64))
            for children, x in dataset("treernn", 8, features=4, dtype=torch.float64)]
    assert_shuffled_batches_match_eager(TreeRegression(style), data)
