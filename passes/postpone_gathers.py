"""Propagation-postponed reorganization: apply row-wise ops before the gather.

Rewrites ``f(gather(X, I))`` into ``gather(f(X), I)`` for a row-wise ``f``:

* ``F.linear(x, W, b)`` and ``x @ W`` with a shared 2-D weight (one ``mm``);
* unary elementwise ops (``relu``, ``sigmoid``, ``tanh``, ...) whose other
  arguments are constants.

Legal because a row-wise op computes row ``i`` of its output from row ``i`` of
its input alone, so computing it on all rows of ``X`` and then reading rows
``I`` gives the same rows. Where ``I`` leaves rows of ``X`` unread, ``f`` runs
on rows that eager never gives it, and their gradient is 0 times ``f``'s
derivative there: that adds 0 only where the derivative is finite. So the
move then needs an op whose derivative is finite at every finite input
(``relu``, ``tanh``, a product with a weight; not ``sqrt``, ``log``,
``reciprocal`` or ``exp``, which overflows: ``0 * inf`` is NaN).

Pays when ``X`` has no more rows than ``I`` (messages per edge become values
per node: |V| rows instead of |E|), or when every user of ``f`` is itself a
gather, so that ``compose_gathers`` folds the moved gather into them and one
gather disappears (allowed while ``X`` has at most ``MAX_GROWTH`` times the
rows of ``I``; also through a ``cat`` that only gathers read). The moved
gather keeps its kind (and so its deterministic backward).

:func:`sites` and :func:`apply` offer every legal move, paying or not, to the
rewrite search (``rewrite_search``), which judges whole graphs by the cost
model instead of the ``MAX_GROWTH`` rule.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import TensorInfo, tensor_info
from dynamo_relational.ops.elementwise import _UNARY

from .context import PassContext
from .gather_nodes import as_gather, is_cat0, rows, set_source
from .linear_nodes import linear_args

MAX_GROWTH = 2
_MATMUL = {torch.matmul, operator.matmul, torch.mm}
_UNARY_OPS = set(_UNARY) - {torch.clamp, torch.clip}  # clamp's bounds may be tensors
#: the unary ops whose derivative is finite at every finite input (autograd's formula, evaluated there):
#: on a row nothing reads, they pass exactly 0 back (see the module docstring)
_FINITE_DERIVATIVE = {
    torch.relu, F.relu, torch.sigmoid, F.sigmoid, torch.special.expit, torch.tanh, F.tanh, torch.neg, operator.neg,
    torch.abs, torch.sin, torch.cos, torch.square, torch.erf, torch.erfc, torch.atan, torch.asinh, torch.sign,
    torch.sgn, torch.floor, torch.ceil, torch.round, torch.trunc, torch.frac, torch.detach, torch.nan_to_num,
    torch.clamp_min, torch.clamp_max, torch.isnan, torch.isinf, torch.isfinite, torch.deg2rad, torch.rad2deg,
    F.leaky_relu, F.elu, F.gelu, F.silu, F.softplus, F.relu6, F.hardtanh, F.mish, F.selu, F.celu, F.logsigmoid,
    F.hardsigmoid, F.hardswish, F.softsign, F.tanhshrink, F.threshold, torch.threshold, F.hardshrink, F.softshrink}


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    moved = 0
    changed = True
    while changed:
        changed = False
        for node in list(gm.graph.nodes):
            gather = as_gather(gm, node)
            if gather is None or gather.reduces or rows(gather.base) is None:
                continue
            for user in list(node.users):
                if _movable(gather, user) and _pays(gm, gather, user):
                    _move_below(gm, gather, user)
                    moved += 1
                    changed = True
    ctx.stats["gathers_postponed"] = moved
    return gm


def sites(gm: fx.GraphModule) -> list[tuple[fx.Node, fx.Node]]:
    """Every ``(gather, row-wise user)`` pair that :func:`apply` can move, whether it pays or not."""
    found = []
    for node in gm.graph.nodes:
        gather = as_gather(gm, node)
        if gather is not None and not gather.reduces and rows(gather.base) is not None:
            found += [(node, user) for user in node.users if _movable(gather, user)]
    return found


def apply(gm: fx.GraphModule, gather_node: fx.Node, user: fx.Node) -> bool:
    """Move the gather ``gather_node`` below its row-wise ``user``."""
    _move_below(gm, as_gather(gm, gather_node), user)
    return True


def _result_row(user: fx.Node, operand: fx.Node) -> TensorInfo:
    """Shape of one row of ``user``'s result (dtype and device follow the operand)."""
    x = tensor_info(operand)
    linear = linear_args(user)
    if linear is not None:
        shape = (tensor_info(linear.weight).shape[0],)
    elif user.target in _MATMUL:
        shape = (tensor_info(user.args[1]).shape[1],)
    else:
        shape = x.shape[1:]
    return TensorInfo(shape, x.dtype, x.device)


def _row_wise_in(user: fx.Node, operand: fx.Node) -> bool:
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
    if user.target in _MATMUL:
        weight, x = tensor_info(user.args[1]) if len(user.args) > 1 else None, tensor_info(operand)
        return info is not None and weight is not None and weight.rank == 2 and x is not None and x.rank == 2
    try:
        unary = user.target in _UNARY_OPS
    except TypeError:
        return False
    return unary and not any(isinstance(a, fx.Node) for a in rest)


def _movable(gather, user: fx.Node) -> bool:
    """``user`` is row-wise in the gather's rows and may run on every row of its base: the gather reads every
    row, or ``user``'s derivative is finite everywhere (so the rows it does not read get exactly 0)."""
    if not _row_wise_in(user, gather.node):
        return False
    if user.target in _MATMUL or linear_args(user) is not None or user.target in _FINITE_DERIVATIVE:
        return True
    return bool(torch.bincount(gather.index, minlength=rows(gather.base)).all())


def _pays(gm: fx.GraphModule, gather, user: fx.Node) -> bool:
    source_rows, gathered_rows = rows(gather.base), gather.index.shape[0]
    if source_rows <= gathered_rows:
        return True
    return _only_gathered(gm, user) and source_rows <= MAX_GROWTH * gathered_rows


def _only_gathered(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Every use of ``node`` is as the base of a gather, directly or as a block of a cat that only gathers read."""
    def read_by_gathers(n):
        return bool(n.users) and all(as_gather(gm, u) is not None and u.args[0] is n for u in n.users)

    return bool(node.users) and all(
        (as_gather(gm, u) is not None and u.args[0] is node) or (is_cat0(u) and read_by_gathers(u))
        for u in node.users)


def _move_below(gm: fx.GraphModule, gather, user: fx.Node) -> None:
    graph = gm.graph
    with graph.inserting_before(user):
        early = graph.create_node("call_function", user.target, (gather.base, *user.args[1:]), dict(user.kwargs))
        late = graph.node_copy(gather.node, lambda n: n)
    row = _result_row(user, gather.base)
    early.meta["rel_info"] = TensorInfo((rows(gather.base), *row.shape), row.dtype, row.device)
    late.meta = dict(user.meta)
    late.meta["rel_info"] = TensorInfo((gather.index.shape[0], *row.shape), row.dtype, row.device)
    moved = type(gather)(late, late.args[0], gather.index)
    set_source(gm, moved, early, gather.index)
    user.replace_all_uses_with(late)
    graph.erase_node(user)
    if not gather.node.users:
        graph.erase_node(gather.node)
