"""An LRNN-style rule network (NeuraLogic-like): scalar neurons, weights shared per rule.

Ground atoms carry scalar values. Two rule layers over the graph's edges:

    h1(V) :- w1_0 * atom(V), w1_1 * atom(U), edge(U, V).     (one rule neuron per grounding)
    h2(V) :- w2_0 * h1(V),   w2_1 * h1(U),   edge(U, V).
    out(G) :- avg over h2(V) of G's atoms.

Each rule neuron is ``tanh(sum_i w_rule[i] * input_i + offset)``; the atom
neuron aggregates its groundings with ``avg`` and applies ``sigmoid``.

    python -m examples.lrnn [mutagenesis|enzymes|proteins] [graphs]
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from examples.common import run_graph_example
from examples.data import GraphBatch


class ScalarLRNN(nn.Module):
    def __init__(self, batch: GraphBatch, rules: int = 2):
        super().__init__()
        self.in_nbrs = batch.in_neighbors()
        self.graphs = batch.nodes_of_graph()
        self.rule_weights = nn.Parameter(torch.randn(rules, 2))
        self.rule_offsets = nn.Parameter(torch.randn(rules))
        self.atom_weight = nn.Parameter(torch.randn(batch.x.shape[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        atoms = [torch.dot(self.atom_weight, x[v]) for v in range(x.shape[0])]   # atom(V) as a scalar
        for r in range(self.rule_weights.shape[0]):
            w, offset = self.rule_weights[r], self.rule_offsets[r]
            heads = []
            for v, nbrs in enumerate(self.in_nbrs):
                groundings = [torch.tanh(w[0] * atoms[v] + w[1] * atoms[u] + offset) for u in nbrs]
                heads.append(torch.sigmoid(torch.stack(groundings).mean(0)) if groundings else atoms[v])
            atoms = heads
        return torch.stack([torch.stack([atoms[v] for v in nodes]).mean(0) for nodes in self.graphs])


def main(name: str = "mutagenesis", graphs: int | None = None) -> dict:
    return run_graph_example("LRNN rule network", ScalarLRNN, name, graphs)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mutagenesis", int(sys.argv[2]) if len(sys.argv) > 2 else None)
