"""Recognise n-ary aggregations.

Rewrites into one ``aggregate(terms, reduce)`` node (the tree's root node
itself, retargeted: it keeps its name, such as ``add_17``):

* trees and chains of ``+`` over values of one shape and dtype
  (``acc = acc + W @ x[u]`` in a loop), including the ``0 +`` that the
  ``sum()`` builtin starts with and a ``torch.zeros`` accumulator's start;
* ``torch.stack(terms).sum/mean/amax/amin(0)``.

Legal because only additions whose result has a single user (the next
addition) are merged, so no intermediate partial sum is observed elsewhere,
and because no broadcasting or type promotion happens in a merged addition.
The merged sum reads its terms where the root stood: a graph that keeps its
order (in-place ops or mode switches left in it, ``ctx.keep_order``) is left
alone, since a term written in place or a mode switched between an inner
addition and the root would change what the sum reads.
Only floating-point values are aggregated: integer additions wrap around in
their own dtype and ``+`` on bools is a logical or, which a sum vectorized
as a reduction would not reproduce (a dense ``sum`` promotes integers to
int64), and the segment kernels have no integer or complex kernels. Those
stay additions, grouped as elementwise ops.
The sum is reassociated (a tree instead of a chain), which changes results
only within floating-point rounding. Saves one node per term and gives the
grouping pass a fan-in to vectorize as one segment or dense reduction.
"""
from __future__ import annotations


import torch
import torch.fx as fx

from dynamo_relational.nodes import set_args
from dynamo_relational.ops import aggregate_fn, tensor_info
from dynamo_relational.ops.aggregate import REDUCTIONS
from dynamo_relational.ops.elementwise import ADDITIONS
from dynamo_relational.ops.facts import is_zeros
from dynamo_relational.ops.reduce import REDUCTION_OF

from .context import PassContext

#: the reductions of a stack that become aggregations (all but ``prod``)
_STACK_REDUCERS = {target: name for target, name in REDUCTION_OF.items() if name in REDUCTIONS}


_Node = fx.Node


def _is_zero(value, like=None) -> bool:
    """A Python 0, or (given the sum's ``like`` info) a ``torch.zeros`` of exactly that shape and dtype."""
    kind = type(value)
    if kind is int or kind is float:
        return value == 0
    if like is None:
        return False
    return is_zeros(value) and tensor_info(value) == like


def _addends(node: fx.Node):
    """The two operands of ``node`` if it is an aggregable addition, else None."""
    if node.op not in ("call_function", "call_method") or node.target not in ADDITIONS or node.kwargs:
        return None
    args = node.args
    if len(args) != 2:
        return None
    info = tensor_info(node)
    if info is None or not info.dtype.is_floating_point:
        return None
    for a in args:   # each a Python 0 or a node of the sum's info (interned: compared by identity)
        kind = type(a)
        if kind is int or kind is float:
            if not a == 0:
                return None
        elif not (isinstance(a, fx.Node) and tensor_info(a) is info):
            return None
    if _is_zero(args[0], info) and _is_zero(args[1], info):
        return None
    return args


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
    if info is None or not info.dtype.is_floating_point or any(tensor_info(t) != info for t in terms):
        return None
    return list(terms), reduce


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    if ctx.keep_order:
        return gm
    graph = gm.graph
    additions = {node for node in _candidates(graph, ADDITIONS) if _addends(node) is not None}
    reducers = set(_candidates(graph, _STACK_REDUCERS))
    stack_sums: dict[fx.Node, list] = {}   # torch.stack(...).sum(0) aggregations: a sum may absorb their terms
    rewritten = 0
    for node in list(graph.nodes):
        if node not in additions and node not in reducers:
            continue   # neither an addition nor a reduction: nothing to do (the checks below say the same)
        absorbed: list[fx.Node] = []
        stacked = _stack_reduction(node) if node in reducers else None
        if stacked is not None:
            terms, reduce = stacked
        elif node in additions:
            if _feeds_one_addition(node, additions):
                continue   # the addition it feeds collects its terms
            reduce, terms = "sum", _sum_terms(node, additions, stack_sums, tensor_info(node), absorbed)
        else:
            continue
        assert reduce in REDUCTIONS
        _become_aggregate(graph, node, terms, reduce)
        additions.discard(node)   # no longer an addition whose operands a later sum could open up
        # Parents first: each is unused once its parent no longer reads it. (An absorbed node reads no
        # stack of its own: an absorbed stack sum is an aggregate already, its stack erased with it.)
        for inner in dict.fromkeys(absorbed):
            if not inner.users:
                graph.erase_node(inner)
        if reduce == "sum":
            stack_sums[node] = terms
        rewritten += 1
    ctx.stats["aggregations"] = rewritten
    return gm


def _become_aggregate(graph: fx.Graph, node: fx.Node, terms: list, reduce: str) -> None:
    """Turn the root ``node`` itself into ``aggregate(terms, reduce)``: its users, position and meta
    stay, which spares creating a node (and a unique name), rewiring its users and erasing it.
    The ``torch.stack`` it reduced is erased once unused."""
    stacks = [a for a in node.all_input_nodes if a.target is torch.stack]
    if node.op != "call_function":   # (each attribute set moves the node in the graph's table by op and target)
        node.op = "call_function"
    node.target = aggregate_fn
    set_args(node, (terms, reduce), {})
    for stack in stacks:
        if not stack.users:
            graph.erase_node(stack)


def _candidates(graph: fx.Graph, targets) -> list[fx.Node]:
    """The call_function and call_method nodes whose target is in ``targets`` (functions and method
    names), found through the graph's index of nodes by target instead of a walk over all nodes."""
    found = []
    for target in targets:
        if isinstance(target, str):
            continue
        found.extend(graph.find_nodes(op="call_function", target=target, sort=False))
    names = {t for t in targets if isinstance(t, str)}   # (the order is irrelevant: callers make sets)
    if names:
        found.extend(n for n in graph.find_nodes(op="call_method", sort=False) if n.target in names)
    return found


def _feeds_one_addition(node: fx.Node, additions: set) -> bool:
    return len(node.users) == 1 and next(iter(node.users)) in additions


def _sum_terms(root: fx.Node, additions: set, stack_sums: dict, info, absorbed: list) -> list:
    """The terms of the addition tree under ``root``, left to right: additions (and stack sums)
    that feed only this tree are opened up (and listed in ``absorbed``, parents first; ``a + a``
    lists ``a`` twice), zeros dropped."""
    terms = []
    pending: list = [root]   # nodes to open up, and leaves wrapped in a 1-tuple (a node is never a tuple)
    while pending:
        item = pending.pop()
        if type(item) is tuple:
            terms.append(item[0])
            continue
        if item is not root:
            absorbed.append(item)
            inner = stack_sums.get(item)
            if inner is not None:
                terms.extend(inner)
                continue
        for a in reversed(item.args):   # reversed: the left operand is popped first
            if _is_zero(a, info):
                continue
            if isinstance(a, fx.Node) and len(a.users) == 1 and (a in additions or a in stack_sums):
                pending.append(a)
            else:
                pending.append((a,))
    return terms
