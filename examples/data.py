"""Seeded synthetic graph batches with the totals of the thesis' data sets (DESIGN.md §6).

No download happens: the generator reproduces the number of graphs, nodes,
edges and node features of Mutagenesis, ENZYMES and PROTEINS, with random
structure inside each graph.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

#: name -> (graphs, nodes, edges, node features)
SHAPES = {
    "mutagenesis": (188, 3371, 7442, 7),
    "enzymes": (600, 19580, 74564, 3),
    "proteins": (1113, 34471, 162088, 3),
}


@dataclass
class GraphBatch:
    x: torch.Tensor                 # [num_nodes, features]
    edges: list[tuple[int, int]]    # directed (source, target)
    graph_of: list[int]             # graph id of every node
    num_graphs: int

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]

    def in_neighbors(self) -> list[list[int]]:
        nbrs: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for u, v in self.edges:
            nbrs[v].append(u)
        return nbrs

    def nodes_of_graph(self) -> list[list[int]]:
        members: list[list[int]] = [[] for _ in range(self.num_graphs)]
        for v, g in enumerate(self.graph_of):
            members[g].append(v)
        return members

    def edge_index(self) -> torch.Tensor:
        return torch.tensor(self.edges, dtype=torch.long).t().contiguous()


def graph_batch(name: str = "mutagenesis", graphs: int | None = None, seed: int = 0,
                dtype: torch.dtype = torch.float32) -> GraphBatch:
    """A batch shaped like data set ``name``; ``graphs`` keeps only that many graphs
    (with proportional node and edge totals), for small tests."""
    total_graphs, total_nodes, total_edges, features = SHAPES[name]
    rng = random.Random(seed)
    g = graphs or total_graphs
    nodes = round(total_nodes * g / total_graphs)
    edges = round(total_edges * g / total_graphs)
    sizes = _split(nodes, g, rng, minimum=2)
    edge_counts = _split(edges, g, rng, weights=sizes)
    graph_of, edge_list, start = [], [], 0
    for gid, (size, count) in enumerate(zip(sizes, edge_counts)):
        graph_of += [gid] * size
        for _ in range(count):
            u = rng.randrange(size)
            v = (u + 1 + rng.randrange(size - 1)) % size
            edge_list.append((start + u, start + v))
        start += size
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, features, generator=gen).to(dtype)
    return GraphBatch(x, edge_list, graph_of, g)


def _split(total: int, parts: int, rng: random.Random, minimum: int = 0, weights=None) -> list[int]:
    """``parts`` positive-ish integers summing to ``total``, randomly around the mean (or ``weights``)."""
    weights = weights or [rng.uniform(0.5, 1.5) for _ in range(parts)]
    scale = (total - minimum * parts) / sum(weights)
    sizes = [minimum + int(w * scale) for w in weights]
    for i in range(total - sum(sizes)):
        sizes[i % parts] += 1
    return sizes


def random_forest(trees: int, nodes: int, seed: int = 0) -> list[list[list[int]]]:
    """``trees`` random rooted trees with ``nodes`` nodes in all: children lists per tree,
    node 0 the root, every child numbered after its parent."""
    rng = random.Random(seed)
    forest = []
    for size in _split(nodes, trees, rng, minimum=1):
        children: list[list[int]] = [[] for _ in range(size)]
        for v in range(1, size):
            children[rng.randrange(max(1, v - 3), v) if v > 1 else 0].append(v)
        forest.append(children)
    return forest


def random_binary_forest(trees: int, leaves: int, seed: int = 0) -> list[list[list[int]]]:
    """``trees`` random full binary trees of ``leaves`` leaves each (pairs merged at random, as a parser
    builds them): children lists per tree, node 0 the root, every child numbered after its parent."""
    rng = random.Random(seed)
    forest = []
    for _ in range(trees):
        children: dict[int, list[int]] = {}
        pool = list(range(leaves))
        while len(pool) > 1:
            pair = rng.sample(pool, 2)
            for v in pair:
                pool.remove(v)
            children[leaves + len(children)] = pair
            pool.append(leaves + len(children) - 1)
        order = [pool[0]]   # breadth first from the root: children after their parent
        for v in order:
            order += children.get(v, [])
        number = {v: i for i, v in enumerate(order)}
        forest.append([[number[c] for c in children.get(v, [])] for v in order])
    return forest
