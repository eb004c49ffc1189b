"""Training with per-neuron dropout: dropout kept in eager's order against the ``group_dropout`` option.

    python -m benchmarks.dropout [--graphs 20] [--threads 1] [--repeats 20] [--no-inductor]

A scalar GCN over a Mutagenesis-shaped batch (``--graphs`` graphs) whose every
neuron applies ``F.dropout(h, 0.5, self.training)``, trained (forward, backward)
eagerly and compiled with ``dynamo_relational.compile``: once with the default
options (each dropout draws eager's numbers in eager's order, ungrouped) and
once with ``group_dropout=True`` (one mask per group). ``--no-inductor`` runs
the grouped graphs as they are, for a quick check. Printed per variant: FX
nodes before and after grouping, nodes left ungrouped, the compile time, the
median time of a training step (forward and backward; the three variants take
turns in one process) and its ratio to eager's.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

from examples.common import interleaved_medians_ms
from examples.data import GraphBatch, graph_batch


class DroppedGCN(nn.Module):
    """Two GCN layers, dropout on every neuron of each, mean-pooled per graph."""

    def __init__(self, batch: GraphBatch, hidden: int = 16, p: float = 0.5):
        super().__init__()
        self.in_nbrs, self.graphs, self.p = batch.in_neighbors(), batch.nodes_of_graph(), p
        self.convs = nn.ModuleList([nn.Linear(batch.x.shape[1], hidden), nn.Linear(hidden, hidden)])

    def forward(self, x):
        h = [x[v] for v in range(x.shape[0])]
        for conv in self.convs:
            h = [F.dropout(torch.relu(sum((conv.weight @ h[u] for u in nbrs), conv.bias)), self.p, self.training)
                 for nbrs in self.in_nbrs]
        return torch.stack([torch.stack([h[v] for v in nodes]).mean(0) for nodes in self.graphs])


def main(argv: list[str] | None = None) -> list[dict]:
    import dynamo_relational

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-inductor", action="store_true", help="run the grouped graphs without Inductor")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", args.graphs)
    model, x = DroppedGCN(batch), batch.x
    variants, rows = {"eager": (model, None)}, []
    for name, options in (("in eager's order", {}), ("group_dropout", {"group_dropout": True})):
        start = time.perf_counter()
        compiled = dynamo_relational.compile(model, x, progress=False, inductor=not args.no_inductor, **options)
        variants[name] = (compiled, time.perf_counter() - start)

    def step(fn):
        return lambda: fn(x).sum().backward()

    times = interleaved_medians_ms({name: step(fn) for name, (fn, _) in variants.items()}, args.repeats)
    print("| variant | FX nodes before -> after | left ungrouped | compile [s] | training step [ms] | step / eager |")
    print("|---|---|---|---|---|---|")
    for name, (fn, compile_s) in variants.items():
        report = fn.report.graphs[0] if compile_s is not None else None
        row = dict(variant=name, step_ms=times[name], ratio=times[name] / times["eager"], compile_s=compile_s,
                   nodes_before=report.nodes_before if report else None,
                   nodes_after=report.nodes_after if report else None,
                   ungrouped=sum(report.ungrouped.values()) if report else None)
        rows.append(row)
        nodes = f"{row['nodes_before']:,} -> {row['nodes_after']:,}" if report else "-"
        print(f"| {name} | {nodes} | {row['ungrouped'] if report else '-'} | "
              f"{'-' if compile_s is None else f'{compile_s:.1f}'} | {row['step_ms']:.2f} | {row['ratio']:.3f} |",
              flush=True)
    return rows


if __name__ == "__main__":
    main()
