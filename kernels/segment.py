"""Segment reduction over CSR offsets, as a ``torch.library`` custom op.

``segment_reduce(data, offsets, reduce, provider="aten")`` reduces the rows
``data[offsets[i]:offsets[i+1]]`` into output row ``i``. The backward pass
expands the offsets into per-row segment ids once and is then a plain gather
over them, which is much faster than a CSR-driven backward. Empty segments
sum to 0; max/min/mean need non-empty segments (the vectorizer only makes
empty ones for sums).

The op has a fake implementation (so it traces under FakeTensor, AOT autograd
and Inductor, where it stays an opaque fallback kernel) and an autograd formula:

* sum:  grad_data = grad_out[segment_ids]
* mean: grad_data = (grad_out / counts)[segment_ids]
* max / min: the gradient is split evenly between the rows that attain the
  extreme, which is exactly what ``torch.amax`` / ``torch.amin`` do in eager
  (with eager's NaNs where the extreme is NaN).

Providers. On CPU the forward kernel is chosen per call by the op's
``provider`` argument (:data:`SEGMENT_PROVIDERS`):

* ``"aten"`` (the default): ``torch.segment_reduce``.
* ``"torch_scatter"``: ``torch_scatter.segment_csr`` from the optional
  torch-scatter package (``pip install --no-build-isolation torch-scatter``,
  or the ``scatter`` extra). Its CPU kernel reduces each output row
  sequentially in row order on one thread, with no atomics, so it is
  deterministic run to run (its documentation says "fully-deterministic"). Where its
  conventions differ from ATen's, the difference is mapped so that the op's
  output is the same with either provider: empty segments give NaN (mean),
  -inf (amax) and +inf (amin) as ATen does, not torch-scatter's 0; max/min
  fall back to ATen for a call whose data holds a NaN (torch-scatter skips
  NaNs, ATen and eager ``amax`` propagate them) or whose result holds the
  dtype's lowest/highest finite value (torch-scatter starts from those, so a
  segment of only -inf/+inf comes back finite). Dtypes other than float32 /
  float64, and empty data, use ATen. It was measured slower than ATen for
  max/min (docs/BENCHMARKS.md, "Kernel providers"), so it is not the default.

The provider is an op argument rather than a module-level switch (like
``gather_reduce.cuda_provider``) because the backend fixes it at compile time
from ``options["segment_provider"]`` (:mod:`dynamo_relational.options`): it is
then part of each compiled graph, so two models compiled with different
providers run side by side in one process, and graphs differing only in the
provider never share compiled code. The backward formulas are the same for
both providers (plain gathers; the tie count of max/min is a segment sum run
by the same provider). On CUDA the argument is ignored: the Triton kernel
(or ATen) runs.
"""
from __future__ import annotations

import torch
from torch import Tensor

from dynamo_relational.errors import OptionsError

from . import triton_csr
from .gather_reduce import flat_rows

SEGMENT_REDUCTIONS = ("sum", "mean", "amax", "amin")
_ATEN_NAME = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}
#: forward kernels on CPU, the values of the op's ``provider`` argument
SEGMENT_PROVIDERS = ("aten", "torch_scatter")
#: dtypes the torch-scatter provider runs (its CPU kernel has no half/bfloat16); others use ATen
_SCATTER_DTYPES = (torch.float32, torch.float64)
#: the value of an empty segment in ATen's ``segment_reduce`` (sums are 0 in both providers)
_EMPTY_VALUE = {"mean": float("nan"), "amax": float("-inf"), "amin": float("inf")}


def require_torch_scatter():
    """The ``torch_scatter`` module, or an ``OptionsError`` naming the option and how to install it."""
    try:
        import torch_scatter   # (optional)
    except ImportError as exc:
        raise OptionsError(
            "option 'segment_provider' is 'torch_scatter', but torch-scatter is not installed "
            f"({exc}): install it with `pip install --no-build-isolation torch-scatter` (it builds from source "
            "against the installed torch; or the `scatter` extra: `pip install --no-build-isolation -e .[scatter]`), "
            "or use segment_provider='aten'") from exc
    return torch_scatter


def _check(data: Tensor, offsets: Tensor, reduce: str, provider: str = "aten") -> None:
    if reduce not in _ATEN_NAME:
        raise ValueError(f"segment_reduce: reduce must be one of {SEGMENT_REDUCTIONS}, got {reduce!r}")
    if provider not in SEGMENT_PROVIDERS:
        raise ValueError(f"segment_reduce: provider must be one of {SEGMENT_PROVIDERS}, got {provider!r}")
    if offsets.dim() != 1 or offsets.shape[0] < 1:
        raise ValueError(f"segment_reduce: offsets must be 1-D and non-empty, got shape {tuple(offsets.shape)}")
    if data.dim() == 0:
        raise ValueError("segment_reduce: data must have a row dimension, got a 0-d tensor")


def _aten(data: Tensor, offsets: Tensor, reduce: str) -> Tensor:
    # Deterministic: each output row is reduced sequentially from its own CSR slice.
    return torch.segment_reduce(data, _ATEN_NAME[reduce], offsets=offsets, axis=0, unsafe=True)


def _has_nan(data: Tensor) -> bool:
    # A finite total rules NaN out without the [rows, ...] mask of isnan (it costs one streaming read).
    return not bool(torch.isfinite(data.sum())) and bool(torch.isnan(data).any())


def _scatter(data: Tensor, offsets: Tensor, reduce: str) -> Tensor:
    """``torch_scatter.segment_csr``, mapped to ATen's results where the two differ (module docstring)."""
    torch_scatter = require_torch_scatter()
    if data.dtype not in _SCATTER_DTYPES or data.numel() == 0:   # (with no data it leaves its output unset)
        return _aten(data, offsets, reduce)
    extreme = reduce in ("amax", "amin")
    if extreme and _has_nan(data):
        return _aten(data, offsets, reduce)
    out = torch_scatter.segment_csr(data, offsets.long(), reduce=_ATEN_NAME[reduce])
    if extreme:
        info = torch.finfo(data.dtype)
        if bool((out == (info.min if reduce == "amax" else info.max)).any()):
            return _aten(data, offsets, reduce)    # possibly a segment of only -inf (+inf)
    if reduce != "sum":
        empty = offsets[1:] == offsets[:-1]
        if bool(empty.any()):
            out[empty] = _EMPTY_VALUE[reduce]
    return out


@torch.library.custom_op("dynamo_relational::segment_reduce", mutates_args=())
def segment_reduce(data: Tensor, offsets: Tensor, reduce: str, provider: str = "aten") -> Tensor:
    _check(data, offsets, reduce, provider)
    if provider == "torch_scatter":
        return _scatter(data, offsets, reduce)
    return _aten(data, offsets, reduce)


@segment_reduce.register_kernel("cuda")
def _(data: Tensor, offsets: Tensor, reduce: str, provider: str = "aten") -> Tensor:
    _check(data, offsets, reduce, provider)
    if not triton_csr.supports(data):
        return torch.segment_reduce(data, _ATEN_NAME[reduce], offsets=offsets, axis=0, unsafe=True)
    flat = flat_rows(data)
    out = triton_csr.csr_reduce(flat, offsets, None, offsets.shape[0] - 1, reduce, empty_mean_is_zero=False)
    return out.reshape((offsets.shape[0] - 1, *data.shape[1:]))


@segment_reduce.register_fake
def _(data: Tensor, offsets: Tensor, reduce: str, provider: str = "aten") -> Tensor:
    _check(data, offsets, reduce, provider)
    return data.new_empty((offsets.shape[0] - 1, *data.shape[1:]))


def _setup_context(ctx, inputs, output):
    data, offsets, reduce, provider = inputs
    ctx.reduce, ctx.provider = reduce, provider
    ctx.rows = data.shape[0]
    if reduce in ("amax", "amin"):
        ctx.save_for_backward(data, offsets, output)
    else:
        ctx.save_for_backward(offsets)


def _expand(rows: Tensor, like: Tensor) -> Tensor:
    return rows.reshape(rows.shape + (1,) * (like.dim() - rows.dim()))


def segment_ids_from_offsets(offsets: Tensor, rows: int) -> Tensor:
    """``ids[r] = i`` for every row ``r`` of segment ``i``."""
    counts = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(counts.shape[0], device=offsets.device), counts,
                                   output_size=rows)


def _backward(ctx, grad_out: Tensor):
    if ctx.reduce in ("amax", "amin"):
        data, offsets, output = ctx.saved_tensors
        segment_ids = segment_ids_from_offsets(offsets, ctx.rows)
        hits = data == output.index_select(0, segment_ids)
        ties = segment_reduce(hits.to(grad_out.dtype), offsets, "sum", ctx.provider)
        # eager's formula, ``grad / ties * hits``: a NaN result (no row equals it: no ties) gives NaN to
        # every row of its segment, as in eager, where zeroing the rows that miss would give 0
        share = (grad_out / ties).index_select(0, segment_ids)
        return share * hits, None, None, None
    (offsets,) = ctx.saved_tensors
    segment_ids = segment_ids_from_offsets(offsets, ctx.rows)
    if ctx.reduce == "mean":
        counts = (offsets[1:] - offsets[:-1]).to(grad_out.dtype)
        grad_out = grad_out / _expand(counts, grad_out)
    return grad_out.index_select(0, segment_ids), None, None, None


segment_reduce.register_autograd(_backward, setup_context=_setup_context)


def csr_offsets(counts: list[int], device: torch.device | str = "cpu") -> Tensor:
    """CSR offsets for consecutive segments of the given sizes."""
    offsets = torch.zeros(len(counts) + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.tensor(counts, dtype=torch.long, device=device), 0, out=offsets[1:])
    return offsets
