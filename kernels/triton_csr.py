"""Triton CUDA kernels for the CSR reductions: ``gather_reduce`` (gather + sum/mean) and
``segment_reduce`` (sum/mean/max/min over contiguous rows).

Two kernels, chosen by the longest segment (or, where that is not known, the
mean length). For short segments (message
passing: a few entries per row) a program reduces a block of ``BLOCK_R`` rows
at once, taking each row's entries one at a time, in order; for long ones
(pooling) a program reduces one row, ``BLOCK_E`` entries at a time, then sums
its tile. Nothing is scattered and nothing is atomic, so results are
deterministic run to run, as on CPU. Accumulation is in float32 (float64 for
float64 data).

These are the CUDA implementations of the custom ops when Triton is
installed (``AVAILABLE``); without it, CUDA falls back to cuSPARSE and ATen.
"""
from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton comes with CUDA builds of torch; CPU builds run without it
    triton = None

AVAILABLE = triton is not None

#: reductions by kernel code
REDUCE_CODES = {"sum": 0, "mean": 1, "amax": 2, "amin": 3}
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

if AVAILABLE:
    @triton.jit
    def _init(BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr):
        if REDUCE == 2:
            return tl.full([BLOCK_R, BLOCK_F], float("-inf"), ACC)
        elif REDUCE == 3:
            return tl.full([BLOCK_R, BLOCK_F], float("inf"), ACC)
        else:
            return tl.zeros([BLOCK_R, BLOCK_F], ACC)

    @triton.jit
    def _load(pointers, mask, REDUCE: tl.constexpr, ACC: tl.constexpr):
        if REDUCE == 2:
            return tl.load(pointers, mask=mask, other=float("-inf")).to(ACC)
        elif REDUCE == 3:
            return tl.load(pointers, mask=mask, other=float("inf")).to(ACC)
        else:
            return tl.load(pointers, mask=mask, other=0.0).to(ACC)

    @triton.jit
    def _read(source, index, entry, live, cols, col_mask, source_stride, HAS_INDEX: tl.constexpr,
              REDUCE: tl.constexpr, ACC: tl.constexpr):
        """The rows of the live entries (through ``index`` if there is one), the neutral value elsewhere."""
        if HAS_INDEX:
            entry = tl.load(index + entry, mask=live, other=0).to(tl.int64)
        return _load(source + entry[:, None] * source_stride + cols[None, :], live[:, None] & col_mask[None, :],
                     REDUCE, ACC)

    @triton.jit
    def _combine(acc, values, REDUCE: tl.constexpr):
        if REDUCE == 2:
            return tl.maximum(acc, values)
        elif REDUCE == 3:
            return tl.minimum(acc, values)
        else:
            return acc + values

    @triton.jit
    def _finish(acc, count, EMPTY_MEAN_IS_ZERO: tl.constexpr, REDUCE: tl.constexpr, ACC: tl.constexpr):
        if REDUCE == 1:
            count = count.to(ACC)
            if EMPTY_MEAN_IS_ZERO:
                count = tl.maximum(count, 1.0)
            acc = acc / count
        return acc

    @triton.jit
    def csr_rows_kernel(source, offsets, index, out, rows, features, source_stride, out_stride,
                        HAS_INDEX: tl.constexpr, REDUCE: tl.constexpr, EMPTY_MEAN_IS_ZERO: tl.constexpr,
                        ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_F: tl.constexpr):
        """Short segments: a program reduces BLOCK_R rows at once, entry by entry, in order."""
        row = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        row_mask = row < rows
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        col_mask = cols < features
        start = tl.load(offsets + row, mask=row_mask, other=0).to(tl.int64)
        count = tl.load(offsets + row + 1, mask=row_mask, other=0).to(tl.int64) - start
        acc = _init(BLOCK_R, BLOCK_F, REDUCE, ACC)
        for step in range(0, tl.max(count)):
            values = _read(source, index, start + step, step < count, cols, col_mask, source_stride,
                           HAS_INDEX, REDUCE, ACC)
            acc = _combine(acc, values, REDUCE)
        acc = _finish(acc, count[:, None], EMPTY_MEAN_IS_ZERO, REDUCE, ACC)
        tl.store(out + row[:, None] * out_stride + cols[None, :], acc.to(out.dtype.element_ty),
                 mask=row_mask[:, None] & col_mask[None, :])

    @triton.jit
    def csr_segment_kernel(source, offsets, index, out, features, source_stride, out_stride,
                           HAS_INDEX: tl.constexpr, REDUCE: tl.constexpr, EMPTY_MEAN_IS_ZERO: tl.constexpr,
                           ACC: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_F: tl.constexpr):
        """Long segments: a program reduces one row, BLOCK_E entries at a time."""
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        col_mask = cols < features
        start = tl.load(offsets + row).to(tl.int64)
        count = tl.load(offsets + row + 1).to(tl.int64) - start
        acc = _init(BLOCK_E, BLOCK_F, REDUCE, ACC)
        for first in range(0, count, BLOCK_E):
            step = first + tl.arange(0, BLOCK_E)
            values = _read(source, index, start + step, step < count, cols, col_mask, source_stride,
                           HAS_INDEX, REDUCE, ACC)
            acc = _combine(acc, values, REDUCE)
        if REDUCE == 2:
            total = tl.max(acc, axis=0)
        elif REDUCE == 3:
            total = tl.min(acc, axis=0)
        else:
            total = tl.sum(acc, axis=0)
        total = _finish(total, count, EMPTY_MEAN_IS_ZERO, REDUCE, ACC)
        tl.store(out + row * out_stride + cols, total.to(out.dtype.element_ty), mask=col_mask)


#: segments longer than this go to the one-row kernel: the row-block kernel steps through its
#: longest row while the block's other rows wait
LONG_SEGMENT = 64


def supports(data: Tensor) -> bool:
    """Whether these kernels can reduce ``data``."""
    return AVAILABLE and data.is_cuda and data.dtype in FLOATS


def longest_segment(offsets: Tensor) -> int:
    """The most entries of any row (waits for the device: compute it once per matrix)."""
    return int((offsets[1:] - offsets[:-1]).max()) if offsets.shape[0] > 1 else 0


def csr_reduce(source: Tensor, offsets: Tensor, index: Tensor | None, rows: int, reduce: str,
               empty_mean_is_zero: bool = True, longest: int | None = None) -> Tensor:
    """``out[i] = reduce(source[index[offsets[i]:offsets[i+1]]])`` (``source[offsets[i]:offsets[i+1]]``
    without ``index``) for a 2-D ``source``; empty segments give 0 for sums, ``-inf``/``inf`` for
    max/min, and 0 or NaN for means. ``longest`` (:func:`longest_segment`) picks the kernel; without
    it, the mean segment length does."""
    source = source.contiguous()
    features = source.shape[1]
    out = source.new_empty((rows, features))
    if rows == 0 or features == 0:
        return out
    block_f = min(triton.next_power_of_2(features), 128)
    common = dict(HAS_INDEX=index is not None, REDUCE=REDUCE_CODES[reduce], EMPTY_MEAN_IS_ZERO=empty_mean_is_zero,
                  ACC=tl.float64 if source.dtype == torch.float64 else tl.float32, BLOCK_F=block_f)
    entries = source.shape[0] if index is None else index.shape[0]
    index = offsets if index is None else index   # (unread without HAS_INDEX)
    tile = max(1, 1024 // block_f)
    if (longest if longest is not None else entries / rows) > LONG_SEGMENT:
        csr_segment_kernel[(rows, triton.cdiv(features, block_f))](
            source, offsets, index, out, features, source.stride(0), out.stride(0), BLOCK_E=tile, **common)
    else:
        block_r = min(tile, triton.next_power_of_2(rows))
        csr_rows_kernel[(triton.cdiv(rows, block_r), triton.cdiv(features, block_f))](
            source, offsets, index, out, rows, features, source.stride(0), out.stride(0), BLOCK_R=block_r, **common)
    return out
