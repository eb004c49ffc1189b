"""Microbenchmark of the gather + segment-reduce providers, from 1e3 to 1e7 gathered rows.

    python -m benchmarks.kernels [--max-rows 1e7] [--features 16] [--repeats 10] [--device cuda]
                                 [--reduce sum|mean|amax|amin] [--threads N]

Each size is a random graph with ``rows`` edges over ``rows / 4`` nodes (mean
in-degree 4), ``features`` floats per row. Every provider computes
``out[v] = reduce of source[u] over the edges u -> v`` (and its backward), and
all results are checked against the first provider before timing (on the
non-empty segments: empty ones are 0 in some providers and NaN / -inf / +inf
in others):

* ``gather_reduce`` (sum and mean): our custom op (one CSR sparse-dense
  product; backward the transposed product), the default of the vectorizer.
  On CPU that is MKL's product; on CUDA it is listed once per provider,
  ``[triton]`` (our Triton kernel, the default when Triton is installed) and
  ``[cusparse]``;
* ``index_select+segment_reduce``: gather the rows, then our ``segment_reduce``
  op (what the vectorizer emits for max / min). On CPU it is listed once per
  provider (``options["segment_provider"]``): ``[aten]`` (``torch.segment_reduce``,
  the default) and ``[torch_scatter]`` (``torch_scatter.segment_csr``, when
  torch-scatter is installed); on CUDA it is ATen's ``torch.segment_reduce``;
* ``index_select+index_add`` (sum): gather, then scatter-add (atomic on some backends);
* ``padded gather+sum [inductor]`` (sum): the index padded to the widest row
  (ELL) and the gather + sum compiled by Inductor, which lowers and fuses it
  (``kernels/padded.py``: the form ``options["gather_reduce_form"] = "padded"``
  compiles to); up to 1e6 rows;
* ``torch_scatter.segment_csr`` (sum): torch-scatter called directly, with its
  own backward, when it is installed.

Prints medians in microseconds, forward and forward+backward.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch

from dynamo_relational.kernels import triton_csr
from dynamo_relational.kernels.gather_reduce import gather_reduce, pack_csr
from dynamo_relational.kernels.padded import ell_layout, gather_reduce_padded
from dynamo_relational.kernels.segment import csr_offsets, segment_reduce

# (the package exports the op under the module's name)
gather_reduce_module = importlib.import_module("dynamo_relational.kernels.gather_reduce")


def _with_provider(provider: str, fn):
    def call(x):
        gather_reduce_module.cuda_provider = provider
        return fn(x)
    return call


#: the padded form materializes [rows, widest row, features] gradients in its backward: small sizes only
PADDED_MAX_ROWS = 10 ** 6


#: the padded gather + sum (``kernels/padded.py``), compiled by Inductor, which lowers and fuses it
_padded_sum = torch.compile(gather_reduce_padded, dynamic=False)


def _segment_reduce(src: torch.Tensor, offsets: torch.Tensor, reduce: str, provider: str):
    return lambda x: segment_reduce(x.index_select(0, src), offsets, reduce, provider)


def providers(source_rows: int, src: torch.Tensor, dst: torch.Tensor, reduce: str = "sum") -> dict:
    counts = torch.bincount(dst, minlength=source_rows)
    offsets = csr_offsets(counts.tolist(), src.device)
    result = {}
    if reduce in ("sum", "mean"):
        csr = pack_csr(offsets, src, source_rows)
        ours = lambda x: gather_reduce(x, csr, source_rows, reduce)  # noqa: E731
        if src.is_cuda:
            result["gather_reduce [cusparse]"] = _with_provider("cusparse", ours)
            if triton_csr.AVAILABLE:
                result = {"gather_reduce [triton]": _with_provider("triton", ours), **result}
        else:
            result["gather_reduce"] = ours
    try:
        import torch_scatter
    except ImportError:
        torch_scatter = None
    if src.is_cuda:
        result["index_select+segment_reduce"] = lambda x: torch.segment_reduce(
            x.index_select(0, src), {"amax": "max", "amin": "min"}.get(reduce, reduce), offsets=offsets, unsafe=True)
    else:
        result["index_select+segment_reduce [aten]"] = _segment_reduce(src, offsets, reduce, "aten")
        if torch_scatter is not None:
            result["index_select+segment_reduce [torch_scatter]"] = _segment_reduce(src, offsets, reduce,
                                                                                   "torch_scatter")
    if reduce == "sum":
        result["index_select+index_add"] = lambda x: x.new_zeros(source_rows, x.shape[1]).index_add_(
            0, dst, x.index_select(0, src))
        if src.shape[0] <= PADDED_MAX_ROWS:
            slots, weights = ell_layout(pack_csr(offsets, src, source_rows), source_rows, source_rows, False, "sum")
            weights = weights.float()   # the benchmark's features are float32
            result["padded gather+sum [inductor]"] = lambda x: _padded_sum(x, slots, weights)
        if torch_scatter is not None:
            result["torch_scatter.segment_csr"] = lambda x: torch_scatter.segment_csr(x.index_select(0, src),
                                                                                      offsets)
    return result


def median_us(fn, repeats: int, device: torch.device) -> float:
    """Median microseconds of ``fn()`` after one warm-up call, waiting for the device on CUDA."""
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-rows", type=float, default=1e7)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--reduce", default="sum", choices=("sum", "mean", "amax", "amin"))
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    default_provider = gather_reduce_module.cuda_provider
    results = []
    rows = 1000
    print(f"reduce={args.reduce} threads={torch.get_num_threads()} features={args.features}")
    print(f"{'rows':>10} {'provider':<44} {'forward us':>12} {'fwd+bwd us':>12}")
    while rows <= args.max_rows:
        nodes = max(rows // 4, 1)
        dst, _ = torch.sort(torch.randint(0, nodes, (rows,)))
        src = torch.randint(0, nodes, (rows,))
        dst, src = dst.to(device), src.to(device)
        x = torch.randn(nodes, args.features, device=device, requires_grad=True)
        fns = providers(nodes, src, dst, args.reduce)
        filled = torch.bincount(dst, minlength=nodes) > 0
        reference = None
        for name, fn in fns.items():
            out = fn(x)
            reference = out if reference is None else reference
            torch.testing.assert_close(out[filled], reference[filled], rtol=1e-4, atol=1e-4)
            with torch.no_grad():
                forward = median_us(lambda: fn(x), args.repeats, device)
            both = median_us(lambda: fn(x).sum().backward(), args.repeats, device)
            results.append(dict(rows=rows, provider=name, forward_us=forward, forward_backward_us=both))
            print(f"{rows:>10} {name:<44} {forward:>12.1f} {both:>12.1f}", flush=True)
        rows *= 10
    gather_reduce_module.cuda_provider = default_provider
    return results


if __name__ == "__main__":
    main()
