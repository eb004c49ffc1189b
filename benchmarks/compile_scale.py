"""Compile time and memory of the fast front-end as the scalar graph grows, up to millions of FX nodes.

    python -m benchmarks.compile_scale [--graphs 188 940 4700] [--no-inductor] [--repeats N] [--floor]

For the scalar GCN on Mutagenesis-shaped batches of the given numbers of
graphs (188 is Mutagenesis, about 40,000 FX nodes; 4,700 is about a million),
one process per size (so peak memory is that size's own): compile with
``dynamo_relational.compile`` and print the FX nodes before and after
grouping, the time of tracing (values included) and of the grouping passes,
the passes' throughput in FX nodes per second, the peak resident memory the
compile added over the built model (per ungrouped FX node), and the total
compile time including Inductor; then each required pass's time per
ungrouped FX node (the optional optimizer passes, which run on the small
grouped graph, together). With ``--repeats N`` each size is compiled N
times in its process and the times are medians (this machine's timings vary by
a third from run to run); memory is the first compile's. Later compiles reuse
the process's caches (``linear_layout``'s measured products, Inductor's code),
so the medians leave those one-off costs out. With ``--floor`` each compile
first times :mod:`benchmarks.pass_floor` on the traced graph (an estimate of the
least work per FX node that grouping needs, in Python, rewriting nothing) and prints it
beside the passes, with the FX nodes per second it allows at most (peak
memory then includes the floor's tables, freed before the passes run).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

from dynamo_relational.passes import OPTIONAL_PASSES, PIPELINE


#: the passes every compile runs (most see every FX node); the others are the optimizer's
REQUIRED_PASSES = tuple(p.name for p in PIPELINE if p.name not in OPTIONAL_PASSES)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: kB


def measure(graphs: int, inductor: bool, repeats: int = 1, floor: bool = False) -> dict:
    import torch

    import dynamo_relational
    import dynamo_relational.passes
    from benchmarks import pass_floor
    from examples.data import graph_batch
    from examples.gcn import ScalarGCN

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs)
    model = ScalarGCN(batch, batch.x.shape[1])
    pipeline = dynamo_relational.passes.PIPELINE
    if floor:   # an extra first pass: it reads the traced graph and leaves it as it is
        walk = dynamo_relational.passes.Pass(pass_floor.NAME, pass_floor.run, "the floor: one walk over the nodes")
        dynamo_relational.passes.PIPELINE = (walk, *pipeline)
    try:
        before = _peak_mb()
        runs = []
        for i in range(repeats):
            start = time.perf_counter()
            compiled = dynamo_relational.compile(model, batch.x, inductor=inductor)
            total = time.perf_counter() - start
            timings = compiled.report.graphs[0].timings
            passes = {name: t for name, t in timings.items()
                      if name not in ("trace", "values", "inductor", "autotune", pass_floor.NAME)}
            runs.append(dict(trace_s=timings["trace"] + timings["values"], inductor_s=timings.get("inductor", 0.0),
                             passes_s=sum(passes.values()), total_s=total,
                             **{f"{name}_s": passes.get(name, 0.0) for name in REQUIRED_PASSES},
                             optimizer_s=sum(t for name, t in passes.items() if name not in REQUIRED_PASSES),
                             floor_s=timings.get(pass_floor.NAME, 0.0)))
            if i == 0:   # the first compile's: later ones run beside its result
                peak_added = _peak_mb() - before
    finally:
        dynamo_relational.passes.PIPELINE = pipeline
    report = compiled.report.graphs[0]
    with torch.no_grad():
        diff = (compiled(batch.x) - model(batch.x)).abs().max().item()
    return dict(graphs=graphs, neurons=batch.num_nodes, edges=len(batch.edges), nodes_before=report.nodes_before,
                nodes_after=report.nodes_after, peak_added_mb=peak_added, max_abs_diff=diff, repeats=repeats,
                floor_counts=report.stats.get("floor"),
                **{key: statistics.median(run[key] for run in runs) for key in runs[0]})


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, nargs="+", default=[188, 940, 4700])
    parser.add_argument("--no-inductor", action="store_true", help="stop after grouping (inductor=False)")
    parser.add_argument("--repeats", type=int, default=1, help="compiles per size; times are medians")
    parser.add_argument("--floor", action="store_true",
                        help="also time the least Python work per FX node that grouping needs (benchmarks.pass_floor)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.child is not None:
        print(json.dumps(measure(args.child, not args.no_inductor, args.repeats, args.floor)))
        return []
    print("| graphs | FX nodes before -> after | trace + values [s] | passes [s] | passes [FX nodes/s] "
          "| peak memory added [MB] | per FX node [KB] | Inductor [s] | total [s] | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for graphs in args.graphs:
        cmd = [sys.executable, "-m", "benchmarks.compile_scale", "--child", str(graphs), "--repeats", str(args.repeats)]
        cmd += ["--no-inductor"] * args.no_inductor + ["--floor"] * args.floor
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(r)
        print(f"| {r['graphs']} | {r['nodes_before']:,} -> {r['nodes_after']} | {r['trace_s']:.1f} | "
              f"{r['passes_s']:.1f} | {r['nodes_before'] / r['passes_s']:,.0f} | {r['peak_added_mb']:,.0f} | "
              f"{r['peak_added_mb'] * 1024 / r['nodes_before']:.2f} | {r['inductor_s']:.1f} | {r['total_s']:.1f} | "
              f"{r['max_abs_diff']:.1e} |", flush=True)
    columns = (*REQUIRED_PASSES, "optimizer")
    print("\nPer pass, microseconds per ungrouped FX node (optimizer: the optional passes together):\n")
    print("| graphs | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for r in rows:
        print(f"| {r['graphs']} | " + " | ".join(f"{r[name + '_s'] / r['nodes_before'] * 1e6:.2f}" for name in columns)
              + " |")
    if args.floor:
        print("\nThe floor (benchmarks/pass_floor.py: read each node once, merge duplicates and sums, signatures and "
              "levels, rewriting nothing):\n")
        print("| graphs | floor [us/FX node] | passes [us/FX node] | passes / floor | FX nodes/s at the floor |")
        print("|---|---|---|---|---|")
        for r in rows:
            floor, passes = (r[key] / r["nodes_before"] * 1e6 for key in ("floor_s", "passes_s"))
            print(f"| {r['graphs']} | {floor:.2f} | {passes:.2f} | {passes / floor:.1f} | {1e6 / floor:,.0f} |")
    return rows


if __name__ == "__main__":
    main()
