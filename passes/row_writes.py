"""Rows written one by one into a new tensor become one ``stack``.

Rewrites ``out = torch.zeros(n, d)`` (or ``x.new_zeros``, ``torch.zeros_like``,
``torch.empty``) followed by ``out[i] = h_i`` for constant integers ``i``
(``operator.setitem``, the common way to fill an output row by row) into
``torch.stack`` of the rows, in index order, where every row is written; into
``index_put`` of that stack into ``out`` where some rows keep their zeros. A
row written twice holds its last value.

Legal when, before its last row write, ``out`` has no user but the row writes
(no read, no other write, no view), no other in-place op and no mode switch
(``torch.no_grad()``) runs between the first and the last write (the stack
reads the rows at the last, in the mode there), and every
``h_i`` has exactly a row's shape, dtype and device (``setitem`` would cast or
broadcast): then ``out`` after the last write is exactly that stack (those
rows in zeros), and each later reader sees it. Tensors of uninitialized memory (``empty``) must have
every row written. Saves the in-place writes, which otherwise keep the whole
graph in its order, ungrouped (``passes/inplace.py``): the rows then group.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import TensorInfo, tensor_info

from .context import PassContext
from .inplace import is_in_place, is_zeros
from .mode_regions import is_mode_switch

_EMPTY_FUNCTIONS = (torch.empty, torch.empty_like)


def _new_tensor(node: fx.Node) -> str | None:
    """``"zeros"`` or ``"empty"`` where ``node`` makes a new tensor on every call, else None."""
    if node.op == "get_attr":
        return None   # a constant is shared by every call (the fast front-end records the factories written into)
    if is_zeros(node):
        return "zeros"
    if (node.op == "call_function" and node.target in _EMPTY_FUNCTIONS) or \
            (node.op == "call_method" and node.target == "new_empty"):
        return "empty"
    return None


def _row_write(node: fx.Node, base: fx.Node, info: TensorInfo) -> int | None:
    """The row ``node`` writes into ``base`` (``base[i] = h`` with ``h`` of exactly a row's info), else None."""
    if node.op != "call_function" or node.target is not operator.setitem or node.kwargs or len(node.args) != 3:
        return None
    target, index, value = node.args
    if target is not base or type(index) is not int or not -info.shape[0] <= index < info.shape[0]:
        return None
    row = TensorInfo(info.shape[1:], info.dtype, info.device)
    return index % info.shape[0] if isinstance(value, fx.Node) and tensor_info(value) is row else None


def _writes_between(first: fx.Node, last: fx.Node, own: set) -> bool:
    """Whether an in-place op other than ``own``, or a mode switch, runs between ``first`` and ``last``: it might
    change a row's value after its write copied it, or the grad mode a row was written in, and the stack reads
    the rows at ``last``, in the mode there."""
    node = first.next
    while node is not last:
        if (node not in own and is_in_place(node)) or is_mode_switch(node):
            return True
        node = node.next
    return False


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    graph = gm.graph
    written = graph.find_nodes(op="call_function", target=operator.setitem)   # (an index, not a walk)
    bases = [(n, kind) for n in dict.fromkeys(w.args[0] for w in written if w.args and isinstance(w.args[0], fx.Node))
             if (kind := _new_tensor(n)) is not None]
    if not bases:
        return gm
    position = {n: i for i, n in enumerate(graph.nodes)}
    rewritten = 0
    for base, kind in bases:
        info = tensor_info(base)
        if info is None or info.rank == 0:
            continue
        writes = sorted((u for u in base.users if _row_write(u, base, info) is not None), key=position.get)
        if not writes:
            continue
        last, own = position[writes[-1]], set(writes)
        readers = [u for u in base.users if u not in own]
        if any(position[u] < last for u in readers) or any(w.users for w in writes) or \
                _writes_between(writes[0], writes[-1], own):
            continue
        rows = {_row_write(w, base, info): w.args[2] for w in writes}   # (in order: the last write wins)
        complete = len(rows) == info.shape[0]
        if not complete and kind != "zeros":
            continue
        indices = sorted(rows)
        with graph.inserting_after(writes[-1]):
            stacked = graph.call_function(torch.stack, ([rows[i] for i in indices],))
            stacked.meta["rel_info"] = TensorInfo((len(indices), *info.shape[1:]), info.dtype, info.device)
            if complete:
                new = stacked
            else:
                with graph.inserting_after(stacked):
                    index = graph.call_function(torch.tensor, (indices,), {"device": info.device})
                    index.meta["rel_info"] = TensorInfo((len(indices),), torch.int64, info.device)
                with graph.inserting_after(index):
                    new = graph.call_function(torch.index_put, (base, (index,), stacked))
                new.meta["rel_info"] = info
        for reader in readers:
            reader.replace_input_with(base, new)
        for write in writes:
            graph.erase_node(write)
        if not base.users:
            graph.erase_node(base)
        rewritten += 1
    ctx.stats["row_writes"] = rewritten
    return gm
