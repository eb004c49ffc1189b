"""Row-wise ops of gathered rows, computed for each reader: ``f(X[P])[I_k]`` -> ``f(X[P[I_k]])``.

The vectorizer groups equal ops of different roles: a TreeLSTM level's
``sigmoid`` of its input, output and forget gates is one ``sigmoid`` of the
gates' rows gathered from a ``cat`` of the groups that computed them, and
each reader (the ``i * u`` group, the ``o * tanh(c)`` group) gathers its rows
back. Where the readers of a row-wise ``f`` (one row-carrying operand) are
all gathers, each reader gets its own ``f`` of the rows it reads, gathered
from ``X`` at once (``P[I_k]``), and a reader that reads one ``cat`` part
(or all of ``X``) whole and in order reads that part itself, without a gather.
Applied where at most one reader still gathers, so that the ``f`` added per
reader is paid by the gathers and the join that no longer run.

Legal because row ``i`` of ``f(X[P])`` is ``f`` of row ``P[i]`` of ``X`` alone,
so the rows a reader reads are the same either way; ``f`` runs on exactly the
rows eager gives it when the readers read each row at most once (required).
On a union of samples it holds for every batch: a batch keeps each reader's
rows in order, so one that reads a whole part in order still does.

Saves, per rewrite, the gather ``X[P]``, a gather per reader that reads a part
whole, and the backward of each (a zeroed buffer and a scatter), for one
``f`` per extra reader.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from dynamo_relational.ops import TensorInfo

from .context import PassContext
from .gather_nodes import as_gather, is_cat0, rows, set_rows_info, set_source
from .postpone_gathers import result_row, row_wise_in


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    hoisted = 0
    for node in list(gm.graph.nodes):
        plan = _plan(gm, node)
        if plan is not None:
            _apply(gm, node, *plan)
            hoisted += 1
    ctx.stats["gathers_hoisted"] = hoisted
    return gm


def _plan(gm: fx.GraphModule, node: fx.Node):
    """``(gather, readers, reads, composed)`` when ``node`` is a row-wise ``f(X[P])`` that the docstring's rule
    rewrites: reader ``k`` reads rows ``composed[k]`` (``P[I_k]``) of ``X``, and ``reads[k]`` is the part of
    ``X`` that they are, whole and in order (None: it gathers them)."""
    if node.op != "call_function" or not node.args or not node.users:
        return None
    gather = as_gather(gm, node.args[0])
    if gather is None or gather.reduces or rows(gather.base) is None or not row_wise_in(node, gather.node):
        return None
    readers = [as_gather(gm, user) for user in node.users]
    if any(r is None or r.reduces or r.base is not node for r in readers):
        return None
    composed = [gather.index[r.index] for r in readers]
    if torch.bincount(torch.cat(composed), minlength=rows(gather.base)).max() > 1:
        return None   # a row read twice would run f twice
    reads = [_whole_part(gather.base, index) for index in composed]
    if sum(read is None for read in reads) > 1:
        return None
    return gather, readers, reads, composed


def _whole_part(base: fx.Node, index: torch.Tensor) -> fx.Node | None:
    """The part of ``base`` (a block of a ``cat``, or ``base`` itself) that ``index`` reads whole and in order."""
    parts = list(base.args[0]) if is_cat0(base) else [base]
    start = 0
    for part in parts:
        count = rows(part)
        if count is None:
            return None
        if count == index.shape[0] and count > 0 and int(index[0]) == start \
                and torch.equal(index, torch.arange(start, start + count, device=index.device)):
            return part
        start += count
    return None


def _apply(gm: fx.GraphModule, node: fx.Node, gather, readers, reads, composed) -> None:
    graph = gm.graph
    row = result_row(node, gather.base)
    for reader, part, index in zip(readers, reads, composed):
        if part is None:   # the reader gathers X's rows; f runs on them
            set_source(gm, reader, gather.base, index)
            operand = reader.node
            set_rows_info(operand, gather.base, index.shape[0])
            with graph.inserting_after(operand):
                own = graph.node_copy(node, lambda n: operand if n is gather.node else n)
            users = [u for u in operand.users if u is not own]
        else:
            with graph.inserting_before(reader.node):
                own = graph.node_copy(node, lambda n: part if n is gather.node else n)
            users = list(reader.node.users)
        own.meta = dict(reader.node.meta)
        own.meta["rel_info"] = TensorInfo((index.shape[0], *row.shape), row.dtype, row.device)
        for user in users:
            user.replace_input_with(reader.node, own)
        if part is not None:
            graph.erase_node(reader.node)
    graph.erase_node(node)
    if not gather.node.users:
        graph.erase_node(gather.node)
