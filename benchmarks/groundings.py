"""Compile time of new groundings: shared compiled code (schema reuse) vs compiling each one.

    python -m benchmarks.groundings [--graphs N] [--groundings K] [--model gcn|sage|gin] [--threads T]

Builds ``K`` Mutagenesis-shaped batches of ``N``, ``N + 5``, ``N + 10``, ...
graphs with different seeds (other molecules: other sizes and index tensors;
the same weights), compiles each with ``dynamo_relational.compile`` twice in
one process, once with ``reuse_compiled=False`` (every batch compiles for its
own sizes) and once with ``reuse_compiled=True`` (the default: the first
batch gets static code, the second compiles code with dynamic sizes, the
later ones reuse it), and prints per batch the compile time, the forward and
forward+backward times of both, and the largest difference from eager.
Medians over batches 3..K are the saving. Inductor's on-disk caches are off
(``--disk-cache`` keeps them), so every compile is a real one.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from examples.common import median_ms

MODELS = {"gcn": ("examples.gcn", "ScalarGCN"), "sage": ("examples.sage", "ScalarSAGE"),
          "gin": ("examples.gin", "ScalarGIN")}


def _build(model: str, batch):
    import importlib

    module, name = MODELS[model]
    return getattr(importlib.import_module(module), name)(batch, batch.x.shape[1])


def _train_step_ms(fn, x: torch.Tensor) -> float:
    leaf = x.clone().requires_grad_()
    return median_ms(lambda: fn(leaf).sum().backward(), repeats=5)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=94, help="graphs per batch (default: half of Mutagenesis)")
    parser.add_argument("--groundings", type=int, default=4)
    parser.add_argument("--model", choices=sorted(MODELS), default="gcn")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--disk-cache", action="store_true", help="keep Inductor's on-disk caches on")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.disk_cache:
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
        inductor_config.autotune_local_cache = False

    import dynamo_relational
    from dynamo_relational.schemas import SCHEMAS
    from examples.data import graph_batch

    torch.manual_seed(0)
    first = _build(args.model, graph_batch("mutagenesis", args.graphs, seed=0))
    rows = []
    for seed in range(args.groundings):
        batch = graph_batch("mutagenesis", args.graphs + 5 * seed, seed=seed)
        model = _build(args.model, batch)
        model.load_state_dict(first.state_dict())
        row = {"batch": seed, "nodes": batch.num_nodes, "edges": len(batch.edges)}
        expected = model(batch.x)
        for reuse in (False, True):
            start = time.perf_counter()
            compiled = dynamo_relational.compile(model, batch.x, reuse_compiled=reuse)
            compiled(batch.x)
            name = "reuse" if reuse else "own"
            row[f"{name}_compile_s"] = time.perf_counter() - start
            with torch.no_grad():
                row[f"{name}_fwd_ms"] = median_ms(lambda: compiled(batch.x))
            row[f"{name}_train_ms"] = _train_step_ms(compiled, batch.x)
            row[f"{name}_diff"] = (compiled(batch.x) - expected).abs().max().item()
        rows.append(row)
        print(f"batch {seed} ({row['nodes']} nodes, {row['edges']} edges): compile {row['reuse_compile_s']:.1f} s "
              f"with reuse / {row['own_compile_s']:.1f} s without; forward {row['reuse_fwd_ms']:.2f} / "
              f"{row['own_fwd_ms']:.2f} ms; forward+backward {row['reuse_train_ms']:.2f} / "
              f"{row['own_train_ms']:.2f} ms; max |compiled - eager| {row['reuse_diff']:.1e} / {row['own_diff']:.1e}",
              flush=True)
    later = rows[2:]   # batch 0 gets static code, batch 1 compiles the shared code
    if later:
        reuse = statistics.median(r["reuse_compile_s"] for r in later)
        own = statistics.median(r["own_compile_s"] for r in later)
        print(f"later groundings (median of batches 2..{len(rows) - 1}): compile {reuse:.1f} s with reuse vs "
              f"{own:.1f} s without ({own / reuse:.1f}x less); schemas cached: {len(SCHEMAS)}")
    return {"rows": rows}


if __name__ == "__main__":
    main()
