"""Fused gather + segment sum/mean (a sparse CSR times dense product), and a
row gather with the same deterministic backward.

``gather_reduce(source, csr, rows, reduce)`` computes

    out[i] = reduce(source[index[offsets[i]:offsets[i+1]]])      reduce in {"sum", "mean"}

which is ``A @ source`` for the 0/1 matrix ``A`` with CSR row pointers
``offsets`` and column indices ``index``. Message passing written one edge at
a time (``sum(W @ h[u] for u in nbrs)``) groups into exactly this. On CPU it
runs as MKL's sparse-dense product: each output row is reduced by one thread
in index order (deterministic), reading ``source`` in place instead of
materialising the ``[nnz, ...]`` rows that ``index_select`` +
``segment_reduce`` copy.

The backward pass is the transposed product ``grad_source = A^T @ grad_out``
(for ``mean``, ``A`` holds 1/size of its segment in each entry, and so does
``A^T``: the op's internal ``"mean_adjoint"`` reduction): again row-parallel and
deterministic, never an atomic scatter. The index structure is a compile-time
constant, so the transpose is computed once, by :func:`pack_csr`, and travels
with ``A`` in one packed buffer ``csr = [offsets, index, offsets_t, index_t]``;
``transpose=True`` multiplies by ``A^T`` instead.

``gather_rows(source, csr)`` is ``source[index]`` (``index_select``, with
``A`` one entry per row) with the same backward: the gradient of a source row
is the ordered sum of the gradients of the rows that read it, instead of the
``index_add`` that autograd would use (and Inductor would lower to atomic
adds on CPU).

Empty segments reduce to 0 (also for ``mean``).
"""
from __future__ import annotations

import math
import warnings
import weakref

import numpy
import torch
from torch import Tensor

from . import triton_csr

GATHER_REDUCTIONS = ("sum", "mean")
#: the reduction that computes the backward of each: a product by the transposed matrix
#: (``"mean_adjoint"``: each entry weighted by 1/size of its segment in the forward's matrix)
ADJOINT = {"sum": "sum", "mean": "mean_adjoint", "mean_adjoint": "mean"}


def pack_csr(offsets: Tensor, index: Tensor, columns: int) -> Tensor:
    """One buffer holding ``A`` (``offsets``, ``index``) and ``A^T`` for a source of ``columns`` rows."""
    if offsets.device.type == "cpu" and index.device.type == "cpu":
        return torch.from_numpy(_pack_csr_numpy(offsets.numpy().astype(numpy.int64, copy=False),
                                                index.numpy().astype(numpy.int64, copy=False), columns))
    offsets, index = offsets.long(), index.long()
    rows = offsets.shape[0] - 1
    row_of = torch.repeat_interleave(torch.arange(rows, device=offsets.device), offsets[1:] - offsets[:-1],
                                     output_size=index.shape[0])
    order = torch.argsort(index, stable=True)  # row_of ascends along A's entries: stable keeps it per column
    offsets_t = torch.zeros(columns + 1, dtype=torch.long, device=offsets.device)
    torch.cumsum(torch.bincount(index, minlength=columns), 0, out=offsets_t[1:])
    packed = torch.cat([offsets, index, offsets_t, row_of[order]])
    # MKL's sparse product takes 32-bit indices; storing them so saves a conversion per call.
    return packed.to(torch.int32) if packed.numel() == 0 or int(packed.max()) < 2 ** 31 - 1 else packed


def _pack_csr_numpy(offsets: numpy.ndarray, index: numpy.ndarray, columns: int) -> numpy.ndarray:
    """:func:`pack_csr` on the CPU, in numpy: the same buffer, several times faster for small index arrays."""
    row_of = numpy.repeat(numpy.arange(offsets.shape[0] - 1), numpy.diff(offsets))
    order = numpy.argsort(index, kind="stable")
    offsets_t = numpy.zeros(columns + 1, dtype=numpy.int64)
    numpy.cumsum(numpy.bincount(index, minlength=columns), out=offsets_t[1:])
    packed = numpy.concatenate([offsets, index, offsets_t, row_of[order]])
    return packed.astype(numpy.int32) if packed.size == 0 or packed.max() < 2 ** 31 - 1 else packed


def unpack_csr(csr: Tensor, rows: int, columns: int, transpose: bool = False) -> tuple[Tensor, Tensor]:
    """``(offsets, index)`` of ``A`` (``rows`` x ``columns``) or, with ``transpose``, of ``A^T``."""
    rest = csr.shape[0] - rows - columns - 2
    nnz = rest // 2
    if rest % 2 or nnz < 0:
        raise ValueError(f"packed CSR of length {csr.shape[0]} does not fit a {rows} x {columns} matrix")
    if transpose:
        start = rows + 1 + nnz
        return csr[start:start + columns + 1], csr[start + columns + 1:]
    return csr[:rows + 1], csr[rows + 1:rows + 1 + nnz]


def _check(source: Tensor, csr: Tensor, reduce: str) -> None:
    if reduce not in ADJOINT:
        raise ValueError(f"gather_reduce: reduce must be one of {tuple(ADJOINT)}, got {reduce!r}")
    if source.dim() == 0 or not source.dtype.is_floating_point:
        raise ValueError(f"gather_reduce: source must be a floating tensor with rows, got "
                         f"{source.dtype} of shape {tuple(source.shape)}")
    if csr.dim() != 1 or csr.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"gather_reduce: csr must be a 1-D int32/int64 tensor, got {csr.dtype} {tuple(csr.shape)}")


def _dims(source: Tensor, rows: int, transpose: bool) -> tuple[int, int]:
    """(rows, columns) of ``A`` itself."""
    return (source.shape[0], rows) if transpose else (rows, source.shape[0])


def flat_rows(source: Tensor) -> Tensor:
    """``source`` as ``[rows, features]``; with no rows too, where ``reshape(0, -1)`` cannot tell the width."""
    return source.reshape(source.shape[0], math.prod(source.shape[1:]))


def _counts(offsets: Tensor, dtype: torch.dtype) -> Tensor:
    return (offsets[1:] - offsets[:-1]).clamp(min=1).to(dtype)


# Defined through torch.library.Library rather than @custom_op: the op is called once per group
# on every step, and the kernel registered directly is dispatched with less Python around it.
_lib = torch.library.Library("dynamo_relational", "FRAGMENT")
_lib.define("gather_reduce(Tensor source, Tensor csr, SymInt rows, str reduce, bool transpose=False) -> Tensor")
_lib.define("gather_rows(Tensor source, Tensor csr) -> Tensor")


def _gather_reduce(source: Tensor, csr: Tensor, rows: int, reduce: str, transpose: bool = False) -> Tensor:
    _check(source, csr, reduce)
    matrix = _matrix(csr, rows, source.shape[0], transpose, reduce, source.dtype, source.device)
    flat = source if source.dim() == 2 else flat_rows(source)
    out = _product(matrix, flat, rows)
    return out if source.dim() == 2 else out.reshape((rows, *source.shape[1:]))


class TritonCSR:
    """``A`` for the Triton kernel: views of its CSR offsets and column indices, and the reduction
    (the kernel divides by the segment sizes itself, see :mod:`.triton_csr`; for ``mean_adjoint``
    the source rows are divided by ``pre`` first, then summed)."""
    __slots__ = ("offsets", "index", "reduce", "pre", "longest", "__weakref__")

    def __init__(self, offsets: Tensor, index: Tensor, reduce: str, pre: Tensor | None = None):
        self.offsets, self.index, self.reduce, self.pre = offsets, index, reduce, pre
        # (reading it back waits for the device, which a CUDA graph being recorded must not do:
        # then the kernel goes by the mean segment length)
        capturing = offsets.is_cuda and torch.cuda.is_current_stream_capturing()
        self.longest = None if capturing else triton_csr.longest_segment(offsets)


#: who multiplies by ``A`` on CUDA: "triton" (when installed) or "cusparse" (``torch.sparse.mm``)
cuda_provider = "triton" if triton_csr.AVAILABLE else "cusparse"


def _product(matrix, flat: Tensor, rows: int) -> Tensor:
    """``A @ flat`` for a 2-D ``flat``; ``matrix`` is ``A`` as :func:`_matrix` made it (None if empty)."""
    if matrix is None or flat.shape[1] == 0:
        return flat.new_zeros((rows, flat.shape[1]))
    if isinstance(matrix, TritonCSR):
        source = flat if matrix.pre is None else flat / matrix.pre
        return triton_csr.csr_reduce(source, matrix.offsets, matrix.index, rows, matrix.reduce,
                                     longest=matrix.longest)
    if torch._C._is_any_autocast_enabled():   # autocast would cast the product to a dtype MKL lacks; the
        with torch.autocast(flat.device.type, enabled=False):   # op's result has its source's dtype
            return _sparse_product(matrix, flat)
    return _sparse_product(matrix, flat)


def _sparse_product(matrix: Tensor, flat: Tensor) -> Tensor:
    if matrix.dtype != flat.dtype:   # bfloat16 or float16 on CPU: see _sparse_dtype
        return torch.sparse.mm(matrix, flat.to(matrix.dtype)).to(flat.dtype)
    return torch.sparse.mm(matrix, flat.contiguous())


_MATRICES: dict = {}
#: matrices built ahead for CUDA graphs (:func:`prepare_products`), alive while a compiled graph holds them
_PREPARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _multiplies_with_triton(device, dtype) -> bool:
    """Whether the Triton kernel multiplies by ``A`` (else ``torch.sparse.mm``). A function of its own
    so that a test can take the Triton path on CPU, in Triton's interpreter."""
    return (cuda_provider == "triton" and triton_csr.AVAILABLE and torch.device(device).type == "cuda"
            and dtype in triton_csr.FLOATS)


def _matrix(csr: Tensor, rows: int, columns: int, transpose: bool, reduce: str, dtype, device):
    """The sparse matrix of the product (None if empty); its values are :func:`entry_weights`.

    Cached per packed buffer: the graph passes the same constant on every
    call, and building the sparse tensor costs as much as a small product.
    The entry holds views of ``csr``, so its address cannot be reused while cached.
    """
    key = _matrix_key(csr, rows, columns, transpose, reduce, dtype, device)
    prepared = _PREPARED.get(key) if _PREPARED else None   # (empty unless CUDA graphs are compiled)
    if prepared is not None:
        return prepared
    cached = _MATRICES.get(key)
    if cached is not None and cached[0] is csr:
        return cached[1]
    matrix = _build_matrix(csr, rows, columns, transpose, reduce, dtype, key[-1])
    # one built while a CUDA graph records lies in the graph's memory pool: it must not outlive the run
    if not (csr.is_cuda and torch.cuda.is_current_stream_capturing()):
        if len(_MATRICES) > 256:
            _MATRICES.clear()
        _MATRICES[key] = (csr, matrix)
    return matrix


def _matrix_key(csr: Tensor, rows: int, columns: int, transpose: bool, reduce: str, dtype, device) -> tuple:
    triton = _multiplies_with_triton(device, dtype)
    return (csr.data_ptr(), csr.shape[0], rows, columns, transpose, reduce, dtype, device, triton)


def _build_matrix(csr: Tensor, rows: int, columns: int, transpose: bool, reduce: str, dtype, triton: bool):
    a, b = (columns, rows) if transpose else (rows, columns)
    offsets, index = unpack_csr(csr, a, b, transpose=transpose)
    if not index.shape[0]:
        return None
    if triton and reduce == "mean_adjoint":
        return TritonCSR(offsets, index, "sum", _adjoint_sizes(csr, a, b, transpose, dtype).unsqueeze(1))
    if triton:
        return TritonCSR(offsets, index, reduce)
    weights = entry_weights(csr, (a, b, transpose), offsets, index, reduce, _sparse_dtype(dtype, csr.device))
    global _BETA_NOTICE_SEEN
    if _BETA_NOTICE_SEEN:
        return torch.sparse_csr_tensor(offsets, index, weights, (rows, columns), check_invariants=False)
    # the CSR product is all we use of the sparse API: its "beta" notice (given once a process) is noise
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        matrix = torch.sparse_csr_tensor(offsets, index, weights, (rows, columns), check_invariants=False)
    _BETA_NOTICE_SEEN = True
    return matrix


_BETA_NOTICE_SEEN = False
_NUMPY_FLOATS = {torch.float32: numpy.float32, torch.float64: numpy.float64}


def prepare_products(source, csr: Tensor, rows: int | None = None, reduce: str = "sum",
                     transpose: bool = False) -> list:
    """Build now the matrices that ``gather_reduce(source, csr, rows, reduce, transpose)`` (or, with ``rows``
    None, ``gather_rows(source, csr)``) and its backward multiply by. Of ``source`` only its ``shape`` and
    ``dtype`` count (a fake tensor or the passes' ``TensorInfo`` will do). The caller holds the returned list;
    while it does, every call finds the matrices built.

    CUDA graphs need this: a matrix built during a recorded run would be allocated in the graphs' memory
    pool and outlive the run, and reading its longest segment back would wait for the device."""
    columns, dtype = source.shape[0], source.dtype
    if rows is None:   # gather_rows: index_select forward, the transposed product backward
        rows = _gather_rows_dims(source, csr)[0]
        products = [(columns, rows, True, "sum")]
    else:
        products = [(rows, columns, transpose, reduce), (columns, rows, not transpose, ADJOINT[reduce])]
    held = []
    for r, c, t, red in products:
        key = _matrix_key(csr, r, c, t, red, dtype, csr.device)
        matrix = _PREPARED.get(key)
        if matrix is None:
            matrix = _build_matrix(csr, r, c, t, red, dtype, key[-1])
        if matrix is not None:
            _PREPARED[key] = matrix
            held.append(matrix)
    return held


def _sparse_dtype(dtype: torch.dtype, device) -> torch.dtype:
    """The dtype of the sparse matrix for a source of ``dtype``: MKL multiplies only float32 and float64
    on CPU, so bfloat16 and float16 sources are multiplied in float32 and the result rounded back
    (each sum then rounds once, where eager's per-term additions in that dtype round at every term)."""
    if dtype in (torch.float32, torch.float64) or torch.device(device).type != "cpu":
        return dtype
    return torch.float32


def entry_weights(csr: Tensor, layout: tuple, offsets: Tensor, index: Tensor, reduce: str,
                   dtype: torch.dtype) -> Tensor:
    """The sparse matrix's values: 1 for ``sum``; for ``mean``, 1/size of the entry's segment; for
    ``mean_adjoint`` (the transposed matrix of a ``mean``), 1/size of the segment the entry came
    from. The product is then the mean, or its backward, itself: no division of the whole
    output (or gradient) per call."""
    if reduce == "sum":
        return torch.ones(index.shape[0], dtype=dtype, device=offsets.device)
    if offsets.device.type == "cpu" and dtype in _NUMPY_FLOATS:   # in numpy: a few microseconds, not tens
        if reduce == "mean":
            sizes = numpy.diff(offsets.numpy())
            return torch.from_numpy(numpy.repeat(_inverse_sizes(sizes, dtype), sizes))
        sizes = numpy.diff(unpack_csr(csr, *layout[:2], transpose=not layout[2])[0].numpy())
        return torch.from_numpy(_inverse_sizes(sizes, dtype)[index.numpy()])
    if reduce == "mean":
        return torch.repeat_interleave(1 / _counts(offsets, dtype), offsets[1:] - offsets[:-1],
                                       output_size=index.shape[0])
    return (1 / _adjoint_sizes(csr, *layout, dtype)).index_select(0, index.long())


def _inverse_sizes(sizes: numpy.ndarray, dtype: torch.dtype) -> numpy.ndarray:
    """1 / each segment size (at least 1: an empty segment reduces to 0), in ``dtype``: :func:`_counts` in numpy."""
    return 1 / numpy.maximum(sizes, 1).astype(_NUMPY_FLOATS[dtype])


def _adjoint_sizes(csr: Tensor, a: int, b: int, transpose: bool, dtype: torch.dtype) -> Tensor:
    """The segment sizes (at least 1) of the matrix whose transpose ``mean_adjoint`` multiplies by."""
    return _counts(unpack_csr(csr, a, b, transpose=not transpose)[0], dtype)


_lib.impl("gather_reduce", _gather_reduce, "CompositeExplicitAutograd")
gather_reduce = torch.ops.dynamo_relational.gather_reduce.default


@torch.library.register_fake("dynamo_relational::gather_reduce")
def _(source, csr, rows, reduce, transpose=False):
    _check(source, csr, reduce)
    return source.new_empty((rows, *source.shape[1:]))


def _setup_gather_reduce(ctx, inputs, output):
    source, csr, rows, reduce, transpose = inputs
    ctx.rows, ctx.reduce, ctx.transpose, ctx.source_rows = rows, reduce, transpose, source.shape[0]
    ctx.save_for_backward(csr)


def _gather_reduce_backward(ctx, grad_out: Tensor):
    (csr,) = ctx.saved_tensors
    return gather_reduce(grad_out, csr, ctx.source_rows, ADJOINT[ctx.reduce], not ctx.transpose), None, None, None, None


torch.library.register_autograd("dynamo_relational::gather_reduce", _gather_reduce_backward,
                               setup_context=_setup_gather_reduce)


def _gather_rows_dims(source: Tensor, csr: Tensor) -> tuple[int, int]:
    # csr = [arange(rows + 1), index (rows), offsets_t (columns + 1), index_t (rows)]
    rest = csr.shape[0] - source.shape[0] - 2
    rows = rest // 3
    if rest % 3 or rows < 0:
        raise ValueError(f"gather_rows: packed CSR of length {csr.shape[0]} does not fit a source of "
                         f"{source.shape[0]} rows")
    return rows, source.shape[0]


def _gather_rows(source: Tensor, csr: Tensor) -> Tensor:
    if source.dim() == 0:
        raise ValueError("gather_rows: source must have rows, got a 0-d tensor")
    _, index = unpack_csr(csr, *_gather_rows_dims(source, csr))
    return source.index_select(0, index)


_lib.impl("gather_rows", _gather_rows, "CompositeExplicitAutograd")
gather_rows = torch.ops.dynamo_relational.gather_rows.default


@torch.library.register_fake("dynamo_relational::gather_rows")
def _(source, csr):
    rows, _ = _gather_rows_dims(source, csr)
    return source.new_empty((rows, *source.shape[1:]))


def _setup_gather_rows(ctx, inputs, output):
    source, csr = inputs
    ctx.source_rows = source.shape[0]
    ctx.save_for_backward(csr)


def _gather_rows_backward(ctx, grad_out: Tensor):
    (csr,) = ctx.saved_tensors
    return gather_reduce(grad_out, csr, ctx.source_rows, "sum", True), None


torch.library.register_autograd("dynamo_relational::gather_rows", _gather_rows_backward,
                               setup_context=_setup_gather_rows)


def unit_offsets(rows: int, device=None) -> Tensor:
    """CSR offsets of ``rows`` segments of one entry each (a plain gather)."""
    return torch.arange(rows + 1, device=device)


# --------------------------------------------------------------------------- eager forms

class _Plan:
    """One product ``out = A @ source`` (or gather ``source[index]``) with ``A`` prepared once, and its transpose.

    The eager forms below run a grouped graph's products as plain ATen calls
    under one ``torch.autograd.Function`` each, or, when no gradient is
    recorded, without it: the custom ops' Python dispatch and autograd
    wrapper cost tens of microseconds per call, as much as a product itself
    on Mutagenesis-sized graphs.
    """
    __slots__ = ("matrix", "index", "rows", "transpose")

    def __init__(self, matrix, index, rows: int):
        self.matrix, self.index, self.rows = matrix, index, rows
        self.transpose: _Plan | None = None

    def apply(self, source: Tensor) -> Tensor:
        if self.index is not None:      # one entry per row: a gather
            return source.index_select(0, self.index)
        flat = source if source.dim() == 2 else flat_rows(source)
        out = _product(self.matrix, flat, self.rows)
        return out if source.dim() == 2 else out.reshape((self.rows, *source.shape[1:]))


class _Product(torch.autograd.Function):
    @staticmethod
    def forward(ctx, source: Tensor, plan: _Plan) -> Tensor:
        ctx.plan = plan
        return plan.apply(source)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _Product.apply(grad, ctx.plan.transpose), None


_PLANS: dict = {}


def _plan(csr: Tensor, rows: int, columns: int, transpose: bool, reduce: str, dtype, device,
          gather: bool = False) -> _Plan:
    """The plan of ``gather_reduce`` (or, with ``gather``, ``gather_rows``) and its transpose, cached
    per packed buffer as :func:`_matrix` is."""
    key = (csr.data_ptr(), csr.shape[0], rows, columns, transpose, reduce, dtype, device, gather, cuda_provider)
    cached = _PLANS.get(key)
    if cached is not None and cached[0] is csr:
        return cached[1]
    if gather:   # gather_rows: an index_select forward, the transposed product backward
        a, b = (columns, rows) if transpose else (rows, columns)
        plan = _Plan(None, unpack_csr(csr, a, b, transpose=transpose)[1], rows)
    else:
        plan = _Plan(_matrix(csr, rows, columns, transpose, reduce, dtype, device), None, rows)
    back = _matrix(csr, columns, rows, not transpose, "sum" if gather else ADJOINT[reduce], dtype, device)
    plan.transpose = _Plan(back, None, columns)
    plan.transpose.transpose = plan
    if len(_PLANS) > 256:
        _PLANS.clear()
    _PLANS[key] = (csr, plan)
    return plan


def gather_reduce_eager(source: Tensor, csr: Tensor, rows: int, reduce: str, transpose: bool = False) -> Tensor:
    """:data:`gather_reduce`, computed the same way, with less per-call overhead (see :class:`_Plan`)."""
    _check(source, csr, reduce)
    return _apply(source, _plan(csr, rows, source.shape[0], transpose, reduce, source.dtype, source.device))


def gather_rows_eager(source: Tensor, csr: Tensor) -> Tensor:
    """:data:`gather_rows`, computed the same way, with less per-call overhead (see :class:`_Plan`)."""
    if source.dim() == 0:
        raise ValueError("gather_rows: source must have rows, got a 0-d tensor")
    rows, columns = _gather_rows_dims(source, csr)
    return _apply(source, _plan(csr, rows, columns, False, "sum", source.dtype, source.device, gather=True))


def _apply(source: Tensor, plan: _Plan) -> Tensor:
    """``plan`` applied to ``source``, through the autograd function only when a gradient is recorded
    (its ``apply`` costs as much as a small product; inference calls skip it)."""
    if torch.is_grad_enabled() and source.requires_grad:
        return _Product.apply(source, plan)
    return plan.apply(source)


#: the custom ops of this module -> their eager forms (``dynamo_relational.backend.aten_executor``)
EAGER_FORMS = {gather_reduce: gather_reduce_eager, gather_rows: gather_rows_eager}


# --------------------------------------------------------------------------- forms for indices new on every call

def pack_indexed(offsets: Tensor, index: Tensor) -> Tensor:
    """The indexed layout ``[offsets, index, row_of]`` of ``A`` that :func:`gather_reduce_indexed` reads on the
    CPU: the CSR and each entry's row, which ``index_add`` takes (``row_of`` ascends)."""
    offsets, index = offsets.long(), index.long()
    row_of = torch.repeat_interleave(torch.arange(offsets.shape[0] - 1, device=offsets.device),
                                     offsets[1:] - offsets[:-1], output_size=index.shape[0])
    return torch.cat([offsets, index, row_of])


def gather_reduce_indexed(source: Tensor, csr: Tensor, rows: int, reduce: str, transpose: bool = False) -> Tensor:
    """:data:`gather_reduce` as ATen's ``index_select`` and ``index_add`` (a mean then scales each row by 1/its
    segment's size), with ATen's own autograd: for graphs whose index tensors are new on every call (the
    batches of a union, :mod:`dynamo_relational.batching`), where building the sparse matrices of
    :func:`gather_reduce_eager` costs more than multiplying by them. On the CPU ``csr`` is in the indexed
    layout (:func:`pack_indexed`), which the batch assembly writes; a sum or mean, not transposed. On CUDA,
    whose ``index_add`` adds in no fixed order, it is :func:`gather_reduce_eager` of the packed layout."""
    if not source.is_cpu:   # (the property: no device object made on every call)
        return gather_reduce_eager(source, csr, rows, reduce, transpose)
    _check(source, csr, reduce)
    if transpose or reduce not in GATHER_REDUCTIONS:
        raise ValueError(f"gather_reduce_indexed: a sum or mean, not transposed, got {reduce!r}"
                         + (" transposed" if transpose else ""))
    nnz, odd = divmod(csr.shape[0] - rows - 1, 2)
    if odd or nnz < 0:
        raise ValueError(f"indexed CSR of length {csr.shape[0]} does not fit {rows} rows")
    index, row_of = csr[rows + 1:rows + 1 + nnz], csr[rows + 1 + nnz:]
    gathered = source if _reads_in_order(index, source.shape[0]) else source.index_select(0, index)
    out = source.new_zeros((rows, *source.shape[1:])).index_add_(0, row_of, gathered)
    if reduce == "mean":
        out = out / _counts(csr[:rows + 1], source.dtype).view(-1, *[1] * (source.dim() - 1))
    return out


def _reads_in_order(index: Tensor, source_rows: int) -> bool:
    """Whether ``index`` reads every source row once, in order (a pooling of each sample's own rows): then the
    gather, and the scatter of its backward, are skipped."""
    return index.shape[0] == source_rows and torch.equal(index, torch.arange(source_rows, device=index.device))


def gather_rows_indexed(source: Tensor, csr: Tensor) -> Tensor:
    """:data:`gather_rows` as ``index_select`` with ATen's autograd (see :func:`gather_reduce_indexed`)."""
    if not source.is_cpu:
        return gather_rows_eager(source, csr)
    return _gather_rows(source, csr)


#: the custom ops of this module -> their forms for graphs whose index tensors are new on every call
INDEXED_FORMS = {gather_reduce: gather_reduce_indexed, gather_rows: gather_rows_indexed}
