"""Float32 gradients of eager and of the compiled model, both against a float64 reference.

    python -m benchmarks.precision [--graphs 2788 ...]

On large graphs the benchmark's gradient check (compiled against eager, both
float32) can fail although nothing is wrong: the two sum in different orders,
and eager accumulates each weight's gradient one neuron at a time. This script
arbitrates: it compiles the scalar GCN on a Mutagenesis-shaped batch with
``dynamo_relational.compile`` and prints, for eager float32 and compiled
float32, the largest difference from eager float64's parameter gradients,
relative to the largest float64 gradient.
"""
from __future__ import annotations

import argparse

import torch


def relative_errors(graphs: int) -> dict[str, float]:
    """{"eager_float32": ..., "relational_float32": ...}: max |g - g64| / max |g64| over all parameters."""
    import dynamo_relational
    from benchmarks.harness import float64_gradients
    from examples.data import graph_batch
    from examples.gcn import ScalarGCN

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs, seed=0)
    model = ScalarGCN(batch, batch.x.shape[1], hidden=10, layers=2)

    def gradients(fn):
        model.zero_grad(set_to_none=True)
        fn(batch.x).sum().backward()
        return torch.cat([p.grad.reshape(-1).double() for p in model.parameters()])

    exact = torch.cat([g.reshape(-1) for g in float64_gradients(model, batch.x)])
    scale = exact.abs().max()
    eager = gradients(model)
    compiled = gradients(dynamo_relational.compile(model, (batch.x,), progress=False))
    return {"eager_float32": float((eager - exact).abs().max() / scale),
            "relational_float32": float((compiled - exact).abs().max() / scale)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", type=int, nargs="+", default=[2788], help="batch sizes (Mutagenesis-shaped)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| graphs | eager float32 vs float64 | relational float32 vs float64 |\n|---|---|---|")
    for graphs in args.graphs:
        errors = relative_errors(graphs)
        print(f"| {graphs} | {errors['eager_float32']:.1e} | {errors['relational_float32']:.1e} |", flush=True)


if __name__ == "__main__":
    main()
