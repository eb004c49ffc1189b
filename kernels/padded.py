"""The Inductor-lowerable form of ``gather_reduce``: a gather over a padded (ELL) index, then a dense sum.

``gather_reduce(source, csr, rows, reduce)`` reads a variable number of source
rows per output row. Inductor has no loop of variable length, so this form
pads every segment to the widest one: ``slots`` is a ``[rows, width]`` index
(padding points at row 0) and ``weights`` a ``[rows, width]`` matrix of the
entries' weights (1 for ``sum``, 1/segment size for ``mean``, 0 for padding).
Then ``out = (source[slots] * weights[..., None]).sum(1)``, the padding
selected away (``where``: an infinite row 0 times weight 0 would be NaN): plain ATen ops that
Inductor lowers to one fused reduction, into which it can also fuse the
elementwise op that produced ``source``.

Its backward is autograd's: an accumulating scatter (``index_put``) into the
source rows, which Inductor's CPU code runs with atomic adds, so it is not
deterministic under several threads. It costs ``rows x width`` reads where the
CSR product costs one per entry. On this project's CPU it measured 12-30x
slower than MKL's product from 1e4 rows on (docs/BENCHMARKS.md, "Kernel
providers"), so it is opt-in: ``options={"gather_reduce_form": "padded"}``
(``passes/padded_gathers.py``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .gather_reduce import ADJOINT, entry_weights, unpack_csr


def ell_layout(csr: Tensor, rows: int, columns: int, transpose: bool, reduce: str) -> tuple[Tensor, Tensor]:
    """``(slots, weights)`` of ``gather_reduce(source, csr, rows, reduce, transpose)`` with ``columns``
    source rows: both ``[rows, widest segment]``, ``slots`` int64, ``weights`` float64 (cast them
    to the source's dtype)."""
    if reduce not in ADJOINT:
        raise ValueError(f"ell_layout: reduce must be one of {tuple(ADJOINT)}, got {reduce!r}")
    a, b = (columns, rows) if transpose else (rows, columns)
    offsets, index = unpack_csr(csr, a, b, transpose=transpose)
    offsets, index = offsets.long(), index.long()
    counts = offsets[1:] - offsets[:-1]
    width = int(counts.max()) if counts.numel() else 0
    segment = torch.arange(rows, device=index.device).repeat_interleave(counts, output_size=index.shape[0])
    slot = torch.arange(index.shape[0], device=index.device) - offsets[segment]   # position in its segment
    slots = torch.zeros((rows, width), dtype=torch.long, device=index.device)
    slots[segment, slot] = index
    weights = torch.zeros((rows, width), dtype=torch.float64, device=index.device)
    weights[segment, slot] = entry_weights(csr, (a, b, transpose), offsets, index, reduce, torch.float64)
    return slots, weights


def gather_reduce_padded(source: Tensor, slots: Tensor, weights: Tensor) -> Tensor:
    """``sum_j weights[r, j] * source[slots[r, j]]`` for every row ``r``: ``gather_reduce`` in ATen ops."""
    picked = source[slots]                          # [rows, width, *features]
    scale = weights.reshape(weights.shape + (1,) * (source.dim() - 1))
    # Padding reads row 0 with weight 0; selected away rather than multiplied, since inf * 0 is NaN
    # (and so would the padding's gradient be, for a NaN in row 0).
    return torch.where(scale != 0, picked * scale, 0).sum(1)
