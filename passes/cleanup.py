"""Remove dead nodes, collapse reshape chains, and check the graph.

* ``reshape(reshape(x, a), b)`` -> ``reshape(x, b)`` when the inner reshape
  has no other user (a reshape depends only on the element order, which the
  inner reshape keeps);
* ``reshape(x, (1, *s))[0]`` -> ``reshape(x, s)`` (a one-member group read back);
* ``reshape(x, s).squeeze(d)`` / ``.unsqueeze(d)`` -> one reshape (the shape is known);
* dead nodes (unused row reads, gathers, constants) are erased, but for calls
  outside the op catalog and random ops, which may change state (vectorize
  marks them).

Legal because all rewritten nodes are pure. Saves nodes the vectorizer leaves
behind at group boundaries.
"""
from __future__ import annotations

import operator

import torch.fx as fx

from dynamo_relational.ops.facts import writes

from .context import PassContext
from .gather_nodes import CONSTANT_PREFIX
from .mode_regions import is_mode_switch
from .vectorize import MAY_HAVE_EFFECTS


def _is_reshape(node) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target == "reshape" \
        and len(node.args) == 2 and isinstance(node.args[1], tuple)


def _squeezed(shape: tuple, op: str, dim: int) -> tuple | None:
    if any(type(s) is not int or s < 0 for s in shape):
        return None
    if op == "unsqueeze":
        at = dim % (len(shape) + 1)
        return shape[:at] + (1,) + shape[at:]
    if not shape:
        return shape
    at = dim % len(shape)
    return shape[:at] + shape[at + 1:] if shape[at] == 1 else shape


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    graph = gm.graph
    for node in list(graph.nodes):
        if _is_reshape(node) and _is_reshape(node.args[0]) and len(node.args[0].users) == 1:
            node.args = (node.args[0].args[0], node.args[1])
        elif (node.op == "call_function" and node.target is operator.getitem and node.args[1] == 0
              and type(node.args[1]) is int and _is_reshape(node.args[0]) and node.args[0].args[1][:1] == (1,)):
            inner = node.args[0]
            with graph.inserting_after(node):
                flat = graph.call_method("reshape", (inner.args[0], inner.args[1][1:]))
            node.replace_all_uses_with(flat)
        elif (node.op == "call_method" and node.target in ("squeeze", "unsqueeze") and len(node.args) == 2
              and not node.kwargs and type(node.args[1]) is int and _is_reshape(node.args[0])):
            shape = _squeezed(node.args[0].args[1], node.target, node.args[1])
            if shape is not None:
                inner = node.args[0]
                node.target, node.args = "reshape", (inner.args[0] if len(inner.users) == 1 else inner, shape)
    # In-place ops, mode switches and the calls that vectorize marked (outside the catalog, or random) have
    # no users but must stay (FX counts neither mul_ nor the exit of inference mode as impure).
    graph.eliminate_dead_code(is_impure_node=lambda n: n.is_impure() or writes(n) or is_mode_switch(n)
                              or MAY_HAVE_EFFECTS in n.meta)
    used = {n.target for n in graph.nodes if n.op == "get_attr"}
    for name in [name for name, _ in gm.named_buffers() if name.startswith(CONSTANT_PREFIX) and name not in used]:
        delattr(gm, name)
    graph.lint()
    gm.recompile()
    return gm
