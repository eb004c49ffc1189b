"""Gather simplification: index tensors that are ranges become views.

Rewrites a row gather (``gather_rows`` / ``index_select``, see :mod:`gather_nodes`):

* ``base[arange(rows(base))]`` (identity) -> ``base``;
* ``base[arange(a, a + n * s, s)]`` (a contiguous or strided run, including a
  single row) -> the slice ``base[a : a + n * s : s]``.

Legal because these indices read exactly the rows the slice reads, in the
same order. Saves the copy and the index buffer: a slice is a view, and its
backward is a strided copy into zeros instead of a scatter.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .context import PassContext
from .gather_nodes import as_gather, rows, set_rows_info


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    simplified = 0
    for node in list(gm.graph.nodes):
        gather = as_gather(gm, node)
        if gather is None or gather.reduces or rows(gather.base) is None:
            continue
        run_ = _arithmetic_run(gather.index)
        if run_ is None:
            continue
        start, step, count = run_
        if start == 0 and step == 1 and count == rows(gather.base):
            node.replace_all_uses_with(gather.base)
        else:
            with gm.graph.inserting_before(node):
                view = gm.graph.call_function(operator.getitem, (
                    gather.base, slice(start, start + (count - 1) * step + 1, step)))
            set_rows_info(view, node, count)
            node.replace_all_uses_with(view)
        gm.graph.erase_node(node)
        simplified += 1
    ctx.stats["gathers_simplified"] = simplified
    return gm


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
