"""Kernels the vectorized graphs call: segment reductions over CSR offsets."""
from .segment import segment_reduce, SEGMENT_REDUCTIONS

__all__ = ["segment_reduce", "SEGMENT_REDUCTIONS"]
