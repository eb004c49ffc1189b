"""A 5-layer GIN (``GINConv`` with eps = 0 and a 2-layer MLP) written one neuron at a time.

    python -m examples.gin [mutagenesis|enzymes|proteins] [graphs]
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from examples.common import run_graph_example
from examples.data import GraphBatch


class ScalarGIN(nn.Module):
    def __init__(self, batch: GraphBatch, features: int, hidden: int = 10, layers: int = 5):
        super().__init__()
        self.in_nbrs = batch.in_neighbors()
        self.graphs = batch.nodes_of_graph()
        dims = [features] + [hidden] * layers
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o))
                                  for i, o in zip(dims, dims[1:]))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(x.shape[0])]
        for mlp in self.mlps:
            h = [torch.relu(mlp(h[v] + sum(h[u] for u in nbrs))) for v, nbrs in enumerate(self.in_nbrs)]
        out = [torch.sigmoid(self.readout(sum(h[v] for v in nodes))) for nodes in self.graphs]
        return torch.stack(out).squeeze(-1)


def main(name: str = "mutagenesis", graphs: int | None = None) -> dict:
    return run_graph_example("scalar GIN", lambda b: ScalarGIN(b, b.x.shape[1]), name, graphs)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mutagenesis", int(sys.argv[2]) if len(sys.argv) > 2 else None)
