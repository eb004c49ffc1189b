"""Values computed from constants alone become one constant, in a sample of a union.

Per-graph code computes some of its values from its structure alone. PyTorch
Geometric's mean of messages counts each node's in-edges: ``ones(E)`` summed
into the nodes by the edge index (after ``constant_indices``: per-node sums
of rows of ones), then clamped and viewed as a column. Each such op would run
in every batch, apart from the others (every sample's counts differ, so they
would not group). This pass evaluates them once, in the sample's trace::

    torch.ones(E)[e] ..., aggregate(...), torch.stack(...).clamp(min=1).view(-1, 1)  ->  a constant [n, 1]

whose rows the per-node code then reads (a row of a sample's constant, which
groups across the samples of a union as the rows of any other value do).

Folds each op of the catalog that neither writes nor draws random numbers,
reads only constant values (deterministic factories without tensor operands,
``torch.ones(E)``; forward constants, ``_tensor_constant*``: tensors
``forward`` built from Python values; constants the passes added, such as
``constant_indices``' row of zeros for a node without messages; ops of
those) and follows the sample's structure: it picks a row by a constant
index (``ones[e]``) or reads a forward constant or a value folded before. A
value becomes a constant where a node that is not folded reads it (a row of
one, ``counts[v]``, stays a read of that row). Values of the shapes alone
(``torch.zeros(1, d).sum(0)``) are left as they are: a union computes each
of them once for all its samples, where a constant would be each sample's.

It runs where a sample's structure is held in constants (forward constants
remain, or ``constant_indices`` rewrote reads by them): no other value follows
the structure. Legal because such a value is the same on every call of the
sample's structure; only where the graph writes into no tensor (a write into a
factory's tensor, or into a view of it, would change a value folded before
the write), and only in a sample's trace (``ctx.in_union``): compiled graphs
leave constant folding to Inductor.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx as fx

from dynamo_relational.ops import REGISTRY
from dynamo_relational.ops.elementwise import draws_random_numbers
from dynamo_relational.ops.facts import is_factory, is_forward_constant, writes

from .context import PassContext
from .gather_nodes import add_constant, constant_value, is_added_constant


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    ctx.stats["folded_constants"] = 0
    graph = gm.graph
    if not ctx.in_union or ctx.keep_order or not (
            ctx.stats.get("constant_indices") or any(map(is_forward_constant, graph.find_nodes(op="get_attr")))):
        return gm   # (most traces: their structure is not held in constants, nothing follows it)
    values: dict[fx.Node, Any] = {}   # the values of constant nodes
    folded: dict[fx.Node, None] = {}   # the constants and ops of the sample's structure, in order
    for node in graph.nodes:
        op = node.op
        if op == "get_attr":
            value = constant_value(gm, node) if is_forward_constant(node) or is_added_constant(node) else None
            if value is not None:
                values[node] = value
                if is_forward_constant(node):   # (a pass's constant, such as a row of zeros, follows no structure)
                    folded[node] = None
            continue
        if op != "call_function" and op != "call_method":
            continue
        if writes(node):
            return gm   # (nothing changed yet)
        inputs = node.all_input_nodes
        if not all(a in values for a in inputs) or draws_random_numbers(node):
            continue
        if not inputs:
            if is_factory(node) and not node.kwargs.get("requires_grad"):
                _evaluate(node, values)
        elif REGISTRY.family_of(node) is not None and _evaluate(node, values) \
                and (any(a in folded for a in inputs) or _picks_rows(node)):
            folded[node] = None
    # the values that ops not folded read become constants; a row of one (``counts[v]``) stays a row read
    read = {node for node in folded if node.op != "get_attr" and any(user not in values for user in node.users)}
    made = 0
    for node in reversed(folded):
        if node not in read:
            continue
        if _picks_rows(node):
            source = node.args[0]
            if source in folded and source.op != "get_attr":
                read.add(source)
            continue
        constant = add_constant(gm, values[node], "folded")
        constant.meta.update(node.meta)
        node.replace_all_uses_with(constant)
        made += 1
    for node in reversed([*values]):   # readers first: the folded values, factories and constants left unread
        if not node.users:
            graph.erase_node(node)
    ctx.stats["folded_constants"] = made
    return gm


def _picks_rows(node: fx.Node) -> bool:
    """Whether ``node`` reads a row of a value by a constant index (``ones[e]``)."""
    return node.op == "call_function" and node.target is operator.getitem and type(node.args[1]) is int


def _evaluate(node: fx.Node, values: dict[fx.Node, Any]) -> bool:
    """Compute ``node``'s value from its operands' ``values`` into ``values``; whether it could be computed as
    a tensor (anything else: left in the graph)."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
    try:
        with torch.no_grad():
            target = node.target
            value = target(*args, **kwargs) if callable(target) else getattr(args[0], target)(*args[1:], **kwargs)
    except Exception:   # (left as it is, to run, or raise, as in eager)
        return False
    if not isinstance(value, torch.Tensor):
        return False
    values[node] = value
    return True
