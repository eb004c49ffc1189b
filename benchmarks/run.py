"""The benchmark suite's command line: ``python -m benchmarks [--quick] [options]``.

For every workload (``benchmarks.workloads.QUICK``, ``FULL`` or ``sweep(...)``, or
``--workloads``): one session in this process with the uncapped systems (eager,
the fast front-end, PyG, PyG under torch.compile), interleaved; then one capped
child per Dynamo-traced system (stock torch.compile and ``backend="relational"``
on the scalar model) with PyG eager (or, without a PyG peer, eager) as its
in-process reference. Results are written after every workload to
``OUT/results.json`` and ``OUT/results.md`` (and, for a sweep, ``OUT/scaling.png``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from benchmarks import report
from benchmarks.session import run_session
from benchmarks.systems import CAPPED, SYSTEMS, available, has_fast_frontend
from benchmarks.worker import run_capped
from benchmarks.workloads import FULL, QUICK, Workload, sweep


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small subsets: a few minutes in all")
    parser.add_argument("--sweep", type=float, metavar="MAX_NEURONS",
                        help="scaling sweep instead: the GCN on 1e3, 1e4, ... MAX_NEURONS neurons, plotted to "
                             "OUT/scaling.png")
    parser.add_argument("--workloads", help="comma-separated workload names, e.g. gcn/mutagenesis,gin/enzymes[20]"
                                            ",tree_lstm/10x100 (default: the quick or the full list)")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}")
    parser.add_argument("--runs", type=int, default=10, help="timed runs per system (medians are reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds before the timed ones")
    parser.add_argument("--cap", type=float, default=None,
                        help="compile-time cap in seconds for Dynamo-traced systems (default 30 quick, 900 full)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for every system (default: torch's)")
    parser.add_argument("--options", type=json.loads, default={},
                        help='backend options of the relational systems as JSON, e.g. \'{"scheduler": "asap"}\'')
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Run the suite; returns (and writes) the results."""
    args = parse_args(argv)
    from tqdm import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is available")
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        sys.exit(f"unknown systems {unknown}; expected some of {SYSTEMS}")
    if args.workloads:
        workloads = [Workload.parse(n) for n in args.workloads.split(",")]
    else:
        workloads = list(sweep(args.sweep) if args.sweep else QUICK if args.quick else FULL)
    if args.cap is None:
        args.cap = 30.0 if args.quick else 900.0
    meta = report.environment(dict(mode="sweep" if args.sweep else "quick" if args.quick else "full",
                                   device=args.device, runs=args.runs, warmup=args.warmup, cap_s=args.cap,
                                   systems=systems, options=args.options, fast_frontend=has_fast_frontend()))
    results = dict(meta=meta, workloads=[])
    bar = tqdm(workloads, desc="workloads", file=sys.stderr)
    for workload in bar:
        results["workloads"].append(measure_workload(workload, systems, args, bar.set_postfix_str))
        meta["load_average_end"] = os.getloadavg()
        report.write(results, args.out)
    if args.sweep:
        from benchmarks.plots import plot_scaling
        print(f"plot: {plot_scaling(results, args.out)}", file=sys.stderr)
    print(report.markdown(results))
    print(f"written: {args.out / 'results.json'}, {args.out / 'results.md'}", file=sys.stderr)
    return results


def measure_workload(workload: Workload, systems: list[str], args: argparse.Namespace, status) -> dict:
    """The uncapped systems in this process, then each capped system in its own child."""
    from tqdm import tqdm

    status(workload.name)
    here = [s for s in systems if s not in CAPPED and available(s, workload.has_peer)]
    session = run_session(workload, here, runs=args.runs, warmup=args.warmup, device=args.device,
                          options=args.options,
                          progress=lambda rounds: tqdm(rounds, desc=f"{workload.name}: timing", leave=False,
                                                       file=sys.stderr))
    for entry in session["systems"].values():
        entry["session"] = "main"
    # the child times its capped system against PyG (and PyG compiled, when asked for) or eager
    references = (["pyg"] + (["pyg_compile"] if "pyg_compile" in systems else [])) if workload.has_peer else ["eager"]
    for system in (s for s in systems if s in CAPPED):
        status(f"{workload.name}: {system} (child, cap {args.cap:g} s)")
        child = run_capped(workload, system, references, runs=args.runs,
                           warmup=args.warmup, device=args.device, cap_s=args.cap, options=args.options)
        entry = session["systems"][system] = child["systems"][system]
        entry["session"] = "child"
        entry["child_references"] = {ref: {k: v for k, v in e.items() if k.endswith("_ms")}
                                     for ref, e in child["systems"].items() if ref != system}
    ordered = {s: session["systems"][s] for s in SYSTEMS if s in session["systems"]}
    return dict(name=workload.name, size=session["size"], systems=ordered)


if __name__ == "__main__":
    main()
