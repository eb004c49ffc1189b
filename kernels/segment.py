"""Segment reduction over CSR offsets, as a ``torch.library`` custom op.

``segment_reduce(data, offsets, segment_ids, reduce)`` reduces the rows
``data[offsets[i]:offsets[i+1]]`` into output row ``i``. ``segment_ids`` is the
same partition written per row (``segment_ids[r] = i``); it is passed in so
that the backward pass is a plain gather over it, which is much faster than a
CSR-driven backward. Every segment must be non-empty (the vectorizer only makes
segments for aggregations of at least one term).

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

SEGMENT_REDUCTIONS = ("sum", "mean", "amax", "amin")
_ATEN_NAME = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}


def _check(data: Tensor, offsets: Tensor, segment_ids: Tensor, reduce: str) -> None:
    if reduce not in _ATEN_NAME:
        raise ValueError(f"segment_reduce: reduce must be one of {SEGMENT_REDUCTIONS}, got {reduce!r}")
    if offsets.dim() != 1 or segment_ids.dim() != 1:
        raise ValueError("segment_reduce: offsets and segment_ids must be 1-D")
    if data.dim() == 0 or segment_ids.shape[0] != data.shape[0]:
        raise ValueError(
            f"segment_reduce: data has shape {tuple(data.shape)} but segment_ids has "
            f"{segment_ids.shape[0]} rows")


@torch.library.custom_op("dynamo_relational::segment_reduce", mutates_args=())
def segment_reduce(data: Tensor, offsets: Tensor, segment_ids: Tensor, reduce: str) -> Tensor:
    _check(data, offsets, segment_ids, reduce)
    # Deterministic: each output row is reduced sequentially from its own CSR slice.
    return torch.segment_reduce(data, _ATEN_NAME[reduce], offsets=offsets, axis=0, unsafe=True)


@segment_reduce.register_fake
def _(data: Tensor, offsets: Tensor, segment_ids: Tensor, reduce: str) -> Tensor:
    _check(data, offsets, segment_ids, reduce)
    return data.new_empty((offsets.shape[0] - 1, *data.shape[1:]))


def _setup_context(ctx, inputs, output):
    data, offsets, segment_ids, reduce = inputs
    ctx.reduce = reduce
    if reduce in ("amax", "amin"):
        ctx.save_for_backward(data, offsets, segment_ids, output)
    else:
        ctx.save_for_backward(offsets, segment_ids)


def _expand(rows: Tensor, like: Tensor) -> Tensor:
    return rows.reshape(rows.shape + (1,) * (like.dim() - rows.dim()))


def _backward(ctx, grad_out: Tensor):
    if ctx.reduce in ("amax", "amin"):
        data, offsets, segment_ids, output = ctx.saved_tensors
        hits = data == output.index_select(0, segment_ids)
        ties = segment_reduce(hits.to(grad_out.dtype), offsets, segment_ids, "sum")
        share = (grad_out / ties).index_select(0, segment_ids)
        return torch.where(hits, share, torch.zeros_like(share)), None, None, None
    offsets, segment_ids = ctx.saved_tensors
    if ctx.reduce == "mean":
        counts = (offsets[1:] - offsets[:-1]).to(grad_out.dtype)
        grad_out = grad_out / _expand(counts, grad_out)
    return grad_out.index_select(0, segment_ids), None, None, None


segment_reduce.register_autograd(_backward, setup_context=_setup_context)


def csr_from_counts(counts: list[int], device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """CSR offsets and per-row segment ids for segments of the given sizes."""
    lengths = torch.tensor(counts, dtype=torch.long, device=device)
    offsets = torch.zeros(len(counts) + 1, dtype=torch.long, device=device)
    torch.cumsum(lengths, 0, out=offsets[1:])
    segment_ids = torch.repeat_interleave(torch.arange(len(counts), device=device), lengths)
    return offsets, segment_ids
