"""Propagation-postponed reorganization: apply row-wise ops before the gather.

Rewrites ``f(gather(X, I))`` into ``gather(f(X), I)`` for a row-wise ``f``:

* ``F.linear(x, W, b)`` and ``x @ W`` with a shared 2-D weight (one ``mm``);
* elementwise ops (``relu``, ``sigmoid``, ``tanh``, ``h * 2``, ...) whose other
  arguments are constants and whose result has the operand's dtype.

Legal because a row-wise op computes row ``i`` of its output from row ``i`` of
its input alone, so computing it on all rows of ``X`` and then reading rows
``I`` gives the same rows; and because ``I`` reads every row of ``X``, so ``f``
runs on exactly the rows eager gives it. On a row nothing reads, the
gradient would be 0 times ``f``'s derivative there, or times the row itself
for a weight's gradient: NaN where either is infinite (``sqrt`` of a negative
number, a linear map of a row of infs), which eager never computes.

Saves work: since ``I`` reads every row of ``X``, ``f`` runs on no more rows
than before, and on fewer where ``I`` reads a row twice (messages per edge
become values per node: |V| rows instead of |E|). The gather moves next to
the reduction that reads it, where ``compose_gathers`` can fold it into the
gathers that read it. The moved gather keeps its kind (and so its deterministic
backward).

:func:`sites` and :func:`apply` offer every move to the rewrite search
(``rewrite_search``), which orders them among the other rewrites by the cost model.
"""
from __future__ import annotations


import torch
import torch.fx as fx

from dynamo_relational.ops import TensorInfo, tensor_info
from dynamo_relational.ops.elementwise import row_wise
from dynamo_relational.ops.facts import takes_three_tensors
from dynamo_relational.ops.matmul import linear_args, product_operands

from .context import PassContext
from .gather_nodes import as_gather, rows, set_source



def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    moved = 0
    changed = True
    while changed:
        changed = False
        for node in list(gm.graph.nodes):
            gather = _postponable(gm, node)
            if gather is None:
                continue
            for user in list(node.users):
                if row_wise_in(user, node):
                    _move_below(gm, gather, user)
                    moved += 1
                    changed = True
    ctx.stats["gathers_postponed"] = moved
    return gm


def sites(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """Every ``(gather, row-wise user)`` pair that :func:`apply` can move."""
    found = []
    for node in gm.graph.nodes:
        if _postponable(gm, node) is not None:
            found += [(node, user) for user in node.users if row_wise_in(user, node)]
    return found


def apply(gm: fx.GraphModule, gather_node: fx.Node, user: fx.Node) -> bool:
    """Move the gather ``gather_node`` below its row-wise ``user``."""
    _move_below(gm, as_gather(gm, gather_node), user)
    return True


def result_row(user: fx.Node, operand: fx.Node) -> TensorInfo:
    """Shape of one row of ``user``'s result (dtype and device follow the operand)."""
    x = tensor_info(operand)
    linear = linear_args(user)
    if linear is not None:
        shape = (tensor_info(linear.weight).shape[0],)
    elif product_operands(user) is not None:
        shape = (tensor_info(user.args[1]).shape[1],)
    else:
        shape = x.shape[1:]
    return TensorInfo(shape, x.dtype, x.device)


def row_wise_in(user: fx.Node, operand: fx.Node) -> bool:
    """``user`` computes each row from the same row of ``operand`` (its only row-carrying input)."""
    if user.op != "call_function" or not user.args or user.args[0] is not operand:
        return False
    rest = list(user.args[1:]) + list(user.kwargs.values())
    if operand in rest:
        return False
    info = rows(operand)
    linear = linear_args(user)
    if linear is not None:
        bias = tensor_info(linear.bias)
        return info is not None and linear.on_rows() and (linear.bias is None or (bias is not None and bias.rank == 1))
    if product_operands(user) is not None:
        weight, x = tensor_info(user.args[1]), tensor_info(operand)
        return info is not None and weight is not None and weight.rank == 2 and x is not None and x.rank == 2
    # an elementwise op of this operand and constants; its result's rows are like the operand's (result_row)
    return row_wise(user) and not takes_three_tensors(user.op, user.target) \
        and not any(isinstance(a, fx.Node) for a in rest) \
        and tensor_info(user) is not None and tensor_info(operand) is not None \
        and tensor_info(user).dtype == tensor_info(operand).dtype


def _postponable(gm: fx.GraphModule, node: fx.Node):
    """The gather ``node`` is, if its row-wise users may move above it: one that reads rows without reducing
    them and reads every row of its base, so that a moved ``f`` runs on exactly the rows eager gives it."""
    gather = as_gather(gm, node)
    if gather is None or gather.reduces or rows(gather.base) is None:
        return None
    return gather if bool(torch.bincount(gather.index, minlength=rows(gather.base)).all()) else None


def _move_below(gm: fx.GraphModule, gather, user: fx.Node) -> None:
    graph = gm.graph
    with graph.inserting_before(user):
        early = graph.create_node("call_function", user.target, (gather.base, *user.args[1:]), dict(user.kwargs))
        late = graph.node_copy(gather.node, lambda n: n)
    row = result_row(user, gather.base)
    early.meta["rel_info"] = TensorInfo((rows(gather.base), *row.shape), row.dtype, row.device)
    late.meta = dict(user.meta)
    late.meta["rel_info"] = TensorInfo((gather.index.shape[0], *row.shape), row.dtype, row.device)
    moved = type(gather)(late, late.args[0], gather.index)
    set_source(gm, moved, early, gather.index)
    user.replace_all_uses_with(late)
    graph.erase_node(user)
    if not gather.node.users:
        graph.erase_node(gather.node)
