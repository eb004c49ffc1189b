"""Rows written or accumulated one by one into a new tensor become one ``stack``.

Rewrites ``out = torch.zeros(n, d)`` (or ``x.new_zeros``, ``torch.zeros_like``,
``torch.empty``, ``torch.Tensor(n, d)``) followed by ``out[i] = h`` and ``out[i] += m`` for constant
integers ``i`` (the common ways to fill an output row by row, or to add each
message into its neuron's row) into each row's value, the sum of the terms
added since its last write (``+`` chains, which the aggregation pass makes one
aggregate), and ``torch.stack`` of those rows in index order where every row
is updated; ``index_put`` of that stack into ``out`` where some rows keep their
zeros.

Legal when, before its last update, ``out`` has no user but the updates (no
read, no other write, no view), no other in-place op and no mode switch
(``torch.no_grad()``) runs between the first and the last update (the stack
reads the rows at the last, in the mode there), and every ``h`` and ``m`` has
exactly a row's shape, dtype and device (``setitem`` and ``+=`` would cast or
broadcast): then ``out`` after the last update is exactly that stack (those
rows in zeros), and each later reader sees it. Tensors of uninitialized memory
(``empty``) must have every row written, and written before any addition.
Saves the in-place ops, which otherwise keep the whole graph in its order,
ungrouped (``passes/inplace.py``): the rows then group.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import TensorInfo, tensor_info
from dynamo_relational.ops.facts import LEGACY_CONSTRUCTORS, is_zeros, makes_tensor, uninitialized, writes

from .context import PassContext
from .mode_regions import is_mode_switch


def _new_tensor(node: fx.Node) -> str | None:
    """``"zeros"`` or ``"empty"`` where ``node`` makes a new tensor on every call, else None."""
    if node.op == "get_attr":
        return None   # a constant is shared by every call (the fast front-end records the factories written into)
    if is_zeros(node):
        return "zeros"
    if makes_tensor(node) and uninitialized(node):
        return "empty"
    if (node.op == "call_function" and node.target in LEGACY_CONSTRUCTORS and node.args and not node.kwargs
            and all(type(a) is int for a in node.args)):
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
        if (node not in own and writes(node)) or is_mode_switch(node):
            return True
        node = node.next
    return False


def _accumulation(read: fx.Node, base: fx.Node, info: TensorInfo) -> tuple | None:
    """``base[i] += h`` as traced, ``base[i]`` (``read``), ``iadd(read, h)``, ``base[i] = that``:
    ``(i, h, iadd, setitem)``, with ``h`` of exactly a row's info, else None."""
    if read.op != "call_function" or read.target is not operator.getitem or read.args[0] is not base \
            or len(read.users) != 1:
        return None
    add = next(iter(read.users))
    if add.op != "call_function" or add.target is not operator.iadd or add.args[0] is not read \
            or len(add.args) != 2 or add.kwargs or len(add.users) != 1:
        return None
    write, term = next(iter(add.users)), add.args[1]
    i = _row_write(write, base, info)
    row = TensorInfo(info.shape[1:], info.dtype, info.device)
    if i is None or write.args[2] is not add or not isinstance(term, fx.Node) or tensor_info(term) is not row \
            or type(read.args[1]) is not int or read.args[1] % info.shape[0] != i:
        return None
    return i, term, add, write


def _updates(base: fx.Node, info: TensorInfo, position: dict) -> tuple[list, list, set] | None:
    """``base``'s users in graph order, as row updates ``(row, value, accumulates)`` (``base[i] = h`` and
    ``base[i] += h``) and the other users (readers), with the nodes of the updates (``own``)."""
    updates, readers, own = [], [], set()
    for user in sorted(base.users, key=position.get):
        if user in own:
            continue   # the write that ends an accumulation
        accumulation = _accumulation(user, base, info)
        if accumulation is not None:
            i, term, add, write = accumulation
            updates.append((i, term, True))
            own.update((user, add, write))
        elif (i := _row_write(user, base, info)) is not None:
            updates.append((i, user.args[2], False))
            own.add(user)
        else:
            readers.append(user)
    return updates, readers, own


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
        updates, readers, own = _updates(base, info, position)
        if not updates:
            continue
        nodes = sorted(own, key=position.get)
        first, last = nodes[0], nodes[-1]
        if any(position[u] < position[last] for u in readers) or \
                any(u not in own for node in nodes for u in node.users) or _writes_between(first, last, own):
            continue
        rows: dict[int, list] = {}   # row -> the terms of its value after the last update
        for i, value, accumulates in updates:
            if not accumulates:
                rows[i] = [value]
            elif i in rows or kind == "zeros":
                rows.setdefault(i, []).append(value)
            else:
                break   # an addition to uninitialized memory
        else:
            complete = len(rows) == info.shape[0]
            if not complete and kind != "zeros":
                continue
            _replace(graph, base, info, rows, complete, last, readers)
            for node in reversed(nodes):   # users first
                graph.erase_node(node)
            if not base.users:
                graph.erase_node(base)
            rewritten += 1
    ctx.stats["row_writes"] = rewritten
    return gm


def _replace(graph: fx.Graph, base: fx.Node, info: TensorInfo, rows: dict, complete: bool, last: fx.Node,
             readers: list) -> None:
    """After ``last``: each row's value (the sum of its terms), their stack (``index_put`` into ``base``
    where some rows keep their zeros), read by ``readers`` instead of ``base``."""
    row = TensorInfo(info.shape[1:], info.dtype, info.device)
    indices = sorted(rows)
    at = last
    values = []
    for i in indices:
        value = rows[i][0]
        for term in rows[i][1:]:
            with graph.inserting_after(at):
                value = at = graph.call_function(operator.add, (value, term))
            value.meta["rel_info"] = row
        values.append(value)
    with graph.inserting_after(at):
        new = stacked = graph.call_function(torch.stack, (values,))
    stacked.meta["rel_info"] = TensorInfo((len(indices), *info.shape[1:]), info.dtype, info.device)
    if not complete:
        with graph.inserting_after(stacked):
            index = graph.call_function(torch.tensor, (indices,), {"device": info.device})
        index.meta["rel_info"] = TensorInfo((len(indices),), torch.int64, info.device)
        with graph.inserting_after(index):
            new = graph.call_function(torch.index_put, (base, (index,), stacked))
        new.meta["rel_info"] = info
    for reader in readers:
        reader.replace_input_with(base, new)
