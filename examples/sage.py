"""A 2-layer GraphSAGE (mean aggregation, like ``SAGEConv``) written one neuron at a time.

    python -m examples.sage [mutagenesis|enzymes|proteins] [graphs]
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from examples.common import run_graph_example
from examples.data import GraphBatch


class ScalarSAGE(nn.Module):
    def __init__(self, batch: GraphBatch, features: int, hidden: int = 10, layers: int = 2):
        super().__init__()
        self.in_nbrs = batch.in_neighbors()
        self.graphs = batch.nodes_of_graph()
        dims = [features] + [hidden] * layers
        self.neighbor = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:]))        # lin_l
        self.root = nn.ModuleList(nn.Linear(i, o, bias=False) for i, o in zip(dims, dims[1:]))  # lin_r
        self.readout = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(x.shape[0])]
        for lin_l, lin_r in zip(self.neighbor, self.root):
            new = []
            for v, nbrs in enumerate(self.in_nbrs):
                msg = lin_l(torch.stack([h[u] for u in nbrs]).mean(0)) if nbrs else lin_l.bias
                new.append(torch.relu(msg + lin_r(h[v])))
            h = new
        out = [torch.sigmoid(self.readout(torch.stack([h[v] for v in nodes]).mean(0))) for nodes in self.graphs]
        return torch.stack(out).squeeze(-1)


def main(name: str = "mutagenesis", graphs: int | None = None) -> dict:
    return run_graph_example("scalar GraphSAGE", lambda b: ScalarSAGE(b, b.x.shape[1]), name, graphs)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mutagenesis", int(sys.argv[2]) if len(sys.argv) > 2 else None)
