"""A recurrent cell over the rows of an input, compiled and eager: a chain that grouping cannot batch.

    python -m benchmarks.recurrent [--rows 3371] [--steps 200] [--width 8] [--threads 1] [--repeats 30]

``h = tanh(W h + x[t])`` for ``steps`` steps, reading the rows of ``x`` (``rows``
rows, Mutagenesis' node count by default) in a stride-17 cycle. Only the reads of
``x`` group; every step is its own node. The model is compiled with
``dynamo_relational.compile`` (Inductor, the default options). Printed: FX nodes
before and after grouping, the compile time, the median forward time under
``no_grad`` of the compiled and the eager model (measured in turns in one
process), their ratio, and the largest difference of the outputs.
"""
from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from examples.common import interleaved_medians_ms


class RecurrentCell(nn.Module):
    def __init__(self, steps: int, width: int):
        super().__init__()
        self.steps = steps
        self.cell = nn.Linear(width, width)

    def forward(self, x):
        h = x[0]
        for step in range(self.steps):
            h = torch.tanh(self.cell(h) + x[(step * 17) % x.shape[0]])
        return h


def measure(rows: int, steps: int, width: int, repeats: int) -> dict:
    import dynamo_relational

    torch.manual_seed(0)
    model, x = RecurrentCell(steps, width), torch.randn(rows, width)
    start = time.perf_counter()
    compiled = dynamo_relational.compile(model, x, progress=False)
    compile_s = time.perf_counter() - start
    report = compiled.report.graphs[0]
    with torch.no_grad():
        times = interleaved_medians_ms({"compiled": lambda: compiled(x), "eager": lambda: model(x)}, repeats)
        diff = (compiled(x) - model(x)).abs().max().item()
    return dict(nodes_before=report.nodes_before, nodes_after=report.nodes_after, compile_s=compile_s,
                compiled_ms=times["compiled"], eager_ms=times["eager"], ratio=times["compiled"] / times["eager"],
                max_abs_diff=diff)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3371)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    r = measure(args.rows, args.steps, args.width, args.repeats)
    print(f"{args.steps} steps of width {args.width} over {args.rows} rows, float32; forward medians under no_grad")
    print("| FX nodes before -> after | compile [s] | compiled [ms] | eager [ms] | compiled / eager | max abs diff |")
    print("|---|---|---|---|---|---|")
    print(f"| {r['nodes_before']:,} -> {r['nodes_after']:,} | {r['compile_s']:.1f} | {r['compiled_ms']:.3f} | "
          f"{r['eager_ms']:.3f} | {r['ratio']:.2f} | {r['max_abs_diff']:.1e} |")
    return r


if __name__ == "__main__":
    main()
