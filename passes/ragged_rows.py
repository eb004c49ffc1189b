"""Ragged fan-ins: a neuron's inputs joined as rows, ``torch.cat([h_1, ..., h_k], 0)``, run through row-wise
ops and reduced over the rows, become the ops on each input and an n-ary sum.

Per-node code often joins a node's k children's states into one ``[k, d]``
tensor, runs linear and elementwise ops over its rows and sums them (the
child-sum TreeLSTM: ``torch.sum(sigmoid(U(child_h) + W(x).repeat(k, 1)) *
child_c, dim=0)``). Every distinct k is then its own shape, so nodes with 1, 2
and 3 children never share a group. This pass rewrites

* ``C = cat(parts, 0)`` of parts of one shape (``[r, ...]``, r rows each) into
  its parts: ``C`` is "ragged", with k parts;
* a row-wise op of ragged operands with k parts of r rows each (elementwise ops,
  ``F.linear`` and ``@`` by a shared matrix) into that op on each part; its
  other operands must broadcast along the rows: fewer dimensions, one row, or
  ``T.repeat(k, 1)`` / ``T.expand(k, d)`` of a one-row ``T`` (read as ``T``);
* ``sum``, ``mean`` (and, for one-row parts, ``amax`` / ``amin``) over dim 0 of
  a ragged value into ``torch.stack(parts).sum(0)`` (of the parts' sums where
  they have several rows), which the aggregation pass makes an n-ary
  aggregate, merged into the reader's sum where that is one.

Only ragged values from which such a reduction is reached are rewritten; a
value also read otherwise keeps a ``cat`` of its new parts for those readers.
Then the parts of every node, whatever its k, are ops of one shape, and a
node's reduction is a fan-in like ``sum(h[c] for c in children)``: groups follow
the depth of the structure, not its child counts.

Legal because a row-wise op computes each row of its result from the same row
of its ragged operands (and the broadcast ones), so on the rows of part j it
computes the rows of part j; a sum over rows is the sum of the parts' sums
(reassociated: equal within rounding). ``amax`` / ``amin`` over one-row parts
are the aggregate's own (gradients split among ties as eager's). Ops that draw
random numbers, write in place or are not known to be row-wise stop a ragged
value, and a graph that keeps its order (``ctx.keep_order``: in-place writes
remain, which a part read later could see) is left alone. Only floating
values are reduced this way.
"""
from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from dynamo_relational.nodes import new_node
from dynamo_relational.ops import REGISTRY, NeuronOp, TensorInfo, tensor_info
from dynamo_relational.ops.base import node_args
from dynamo_relational.ops.elementwise import ELEMENTWISE, draws_random_numbers
from dynamo_relational.ops.facts import writes
from dynamo_relational.ops.matmul import linear_args, product_operands
from dynamo_relational.ops.reduce import REDUCE, reduced
from dynamo_relational.ops.reshape import LAYOUT

from .context import PassContext

#: the joins whose parts become a ragged value, with the name of their dimension argument
_JOINS = {torch.cat: "dim", torch.concat: "dim", torch.concatenate: "axis"}
#: the reductions over rows that end a ragged value; amax and amin only over one-row parts
_ROW_REDUCTIONS = ("sum", "mean", "amax", "amin")


@dataclass
class _Ragged:
    """A value whose rows are ``k`` parts of one shape each, ``part`` (rows first)."""
    k: int
    part: TensorInfo
    #: a join's parts, in order
    joined: tuple = ()
    #: the non-ragged operands of a row-wise op -> what each part reads for it
    reads: dict = field(default_factory=dict)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    ctx.stats["ragged_reductions"] = 0
    if ctx.keep_order:
        return gm
    graph = gm.graph
    joins = [n for join in _JOINS for n in graph.find_nodes(op="call_function", target=join, sort=False)]
    if not joins:
        return gm   # (every ragged value starts at a join: a graph without one has none)
    # Only the joins and the readers of ragged values can be ragged or reduce one: those are visited, in the
    # graph's order (a node is pushed by an operand, which comes before it).
    position = {node: i for i, node in enumerate(graph.nodes)}
    pending = [(position[n], n) for n in joins]
    heapq.heapify(pending)
    ragged: dict[fx.Node, _Ragged] = {}
    reductions: list[tuple[fx.Node, fx.Node, str, bool]] = []
    visited: set[fx.Node] = set()
    while pending:
        node = heapq.heappop(pending)[1]
        if node in visited:
            continue
        visited.add(node)
        found = _join(node)
        if found is None:
            found = _row_wise(node, ragged)
        if found is not None:
            ragged[node] = found
            for user in node.users:
                if user.op in ("call_function", "call_method"):
                    heapq.heappush(pending, (position[user], user))
            continue
        reduction = _row_reduction(node, ragged)
        if reduction is not None:
            reductions.append((node, *reduction))
    needed = _reaching(reductions, ragged)
    order = sorted(needed, key=position.__getitem__)
    parts: dict[fx.Node, list] = {}
    for node in order:   # a ragged value's operands are split before it
        parts[node] = _split(graph, node, ragged[node], parts)
    for node, x, name, keepdim in reductions:
        if x in parts:
            _reduce_parts(graph, node, parts[x], ragged[x], name, keepdim)
    for node in reversed(order):   # readers first
        if node.users and not ragged[node].joined:   # read elsewhere too: rows joined again for them
            with graph.inserting_after(node):
                joined = new_node(graph, "call_function", torch.cat, (parts[node], 0), {})
            joined.meta.update(node.meta)   # (in place: setting a node's attribute updates the graph's tables)
            node.replace_all_uses_with(joined)
        if not node.users:
            graph.erase_node(node)
        for copy in ragged[node].reads:
            if not copy.users and _broadcast_copy(copy) is not None:
                graph.erase_node(copy)   # a repeat / expand whose one-row source the parts read instead
    ctx.stats["ragged_reductions"] = sum(1 for _, x, _, _ in reductions if x in parts)
    return gm


def _join(node: fx.Node) -> _Ragged | None:
    """``cat(parts, 0)`` of parts of two or more dimensions that share one shape, dtype and device."""
    try:
        dim_name = _JOINS.get(node.target) if node.op == "call_function" else None
    except TypeError:   # unhashable target
        return None
    args = node_args(node, ("tensors", dim_name)) if dim_name else None
    parts = args.get("tensors") if args else None
    if not isinstance(parts, (list, tuple)) or not parts or not all(isinstance(p, fx.Node) for p in parts):
        return None
    part = tensor_info(parts[0])
    dim = args.get(dim_name, 0)
    if part is None or part.rank < 2 or part.shape[0] == 0 or type(dim) is not int or dim % part.rank != 0 \
            or any(tensor_info(p) is not part for p in parts):   # (infos are interned)
        return None
    return _Ragged(len(parts), part, joined=tuple(parts))


def _row_wise(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> _Ragged | None:
    """The ragged value ``node`` makes, if it is a row-wise op of ragged operands of one layout (k parts
    of the same number of rows) and of operands that broadcast along the rows."""
    info = tensor_info(node)
    if info is None or info.rank < 2 or writes(node):
        return None
    linear, product = linear_args(node), product_operands(node)
    broadcast: list = []
    if linear is not None:
        rowed, matrix = [linear.x], [a for a in (linear.weight, linear.bias) if a is not None]
    elif product is not None:
        rowed, matrix = [product[0]], [product[1]]
    elif REGISTRY.family_of(node) is ELEMENTWISE and not draws_random_numbers(node):
        operands = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
        rowed, matrix = [a for a in operands if a in ragged], []
        broadcast = [a for a in operands if a not in ragged]
    else:
        return None
    if not rowed or any(a not in ragged for a in rowed) or any(a in ragged for a in matrix) \
            or (matrix and (tensor_info(matrix[0]) or info).rank != 2):
        return None
    first = ragged[rowed[0]]
    rows = first.part.shape[0]
    if any(ragged[a].k != first.k or ragged[a].part.shape[0] != rows or ragged[a].part.rank != info.rank
           for a in rowed) or info.shape[0] != first.k * rows:
        return None
    reads = {a: _broadcast_source(a, info) for a in broadcast}
    if any(source is None for source in reads.values()):
        return None
    return _Ragged(first.k, TensorInfo((rows, *info.shape[1:]), info.dtype, info.device), reads=reads)


def _broadcast_source(operand: fx.Node, info: TensorInfo) -> fx.Node | None:
    """What a part reads for a non-ragged ``operand`` of a row-wise op with result ``info``: the operand
    itself where it broadcasts along the rows, the one-row tensor a ``repeat`` / ``expand`` copied along
    them, or None."""
    operand_info = tensor_info(operand)
    if operand_info is None:
        return None
    if operand_info.rank < info.rank or operand_info.shape[0] == 1:
        return operand
    return _broadcast_copy(operand, info)


def _broadcast_copy(node: fx.Node, info: TensorInfo | None = None) -> fx.Node | None:
    """``T`` if ``node`` is ``T.repeat(n, 1, ...)`` or ``T.expand(n, ...)`` of a ``T`` that has one row (or
    fewer dimensions) and the other sizes of ``node``: a copy of ``T`` along the rows, which broadcasting
    ``T`` gives every part alike."""
    if REGISTRY.family_of(node) is not LAYOUT:
        return None
    op = LAYOUT.describe(node)
    if not isinstance(op, NeuronOp) or op.template[0] not in ("repeat", "expand"):
        return None
    source, copied = op.operands[0], tensor_info(node)
    source_info = tensor_info(source)
    if source_info is None or copied is None or (info is not None and copied.rank != info.rank):
        return None
    padded = (1,) * (copied.rank - source_info.rank) + source_info.shape
    return source if padded[0] == 1 and padded[1:] == copied.shape[1:] else None


def _row_reduction(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> tuple[fx.Node, str, bool] | None:
    """``(x, reduction, keepdim)`` if ``node`` reduces a ragged floating ``x`` over its rows (dim 0) alone."""
    if REGISTRY.family_of(node) is not REDUCE:
        return None
    r = reduced(node)
    if isinstance(r, str) or r.input not in ragged or r.name not in _ROW_REDUCTIONS or r.dims != (0,):
        return None
    if r.name in ("amax", "amin") and ragged[r.input].part.shape[0] != 1:
        return None   # ties across parts would share the gradient otherwise than eager's
    return r.input, r.name, r.keepdim


def _reaching(reductions, ragged: dict[fx.Node, _Ragged]) -> dict[fx.Node, None]:
    """The ragged values a reduction reads, directly or through row-wise ops (an ordered set)."""
    needed: dict[fx.Node, None] = {}
    pending = [x for _, x, _, _ in reductions]
    while pending:
        node = pending.pop()
        if node in needed:
            continue
        needed[node] = None
        if not ragged[node].joined:
            pending += [a for a in node.all_input_nodes if a in ragged]
    return needed


def _split(graph: fx.Graph, node: fx.Node, value: _Ragged, parts: dict[fx.Node, list]) -> list:
    """The parts of ragged ``node``: a join's operands, or the row-wise op on each part of its operands."""
    if value.joined:
        return list(value.joined)
    meta = _meta_without_value(node)
    made = []
    with graph.inserting_before(node):
        for j in range(value.k):
            def operand(a, j=j):
                return parts[a][j] if a in parts else value.reads.get(a, a)
            args = fx.node.map_arg(node.args, operand)
            kwargs = fx.node.map_arg(node.kwargs, operand)
            part = new_node(graph, node.op, node.target, args, kwargs)
            part.meta.update(meta, rel_info=value.part)
            made.append(part)
    return made


def _reduce_parts(graph: fx.Graph, node: fx.Node, parts: list, value: _Ragged, name: str, keepdim: bool) -> None:
    """Replace ``node``, a reduction over the rows of a ragged value, by one over its ``parts``."""
    part = value.part
    row = TensorInfo((1, *part.shape[1:]), part.dtype, part.device)
    meta = _meta_without_value(node)

    def made(n: fx.Node, info: TensorInfo) -> fx.Node:
        n.meta.update(meta, rel_info=info)
        return n

    def call(kind: str, target, *args) -> fx.Node:
        return new_node(graph, kind, target, args, {})

    rows = part.shape[0]
    reduce = "sum" if name == "mean" and rows != 1 else name
    with graph.inserting_before(node):
        terms = parts if rows == 1 else [made(call("call_method", "sum", p, 0, True), row) for p in parts]
        stacked = made(call("call_function", torch.stack, list(terms)), TensorInfo((len(terms), *row.shape),
                                                                                   row.dtype, row.device))
        total = made(call("call_method", reduce, stacked, 0), row)   # an aggregate to the aggregation pass
        if reduce != name:
            total = made(call("call_function", operator.truediv, total, value.k * rows), row)
        if not keepdim:
            total = made(call("call_method", "reshape", total, part.shape[1:]), tensor_info(node))
    node.replace_all_uses_with(total)
    graph.erase_node(node)


def _meta_without_value(node: fx.Node) -> dict:
    """``node``'s meta (source lines, module stack) for a node that computes another value in its place."""
    return {k: v for k, v in node.meta.items() if k not in ("val", "example_value", "tensor_meta", "rel_info")}
