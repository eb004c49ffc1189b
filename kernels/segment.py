"""Segment reduction over CSR offsets, as a ``torch.library`` custom op.

``segment_reduce(data, offsets, reduce)`` reduces the rows
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
  extreme, which is exactly what ``torch.amax`` / ``torch.amin`` do in eager.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import triton_csr

SEGMENT_REDUCTIONS = ("sum", "mean", "amax", "amin")
_ATEN_NAME = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}


def _check(data: Tensor, offsets: Tensor, reduce: str) -> None:
    if reduce not in _ATEN_NAME:
        raise ValueError(f"segment_reduce: reduce must be one of {SEGMENT_REDUCTIONS}, got {reduce!r}")
    if offsets.dim() != 1 or offsets.shape[0] < 1:
        raise ValueError(f"segment_reduce: offsets must be 1-D and non-empty, got shape {tuple(offsets.shape)}")
    if data.dim() == 0:
        raise ValueError("segment_reduce: data must have a row dimension, got a 0-d tensor")


@torch.library.custom_op("dynamo_relational::segment_reduce", mutates_args=())
def segment_reduce(data: Tensor, offsets: Tensor, reduce: str) -> Tensor:
    _check(data, offsets, reduce)
    # Deterministic: each output row is reduced sequentially from its own CSR slice.
    return torch.segment_reduce(data, _ATEN_NAME[reduce], offsets=offsets, axis=0, unsafe=True)


@segment_reduce.register_kernel("cuda")
def _(data: Tensor, offsets: Tensor, reduce: str) -> Tensor:
    _check(data, offsets, reduce)
    if not triton_csr.supports(data):
        return torch.segment_reduce(data, _ATEN_NAME[reduce], offsets=offsets, axis=0, unsafe=True)
    flat = data.reshape(data.shape[0], -1)
    out = triton_csr.csr_reduce(flat, offsets, None, offsets.shape[0] - 1, reduce, empty_mean_is_zero=False)
    return out.reshape((offsets.shape[0] - 1, *data.shape[1:]))


@segment_reduce.register_fake
def _(data: Tensor, offsets: Tensor, reduce: str) -> Tensor:
    _check(data, offsets, reduce)
    return data.new_empty((offsets.shape[0] - 1, *data.shape[1:]))


def _setup_context(ctx, inputs, output):
    data, offsets, reduce = inputs
    ctx.reduce = reduce
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
        ties = segment_reduce(hits.to(grad_out.dtype), offsets, "sum")
        share = (grad_out / ties).index_select(0, segment_ids)
        return torch.where(hits, share, torch.zeros_like(share)), None, None
    (offsets,) = ctx.saved_tensors
    segment_ids = segment_ids_from_offsets(offsets, ctx.rows)
    if ctx.reduce == "mean":
        counts = (offsets[1:] - offsets[:-1]).to(grad_out.dtype)
        grad_out = grad_out / _expand(counts, grad_out)
    return grad_out.index_select(0, segment_ids), None, None


segment_reduce.register_autograd(_backward, setup_context=_setup_context)


def csr_offsets(counts: list[int], device: torch.device | str = "cpu") -> Tensor:
    """CSR offsets for consecutive segments of the given sizes."""
    offsets = torch.zeros(len(counts) + 1, dtype=torch.long, device=device)
    torch.cumsum(torch.tensor(counts, dtype=torch.long, device=device), 0, out=offsets[1:])
    return offsets
