"""Kernels the vectorized graphs call: segment reductions over CSR offsets, fused gather + reduce."""
from .gather_reduce import GATHER_REDUCTIONS, gather_reduce, gather_rows, pack_csr, unit_offsets
from .segment import SEGMENT_REDUCTIONS, segment_reduce

__all__ = ["gather_reduce", "gather_rows", "pack_csr", "unit_offsets", "GATHER_REDUCTIONS", "segment_reduce",
           "SEGMENT_REDUCTIONS"]
