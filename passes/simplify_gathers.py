"""Gather simplification: index tensors that are ranges, or repeated ranges, become views.

Rewrites a row gather (``gather_rows`` / ``index_select``, see :mod:`gather_nodes`)
whose constant index is, with ``run = arange(a, a + n * s, s)`` (``s >= 1``):

* ``arange(rows(base))`` (identity) -> ``base``;
* ``run`` (a contiguous or strided run, including a single row) -> the slice
  ``base[a : a + (n - 1) * s + 1 : s]``;
* ``run.repeat(k)`` ("dimension-1 repetition", a repeated subsequence
  ``[a, a+s, .., a, a+s, ..]``) ->
  ``base[run].unsqueeze(0).expand(k, n, *rest).reshape(k * n, *rest)``;
* ``run.repeat_interleave(k)`` ("dimension-2 repetition", each row repeated
  ``k`` times ``[a, a, .., a+s, a+s, ..]``) ->
  ``base[run].unsqueeze(1).expand(n, k, *rest).reshape(n * k, *rest)``
  (a single row repeated, ``n == 1``, takes this form).

The names are those of the NeuraLogic vectorizer thesis (seeds/000, 5.2.1).
Detection is a few tensor ops on the index: the first repeat of ``index[0]``
(dimension 1) or the first change of value (dimension 2) gives the candidate
factorization, the index reshaped to ``[k, n]`` / ``[n, k]`` must equal its
first row / column broadcast, and that row / column must be a run.

Legal because, in row-major order, row ``i`` of the reshaped ``[k, n, ..]``
broadcast is row ``i % n`` of the slice (dimension 1) and of ``[n, k, ..]`` is
row ``i // k`` (dimension 2): exactly the rows the index reads, in order.

What it saves. A slice is a view: no copy, no index buffer, and its backward
is a strided copy into zeros instead of a scatter. The repetitions are views
up to the final ``reshape``, which must copy when run eagerly (the ATen
executor), but which Inductor lowers to index arithmetic (``x[i % n]`` /
``x[i // k]``) and inlines into a pointwise consumer, so the repeated rows are
never written and no index buffer is read, whereas the opaque ``gather_rows``
op always materializes its output; the backward of ``expand`` is a dense,
deterministic sum over the repeat dimension instead of a CSR gather of the
transposed index. ``python -m benchmarks.repetition --threads 1`` (a 250 x 64
run read 8 times, forward+backward, Inductor's code): 0.66x the gather's
time for dimension 1 and 0.51x for dimension 2 on the 2-core machine; with
``--autotune`` the ATen executor runs both and the ratio is 0.83x (its
``reshape`` copies). Of the example models only the LRNN fires (its rule
weights are read with each row repeated).

Gathers that reduce (``gather_reduce``) are left alone. Counts:
``stats["gathers_simplified"]`` (identity and slices) and
``stats["gathers_broadcast"]`` (repetitions).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import TensorInfo, tensor_info

from .context import PassContext
from .gather_nodes import as_gather, rows, set_rows_info


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    simplified = broadcast = 0
    for node in list(gm.graph.nodes):
        gather = as_gather(gm, node)
        if gather is None or gather.reduces or rows(gather.base) is None:
            continue
        run_ = _arithmetic_run(gather.index)
        if run_ is not None:
            node.replace_all_uses_with(_run_view(gm, node, gather.base, run_))
            simplified += 1
        else:
            repetition = repetition_of(gather.index)
            if repetition is None:
                continue
            node.replace_all_uses_with(_broadcast_view(gm, node, gather.base, *repetition))
            broadcast += 1
        gm.graph.erase_node(node)
    ctx.stats["gathers_simplified"] = simplified
    ctx.stats["gathers_broadcast"] = broadcast
    return gm


def _run_view(gm: fx.GraphModule, node: fx.Node, base: fx.Node, run_: tuple[int, int, int]) -> fx.Node:
    """``base[start : .. : step]`` (``count`` rows), inserted before ``node``; ``base`` itself if that is all of it."""
    start, step, count = run_
    if start == 0 and step == 1 and count == rows(base):
        return base
    with gm.graph.inserting_before(node):
        view = gm.graph.call_function(operator.getitem, (base, slice(start, start + (count - 1) * step + 1, step)))
    set_rows_info(view, base, count)
    return view


def _broadcast_view(gm: fx.GraphModule, node: fx.Node, base: fx.Node, dim: int, times: int,
                    run_: tuple[int, int, int]) -> fx.Node:
    """The rows ``run_`` of ``base`` ``times`` times over (``dim == 1``) or each ``times`` times (``dim == 2``)."""
    count = run_[2]
    like = tensor_info(base)   # known: the pass only rewrites gathers of bases with known rows
    rest = like.shape[1:]
    if dim == 1:
        lifted_shape, grid = (1, count, *rest), (times, count, *rest)
    else:
        lifted_shape, grid = (count, 1, *rest), (count, times, *rest)
    source = _run_view(gm, node, base, run_)
    with gm.graph.inserting_before(node):
        lifted = _with_info(gm.graph.call_method("unsqueeze", (source, dim - 1)), lifted_shape, like)
        spread = _with_info(gm.graph.call_method("expand", (lifted, grid)), grid, like)
        flat = gm.graph.call_method("reshape", (spread, (times * count, *rest)))
    set_rows_info(flat, base, times * count)
    return flat


def _with_info(node: fx.Node, shape: tuple[int, ...], like: TensorInfo) -> fx.Node:
    node.meta["rel_info"] = TensorInfo(shape, like.dtype, like.device)
    return node


def _arithmetic_run(index: torch.Tensor) -> tuple[int, int, int] | None:
    """``(start, step, count)`` if ``index`` is ``start + step * arange(count)`` with ``step >= 1``."""
    count = index.shape[0]
    if count == 0:
        return None
    start = int(index[0])
    step = int(index[1] - index[0]) if count > 1 else 1
    if step < 1:
        return None
    expected = torch.arange(start, start + step * count, step, device=index.device, dtype=index.dtype)
    return (start, step, count) if torch.equal(index, expected) else None


def repetition_of(index: torch.Tensor) -> tuple[int, int, tuple[int, int, int]] | None:
    """``(dim, k, run)`` if ``index`` is an arithmetic ``run`` repeated ``k >= 2`` times, else None.

    ``dim == 1``: ``run.repeat(k)`` (the whole run, ``k`` times);
    ``dim == 2``: ``run.repeat_interleave(k)`` (each element ``k`` times; also
    a single row repeated, ``run`` of length 1). ``run`` is ``(start, step, count)``
    as :func:`_arithmetic_run` gives it. A plain run (``k == 1``) is not a repetition.
    """
    total = index.shape[0]
    if index.dim() != 1 or total < 2:
        return None
    if bool(index[1] == index[0]):
        # dimension 2: k is the length of the first block of equal values
        changes = torch.nonzero(index != index[0])
        times = int(changes[0, 0]) if changes.numel() else total
        dim, count = 2, total // times
    else:
        # dimension 1: the run is strictly increasing, so it ends where index[0] comes back
        again = torch.nonzero(index[1:] == index[0])
        if not again.numel():
            return None
        count = int(again[0, 0]) + 1
        dim, times = 1, total // count
    if times < 2 or times * count != total:
        return None
    table = index.reshape((times, count) if dim == 1 else (count, times))
    first = table[:1] if dim == 1 else table[:, :1]
    if not torch.equal(table, first.expand_as(table)):
        return None
    run_ = _arithmetic_run(first.reshape(-1))
    return None if run_ is None else (dim, times, run_)
