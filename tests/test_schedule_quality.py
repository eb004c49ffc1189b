"""Tree schedules come within 5% of ED-Batch's lower bound on the number of groups, for one grounding of a
forest (``explain()``) and for the union that ``dynamo_relational.batch`` groups from its trees."""
import torch
from torch import nn

import dynamo_relational
from examples.data import random_binary_forest

HIDDEN = 8


class RecursiveNet(nn.Module):
    """``h_v = tanh(W_l h_left + W_r h_right + b)`` over one binary tree; a leaf embeds its features."""

    def __init__(self):
        super().__init__()
        self.left, self.right = nn.Linear(HIDDEN, HIDDEN, bias=False), nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.bias, self.leaf = nn.Parameter(torch.zeros(HIDDEN)), nn.Linear(HIDDEN, HIDDEN)

    def forward(self, children: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        h: list = [None] * len(children)
        for v in reversed(range(len(children))):
            if children[v]:
                left, right = children[v]
                h[v] = torch.tanh(self.left(h[left]) + self.right(h[right]) + self.bias)
            else:
                h[v] = torch.tanh(self.leaf(x[v]))
        return h[0]


class Forest(nn.Module):
    """:class:`RecursiveNet` over every tree of a forest: one grounding."""

    def __init__(self, net: RecursiveNet, forest: list[list[list[int]]]):
        super().__init__()
        self.net, self.forest = net, forest

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        roots, start = [], 0
        for children in self.forest:
            roots.append(self.net(children, x[start:start + len(children)]))
            start += len(children)
        return torch.stack(roots)


def test_a_forest_of_binary_trees_is_scheduled_within_five_percent_of_the_bound():
    forest = random_binary_forest(64, 20)
    net = RecursiveNet()
    x = torch.randn(sum(map(len, forest)), HIDDEN)
    graph = dynamo_relational.explain(Forest(net, forest), x, inductor=False, progress=False).graphs[0]
    assert graph.groups <= 1.05 * graph.lower_bound, (graph.groups, graph.lower_bound)

    batched = dynamo_relational.batch(net, progress=False)
    samples = [(children, torch.randn(len(children), HIDDEN)) for children in forest]
    for _ in range(2):   # the first call traces the new structures, the second groups them
        batched(samples)
    groups, bound = batched.report.union_groups
    assert batched.report.groupings == 1 and groups <= 1.05 * bound, batched.report
