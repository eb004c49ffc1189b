"""Idioms of per-neuron code beyond plain arithmetic, each compiled and eager, on one graph batch.

    python -m benchmarks.idioms [--graphs 20] [--idioms masks,attention,...] [--threads 1] [--repeats 20]
                                [--no-inductor] [--device cuda]

Each idiom is a small one-layer model written one neuron at a time over a
Mutagenesis-shaped batch (``--graphs`` graphs): ``nn.ReLU(inplace=True)``
and ``nn.Dropout`` in eval mode; masks from comparisons and
``&`` with ``masked_fill`` and casts; LSTM-style gates split with ``chunk``;
GAT attention (``softmax`` over the stacked neighbour scores); ``LayerNorm``;
a gated-graph ``nn.GRUCell`` update; an ``nn.LSTMCell`` update; bilinear ``einsum`` messages; type
embeddings looked up with ``emb(torch.tensor(t))``; feature slices
``x[v, :4]``, ``x[u, 4:]``; and a GCN-style sum of scaled messages whose neurons without
in-neighbours keep their own scaled message (a readout mixing two groups); max pooling of the stacked
messages with ``torch.max(messages, 0)[0]``; PNA-style mean, max and standard deviation of them; rows
read two-dimensional, ``self.lin(x[v:v + 1])``; and a loss at every neuron, ``F.cross_entropy`` of its
messages averaged by hand and its label.
Each is compiled with ``dynamo_relational.compile`` (Inductor, the default
options; ``--no-inductor`` runs the grouped graph as it is, for a quick check) on ``--device``
(the models build their constants on the input's device). Printed per idiom: FX nodes before and
after grouping, nodes left ungrouped, the compile time, the median forward times under ``no_grad`` of
the compiled and the eager model (measured in turns in one process), their
ratio, and the largest difference of the outputs.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from examples.common import interleaved_medians_ms
from examples.data import GraphBatch, graph_batch

WIDTH = 8


class _PerNeuron(nn.Module):
    """A model over ``batch``'s graph: ``in_nbrs[v]`` lists the neurons whose messages ``v`` reads."""

    def __init__(self, batch: GraphBatch):
        super().__init__()
        self.in_nbrs = [[] for _ in range(batch.num_nodes)]
        for u, v in batch.edges:
            self.in_nbrs[v].append(u)
        self.lin = nn.Linear(batch.x.shape[1], WIDTH)


class InPlaceReLU(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.act = nn.ReLU(inplace=True)
        self.drop = nn.Dropout(0.5)
        self.eval()   # dropout is the identity: inference

    def forward(self, x):
        return torch.stack([self.drop(self.act(sum((self.lin(x[u]) for u in nbrs), self.lin(x[v]))))
                            for v, nbrs in enumerate(self.in_nbrs)])


class Masks(_PerNeuron):
    def forward(self, x):
        out = []
        for v, nbrs in enumerate(self.in_nbrs):
            own = self.lin(x[v])
            h = sum((self.lin(x[u]) for u in nbrs), own)
            mask = (h > 0) & (own < 1)
            out.append(torch.where(mask, h, -h) * mask.to(h.dtype) + h.masked_fill(~mask, 0.5))
        return torch.stack(out)


class ChunkedGates(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.gates = nn.Linear(batch.x.shape[1], 4 * WIDTH)

    def forward(self, x):
        out = []
        for v, nbrs in enumerate(self.in_nbrs):
            i, f, o, u = self.gates(sum((x[u] for u in nbrs), x[v])).chunk(4)
            c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f)
            out.append(torch.sigmoid(o) * torch.tanh(c))
        return torch.stack(out)


class Attention(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.att = nn.Parameter(torch.randn(2 * WIDTH))

    def forward(self, x):
        h = [self.lin(x[v]) for v in range(len(self.in_nbrs))]
        out = []
        for v, nbrs in enumerate(self.in_nbrs):
            sources = nbrs + [v]
            scores = torch.stack([F.leaky_relu(torch.dot(self.att, torch.cat([h[v], h[u]])), 0.2) for u in sources])
            weights = torch.softmax(scores, 0)
            out.append(torch.relu(sum(weights[i] * h[u] for i, u in enumerate(sources))))
        return torch.stack(out)


class Normalized(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x):
        return torch.stack([self.norm(torch.relu(self.lin(sum((x[u] for u in nbrs), x[v]))))
                            for v, nbrs in enumerate(self.in_nbrs)])


class GatedUpdate(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.message = nn.Linear(WIDTH, WIDTH)
        self.gru = nn.GRUCell(WIDTH, WIDTH)

    def forward(self, x):
        h = [self.lin(x[v]) for v in range(len(self.in_nbrs))]
        return torch.stack([self.gru(sum((self.message(h[u]) for u in nbrs), x.new_zeros(WIDTH)), h[v])
                            for v, nbrs in enumerate(self.in_nbrs)])


class LstmUpdate(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.message = nn.Linear(WIDTH, WIDTH)
        self.cell = nn.LSTMCell(WIDTH, WIDTH)

    def forward(self, x):
        h = [self.lin(x[v]) for v in range(len(self.in_nbrs))]
        states = [self.cell(sum((self.message(h[u]) for u in nbrs), h[v]).unsqueeze(0))
                  for v, nbrs in enumerate(self.in_nbrs)]
        return torch.stack([(hy + cy)[0] for hy, cy in states])


class Bilinear(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.B = nn.Parameter(torch.randn(WIDTH, WIDTH, WIDTH) / WIDTH)

    def forward(self, x):
        h = [self.lin(x[v]) for v in range(len(self.in_nbrs))]
        return torch.stack([sum((torch.einsum("i,ijk,k->j", h[v], self.B, h[u]) for u in nbrs), h[v])
                            for v, nbrs in enumerate(self.in_nbrs)])


class TypeEmbeddings(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.types = [int(row[:4].argmax()) for row in batch.x]   # a node type from the features: Python data
        self.emb = nn.Embedding(4, WIDTH)

    def forward(self, x):
        h = [self.lin(x[v]) + self.emb(torch.tensor(self.types[v], device=x.device))
             for v in range(len(self.in_nbrs))]
        return torch.stack([torch.relu(sum((h[u] for u in nbrs), h[v])) for v, nbrs in enumerate(self.in_nbrs)])


class FeatureSlices(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.first = nn.Linear(4, WIDTH)
        self.second = nn.Linear(batch.x.shape[1] - 4, WIDTH)

    def forward(self, x):
        return torch.stack([torch.relu(self.first(x[v, :4]) + sum((self.second(x[u, 4:]) for u in nbrs),
                                                                    x.new_zeros(WIDTH)))
                            for v, nbrs in enumerate(self.in_nbrs)])


class MaxPool(_PerNeuron):
    def forward(self, x):
        out = []
        for v, nbrs in enumerate(self.in_nbrs):
            messages = torch.stack([torch.relu(self.lin(x[u])) for u in nbrs + [v]])
            out.append(torch.max(messages, 0)[0])   # GraphSAGE's max pooling, as it is often written
        return torch.stack(out)


class Statistics(_PerNeuron):
    def forward(self, x):
        out = []
        for v, nbrs in enumerate(self.in_nbrs):
            messages = torch.stack([self.lin(x[u]) for u in nbrs + [v]])
            spread = messages.std(0, unbiased=False)
            out.append(torch.cat([messages.mean(0), messages.max(dim=0).values, spread]))   # PNA's aggregators
        return torch.stack(out)


class LoneNeurons(_PerNeuron):
    def forward(self, x):
        degree = [len(nbrs) + 1 for nbrs in self.in_nbrs]
        out = []
        for v, nbrs in enumerate(self.in_nbrs):
            scaled = [self.lin(x[u]) / (degree[u] * degree[v]) ** 0.5 for u in nbrs + [v]]
            out.append(sum(scaled[1:], scaled[0]) if nbrs else scaled[0])
        return torch.stack(out)


class RowSlices(_PerNeuron):
    def forward(self, x):   # each neuron's row read two-dimensional, as often written for nn.Linear
        return torch.cat([torch.relu(sum((self.lin(x[u:u + 1]) for u in nbrs), self.lin(x[v:v + 1])))
                          for v, nbrs in enumerate(self.in_nbrs)])


class NodeLosses(_PerNeuron):
    def __init__(self, batch: GraphBatch):
        super().__init__(batch)
        self.register_buffer("labels", torch.tensor([int(row[:4].argmax()) for row in batch.x]))

    def forward(self, x):   # a loss at every neuron, of its messages averaged by hand
        return sum(F.cross_entropy(sum((self.lin(x[u]) for u in nbrs), self.lin(x[v])) / (len(nbrs) + 1),
                                   self.labels[v]) for v, nbrs in enumerate(self.in_nbrs))


IDIOMS = {"inplace_relu": InPlaceReLU, "masks": Masks, "chunked_gates": ChunkedGates, "attention": Attention,
          "layer_norm": Normalized, "gru_update": GatedUpdate, "lstm_update": LstmUpdate, "einsum": Bilinear,
          "embeddings": TypeEmbeddings, "feature_slices": FeatureSlices, "lone_neurons": LoneNeurons,
          "max_pool": MaxPool, "statistics": Statistics, "row_slices": RowSlices, "node_losses": NodeLosses}


def measure(name: str, graphs: int, repeats: int, inductor: bool = True, device: str = "cpu") -> dict:
    import dynamo_relational

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs)
    model, x = IDIOMS[name](batch).to(device), batch.x.to(device)
    synchronize = torch.cuda.synchronize if x.is_cuda else (lambda: None)   # time the kernels, not their launch
    start = time.perf_counter()
    compiled = dynamo_relational.compile(model, x, progress=False, inductor=inductor)
    compile_s = time.perf_counter() - start
    report = compiled.report.graphs[0]
    with torch.no_grad():
        times = interleaved_medians_ms({"compiled": lambda: (compiled(x), synchronize()),
                                        "eager": lambda: (model(x), synchronize())}, repeats)
        diff = (compiled(x) - model(x)).abs().max().item()
    return dict(idiom=name, nodes_before=report.nodes_before, nodes_after=report.nodes_after,
                ungrouped=sum(report.ungrouped.values()), compile_s=compile_s, compiled_ms=times["compiled"],
                eager_ms=times["eager"], ratio=times["compiled"] / times["eager"], max_abs_diff=diff)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=20)
    parser.add_argument("--idioms", default=",".join(IDIOMS), help=f"comma-separated subset of {', '.join(IDIOMS)}")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-inductor", action="store_true", help="run the grouped graph without Inductor")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = parser.parse_args(argv)
    names = [n for n in args.idioms.split(",") if n]
    unknown = [n for n in names if n not in IDIOMS]
    if unknown:
        parser.error(f"unknown idioms {unknown}; choose from {', '.join(IDIOMS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    print("| idiom | FX nodes before -> after | left ungrouped | compile [s] | compiled [ms] | eager [ms] "
          "| compiled / eager | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        r = measure(name, args.graphs, args.repeats, inductor=not args.no_inductor, device=args.device)
        rows.append(r)
        print(f"| {name} | {r['nodes_before']:,} -> {r['nodes_after']:,} | {r['ungrouped']:,} | {r['compile_s']:.1f} "
              f"| {r['compiled_ms']:.2f} | {r['eager_ms']:.2f} | {r['ratio']:.3f} | {r['max_abs_diff']:.1e} |",
              flush=True)
    return rows


if __name__ == "__main__":
    main()
