"""The segment reduction alone, per provider of ``segment_reduce``, from 1e3 to 1e7 rows (forward, CPU).

    python -m benchmarks.segment_providers [--max-rows 1e7] [--features 16] [--repeats 21] [--threads 1]
                                           [--reductions amax,sum]

Each size reduces ``rows`` random rows of ``features`` floats into ``rows / 4``
segments of random sizes (mean 4, some empty), with no gather in front (that
is ``benchmarks.kernels``, where the gather dominates at large sizes). The
calls are interleaved, one of each per round, so that load from elsewhere on
the machine touches them alike; the figures are medians in microseconds:

* ``aten op`` / ``torch_scatter op``: our ``segment_reduce`` op with
  ``provider="aten"`` (the default) / ``"torch_scatter"`` (its results mapped
  to ATen's, see ``dynamo_relational.kernels.segment``);
* ``raw aten`` / ``raw torch_scatter``: ``torch.segment_reduce`` and
  ``torch_scatter.segment_csr`` called directly.

Needs torch-scatter.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dynamo_relational.kernels.segment import csr_offsets, require_torch_scatter, segment_reduce

_NAME = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}


def calls(data: torch.Tensor, offsets: torch.Tensor, reduce: str) -> dict:
    torch_scatter = require_torch_scatter()
    name = _NAME[reduce]
    return {
        "aten op": lambda: segment_reduce(data, offsets, reduce),
        "torch_scatter op": lambda: segment_reduce(data, offsets, reduce, "torch_scatter"),
        "raw aten": lambda: torch.segment_reduce(data, name, offsets=offsets, unsafe=True),
        "raw torch_scatter": lambda: torch_scatter.segment_csr(data, offsets, reduce=name),
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=float, default=1e7)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=21, help="rounds per size (a third of them at 1e7 rows)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--reductions", default="amax,sum")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    names = list(calls(torch.zeros(1, 1), csr_offsets([1]), "sum"))
    print(f"threads={torch.get_num_threads()} features={args.features}")
    print(f"{'rows':>9} {'reduce':>6} " + " ".join(f"{n:>17}" for n in names) + "  torch_scatter/aten (ops)")
    results = []
    for reduce in args.reductions.split(","):
        rows = 1000
        while rows <= args.max_rows:
            segments = max(rows // 4, 1)
            counts = torch.bincount(torch.randint(0, segments, (rows,)), minlength=segments)
            offsets = csr_offsets(counts.tolist())
            data = torch.randn(rows, args.features)
            fns = calls(data, offsets, reduce)
            filled = counts > 0
            with torch.no_grad():
                reference = fns["aten op"]()
                for name, fn in fns.items():    # warm-up, and the same results on non-empty segments
                    torch.testing.assert_close(fn()[filled], reference[filled], rtol=1e-5, atol=1e-5)
                times = {name: [] for name in fns}
                for _ in range(args.repeats if rows < 10 ** 7 else max(3, args.repeats // 3)):
                    for name, fn in fns.items():
                        start = time.perf_counter()
                        fn()
                        times[name].append(time.perf_counter() - start)
            med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
            ratio = med["torch_scatter op"] / med["aten op"]
            results.append(dict(rows=rows, reduce=reduce, ratio=ratio, **med))
            print(f"{rows:>9} {reduce:>6} " + " ".join(f"{med[n]:>17.1f}" for n in names) + f"  {ratio:.2f}",
                  flush=True)
            rows *= 10
    return results


if __name__ == "__main__":
    main()
