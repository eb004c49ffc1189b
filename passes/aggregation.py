"""Recognise n-ary aggregations.

Rewrites into one ``aggregate(terms, reduce)`` node:

* trees and chains of ``+`` over values of one shape and dtype
  (``acc = acc + W @ x[u]`` in a loop), including the ``0 +`` that the
  ``sum()`` builtin starts with and a ``torch.zeros`` accumulator's start;
* ``torch.stack(terms).sum/mean/amax/amin(0)``.

Legal because only additions whose result has a single user (the next
addition) are merged, so no intermediate partial sum is observed elsewhere,
and because no broadcasting or type promotion happens in a merged addition.
The sum is reassociated (a tree instead of a chain), which changes results
only within floating-point rounding. Saves one node per term and gives the
grouping pass a fan-in to vectorize as one segment or dense reduction.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import aggregate_fn, tensor_info
from dynamo_relational.ops.aggregate import REDUCTIONS

from .context import PassContext
from .inplace import is_zeros

_ADD = {operator.add, torch.add, "add", "__radd__"}
_STACK_REDUCERS = {torch.sum: "sum", torch.mean: "mean", torch.amax: "amax", torch.amin: "amin",
                   "sum": "sum", "mean": "mean", "amax": "amax", "amin": "amin"}


def _is_zero(value, like=None) -> bool:
    """A Python 0, or (given the sum's ``like`` info) a ``torch.zeros`` of exactly that shape and dtype."""
    if type(value) in (int, float):
        return value == 0
    return like is not None and is_zeros(value) and tensor_info(value) == like


def _addends(node: fx.Node):
    """The two operands of ``node`` if it is an aggregable addition, else None."""
    if node.op not in ("call_function", "call_method") or node.target not in _ADD or node.kwargs:
        return None
    if len(node.args) != 2:
        return None
    info = tensor_info(node)
    if info is None:
        return None
    for a in node.args:
        if not (_is_zero(a) or (isinstance(a, fx.Node) and tensor_info(a) == info)):
            return None
    if all(_is_zero(a, info) for a in node.args):
        return None
    return node.args


def _stack_reduction(node: fx.Node):
    """(terms, reduce) if ``node`` is ``torch.stack(terms).<reduce>(0)``, else None."""
    if node.op not in ("call_function", "call_method"):
        return None
    try:
        reduce = _STACK_REDUCERS.get(node.target)
    except TypeError:
        return None
    if reduce is None or not node.args or set(node.kwargs) - {"dim"}:
        return None
    source = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if len(node.args) > 2 or dim != 0 or type(dim) is not int:
        return None
    if not (isinstance(source, fx.Node) and source.target is torch.stack and len(source.users) == 1):
        return None
    terms = source.args[0] if source.args else None
    stack_dim = source.args[1] if len(source.args) > 1 else source.kwargs.get("dim", 0)
    if stack_dim != 0 or not isinstance(terms, (list, tuple)) or not terms:
        return None
    info = tensor_info(node)
    if info is None or any(tensor_info(t) != info for t in terms):
        return None
    return list(terms), reduce


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    graph = gm.graph
    additions = {node for node in graph.nodes if _addends(node) is not None}
    stack_sums: dict[fx.Node, list] = {}   # torch.stack(...).sum(0) aggregations: a sum may absorb their terms
    rewritten = 0
    for node in list(graph.nodes):
        absorbed: list[fx.Node] = []
        stacked = _stack_reduction(node)
        if stacked is not None:
            terms, reduce = stacked
        elif node in additions:
            if _feeds_one_addition(node, additions):
                continue   # the addition it feeds collects its terms
            reduce, terms = "sum", _sum_terms(node, additions, stack_sums, tensor_info(node), absorbed)
        else:
            continue
        assert reduce in REDUCTIONS
        with graph.inserting_before(node):
            # Arguments set after creation: create_node walks them looking for SymInts, slow for long lists.
            agg = graph.call_function(aggregate_fn)
        agg.args = (terms, reduce)
        agg.meta = dict(node.meta)
        node.replace_all_uses_with(agg)
        _erase_dead_chain(graph, node)
        for inner in dict.fromkeys(absorbed):   # parents first: each is unused once its parent is gone
            _erase_dead_chain(graph, inner)
        if reduce == "sum":
            stack_sums[agg] = terms
        rewritten += 1
    ctx.stats["aggregations"] = rewritten
    return gm


def _feeds_one_addition(node: fx.Node, additions: set) -> bool:
    return len(node.users) == 1 and next(iter(node.users)) in additions


def _sum_terms(root: fx.Node, additions: set, stack_sums: dict, info, absorbed: list) -> list:
    """The terms of the addition tree under ``root``, left to right: additions (and stack sums)
    that feed only this tree are opened up (and listed in ``absorbed``, parents first; ``a + a``
    lists ``a`` twice), zeros dropped."""
    terms = []
    pending: list = [root]
    while pending:
        item = pending.pop()
        if type(item) is _Term:
            terms.append(item.value)
            continue
        if item is not root:
            absorbed.append(item)
            if item in stack_sums:
                terms.extend(stack_sums[item])
                continue
        for a in reversed(item.args):   # reversed: the left operand is popped first
            if _is_zero(a, info):
                continue
            if isinstance(a, fx.Node) and len(a.users) == 1 and (a in additions or a in stack_sums):
                pending.append(a)
            else:
                pending.append(_Term(a))
    return terms


class _Term:
    """A leaf of the addition tree, kept in order on the work stack."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _erase_dead_chain(graph: fx.Graph, node: fx.Node) -> None:
    """Erase ``node`` and the ``torch.stack`` that fed only it."""
    if node.users or node.op not in ("call_function", "call_method"):
        return
    stacks = [a for a in node.all_input_nodes if a.target is torch.stack]
    graph.erase_node(node)
    for stack in stacks:
        if not stack.users:
            graph.erase_node(stack)
