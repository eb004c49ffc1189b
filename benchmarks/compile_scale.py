"""Compile time and memory of the fast front-end as the scalar graph grows, up to millions of FX nodes.

    python -m benchmarks.compile_scale [--graphs 188 940 4700] [--no-inductor]

For the scalar GCN on Mutagenesis-shaped batches of the given numbers of
graphs (188 is Mutagenesis, about 40,000 FX nodes; 4,700 is about a million),
one process per size (so peak memory is that size's own): compile with
``dynamo_relational.compile`` and print the FX nodes before and after
grouping, the time of tracing (values included) and of the grouping passes,
the passes' throughput in FX nodes per second, the peak resident memory the
compile added over the built model (per ungrouped FX node), and the total
compile time including Inductor.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: kB


def measure(graphs: int, inductor: bool) -> dict:
    import torch

    import dynamo_relational
    from examples.data import graph_batch
    from examples.gcn import ScalarGCN

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs)
    model = ScalarGCN(batch, batch.x.shape[1])
    before = _peak_mb()
    start = time.perf_counter()
    compiled = dynamo_relational.compile(model, batch.x, inductor=inductor)
    total = time.perf_counter() - start
    report = compiled.report.graphs[0]
    passes = sum(t for name, t in report.timings.items() if name not in ("trace", "values", "inductor", "autotune"))
    with torch.no_grad():
        diff = (compiled(batch.x) - model(batch.x)).abs().max().item()
    return dict(graphs=graphs, neurons=batch.num_nodes, edges=len(batch.edges), nodes_before=report.nodes_before,
                nodes_after=report.nodes_after, trace_s=report.timings["trace"] + report.timings["values"],
                passes_s=passes, inductor_s=report.timings.get("inductor", 0.0), total_s=total,
                peak_added_mb=_peak_mb() - before, max_abs_diff=diff)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, nargs="+", default=[188, 940, 4700])
    parser.add_argument("--no-inductor", action="store_true", help="stop after grouping (inductor=False)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(measure(args.child, not args.no_inductor)))
        return []
    print("| graphs | FX nodes before -> after | trace + values [s] | passes [s] | passes [FX nodes/s] "
          "| peak memory added [MB] | per FX node [KB] | Inductor [s] | total [s] | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for graphs in args.graphs:
        cmd = [sys.executable, "-m", "benchmarks.compile_scale", "--child", str(graphs)]
        if args.no_inductor:
            cmd.append("--no-inductor")
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(r)
        print(f"| {r['graphs']} | {r['nodes_before']:,} -> {r['nodes_after']} | {r['trace_s']:.1f} | "
              f"{r['passes_s']:.1f} | {r['nodes_before'] / r['passes_s']:,.0f} | {r['peak_added_mb']:,.0f} | "
              f"{r['peak_added_mb'] * 1024 / r['nodes_before']:.2f} | {r['inductor_s']:.1f} | {r['total_s']:.1f} | "
              f"{r['max_abs_diff']:.1e} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
