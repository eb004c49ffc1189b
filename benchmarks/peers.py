"""PyTorch Geometric peers of the scalar-granular example models, with the SAME weights.

Each peer is built from a scalar model (``examples.gcn.ScalarGCN``,
``examples.sage.ScalarSAGE``, ``examples.gin.ScalarGIN``) and its
:class:`~examples.data.GraphBatch`, copies every weight from it and is called
like it: ``peer(x) -> [num_graphs]``. The graph (``edge_index``) and the node
-> graph assignment (``batch``) are buffers, so ``peer.to(device)`` moves them.

What each scalar model computes and how PyG expresses it exactly:

* ``ScalarGCN``: ``h_v = relu(b + sum_{u -> v} W h_u)`` (no self loop, no
  normalization, bias after the aggregation) is
  ``GCNConv(normalize=False, add_self_loops=False)``, whose ``lin`` has no bias
  and whose ``bias`` is added after the sum. Mean pool, then
  ``sigmoid(readout(.))``.
* ``ScalarSAGE``: ``h_v = relu(lin_l(mean_{u -> v} h_u) + lin_r(h_v))``, and
  ``lin_l.bias`` alone for a node without in-neighbours, is ``SAGEConv`` (mean
  aggregation: an empty mean is 0 there). Mean pool, readout.
* ``ScalarGIN``: ``h_v = relu(mlp(h_v + sum_{u -> v} h_u))`` is
  ``GINConv(mlp, eps=0)`` followed by ``relu``. Sum pool, readout.
* ``examples.styles.AccumulatorGCN`` (a GCN written in another author's style:
  a ``torch.zeros`` accumulator, ``+=``, the bias after the loop):
  ``h_v = tanh(b + sum_{u -> v} W x_u)`` per node, one layer, no pooling, is
  ``GCNConv(normalize=False, add_self_loops=False)`` followed by ``tanh``.

:func:`peer_of` picks the peer for a scalar model; the benchmark checks the
peer's output against the scalar model's eager output before timing anything.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from examples.data import GraphBatch


class _PygGraphModel(nn.Module):
    """Common part: the batch's graph as buffers, relu after every conv in ``self.convs``
    (set by the subclass), pooling and the sigmoid readout."""

    def __init__(self, batch: GraphBatch, readout: nn.Linear, pool: str):
        super().__init__()
        self.register_buffer("edge_index", batch.edge_index())
        self.register_buffer("batch", torch.tensor(batch.graph_of, dtype=torch.long))
        self.num_graphs = batch.num_graphs
        self.readout = copy.deepcopy(readout)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.relu(conv(x, self.edge_index))
        return self.pooled_readout(x)

    def pooled_readout(self, h: torch.Tensor) -> torch.Tensor:
        from torch_geometric.nn import global_add_pool, global_mean_pool

        pool = global_mean_pool if self.pool == "mean" else global_add_pool
        return torch.sigmoid(self.readout(pool(h, self.batch, size=self.num_graphs))).squeeze(-1)


class PygGCN(_PygGraphModel):
    """``GCNConv(normalize=False, add_self_loops=False)`` layers with ``ScalarGCN``'s weights."""

    def __init__(self, scalar: nn.Module, batch: GraphBatch):
        from torch_geometric.nn import GCNConv

        super().__init__(batch, scalar.readout, pool="mean")
        self.convs = nn.ModuleList()
        for lin in scalar.convs:
            conv = GCNConv(lin.in_features, lin.out_features, normalize=False, add_self_loops=False)
            with torch.no_grad():
                conv.lin.weight.copy_(lin.weight)
                conv.bias.copy_(lin.bias)
            self.convs.append(conv)


class PygSAGE(_PygGraphModel):
    """``SAGEConv`` (mean) layers with ``ScalarSAGE``'s weights (``neighbor`` -> ``lin_l``, ``root`` -> ``lin_r``)."""

    def __init__(self, scalar: nn.Module, batch: GraphBatch):
        from torch_geometric.nn import SAGEConv

        super().__init__(batch, scalar.readout, pool="mean")
        self.convs = nn.ModuleList()
        for lin_l, lin_r in zip(scalar.neighbor, scalar.root):
            conv = SAGEConv(lin_l.in_features, lin_l.out_features, aggr="mean")
            conv.lin_l.load_state_dict(lin_l.state_dict())
            conv.lin_r.load_state_dict(lin_r.state_dict())
            self.convs.append(conv)


class PygGIN(_PygGraphModel):
    """``GINConv(mlp, eps=0)`` layers with copies of ``ScalarGIN``'s MLPs."""

    def __init__(self, scalar: nn.Module, batch: GraphBatch):
        from torch_geometric.nn import GINConv

        super().__init__(batch, scalar.readout, pool="sum")
        self.convs = nn.ModuleList()
        for mlp in scalar.mlps:
            conv = GINConv(copy.deepcopy(mlp), eps=0.0, train_eps=False)
            conv.nn.load_state_dict(mlp.state_dict())   # GINConv's constructor re-initializes its nn
            self.convs.append(conv)


class PygAccumulatorGCN(nn.Module):
    """``GCNConv(normalize=False, add_self_loops=False)`` and ``tanh`` with ``AccumulatorGCN``'s weights."""

    def __init__(self, scalar: nn.Module, batch: GraphBatch):
        from torch_geometric.nn import GCNConv

        super().__init__()
        self.register_buffer("edge_index", batch.edge_index())
        hidden, features = scalar.weight.shape
        self.conv = GCNConv(features, hidden, normalize=False, add_self_loops=False)
        with torch.no_grad():
            self.conv.lin.weight.copy_(scalar.weight)
            self.conv.bias.copy_(scalar.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x, self.edge_index))


def peer_of(scalar: nn.Module, batch: GraphBatch) -> nn.Module | None:
    """The PyG model computing what ``scalar`` computes, with its weights; None if there is none."""
    from examples.gcn import ScalarGCN
    from examples.gin import ScalarGIN
    from examples.sage import ScalarSAGE
    from examples.styles import AccumulatorGCN

    peers = {ScalarGCN: PygGCN, ScalarSAGE: PygSAGE, ScalarGIN: PygGIN, AccumulatorGCN: PygAccumulatorGCN}
    peer = peers.get(type(scalar))
    return peer(scalar, batch) if peer else None
