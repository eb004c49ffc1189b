"""A child-sum TreeLSTM (Tai et al. 2015) over random trees, one tree node at a time.

    python -m examples.tree_lstm [trees] [nodes] [scalar|childsum]

``scalar`` (the default) adds the children's states one by one; ``childsum`` is
:class:`examples.per_sample.ChildSumTreeLSTM`, which concatenates them into a
``[k, hidden]`` tensor per node, as per-node TreeLSTM code is often written.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from examples.common import run_tree_example


class ScalarTreeLSTM(nn.Module):
    def __init__(self, forest: list[list[list[int]]], features: int, hidden: int = 10):
        super().__init__()
        self.forest = forest
        self.hidden = hidden
        self.W_iou = nn.Linear(features, 3 * hidden)
        self.U_iou = nn.Linear(hidden, 3 * hidden, bias=False)
        self.W_f = nn.Linear(features, hidden)
        self.U_f = nn.Linear(hidden, hidden, bias=False)

    def node(self, x, children_states):
        iou = self.W_iou(x)
        if children_states:
            iou = iou + self.U_iou(sum(h for h, _ in children_states))
        i, o, u = torch.sigmoid(iou[:self.hidden]), torch.sigmoid(iou[self.hidden:2 * self.hidden]), \
            torch.tanh(iou[2 * self.hidden:])
        c = i * u
        wf = self.W_f(x)
        for h_k, c_k in children_states:
            c = c + torch.sigmoid(wf + self.U_f(h_k)) * c_k
        return o * torch.tanh(c), c

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        roots, start = [], 0
        for children in self.forest:
            states = [None] * len(children)
            for v in reversed(range(len(children))):   # children are numbered after parents
                states[v] = self.node(x[start + v], [states[c] for c in children[v]])
            roots.append(states[0][0])
            start += len(children)
        return torch.stack(roots)


def main(trees: int = 50, nodes: int = 500, style: str = "scalar") -> dict:
    if style == "scalar":
        return run_tree_example("TreeLSTM", ScalarTreeLSTM, trees, nodes)
    from examples.per_sample import ChildSumTreeLSTM, Forest   # (per_sample imports this module)

    return run_tree_example("child-sum TreeLSTM (children's states concatenated)",
                            lambda forest, features: Forest(ChildSumTreeLSTM(features), forest), trees, nodes)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]), *sys.argv[3:4])
