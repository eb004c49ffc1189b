"""An element picked out of each row by an index per row, ``x[torch.arange(k), labels]`` (or
``x[range(k), labels]``), becomes ``x.gather(1, labels[:, None])[:, 0]``.

Per-node code that writes its likelihood by hand picks each node's label's
log-probability out of the rows of its stacked scores with advanced indexing.
That index reads the scores as a whole; a gather within each row by that row's
index is row-wise, and the ragged-rows pass splits it into a gather per node
of its own label (in a union of samples, a row read of the sample's labels).

Legal because both read element ``labels[i]`` of row ``i`` for every ``i`` of
a ``[k, c]`` value ``x`` and a ``[k]`` int64 ``labels`` (advanced indexing
with these two index tensors broadcast together is exactly that); the
backward of both adds each gradient into the element read. Only a range that
counts the rows from 0 in steps of 1 is rewritten: a constant tensor equal to
it, a ``torch.arange`` call or a Python ``range``.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.nodes import meta_without_value, new_node
from dynamo_relational.ops import TensorInfo, tensor_info

from .context import PassContext
from .gather_nodes import constant_value


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    picked = 0
    graph = gm.graph
    for node in list(graph.find_nodes(op="call_function", target=operator.getitem)):
        x, index = node.args if len(node.args) == 2 and not node.kwargs else (None, None)
        if type(index) is not tuple or len(index) != 2:   # (most reads: x[v])
            continue
        info, x_info = tensor_info(node), tensor_info(x)
        if x_info is None or info is None or x_info.rank != 2:
            continue
        rows, labels = index
        label_info = tensor_info(labels)
        k = x_info.shape[0]
        if label_info is None or label_info.shape != (k,) or label_info.dtype != torch.int64 \
                or not _counts_rows(gm, rows, k):
            continue
        meta = meta_without_value(node)
        with graph.inserting_before(node):
            column = new_node(graph, "call_function", operator.getitem, (labels, (slice(None), None)), {})
            column.meta.update(meta, rel_info=TensorInfo((k, 1), torch.int64, label_info.device))
            gathered = new_node(graph, "call_function", torch.gather, (x, 1, column), {})
            gathered.meta.update(meta, rel_info=TensorInfo((k, 1), x_info.dtype, x_info.device))
            pick = new_node(graph, "call_function", operator.getitem, (gathered, (slice(None), 0)), {})
            pick.meta.update(meta, rel_info=info)
        node.replace_all_uses_with(pick)
        graph.erase_node(node)
        if isinstance(rows, fx.Node) and not rows.users:
            graph.erase_node(rows)
        picked += 1
    ctx.stats["rows_picked"] = picked
    return gm


def _counts_rows(gm: fx.GraphModule, rows, k: int) -> bool:
    """Whether ``rows`` is ``0, 1, ..., k - 1``: a Python ``range``, a ``torch.arange`` call or a constant."""
    if type(rows) is range:
        return rows == range(k)
    if not isinstance(rows, fx.Node):
        return False
    if rows.op == "call_function" and rows.target is torch.arange:
        bounds = rows.args if not set(rows.kwargs) - {"dtype", "device"} else None
        return bounds in ((k,), (0, k), (0, k, 1)) and rows.kwargs.get("dtype") in (None, torch.int64)
    if rows.op == "get_attr":
        value = constant_value(gm, rows)
        return value is not None and value.dtype == torch.int64 and value.shape == (k,) \
            and bool(torch.equal(value.cpu(), torch.arange(k)))
    return False
