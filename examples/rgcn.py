"""A 2-layer R-GCN with one weight matrix per edge type, written one neuron at a time:
``h_v' = relu(W_root h_v + sum_{(u, r) -> v} W[r] h_u + b)``. The per-edge
weights ``W[r]`` are gathered into one batched matmul.

    python -m examples.rgcn [mutagenesis|enzymes|proteins] [graphs]
"""
from __future__ import annotations

import random
import sys

import torch
from torch import nn

from examples.common import run_graph_example
from examples.data import GraphBatch


class ScalarRGCN(nn.Module):
    def __init__(self, batch: GraphBatch, features: int, edge_types: int = 3, hidden: int = 10,
                 layers: int = 2, seed: int = 0):
        super().__init__()
        rng = random.Random(seed)
        self.in_edges = [[] for _ in range(batch.num_nodes)]
        for u, v in batch.edges:
            self.in_edges[v].append((u, rng.randrange(edge_types)))
        dims = [features] + [hidden] * layers
        self.weight = nn.ParameterList(nn.Parameter(torch.randn(edge_types, o, i) / i ** 0.5)
                                       for i, o in zip(dims, dims[1:]))
        self.root = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(x.shape[0])]
        for weight, root in zip(self.weight, self.root):
            h = [torch.relu(sum((weight[r] @ h[u] for u, r in edges), root(h[v])))
                 for v, edges in enumerate(self.in_edges)]
        return torch.stack(h)


def main(name: str = "mutagenesis", graphs: int | None = None) -> dict:
    return run_graph_example("scalar R-GCN", lambda b: ScalarRGCN(b, b.x.shape[1]), name, graphs)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mutagenesis", int(sys.argv[2]) if len(sys.argv) > 2 else None)
