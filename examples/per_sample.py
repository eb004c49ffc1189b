"""Models written for one sample, trained over shuffled mini-batches of samples of different structures
with ``dynamo_relational.batch``.

    python -m examples.per_sample [treelstm|childsum|treernn|gcn|gcn_edges|gcn_dense|gin|sage|sage_edges|rgcn|lrnn]
                                  [samples] [batch size] [epochs]

Each model's ``forward`` takes one sample: a tree (a list of children lists, parents numbered before
their children) or a molecule (a list of in-neighbour lists; for the R-GCN, of (neighbour, bond type)
pairs), and its node features. The script trains an epoch at a time, eagerly and batched, from the same
weights, and prints each epoch's time, the largest difference between the two models' weights after it,
and the batched module's report.
"""
from __future__ import annotations

import random
import sys
import time

import torch
from torch import nn

from examples.tree_lstm import ScalarTreeLSTM


class TreeRNN(nn.Module):
    """``h_v = tanh(W x_v + U sum_c h_c + b)``; the root's state is the result."""

    def __init__(self, features: int, hidden: int = 16):
        super().__init__()
        self.W = nn.Linear(features, hidden)
        self.U = nn.Linear(hidden, hidden, bias=False)

    def forward(self, children: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        h = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(x[v])
            h[v] = torch.tanh(own + self.U(sum(h[c] for c in children[v])) if children[v] else own)
        return h[0]


class TreeLSTM(ScalarTreeLSTM):
    """A child-sum TreeLSTM (Tai et al. 2015), the cell of ``examples.tree_lstm``, over one tree; the root's
    hidden state is the result."""

    def __init__(self, features: int, hidden: int = 16):
        super().__init__([], features, hidden)   # no forest: the tree is forward's argument

    def forward(self, children: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        states = [None] * len(children)
        for v in reversed(range(len(children))):
            states[v] = self.node(x[v], [states[c] for c in children[v]])
        return states[0][0]


class ChildSumTreeLSTM(nn.Module):
    """The child-sum TreeLSTM as per-node code is commonly written: a node's children's states are
    concatenated into ``[k, hidden]`` tensors (k rows for k children), the forget gates run over those rows
    and ``torch.sum(..., dim=0)`` adds them up. Same equations as :class:`TreeLSTM`."""

    def __init__(self, features: int, hidden: int = 16):
        super().__init__()
        self.hidden = hidden
        self.ioux = nn.Linear(features, 3 * hidden)
        self.iouh = nn.Linear(hidden, 3 * hidden)
        self.fx = nn.Linear(features, hidden)
        self.fh = nn.Linear(hidden, hidden)

    def node_forward(self, x, child_c, child_h):
        child_h_sum = torch.sum(child_h, dim=0, keepdim=True)
        iou = self.ioux(x) + self.iouh(child_h_sum)
        i, o, u = torch.split(iou, iou.size(1) // 3, dim=1)
        i, o, u = torch.sigmoid(i), torch.sigmoid(o), torch.tanh(u)
        f = torch.sigmoid(self.fh(child_h) + self.fx(x).repeat(len(child_h), 1))
        c = i * u + torch.sum(f * child_c, dim=0, keepdim=True)
        return c, o * torch.tanh(c)

    def forward(self, children: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        states: list = [None] * len(children)
        for v in reversed(range(len(children))):
            if children[v]:
                child_c = torch.cat([states[c][0] for c in children[v]], dim=0)
                child_h = torch.cat([states[c][1] for c in children[v]], dim=0)
            else:
                child_c = child_h = x.new_zeros(1, self.hidden)
            states[v] = self.node_forward(x[v], child_c, child_h)
        return states[0][1]


class TreeNode:
    """A parse tree node as widely copied TreeLSTM code builds it: ``idx`` (its word's row), ``children``."""

    def __init__(self, idx: int, children: list[TreeNode]):
        self.idx, self.children, self.num_children = idx, children, len(children)


def object_tree(children: list[list[int]], v: int = 0) -> TreeNode:
    """The tree of children lists ``children`` as :class:`TreeNode` objects, rooted at ``v``."""
    return TreeNode(v, [object_tree(children, c) for c in children[v]])


class ObjectChildSumTreeLSTM(ChildSumTreeLSTM):
    """:class:`ChildSumTreeLSTM` as widely copied per-node code writes it, over a tree of :class:`TreeNode`
    objects: recursion over the children, each node's ``(c, h)`` stored on the node (``tree.state``) for its
    parent to read, leaves' zero states made by ``x.detach().new(1, d).fill_(0.).requires_grad_()``. Same
    equations and results; ``forward(tree, x)`` returns the root's ``h``."""

    def forward(self, tree: TreeNode, inputs: torch.Tensor) -> torch.Tensor:   # type: ignore[override]
        for child in tree.children:
            self.forward(child, inputs)
        if tree.num_children == 0:
            child_c = inputs[0].detach().new(1, self.hidden).fill_(0.).requires_grad_()
            child_h = inputs[0].detach().new(1, self.hidden).fill_(0.).requires_grad_()
        else:
            child_c, child_h = zip(*(child.state for child in tree.children))
            child_c, child_h = torch.cat(child_c, dim=0), torch.cat(child_h, dim=0)
        tree.state = self.node_forward(inputs[tree.idx], child_c, child_h)
        return tree.state[1]


class MoleculeGCN(nn.Module):
    """Two sum-aggregation graph convolutions, mean pooling and a sigmoid readout, for one molecule."""

    def __init__(self, features: int, hidden: int = 16, layers: int = 2):
        super().__init__()
        dims = [features] + [hidden] * layers
        self.convs = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:]))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(len(in_nbrs))]
        for conv in self.convs:
            h = [torch.relu(sum((conv.weight @ h[u] for u in nbrs), conv.bias)) for nbrs in in_nbrs]
        return torch.sigmoid(self.readout(torch.stack(h).mean(0)))


class MoleculeEdgeGCN(MoleculeGCN):
    """:class:`MoleculeGCN` written with tensor ops over the molecule's edge index, as per-graph code over PyTorch
    Geometric's ``edge_index`` is: each layer reads its edges' sources (``h[src]``) and sums the messages into
    their targets (``index_add``)."""

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        src = torch.tensor([u for nbrs in in_nbrs for u in nbrs], dtype=torch.long, device=x.device)
        dst = torch.tensor([v for v, nbrs in enumerate(in_nbrs) for _ in nbrs], dtype=torch.long, device=x.device)
        h = x
        for conv in self.convs:
            sums = torch.zeros(len(in_nbrs), conv.out_features, dtype=x.dtype, device=x.device)
            h = torch.relu(sums.index_add(0, dst, h[src] @ conv.weight.t()) + conv.bias)
        return torch.sigmoid(self.readout(h.mean(0)))


class MoleculeDenseGCN(MoleculeGCN):
    """:class:`MoleculeGCN` written over the molecule's dense adjacency matrix ``A`` (``A[v, u]``: the bonds from
    ``u`` into ``v``), as per-graph code over an adjacency matrix is: ``h = relu(A @ h W^T + b)``."""

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        src = torch.tensor([u for nbrs in in_nbrs for u in nbrs], dtype=torch.long, device=x.device)
        dst = torch.tensor([v for v, nbrs in enumerate(in_nbrs) for _ in nbrs], dtype=torch.long, device=x.device)
        adjacency = torch.zeros(len(in_nbrs), len(in_nbrs), dtype=x.dtype, device=x.device).index_put_(
            (dst, src), torch.ones(len(src), dtype=x.dtype, device=x.device), accumulate=True)
        h = x
        for conv in self.convs:
            h = torch.relu(adjacency @ (h @ conv.weight.t()) + conv.bias)
        return torch.sigmoid(self.readout(h.mean(0)))


class MoleculeGIN(nn.Module):
    """Graph isomorphism layers (``h_v = MLP(sum of h_u over v's in-neighbours, v itself included)``), sum
    pooling and a sigmoid readout, for one molecule."""

    def __init__(self, features: int, hidden: int = 16, layers: int = 2):
        super().__init__()
        dims = [features] + [hidden] * layers
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(i, o), nn.ReLU(), nn.Linear(o, o))
                                  for i, o in zip(dims, dims[1:]))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(len(in_nbrs))]
        for mlp in self.mlps:
            h = [torch.relu(mlp(sum(h[u] for u in nbrs))) for nbrs in in_nbrs]
        return torch.sigmoid(self.readout(torch.stack(h).sum(0)))


class MoleculeSAGE(nn.Module):
    """GraphSAGE layers (``h_v = relu(W_l mean of h_u over v's in-neighbours + W_r h_v)``, as ``SAGEConv``), mean
    pooling and a sigmoid readout, for one molecule."""

    def __init__(self, features: int, hidden: int = 16, layers: int = 2):
        super().__init__()
        dims = [features] + [hidden] * layers
        self.neighbor = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:]))
        self.root = nn.ModuleList(nn.Linear(i, o, bias=False) for i, o in zip(dims, dims[1:]))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(len(in_nbrs))]
        for lin_l, lin_r in zip(self.neighbor, self.root):
            h = [torch.relu(lin_l(torch.stack([h[u] for u in nbrs]).mean(0)) + lin_r(h[v]))
                 for v, nbrs in enumerate(in_nbrs)]
        return torch.sigmoid(self.readout(torch.stack(h).mean(0)))


class MoleculeEdgeSAGE(MoleculeSAGE):
    """:class:`MoleculeSAGE` written with tensor ops over the molecule's edge index, as ``SAGEConv`` computes
    it: each layer sums its edges' sources into their targets (``index_add``) and divides by the targets'
    in-degrees, counted by the same sum over ones."""

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        src = torch.tensor([u for nbrs in in_nbrs for u in nbrs], dtype=torch.long, device=x.device)
        dst = torch.tensor([v for v, nbrs in enumerate(in_nbrs) for _ in nbrs], dtype=torch.long, device=x.device)
        counts = torch.zeros(len(in_nbrs), 1, dtype=x.dtype, device=x.device).index_add(
            0, dst, torch.ones(len(dst), 1, dtype=x.dtype, device=x.device)).clamp(min=1)
        h = x
        for lin_l, lin_r in zip(self.neighbor, self.root):
            sums = torch.zeros(len(in_nbrs), h.shape[1], dtype=x.dtype, device=x.device).index_add(0, dst, h[src])
            h = torch.relu(lin_l(sums / counts) + lin_r(h))
        return torch.sigmoid(self.readout(h.mean(0)))


class MoleculeRGCN(nn.Module):
    """R-GCN layers with one weight matrix per bond type (``h_v = relu(W_root h_v + sum over bonds (u, r) -> v
    of W[r] h_u + b)``), mean pooling and a sigmoid readout, for one molecule given as in-bond lists."""

    def __init__(self, features: int, hidden: int = 16, layers: int = 2, bond_types: int = 3):
        super().__init__()
        dims = [features] + [hidden] * layers
        self.weight = nn.ParameterList(nn.Parameter(torch.randn(bond_types, o, i) / i ** 0.5)
                                       for i, o in zip(dims, dims[1:]))
        self.root = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims, dims[1:]))
        self.readout = nn.Linear(hidden, 1)

    def forward(self, in_bonds: list[list[tuple[int, int]]], x: torch.Tensor) -> torch.Tensor:
        h = [x[v] for v in range(len(in_bonds))]
        for weight, root in zip(self.weight, self.root):
            h = [torch.relu(sum((weight[r] @ h[u] for u, r in bonds), root(h[v]))) for v, bonds in enumerate(in_bonds)]
        return torch.sigmoid(self.readout(torch.stack(h).mean(0)))


class MoleculeLRNN(nn.Module):
    """The rule network of ``examples.lrnn`` for one molecule: scalar atom neurons, two rule layers over its
    bonds (``h(V) :- w_0 * atom(V), w_1 * atom(U), edge(U, V)``, each grounding ``tanh``, their average
    ``sigmoid``), the atoms' average as the result."""

    def __init__(self, features: int, rules: int = 2):
        super().__init__()
        self.rule_weights = nn.Parameter(torch.randn(rules, 2))
        self.rule_offsets = nn.Parameter(torch.randn(rules))
        self.atom_weight = nn.Parameter(torch.randn(features))

    def forward(self, in_nbrs: list[list[int]], x: torch.Tensor) -> torch.Tensor:
        atoms = [torch.dot(self.atom_weight, x[v]) for v in range(len(in_nbrs))]
        for w, offset in zip(self.rule_weights, self.rule_offsets):
            atoms = [torch.sigmoid(torch.stack([torch.tanh(w[0] * atoms[v] + w[1] * atoms[u] + offset)
                                                for u in nbrs]).mean(0)) if nbrs else atoms[v]
                     for v, nbrs in enumerate(in_nbrs)]
        return torch.stack(atoms).mean(0)


class Forest(nn.Module):
    """A per-sample model over a fixed list of structures as one grounding, for ``dynamo_relational.compile``
    and ``torch.compile``: ``forward(x)`` takes the samples' node features joined along dim 0 and returns
    their results joined along dim 0."""

    def __init__(self, model: nn.Module, structures: list):
        super().__init__()
        self.model, self.structures = model, structures

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        results, start = [], 0
        for structure in self.structures:
            results.append(self.model(structure, x[start:start + len(structure)]))
            start += len(structure)
        return torch.cat(results)


def random_tree(nodes: int, rng: random.Random) -> list[list[int]]:
    """Children lists of a random tree whose parents are numbered before their children."""
    children: list[list[int]] = [[] for _ in range(nodes)]
    for v in range(1, nodes):
        children[rng.randrange(max(0, v - 3), v)].append(v)
    return children


def parse_tree(words: int, rng: random.Random) -> list[list[int]]:
    """Children lists of a random binary parse tree over ``words`` leaves (``2 * words - 1`` nodes, each
    inner node splits its span of words at a random point), parents numbered before their children."""
    children: list[list[int]] = [[]]
    spans = [(0, words, 0)]   # (first word, words, node)
    while spans:
        first, width, node = spans.pop()
        if width > 1:
            split = rng.randint(1, width - 1)
            for start, size in ((first, split), (first + split, width - split)):
                children[node].append(len(children))
                spans.append((start, size, len(children)))
                children.append([])
    return children


def sentence_length(rng: random.Random) -> int:
    """A sentence length shaped like the Stanford Sentiment Treebank's: 4 to 48 words, about 19 on average
    (a triangular distribution with its mode at 5)."""
    return min(48, max(4, round(rng.triangular(4, 48, 5))))


def random_molecule(atoms: int, rng: random.Random) -> list[list[int]]:
    """In-neighbour lists of a random connected molecule-like graph (a chain plus a few rings, self-loops)."""
    nbrs = [{v} for v in range(atoms)]
    for v in range(1, atoms):
        u = v - 1 if rng.random() < 0.8 else rng.randrange(v)
        nbrs[v].add(u)
        nbrs[u].add(v)
    return [sorted(n) for n in nbrs]


def random_typed_molecule(atoms: int, rng: random.Random, bond_types: int = 3) -> list[list[tuple[int, int]]]:
    """In-bond lists ``(neighbour, bond type)`` of a random molecule-like graph (:func:`random_molecule`'s, the
    self-loops left out); a bond has one type both ways."""
    types: dict[tuple[int, int], int] = {}
    return [[(u, types.setdefault((min(u, v), max(u, v)), rng.randrange(bond_types))) for u in nbrs if u != v]
            for v, nbrs in enumerate(random_molecule(atoms, rng))]


MODELS = {"treelstm": (TreeLSTM, random_tree), "childsum": (ChildSumTreeLSTM, random_tree),
          "treernn": (TreeRNN, random_tree), "gcn": (MoleculeGCN, random_molecule),
          "gcn_edges": (MoleculeEdgeGCN, random_molecule), "gcn_dense": (MoleculeDenseGCN, random_molecule),
          "gin": (MoleculeGIN, random_molecule), "sage": (MoleculeSAGE, random_molecule),
          "sage_edges": (MoleculeEdgeSAGE, random_molecule),
          "rgcn": (MoleculeRGCN, random_typed_molecule), "lrnn": (MoleculeLRNN, random_molecule)}


def dataset(kind: str, samples: int, features: int = 8, seed: int = 0, dtype=torch.float32,
            treebank: bool = False) -> list[tuple]:
    """``samples`` (structure, features) pairs of 2 to 40 nodes (trees) or 5 to 30 atoms (molecules);
    with ``treebank``, the trees are binary parse trees of SST-shaped sentences (:func:`parse_tree`,
    :func:`sentence_length`)."""
    rng = random.Random(seed)
    make = MODELS[kind][1]
    if treebank and make is not random_tree:
        raise ValueError(f"treebank=True makes parse trees, for the tree models; {kind!r} reads molecules")
    low, high = (2, 40) if make is random_tree else (5, 30)
    generator = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(samples):
        structure = parse_tree(sentence_length(rng), rng) if treebank else make(rng.randint(low, high), rng)
        data.append((structure, torch.randn(len(structure), features, generator=generator, dtype=dtype)))
    return data


def batches(samples: int, batch_size: int, seed: int) -> list[list[int]]:
    """The sample indices of each mini-batch of an epoch, shuffled with ``seed``."""
    order = list(range(samples))
    random.Random(seed).shuffle(order)
    return [order[i:i + batch_size] for i in range(0, samples, batch_size)]


def train_step(model, data: list[tuple], targets: torch.Tensor, chosen: list[int], optimizer) -> None:
    """One SGD step on the samples ``chosen`` of ``data``; ``model`` takes a list of samples."""
    outputs = model([data[j] for j in chosen])
    loss = sum(((out.mean() - targets[j]) ** 2 for out, j in zip(outputs, chosen)), torch.zeros(())) / len(chosen)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_epoch(model, data: list[tuple], targets: torch.Tensor, batch_size: int, optimizer, seed: int) -> float:
    """One epoch of SGD over shuffled mini-batches; ``model`` takes a list of samples. Returns seconds."""
    start = time.perf_counter()
    for chosen in batches(len(data), batch_size, seed):
        train_step(model, data, targets, chosen, optimizer)
    if targets.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main(kind: str = "treelstm", samples: int = 400, batch_size: int = 25, epochs: int = 3) -> dict:
    import copy

    import dynamo_relational

    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = dataset(kind, samples)
    targets = torch.randn(samples)
    eager = MODELS[kind][0](data[0][1].shape[1])
    model = copy.deepcopy(eager)
    batched = dynamo_relational.batch(model)
    run_eager = lambda samples: [eager(*s) for s in samples]   # noqa: E731
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (eager, model)]
    times = []
    for epoch in range(epochs):
        eager_s = train_epoch(run_eager, data, targets, batch_size, optimizers[0], epoch)
        batched_s = train_epoch(batched, data, targets, batch_size, optimizers[1], epoch)
        diff = max((a - b).abs().max().item() for a, b in zip(eager.parameters(), model.parameters()))
        times.append((eager_s, batched_s))
        print(f"epoch {epoch}: eager {eager_s:.2f} s, batched {batched_s:.2f} s ({eager_s / batched_s:.1f}x); "
              f"largest weight difference {diff:.1e}")
    print(batched.report)
    return {"times": times, "weight_diff": diff, "report": batched.report}


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "treelstm", *(int(a) for a in args[1:4]))
