"""A 2-layer GCN written one neuron at a time (sum aggregation, like
``GCNConv(normalize=False)``), mean-pooled per graph, with a sigmoid readout.

    python -m examples.gcn [mutagenesis|enzymes|proteins] [graphs]
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from examples.common import run_graph_example
from examples.data import GraphBatch


class ScalarGCN(nn.Module):
    def __init__(self, batch: GraphBatch, features: int, hidden: int = 10, layers: int = 2):
        super().__init__()
        self.in_nbrs = batch.in_neighbors()
        self.graphs = batch.nodes_of_graph()
        dims = [features] + [hidden] * layers
        self.convs = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:]))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(x.shape[0])]
        for conv in self.convs:
            h = [torch.relu(sum((conv.weight @ h[u] for u in nbrs), conv.bias)) for nbrs in self.in_nbrs]
        out = []
        for nodes in self.graphs:
            pooled = torch.stack([h[v] for v in nodes]).mean(0)
            out.append(torch.sigmoid(self.readout(pooled)))
        return torch.stack(out).squeeze(-1)


def main(name: str = "mutagenesis", graphs: int | None = None, fast: bool = False) -> dict:
    return run_graph_example("scalar GCN", lambda b: ScalarGCN(b, b.x.shape[1]), name, graphs, fast)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mutagenesis", int(sys.argv[2]) if len(sys.argv) > 2 else None)
