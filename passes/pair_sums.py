"""Sums of one row of each of two joined values: ``gather_reduce(cat([a, b]), ...)`` -> ``a[I] + b``.

The aggregation sums a node's terms, read from the groups that computed them,
as one ``gather_reduce`` over those groups joined by ``torch.cat``. A
TreeLSTM cell's ``W x + U h`` is such a sum of two terms, one per level. Where
every segment sums one row of ``a`` and row ``i`` of ``b`` (``b`` has one row
per segment, in order), the sum is ``gather_rows(a, I) + b``: the join, the
zeros and scatter of the sum, and their backward no longer run; a gather of
``a`` and an add do (which Inductor can fuse with their readers).

Legal for any such index: a sum of two terms is the same in either order
(floating-point addition commutes), so the values are equal and the gradients
the same maps. On a union of samples it holds for every batch: segment ``i``
reads row ``i`` of ``b``, so that row belongs to the segment's sample, and a
batch keeps the rows of ``b`` and of the sum in the same order.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from dynamo_relational.kernels.gather_reduce import pack_csr, unit_offsets
from dynamo_relational.ops import tensor_info

from .context import PassContext
from .gather_nodes import add_constant, as_gather, is_cat0, rows, set_rows_info

_GATHER_ROWS = torch.ops.dynamo_relational.gather_rows.default
_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    rewritten = 0
    for node in list(gm.graph.nodes):
        match = _match(gm, node)
        if match is None:
            continue
        a, b, index = match
        with gm.graph.inserting_before(node):
            csr = add_constant(gm, pack_csr(unit_offsets(index.shape[0], index.device), index, rows(a)), "csr")
            gathered = gm.graph.call_function(_GATHER_ROWS, (a, csr))
            total = gm.graph.call_function(torch.add, (gathered, b))
        set_rows_info(gathered, a, index.shape[0])
        total.meta.update(node.meta)
        node.replace_all_uses_with(total)
        gm.graph.erase_node(node)   # (the join goes with cleanup, where nothing else reads it)
        rewritten += 1
    ctx.stats["pair_sums"] = rewritten
    return gm


def _match(gm: fx.GraphModule, node: fx.Node) -> tuple[fx.Node, fx.Node, torch.Tensor] | None:
    """``(a, b, I)`` of a sum the module docstring's conditions allow rewriting, else None (``b`` may be either
    of the joined values)."""
    if node.op != "call_function" or node.target is not _GATHER_REDUCE:
        return None
    gather = as_gather(gm, node)
    reduce = node.args[3] if len(node.args) > 3 else node.kwargs.get("reduce")
    if gather is None or gather.offsets is None or reduce != "sum" or not is_cat0(gather.base) \
            or len(gather.base.args[0]) != 2:
        return None
    parts, segments = gather.base.args[0], node.args[2]
    counts = [rows(part) for part in parts]
    infos = [tensor_info(n) for n in (*parts, node)]
    if type(segments) is not int or None in counts or None in infos \
            or len({(info.shape[1:], info.dtype) for info in infos}) != 1:
        return None
    offsets, index = gather.offsets.long(), gather.index.long()
    if not torch.equal(offsets, torch.arange(0, 2 * segments + 1, 2, device=offsets.device)):
        return None
    pairs = index.view(segments, 2)
    for b in (1, 0):
        start = 0 if b == 0 else counts[0]   # where part b's rows begin in the join
        own = torch.arange(segments, device=index.device) + start
        read = torch.where(pairs[:, 1] == own, pairs[:, 0], pairs[:, 1])   # the other entry of each segment
        other_start = counts[0] if b == 0 else 0
        if counts[b] == segments and bool(((pairs[:, 0] == own) | (pairs[:, 1] == own)).all()) \
                and bool(((read >= other_start) & (read < other_start + counts[1 - b])).all()):
            return parts[1 - b], parts[b], read - other_start
    return None
