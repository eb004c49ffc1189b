"""Gather absorption: a row gather of a reduction's result becomes part of the reduction.

Rewrites ``gather_rows(f(gather_reduce(z, csr, R)), I)`` into
``f(gather_reduce(z, csr_I, len(I)))``, where segment ``j`` of ``csr_I`` is
segment ``I[j]`` of ``csr`` and ``f`` is a chain of row-wise elementwise ops
(unary ones, and binary ones whose other operand is broadcast along the rows,
as a bias is).

Legal because row ``i`` of a reduction depends on segment ``i`` alone, and a
row-wise op computes row ``i`` from row ``i``: reading rows ``I`` of the
result is reducing segments ``I``. Every op between must have no other user.

The typical case is the output ``stack`` of a model where many neurons
compute the same value, such as every node without in-neighbours in a GCN
written with an accumulator: CSE merges those neurons into one row, and a
final gather copies it out to all of them. Absorbed, each becomes an empty
segment of the reduction, and the gather and its backward go away. Taken
where :mod:`dynamo_relational.cost` (FLOPs plus bytes on the graph's device)
estimates it cheaper: unfused, the reduction of ``E`` entries into ``R``
rows, the ops on ``R`` rows and the gather of ``|I|`` rows; absorbed, the
reduction of ``E'`` entries into ``|I|`` rows (a duplicated non-empty segment
is reduced again) and the ops on ``|I|`` rows. Both estimates of every
candidate are in ``stats["cost_choices"]`` (printed by ``explain()``).
:func:`sites` and :func:`apply` offer the rejected candidates to the rewrite
search (``rewrite_search``), which judges the whole graph.
"""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from dynamo_relational import cost
from dynamo_relational.kernels.gather_reduce import pack_csr
from dynamo_relational.ops import TensorInfo, tensor_info
from dynamo_relational.ops.elementwise import row_wise
from dynamo_relational.ops.facts import takes_three_tensors

from .context import PassContext
from .gather_nodes import add_constant, as_gather, rows

_GATHER_ROWS = torch.ops.dynamo_relational.gather_rows.default


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    absorbed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is _GATHER_ROWS and _absorb(gm, node, ctx):
            absorbed += 1
    ctx.stats["gathers_absorbed"] = absorbed
    return gm


def sites(gm: fx.GraphModule) -> list[tuple[fx.Node]]:
    """The row gathers :func:`apply` can absorb into the reduction they read."""
    return [(node,) for node in gm.graph.nodes
            if node.op == "call_function" and node.target is _GATHER_ROWS and _path(gm, node) is not None]


def apply(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Absorb the gather ``node`` where legal, whatever the estimate says."""
    return _absorb(gm, node, None)


def _row_operand(node: fx.Node) -> fx.Node | None:
    """The one operand of a row-wise elementwise ``node`` that carries rows, else None."""
    if not row_wise(node) or takes_three_tensors(node.op, node.target):
        return None
    out = tensor_info(node)
    operands = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
    if out is None or any(tensor_info(a) is None for a in operands):
        return None
    carrying = [a for a in operands if tensor_info(a).rank == out.rank]
    broadcast = all(tensor_info(a).rank < out.rank for a in operands if a not in carrying)
    return carrying[0] if len(carrying) == 1 and broadcast else None


def _path(gm: fx.GraphModule, node: fx.Node):
    """``(gather, ops between, reduction node, reduction)`` where ``node`` reads a reduction's rows through
    row-wise ops that nothing else uses, else None."""
    gather = as_gather(gm, node)
    if gather is None:
        return None
    chain, source = [], gather.base   # the ops between, from the gather up
    while True:
        if len(source.users) != 1:
            return None
        reduction = as_gather(gm, source)
        if reduction is not None:
            break
        operand = _row_operand(source)
        if operand is None:
            return None
        chain.append(source)
        source = operand
    if not reduction.reduces or rows(reduction.base) is None:
        return None
    return gather, chain, source, reduction


def _absorb(gm: fx.GraphModule, node: fx.Node, ctx: PassContext | None) -> bool:
    """Absorb where legal and, with a ``ctx`` to record the choice in, where estimated cheaper."""
    path = _path(gm, node)
    if path is None:
        return False
    gather, chain, source, reduction = path
    offsets, index, picked = reduction.offsets, reduction.index, gather.index
    counts = (offsets[1:] - offsets[:-1])[picked]
    new_offsets = torch.zeros(picked.shape[0] + 1, dtype=offsets.dtype, device=offsets.device)
    torch.cumsum(counts, 0, out=new_offsets[1:])
    within = torch.arange(int(new_offsets[-1]), device=index.device) - new_offsets[:-1].repeat_interleave(counts)
    new_index = index[offsets[picked].repeat_interleave(counts) + within]

    info = tensor_info(node)
    item, width = info.dtype.itemsize, _width(reduction.base)

    def ops(count: int) -> cost.Cost:
        return sum((cost.elementwise(count, _width(op), item) for op in chain), cost.Cost())

    unfused = (cost.gather_reduce(index.shape[0], rows(source), width, item) + ops(rows(source))
               + cost.gather(picked.shape[0], _width(node), item))
    fused = cost.gather_reduce(new_index.shape[0], picked.shape[0], width, item) + ops(picked.shape[0])
    unfused_us, fused_us = unfused.seconds(info.device) * 1e6, fused.seconds(info.device) * 1e6
    if ctx is not None:
        ctx.stats.setdefault("cost_choices", []).append(dict(
            pass_="absorb_gathers", node=node.name, choice="absorbed" if fused_us < unfused_us else "kept",
            estimates_us={"unfused": unfused_us, "absorbed": fused_us}))
        if fused_us >= unfused_us:
            return False
    graph = gm.graph
    with graph.inserting_before(node):
        csr = add_constant(gm, pack_csr(new_offsets, new_index, rows(reduction.base)), "csr")
        args = list(source.args)
        args[1], args[2] = csr, picked.shape[0]
        value = _with_rows(graph.create_node("call_function", source.target, tuple(args), dict(source.kwargs)),
                           source, picked.shape[0])
        for op, previous in zip(reversed(chain), [source, *reversed(chain)]):
            value = _with_rows(graph.node_copy(op, lambda n, p=previous, v=value: v if n is p else n), op,
                               picked.shape[0])
    node.replace_all_uses_with(value)
    for dead in (node, *chain, source):
        graph.erase_node(dead)
    return True


def _width(node: fx.Node) -> int:
    return math.prod(tensor_info(node).shape[1:])


def _with_rows(new: fx.Node, like: fx.Node, count: int) -> fx.Node:
    info = tensor_info(like)
    new.meta["rel_info"] = TensorInfo((count, *info.shape[1:]), info.dtype, info.device)
    return new
