"""Microbenchmark of the gather + segment-sum providers, from 1e3 to 1e7 gathered rows.

    python -m benchmarks.kernels [--max-rows 1e7] [--features 16] [--repeats 10]

Each size is a random graph with ``rows`` edges over ``rows / 4`` nodes (mean
in-degree 4), ``features`` floats per row. Every provider computes
``out[v] = sum of source[u] over the edges u -> v`` (and its backward), and all
results are checked against the first provider before timing:

* ``gather_reduce``: our custom op (one CSR sparse-dense product; backward the
  transposed product), the default of the vectorizer;
* ``index_select+segment_reduce``: gather the rows, then ATen's CSR segment reduction;
* ``index_select+index_add``: gather, then scatter-add (atomic on some backends);
* ``torch_scatter.segment_csr``: when torch-scatter is installed.

Prints medians in microseconds, forward and forward+backward.
"""
from __future__ import annotations

import argparse

import torch

from dynamo_relational.kernels.gather_reduce import gather_reduce, pack_csr
from dynamo_relational.kernels.segment import csr_offsets
from examples.common import median_ms


def providers(source_rows: int, src: torch.Tensor, dst: torch.Tensor) -> dict:
    counts = torch.bincount(dst, minlength=source_rows)
    offsets = csr_offsets(counts.tolist())
    csr = pack_csr(offsets, src, source_rows)
    result = {
        "gather_reduce": lambda x: gather_reduce(x, csr, source_rows, "sum"),
        "index_select+segment_reduce": lambda x: torch.segment_reduce(
            x.index_select(0, src), "sum", offsets=offsets, unsafe=True),
        "index_select+index_add": lambda x: x.new_zeros(source_rows, x.shape[1]).index_add_(
            0, dst, x.index_select(0, src)),
    }
    try:
        import torch_scatter

        result["torch_scatter.segment_csr"] = lambda x: torch_scatter.segment_csr(x.index_select(0, src), offsets)
    except ImportError:
        pass
    return result


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=float, default=1e7)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    results = []
    rows = 1000
    print(f"{'rows':>10} {'provider':<30} {'forward us':>12} {'fwd+bwd us':>12}")
    while rows <= args.max_rows:
        nodes = max(rows // 4, 1)
        dst, _ = torch.sort(torch.randint(0, nodes, (rows,)))
        src = torch.randint(0, nodes, (rows,))
        x = torch.randn(nodes, args.features, requires_grad=True)
        fns = providers(nodes, src, dst)
        reference = None
        for name, fn in fns.items():
            out = fn(x)
            reference = out if reference is None else reference
            torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)
            with torch.no_grad():
                forward = median_ms(lambda: fn(x), args.repeats, warmup=1) * 1e3
            both = median_ms(lambda: fn(x).sum().backward(), args.repeats, warmup=1) * 1e3
            results.append(dict(rows=rows, provider=name, forward_us=forward, forward_backward_us=both))
            print(f"{rows:>10} {name:<30} {forward:>12.1f} {both:>12.1f}", flush=True)
        rows *= 10
    return results


if __name__ == "__main__":
    main()
