"""A relational GNN over molecule graphs, written one neuron at a time (scalar-granular).

For every atom ``v`` of element ``e(v)``, and every layer ``l``:

    h0[v]     = E[e(v)]                                             (an embedding per element)
    h{l+1}[v] = relu(R_l h_l[v] + b_l + sum over bonds u -(t)- v of W_l[t] h_l[u])   (bond-type-aware)

and for every molecule ``m``: ``logit[m] = w . mean of h_L over m's atoms + c``.
Python loops over the grounded atoms, bonds and molecules build one tiny op per
neuron and per bond; ``torch.compile(..., backend="relational")`` groups them
into a handful of gathers, segment sums and matmuls.
"""
from __future__ import annotations

import torch
from torch import nn

from .grounding import MoleculeGraphs


class MoleculeRGCN(nn.Module):
    """R-GCN with an embedding per element and a weight matrix per bond type and layer;
    ``forward()`` returns one logit per molecule (all of them, in ``graphs`` order)."""

    def __init__(self, graphs: MoleculeGraphs, hidden: int = 16, layers: int = 2):
        super().__init__()
        self.atom_element = graphs.atom_element.tolist()
        self.in_bonds = graphs.in_bonds()
        self.molecules = graphs.atoms_of()
        self.embedding = nn.Parameter(torch.randn(len(graphs.elements), hidden))
        self.bond_weight = nn.Parameter(torch.randn(layers, len(graphs.bond_types), hidden, hidden) / hidden ** 0.5)
        self.root = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(layers))
        self.readout = nn.Linear(hidden, 1)

    def forward(self) -> torch.Tensor:
        element = [self.embedding[e] for e in range(self.embedding.shape[0])]
        h = [element[e] for e in self.atom_element]
        for bond_weight, root in zip(self.bond_weight, self.root):
            weight = [bond_weight[t] for t in range(bond_weight.shape[0])]
            h = [torch.relu(sum((weight[t] @ h[u] for u, t in bonds), root(h[v])))
                 for v, bonds in enumerate(self.in_bonds)]
        pooled = [torch.stack([h[v] for v in atoms]).mean(0) for atoms in self.molecules]
        return torch.stack([self.readout(p) for p in pooled]).squeeze(-1)
