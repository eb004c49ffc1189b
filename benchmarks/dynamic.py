"""Training over shuffled mini-batches of samples with different structures: eager, ``dynamo_relational.batch``
and, for the TreeLSTMs, code batched by hand.

    python -m benchmarks.dynamic [--models treelstm childsum treernn gcn gin] [--samples 400] [--batch 25]
                                 [--epochs 4] [--max-union-nodes N]
                                 [--threads 1] [--device cpu]

For each model of ``examples/per_sample.py`` (written for one sample; ``gat``:
:class:`MoleculeGAT`, written with PyTorch Geometric's layers; ``childsum_objects``:
the child-sum TreeLSTM as widely copied code writes it, over trees of node
objects that hold each node's state), trains
``--epochs`` epochs of SGD over the same shuffled mini-batches in one process,
from the same weights. In the first two epochs, which trace and group and run
long while the machine's speed drifts, the systems take turns batch by batch
(an epoch's seconds are the sum of its steps'); later ones take turns epoch by
epoch, so that each system's steps run after its own, as in a training loop:

* ``eager``: the model called sample by sample;
* ``batched``: ``dynamo_relational.batch(model)`` (``--max-union-nodes N``: its
  ``max_union_nodes=N``, the structures grouped as several unions of at most
  ``N`` FX nodes each);
* ``by hand`` (the TreeLSTMs): :func:`level_batched_tree_lstm`, the same cell
  written for a whole batch, every node of one height at once, as DGL-style
  hand-batched code does: the bar a compiler that batches for the user should reach;
* ``PyG`` (molecule GCNs, GIN, GraphSAGE and GAT): :func:`pyg_molecules`, the same model written
  with PyTorch Geometric, its batches collated from ``Data`` objects as PyG's
  ``DataLoader`` does.

Prints each epoch's seconds and the ratios to eager, the median of the epochs
after the second (the steady state: no tracing or grouping), the batched
module's report, the largest difference between each system's weights and
eager's after training (float32), the median assembly time of a batch per
node of its samples (tree nodes, atoms) in training and then over the last
epoch's batches again under ``torch.no_grad()`` (in training, the first
allocation after a step also does the allocator's work for the memory the
step's backward freed), and the process's resident memory
before the model's run and after it (what the batched module keeps: every
traced structure and the grouped union).
"""
from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import time
from typing import Callable

import torch
from torch import nn

from examples.per_sample import (MODELS, ChildSumTreeLSTM, MoleculeGCN, MoleculeSAGE, ObjectChildSumTreeLSTM, TreeLSTM,
                                 batches, dataset, object_tree, train_step)


def level_batched_tree_lstm(model: TreeLSTM | ChildSumTreeLSTM, samples: list[tuple]) -> list[torch.Tensor]:
    """The root state of each ``(children, x)`` tree of ``samples``, computed with ``model``'s weights level by
    level over the whole batch: leaves first, then every node whose children are done, its children's
    states gathered and summed with ``index_add``."""
    if isinstance(model, ChildSumTreeLSTM):
        W_iou, U_iou, W_f, U_f = model.ioux, model.iouh, model.fx, model.fh
    else:
        W_iou, U_iou, W_f, U_f = model.W_iou, model.U_iou, model.W_f, model.U_f
    children_of, parents, xs, roots, start = [], [], [], [], 0
    heights: list[int] = []
    for children, x in samples:
        height = [0] * len(children)
        for v in reversed(range(len(children))):
            height[v] = 1 + max((height[c] for c in children[v]), default=-1)
            children_of += [start + c for c in children[v]]
            parents += [start + v] * len(children[v])
        heights += height
        roots.append(start)
        xs.append(x)
        start += len(children)
    x = torch.cat(xs)
    device, hidden = x.device, model.hidden
    height, child, parent = (torch.tensor(v, device=device) for v in (heights, children_of, parents))
    iou_x, f_x = W_iou(x), W_f(x)
    h = c = x.new_zeros(start, hidden)
    for level in range(max(heights) + 1):
        nodes = (height == level).nonzero().squeeze(1)
        edge = height[parent] == level
        kids, of = child[edge], parent[edge]
        h_sum = torch.zeros_like(h).index_add(0, of, h[kids])[nodes]
        iou = iou_x[nodes] + U_iou(h_sum)
        i, o, u = iou.split(hidden, dim=1)
        forget = torch.sigmoid(f_x[of] + U_f(h[kids])) * c[kids]
        c_level = torch.sigmoid(i) * torch.tanh(u) + torch.zeros_like(c).index_add(0, of, forget)[nodes]
        h = h.index_copy(0, nodes, torch.sigmoid(o) * torch.tanh(c_level))
        c = c.index_copy(0, nodes, c_level)
    return list(h[roots])


class MoleculeGAT(nn.Module):
    """Two graph attention layers (PyTorch Geometric's ``GATConv``, two heads), mean pooling and a sigmoid
    readout, for one molecule: per-graph code written with PyG's layers, called on the molecule's edge index.
    Its PyG peer calls the same layers on each collated batch."""

    def __init__(self, features: int, hidden: int = 8, heads: int = 2):
        super().__init__()
        from torch_geometric.nn import GATConv

        self.convs = nn.ModuleList([GATConv(features, hidden, heads), GATConv(hidden * heads, hidden, heads)])
        self.readout = nn.Linear(hidden * heads, 1)

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        edge_index = torch.tensor([[u for nbrs in in_nbrs for u in nbrs],
                                   [v for v, nbrs in enumerate(in_nbrs) for _ in nbrs]], device=x.device)
        return torch.sigmoid(self.readout(self.nodes(x, edge_index).mean(0)))

    def nodes(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.relu(conv(x, edge_index))
        return x


#: the models: ``examples/per_sample.py``'s, those written with PyG's layers (on its molecules), and the
#: child-sum TreeLSTM over trees of node objects (on its trees)
KINDS = {**MODELS, "gat": (MoleculeGAT, MODELS["gcn"][1]),
         "childsum_objects": (ObjectChildSumTreeLSTM, MODELS["childsum"][1])}
#: the data set that a kind of :data:`KINDS` trains on, where it is another kind's
DATA_OF = {"gat": "gcn", "childsum_objects": "childsum"}


def pyg_molecules(model: nn.Module, data: list[tuple]) -> Callable[[list[tuple]], list[torch.Tensor]]:
    """``model`` (a :class:`MoleculeGCN`, :class:`MoleculeGIN`, :class:`MoleculeSAGE` or :class:`MoleculeGAT`)
    written with PyTorch Geometric: each sample of ``data`` stored once as a ``Data`` object, as a PyG data set
    holds it, and every batch collated by ``Batch.from_data_list`` (what PyG's ``DataLoader`` does) and computed
    with scatter sums (means) over its edges, or with the GAT's own layers."""
    from torch_geometric.data import Batch, Data
    from torch_geometric.utils import scatter

    graphs = {id(x): Data(x=x, edge_index=torch.tensor([[u, v] for v, nbrs in enumerate(in_nbrs) for u in nbrs],
                                                         device=x.device).t().contiguous())
              for in_nbrs, x in data}

    def forward(samples: list[tuple]) -> list[torch.Tensor]:
        batch = Batch.from_data_list([graphs[id(x)] for _, x in samples])
        (source, target), h = batch.edge_index, batch.x
        if isinstance(model, MoleculeGAT):
            pooled = scatter(model.nodes(h, batch.edge_index), batch.batch, 0, batch.num_graphs, reduce="mean")
        elif isinstance(model, MoleculeGCN):
            for conv in model.convs:
                h = torch.relu(scatter(h[source] @ conv.weight.t(), target, 0, h.shape[0], reduce="sum") + conv.bias)
            pooled = scatter(h, batch.batch, 0, batch.num_graphs, reduce="mean")
        elif isinstance(model, MoleculeSAGE):
            for lin_l, lin_r in zip(model.neighbor, model.root):
                h = torch.relu(lin_l(scatter(h[source], target, 0, h.shape[0], reduce="mean")) + lin_r(h))
            pooled = scatter(h, batch.batch, 0, batch.num_graphs, reduce="mean")
        else:
            for mlp in model.mlps:
                h = torch.relu(mlp(scatter(h[source], target, 0, h.shape[0], reduce="sum")))
            pooled = scatter(h, batch.batch, 0, batch.num_graphs, reduce="sum")
        return list(torch.sigmoid(model.readout(pooled)))
    return forward


def _epoch(systems: dict, optimizers: dict, data: list[tuple], targets: torch.Tensor, batch_size: int, epoch: int,
           by_batch: bool) -> dict[str, float]:
    """Each system's seconds for one epoch, the systems taking turns ``by_batch`` or epoch by epoch."""
    seconds = dict.fromkeys(systems, 0.0)
    turns = [[chosen] for chosen in batches(len(data), batch_size, epoch)] if by_batch \
        else [batches(len(data), batch_size, epoch)]
    for chosen_batches in turns:
        for name, (_, fn) in systems.items():
            start = time.perf_counter()
            for chosen in chosen_batches:
                train_step(fn, data, targets, chosen, optimizers[name])
            if targets.is_cuda:
                torch.cuda.synchronize()
            seconds[name] += time.perf_counter() - start
    return seconds


def resident_mb() -> float:
    """The process's resident memory now (Linux), else its peak so far, in MB."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 10


def run(kind: str, samples: int, batch_size: int, epochs: int, device: str = "cpu", treebank: bool = False,
        max_union_nodes: int | str | None = "auto") -> dict:
    import dynamo_relational

    torch.manual_seed(0)
    gc.collect()
    resident_before = resident_mb()
    data = [(structure, x.to(device)) for structure, x in dataset(DATA_OF.get(kind, kind), samples,
                                                                   treebank=treebank)]
    targets = torch.randn(samples, device=device)
    eager = KINDS[kind][0](data[0][1].shape[1]).to(device)
    model = copy.deepcopy(eager)
    systems = {"eager": (eager, lambda batch: [eager(*s) for s in batch]),
               "batched": (model, dynamo_relational.batch(model, progress=False, max_union_nodes=max_union_nodes))}
    children = {id(x): structure for structure, x in data}   # (the children lists of a tree of objects)
    if kind == "childsum_objects":   # eager calls store states on their own trees, by hand reads the lists
        own_trees = {id(x): object_tree(structure) for structure, x in data}
        systems["eager"] = (eager, lambda batch: [eager(own_trees[id(x)], x) for _, x in batch])
        data = [(object_tree(structure), x) for structure, x in data]
    if kind in ("treelstm", "childsum", "childsum_objects"):
        by_hand = copy.deepcopy(eager)
        systems["by hand"] = (by_hand, lambda batch: level_batched_tree_lstm(by_hand, [(children[id(x)], x)
                                                                                       for _, x in batch]))
    if kind in ("gcn", "gcn_edges", "gcn_dense", "gin", "sage", "sage_edges", "gat"):
        pyg = copy.deepcopy(eager)
        systems["PyG"] = (pyg, pyg_molecules(pyg, data))
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01) for name, (m, _) in systems.items()}
    rows = []
    for epoch in range(epochs):
        row = _epoch(systems, optimizers, data, targets, batch_size, epoch, by_batch=epoch < 2)
        rows.append(row)
        print(f"  {kind} epoch {epoch}: " + "  ".join(
            f"{name} {s:7.2f} s ({row['eager'] / s:5.2f}x)" for name, s in row.items()), flush=True)
    steady = rows[2:] or rows[-1:]
    result = {"model": kind, "epochs": rows, "report": systems["batched"][1].report,
              "steady_s": {name: statistics.median(r[name] for r in steady) for name in systems},
              "weight_diff": {name: max((a - b).abs().max().item() for a, b in zip(eager.parameters(), m.parameters()))
                              for name, (m, _) in systems.items() if name != "eager"}}
    result["steady_ratio"] = {name: result["steady_s"]["eager"] / s for name, s in result["steady_s"].items()}
    gc.collect()
    result["resident_mb"] = (resident_before, resident_mb())
    nodes_per_batch = statistics.mean(len(x) for _, x in data) * batch_size
    batched = systems["batched"][1]
    result["assembly_us_per_node"] = _median_us(batched.report.assembly_seconds) / nodes_per_batch
    # and the last epoch's batches under no_grad: in training, the first allocation after a step also does the
    # allocator's work for the memory that the step's backward freed
    trained = len(batched.report.assembly_seconds)
    with torch.no_grad():
        for chosen in batches(len(data), batch_size, epochs - 1):
            batched([data[i] for i in chosen])
    result["no_grad_assembly_us_per_node"] = _median_us(batched.report.assembly_seconds[trained:]) / nodes_per_batch
    return result


def _median_us(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e6 if seconds else float("nan")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(KINDS),
                        default=["treelstm", "childsum", "treernn", "gcn", "gin"])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--batch", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--treebank", action="store_true",
                        help="the tree models read binary parse trees of SST-shaped sentences (4-48 words, about "
                             "19 on average) instead of random trees of 2-40 nodes")
    parser.add_argument("--max-union-nodes", type=int, default=None,
                        help="group the structures as several unions of at most this many FX nodes each "
                             "(default: as many as the memory available holds)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for kind in args.models:
        result = run(kind, args.samples, args.batch, args.epochs, args.device, args.treebank,
                     args.max_union_nodes or "auto")
        steady = "  ".join(f"{name} {s:.2f} s ({result['steady_ratio'][name]:.1f}x)"
                           for name, s in result["steady_s"].items())
        diffs = ", ".join(f"{name} {d:.1e}" for name, d in result["weight_diff"].items())
        training, no_grad = result["assembly_us_per_node"], result["no_grad_assembly_us_per_node"]
        before, after = result["resident_mb"]
        print(f"{kind}: steady epochs: {steady}; largest weight difference to eager: {diffs}; "
              f"assembly per node of a batch's samples, median: {training:.2f} us in training, {no_grad:.2f} us "
              f"under torch.no_grad(); resident memory before / after: {before:.0f} / {after:.0f} MB")
        print("\n".join("    " + line for line in str(result["report"]).splitlines()), flush=True)
        results.append(result)
    return results


if __name__ == "__main__":
    main()
