"""A recursive neural network (TreeRNN, Socher et al. 2011) over random trees, one tree node at a time.

    python -m examples.tree_rnn [trees] [nodes]

Each node combines its own features with the sum of its children's states:
``h_v = tanh(W x_v + U sum_c h_c + b)``; the roots' states are the output.
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from examples.common import run_tree_example


class ScalarTreeRNN(nn.Module):
    def __init__(self, forest: list[list[list[int]]], features: int, hidden: int = 10):
        super().__init__()
        self.forest = forest
        self.W = nn.Linear(features, hidden)
        self.U = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        roots, start = [], 0
        for children in self.forest:
            h = [None] * len(children)
            for v in reversed(range(len(children))):   # children are numbered after parents
                own = self.W(x[start + v])
                h[v] = torch.tanh(own + self.U(sum(h[c] for c in children[v])) if children[v] else own)
            roots.append(h[0])
            start += len(children)
        return torch.stack(roots)


def main(trees: int = 50, nodes: int = 500) -> dict:
    return run_tree_example("TreeRNN", ScalarTreeRNN, trees, nodes)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
