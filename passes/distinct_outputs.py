"""Outputs alias each other and the inputs no more than eager's do.

Grouping can make an output share memory where eager's did not: CSE merges
two equal outputs (``torch.zeros(3)`` returned twice) into one tensor, and a
vectorized value can be a view of an input (``torch.stack([x[i] for i in
range(n)])`` is ``x`` itself once its identity gather is a view). A caller
that writes into one output would then change the other one, or the input.
This pass clones each output that shares memory with an input or another
output when it did not in the graph the pipeline started from
(:func:`output_aliases`, recorded in ``ctx.output_aliases`` before the first
pass); outputs that eager returns as views or as the same tensor stay so.

Memory is followed back through the ops that may return a view or their
input itself (views, casts, ``detach``, in-place ops, ``getitem``, modules):
the *roots* of a value are the computed tensors and inputs it may share
memory with. Legal because a clone has the same value and gradient. Costs a
copy of the cloned outputs only; most graphs have one fresh output and get none.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from .context import PassContext
from .inplace import is_in_place

#: ops (function ``__name__`` or method name) whose result may be a view of an operand, or the operand itself
VIEW_OPS = frozenset((
    "getitem", "__getitem__", "getattr", "view", "view_as", "reshape", "reshape_as", "narrow", "select", "squeeze",
    "unsqueeze", "transpose", "swapaxes", "swapdims", "t", "permute", "movedim", "moveaxis", "expand", "expand_as",
    "flatten", "unflatten", "unbind", "split", "chunk", "tensor_split", "as_strided", "detach", "diagonal", "unfold",
    "contiguous", "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "bool", "cpu",
    "cuda", "real", "imag", "view_as_real", "view_as_complex", "alias", "requires_grad_", "values", "indices",
    "dropout"))   # dropout outside training returns its input


@dataclass(frozen=True)
class OutputAliases:
    """For each output position: the inputs (placeholders and attributes, by name) it may share memory with,
    and the other positions it may share memory with."""
    inputs: tuple[frozenset, ...]
    shared: tuple[frozenset, ...]


def may_alias(node: fx.Node) -> bool:
    """Whether ``node`` may return (a view of) one of its tensor operands instead of a new tensor."""
    if node.op == "call_module" or is_in_place(node):   # an in-place op returns its receiver
        return True
    if node.op == "call_method":
        return node.target in VIEW_OPS
    return node.op == "call_function" and getattr(node.target, "__name__", None) in VIEW_OPS


def _roots(value, memo: dict) -> frozenset:
    """The computed nodes and inputs (``("input", op, name)``) whose memory ``value`` may share. Iterative:
    a chain of views can be longer than Python's recursion limit."""
    if not isinstance(value, fx.Node):
        return frozenset()
    stack = [value]
    while stack:
        node = stack[-1]
        if node in memo:
            stack.pop()
        elif node.op in ("placeholder", "get_attr"):
            memo[node] = frozenset({("input", node.op, node.target)})
        elif not may_alias(node):
            memo[node] = frozenset({node})
        else:
            pending = [a for a in node.all_input_nodes if a not in memo]
            if pending:
                stack.extend(pending)
            else:
                memo[node] = frozenset().union(*(memo[a] for a in node.all_input_nodes))
    return memo[value]


def _outputs(graph: fx.Graph) -> list:
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = output.args[0]
    return list(values) if isinstance(values, (list, tuple)) else [values]


def output_aliases(graph: fx.Graph) -> OutputAliases:
    """What each output of ``graph`` may share memory with (see :class:`OutputAliases`)."""
    memo: dict = {}
    roots = [_roots(v, memo) for v in _outputs(graph)]
    inputs = tuple(frozenset(r for r in rs if type(r) is tuple) for rs in roots)
    shared = tuple(frozenset(q for q, other in enumerate(roots) if q != p and rs & other)
                   for p, rs in enumerate(roots))
    return OutputAliases(inputs, shared)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    before = ctx.output_aliases
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = _outputs(graph)
    if before is None or len(values) != len(before.inputs):
        return gm
    memo: dict = {}
    roots = [_roots(v, memo) for v in values]
    cloned = []
    for p, value in enumerate(values):
        new_inputs = {r for r in roots[p] if type(r) is tuple} - before.inputs[p]
        new_shared = [q for q, other in enumerate(roots) if q != p and q not in before.shared[p] and roots[p] & other]
        if not (new_inputs or new_shared):
            continue
        with graph.inserting_before(output):
            copy = graph.call_method("clone", (value,))
        copy.meta = dict(value.meta)
        values[p], roots[p] = copy, frozenset({copy})
        cloned.append(p)
    if cloned:
        structure = output.args[0]
        output.args = (type(structure)(values) if isinstance(structure, (list, tuple)) else values[0],)
        gm.recompile()
        ctx.stats["outputs_cloned"] = len(cloned)
    return gm
