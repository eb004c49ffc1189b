"""One message-passing layer written in the two orders of a sum-product:

* ``AggregateThenTransform``: ``h_v = tanh(W @ sum(x[u] for u in N(v)))``;
* ``TransformThenAggregate``: ``h_v = tanh(sum(W @ x[u] for u in N(v)))``.

They compute the same function (up to rounding). Which order is faster
depends on the widths: the sum moves ``E`` rows, so it should run on the
narrower side of ``W``. The rewrite search (``passes/rewrite_search.py``)
commutes the linear map and the sum whichever way the model was written, so
both forms compile to the same graph. Compare with ``python -m benchmarks.search``.

    python -m examples.sum_product [in_features] [out_features]
"""
from __future__ import annotations

import sys

import torch
from torch import nn

import dynamo_relational
from examples.data import GraphBatch, graph_batch


class AggregateThenTransform(nn.Module):
    def __init__(self, batch: GraphBatch, in_features: int, out_features: int):
        super().__init__()
        self.nbrs = [[v, *nbrs] for v, nbrs in enumerate(batch.in_neighbors())]   # with a self-loop
        self.weight = nn.Parameter(torch.randn(out_features, in_features) / in_features ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.tanh(self.weight @ sum(x[u] for u in nbrs)) for nbrs in self.nbrs])


class TransformThenAggregate(AggregateThenTransform):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.tanh(sum(self.weight @ x[u] for u in nbrs)) for nbrs in self.nbrs])


def main(in_features: int = 64, out_features: int = 4) -> None:
    batch = graph_batch("mutagenesis", graphs=20)
    x = torch.randn(batch.x.shape[0], in_features)
    for form in (AggregateThenTransform, TransformThenAggregate):
        torch.manual_seed(0)
        model = form(batch, in_features, out_features)
        compiled = dynamo_relational.compile(model, [x])
        search = compiled.report.graphs[0].stats["search"]
        moves = ", ".join(step["rewrite"] + " at " + step["at"] for step in search["path"]) or "none"
        print(f"{form.__name__}: estimated {search['start_us']:.1f} -> {search['best_us']:.1f} us "
              f"(moves: {moves}); max |compiled - eager| = {(compiled(x) - model(x)).abs().max():.2e}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
