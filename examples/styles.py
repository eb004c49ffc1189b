"""Scalar-granular models written in other people's styles; each compiles unchanged.

    python -m examples.styles [graphs] [--dynamo]

Compiles every style on the Mutagenesis-shaped batch (full size by default) and
prints, per style, the largest difference from eager, the speedup and the FX
node counts before and after grouping.
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn

from examples.common import run_graph_example


class AccumulatorGCN(nn.Module):
    """Adjacency as a dict, an explicit accumulator with ``+=``, bias added after the loop."""

    def __init__(self, batch, hidden=8):
        super().__init__()
        self.adj = {v: nbrs for v, nbrs in enumerate(batch.in_neighbors())}
        self.weight = nn.Parameter(torch.randn(hidden, batch.x.shape[1]) / 3)
        self.bias = nn.Parameter(torch.randn(hidden))

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            acc = torch.zeros(self.weight.shape[0], dtype=x.dtype, device=x.device)
            for u in self.adj[v]:
                acc += F.linear(x[u], self.weight)
            out.append(torch.tanh(acc + self.bias))
        return torch.stack(out)


class RowVectorMessages(nn.Module):
    """``x[u] @ W.T`` row-vector products, ``torch.stack(msgs).sum(0)`` aggregation, a root term."""

    def __init__(self, batch, hidden=8):
        super().__init__()
        self.nbrs = batch.in_neighbors()
        self.W = nn.Parameter(torch.randn(hidden, batch.x.shape[1]) / 3)
        self.root = nn.Linear(batch.x.shape[1], hidden)

    def forward(self, x):
        rows = []
        for v, nbrs in enumerate(self.nbrs):
            msgs = [x[u] @ self.W.T for u in nbrs] + [self.root(x[v])]
            rows.append(F.relu(torch.stack(msgs).sum(0)))
        return torch.stack(rows).mean(0)


class EdgeWeights(nn.Module):
    """One learnable scalar per edge times the source row (``w[e] * h[u]``)."""

    def __init__(self, batch):
        super().__init__()
        self.edges = batch.edges
        self.edge_weight = nn.Parameter(torch.randn(len(batch.edges)))

    def forward(self, x):
        incoming = [[] for _ in range(x.shape[0])]
        for e, (u, v) in enumerate(self.edges):
            incoming[v].append(self.edge_weight[e] * x[u])
        return torch.stack([torch.sigmoid(sum(terms)) if terms else x[v] for v, terms in enumerate(incoming)])


class EdgeConcat(nn.Module):
    """EdgeConv style: ``lin(cat([h[v], h[u] - h[v]]))`` per edge, max over the edges."""

    def __init__(self, batch, hidden=6):
        super().__init__()
        self.nbrs = batch.in_neighbors()
        self.lin = nn.Linear(2 * batch.x.shape[1], hidden)

    def forward(self, x):
        out = []
        for v, nbrs in enumerate(self.nbrs):
            if nbrs:
                msgs = [torch.relu(self.lin(torch.cat([x[v], x[u] - x[v]]))) for u in nbrs]
                out.append(torch.stack(msgs).amax(0))
        return torch.stack(out)


class LinearPerType(nn.Module):
    """One ``nn.Linear`` per edge type (R-GCN written with modules)."""

    def __init__(self, batch, types=3, hidden=6):
        super().__init__()
        self.lins = nn.ModuleList(nn.Linear(batch.x.shape[1], hidden) for _ in range(types))
        self.in_edges = [[] for _ in range(batch.num_nodes)]
        for e, (u, v) in enumerate(batch.edges):
            self.in_edges[v].append((u, e % types))

    def forward(self, x):
        return torch.stack([torch.tanh(sum((self.lins[t](x[u]) for u, t in edges),
                                           torch.zeros(6, dtype=x.dtype, device=x.device)))
                            for edges in self.in_edges])


STYLES = {"accumulator": AccumulatorGCN, "row_vector": RowVectorMessages, "edge_weights": EdgeWeights,
          "edge_concat": EdgeConcat, "linear_per_type": LinearPerType}


def main(graphs: int | None = None, fast: bool = True) -> dict:
    return {name: run_graph_example(f"style {name!r}", style, "mutagenesis", graphs, fast)
            for name, style in STYLES.items()}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(int(args[0]) if args else None, fast="--dynamo" not in sys.argv)
