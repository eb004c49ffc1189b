"""What the rewrite search (passes/rewrite_search.py) gains: the same model compiled with and without it.

    python -m benchmarks.search [--graphs 188] [--threads 1] [--repeats 30]

For each model, compiles it twice with ``dynamo_relational.compile`` (the
search on, and ``disable=("rewrite_search",)``) and prints, measured side by
side in one process: the search's estimate before and after, its moves and
its compile time, and the median forward and forward+backward times of both
compilations with their ratio. Models: the sum-product layer of
``examples/sum_product.py`` in both written orders, narrowing (64 -> 4) and
widening (4 -> 64), and the GCN, GraphSAGE and GIN of the examples.
"""
from __future__ import annotations

import argparse

import torch

from examples.common import interleaved_medians_ms


def models(batch):
    from examples.sum_product import AggregateThenTransform, TransformThenAggregate
    from tests.helpers import BUILDERS

    for form in (AggregateThenTransform, TransformThenAggregate):
        for widths in ((64, 4), (4, 64)):
            yield f"{form.__name__} {widths[0]}->{widths[1]}", form(batch, *widths), widths[0]
    for name in ("gcn", "sage", "gin"):
        yield name, BUILDERS[name](batch), batch.x.shape[1]


def measure(name: str, model: torch.nn.Module, x: torch.Tensor, repeats: int) -> dict:
    import dynamo_relational

    x = x.detach().requires_grad_()
    compiled = {label: dynamo_relational.compile(model, [x], progress=False, **options)
                for label, options in (("search", {}), ("greedy", {"disable": ("rewrite_search",)}))}
    with torch.no_grad():
        forward = interleaved_medians_ms({label: (lambda fn=fn: fn(x)) for label, fn in compiled.items()}, repeats)
    both = interleaved_medians_ms({label: (lambda fn=fn: fn(x).sum().backward()) for label, fn in compiled.items()},
                                  repeats)
    times = {label: (forward[label], both[label]) for label in compiled}
    search = compiled["search"].report.graphs[0].stats["search"]
    return dict(model=name, start_us=search["start_us"], best_us=search["best_us"], seconds=search["seconds"],
                moves=", ".join(step["rewrite"] for step in search["path"]) or "none",
                forward=times["search"][0] / times["greedy"][0], both=times["search"][1] / times["greedy"][1],
                times=times)


def main(argv: list[str] | None = None) -> list[dict]:
    from examples.data import graph_batch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, default=188, help="Mutagenesis graphs in the batch")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    batch = graph_batch("mutagenesis", args.graphs)
    print("| model | estimate before -> after [us] | moves | search [s] | fwd search / greedy [ms] | ratio "
          "| fwd+bwd search / greedy [ms] | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name, model, features in models(batch):
        torch.manual_seed(0)
        x = batch.x if features == batch.x.shape[1] else torch.randn(batch.x.shape[0], features)
        r = measure(name, model, x, args.repeats)
        rows.append(r)
        (f_s, b_s), (f_g, b_g) = r["times"]["search"], r["times"]["greedy"]
        print(f"| {name} | {r['start_us']:.1f} -> {r['best_us']:.1f} | {r['moves']} | {r['seconds']:.2f} "
              f"| {f_s:.3f} / {f_g:.3f} | {r['forward']:.2f} | {b_s:.3f} / {b_g:.3f} | {r['both']:.2f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
