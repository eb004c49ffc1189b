"""The benchmark workloads: a scalar-granular example model on a seeded input.

A :class:`Workload` is a name and a size; :meth:`Workload.build` constructs the
scalar model (seeded, so every process that builds it gets the same weights),
its input and, for the GNNs, its PyTorch Geometric peer with the same weights.

``QUICK`` uses small subsets (a few minutes in all, stock torch.compile
included); ``FULL`` uses the data sets' totals (DESIGN.md section 6), the
2-layer GCN and GraphSAGE with hidden size 10 as in the thesis, the 5-layer GIN,
the LRNN rule network, the TreeLSTM and the TreeRNN.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from examples.data import SHAPES, graph_batch, random_forest

MODELS = ("gcn", "sage", "gin", "gcn_acc", "lrnn", "tree_lstm", "tree_rnn")
TREE_MODELS = ("tree_lstm", "tree_rnn")
TREE_FEATURES = 8


@dataclass(frozen=True)
class Built:
    model: nn.Module
    x: torch.Tensor
    #: the PyG model with the same weights, or None (LRNN, tree models)
    peer: nn.Module | None
    #: sizes for the report: graphs/trees, nodes, edges
    size: dict


@dataclass(frozen=True)
class Workload:
    #: one of MODELS
    model: str
    #: data set shape for graph models (examples.data.SHAPES); "forest" for the tree models
    dataset: str
    #: graphs (or trees) to keep; None = the data set's total
    graphs: int | None = None
    #: tree nodes in all (tree models only)
    nodes: int | None = None

    @property
    def has_peer(self) -> bool:
        """Whether the model has a PyG peer (benchmarks.peers)."""
        return self.model in ("gcn", "sage", "gin", "gcn_acc")

    @property
    def name(self) -> str:
        if self.model in TREE_MODELS:
            return f"{self.model}/{self.graphs}x{self.nodes}"
        return f"{self.model}/{self.dataset}" + (f"[{self.graphs}]" if self.graphs else "")

    def build(self, seed: int = 0) -> Built:
        """The scalar model, its input and its PyG peer; deterministic for a given seed."""
        from benchmarks.peers import peer_of

        torch.manual_seed(seed)
        if self.model in TREE_MODELS:
            from examples.tree_lstm import ScalarTreeLSTM
            from examples.tree_rnn import ScalarTreeRNN

            forest = random_forest(self.graphs, self.nodes, seed=seed)
            x = torch.randn(self.nodes, TREE_FEATURES)
            model = (ScalarTreeLSTM if self.model == "tree_lstm" else ScalarTreeRNN)(forest, TREE_FEATURES)
            return Built(model, x, None, dict(trees=len(forest), nodes=self.nodes,
                                              edges=self.nodes - len(forest)))
        batch = graph_batch(self.dataset, self.graphs, seed=seed)
        features = batch.x.shape[1]
        if self.model == "gcn":
            from examples.gcn import ScalarGCN
            model = ScalarGCN(batch, features, hidden=10, layers=2)
        elif self.model == "sage":
            from examples.sage import ScalarSAGE
            model = ScalarSAGE(batch, features, hidden=10, layers=2)
        elif self.model == "gin":
            from examples.gin import ScalarGIN
            model = ScalarGIN(batch, features, hidden=10, layers=5)
        elif self.model == "gcn_acc":
            from examples.styles import AccumulatorGCN
            model = AccumulatorGCN(batch, hidden=10)
        elif self.model == "lrnn":
            from examples.lrnn import ScalarLRNN
            model = ScalarLRNN(batch)
        else:
            raise ValueError(f"unknown model {self.model!r}; expected one of {MODELS}")
        return Built(model, batch.x, peer_of(model, batch),
                     dict(graphs=batch.num_graphs, nodes=batch.num_nodes, edges=len(batch.edges)))

    @classmethod
    def parse(cls, name: str) -> "Workload":
        """The inverse of :attr:`name`: ``gcn/mutagenesis``, ``gin/enzymes[20]``, ``tree_lstm/10x100``."""
        model, _, rest = name.partition("/")
        if model in TREE_MODELS:
            trees, _, nodes = rest.partition("x")
            return cls(model, "forest", int(trees), int(nodes))
        dataset, _, graphs = rest.partition("[")
        return cls(model, dataset, int(graphs.rstrip("]")) if graphs else None)


GRAPH_DATASETS = ("mutagenesis", "enzymes", "proteins")

QUICK = (
    Workload("gcn", "mutagenesis", 3),
    Workload("sage", "mutagenesis", 3),
    Workload("gin", "mutagenesis", 2),
    Workload("gcn_acc", "mutagenesis", 3),
    Workload("lrnn", "mutagenesis", 3),
    Workload("tree_lstm", "forest", 3, 30),
    Workload("tree_rnn", "forest", 3, 30),
)

FULL = tuple(Workload(m, d) for m in ("gcn", "sage", "gin", "lrnn") for d in GRAPH_DATASETS) + (
    Workload("gcn_acc", "mutagenesis"),
    Workload("tree_lstm", "forest", 100, 3000),
    Workload("tree_rnn", "forest", 100, 3000),
)


def sweep(max_neurons: float = 1e6, model: str = "gcn") -> tuple[Workload, ...]:
    """Mutagenesis-shaped batches of 1e3, 1e4, ... up to ``max_neurons`` neurons for the scaling
    plots; a neuron is one node's hidden vector in one layer (graph nodes x 2 layers)."""
    graphs, nodes, _, _ = SHAPES["mutagenesis"]
    sizes, neurons = [], 1e3
    while neurons <= max_neurons * (1 + 1e-9):
        sizes.append(Workload(model, "mutagenesis", max(1, round(neurons / 2 / (nodes / graphs)))))
        neurons *= 10
    return tuple(sizes)


def neurons(workload: Workload, size: dict) -> int:
    """The neuron count :func:`sweep` means: graph nodes x layers (per-node vector neurons)."""
    layers = {"gcn": 2, "sage": 2, "gin": 5, "gcn_acc": 1, "lrnn": 2}.get(workload.model, 1)
    return size["nodes"] * layers
