"""Turn in-place ops on fresh temporaries into pure ops; find the in-place ops that remain.

Rewrites ``acc += t`` (``operator.iadd`` and friends, ``Tensor.add_`` without
``alpha``) into ``acc + t``, an activation with ``inplace=True``
(``nn.ReLU(inplace=True)``) into the plain call, and an in-place method or
function whose plain form is in the neuron-op catalog (``h.relu_()``,
``torch.sigmoid_(h)``), or is a sum or reduction of rows into a tensor
(``index_add_``, ``scatter_add_``, ``scatter_reduce_``, ``index_reduce_``),
into that form, and ``t.fill_(v)`` or ``t.zero_()`` of a
new tensor ``t`` into the call that makes it filled (``x.new(1, d).fill_(0.)`` into
``x.new_full((1, d), 0.)``), and ``t.requires_grad_()`` of such a new tensor into
the call that makes it with ``requires_grad=True``. Legal when ``acc`` (``h``) is a fresh
temporary: produced by an arithmetic op, ``torch.zeros`` or ``torch.clone``
(not a view, input or parameter, nor a cast, ``detach`` or dropout, which may
return their input itself) whose only user is the in-place op, and the
result has its shape and dtype. Then nothing else can observe the mutation,
and the plain op computes the same values. Every other in-place op is
recorded in ``ctx.keep_order``; the grouping pass then leaves the graph as it
is, since grouping copies values that in-place ops may alias. When none is
left, a ``clone`` that is only read is replaced by its input (same value, one
node less). Dropout outside training or of probability 0, which returns its
input itself, is first replaced by that input.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import REGISTRY, tensor_info
from dynamo_relational.ops.elementwise import ELEMENTWISE, RANDOM_IN_TRAINING, may_draw
from dynamo_relational.ops.facts import aten_name, is_zeros, makes_tensor, may_alias, writes

from .context import PassContext


def _fresh_temporary(node: fx.Node, user: fx.Node) -> bool:
    family = REGISTRY.family_of(node) if node.op in ("call_function", "call_method") else None
    fresh = (family is not None and family.fresh and not may_alias(node)) \
        or is_zeros(node) or (node.op == "call_function" and node.target is torch.clone)
    return fresh and list(node.users) == [user] and not writes(node)


def _drop_read_only_clones(graph: fx.Graph) -> None:
    """``clone(x)`` that is only read (its ``+=`` became ``+`` above) has ``x``'s value: use ``x``.
    Called only when no in-place op is left, so nothing can change ``x`` in between."""
    for node in list(graph.nodes):
        if (node.op == "call_function" and node.target is torch.clone and len(node.args) == 1 and not node.kwargs
                and isinstance(node.args[0], fx.Node)
                and all(u.op != "output" and not writes(u) for u in node.users)):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


#: in-place sums and reductions of rows into a tensor (``m.new_zeros(n, d).scatter_add_(0, index, m)``, as PyTorch
#: Geometric aggregates messages), whose plain forms the catalog does not group but a union collates
#: (``dynamo_relational.collation``)
_REDUCED_INTO = frozenset(("index_add_", "scatter_add_", "scatter_reduce_", "index_reduce_"))


def _pure_call(node: fx.Node):
    """``(op, target, kwargs)`` of the plain call that computes ``node``'s value, if known, else None."""
    kwargs = node.kwargs
    if node.op == "call_function" and getattr(node.target, "__module__", None) == "_operator":
        plain = getattr(operator, f"__{node.target.__name__[1:]}__", None)   # operator.iadd -> operator.add
        return ("call_function", plain, {}) if plain is not None and len(node.args) == 2 and not kwargs else None
    if kwargs.get("out") is not None:
        return None
    if kwargs.get("inplace") is True:   # F.relu(h, inplace=True)
        if REGISTRY.family_of(node) is not ELEMENTWISE or node.target in RANDOM_IN_TRAINING:
            return None
        return node.op, node.target, {k: v for k, v in kwargs.items() if k != "inplace"}
    name = aten_name(node.op, node.target)
    if name is None or not name.endswith("_") or name.endswith("__"):
        return None
    if node.op == "call_method":
        plain = name[:-1]
        known = REGISTRY.knows(node.op, plain) or name in _REDUCED_INTO
        return (node.op, plain, dict(kwargs)) if known else None
    for module in (torch, F):   # torch.relu_ -> torch.relu, F.elu_ -> F.elu
        if getattr(module, name, None) is node.target:
            plain = getattr(module, name[:-1], None)
            if plain is not None and REGISTRY.knows(node.op, plain):
                return node.op, plain, dict(kwargs)
    return None


def _read_through_idle_dropouts(graph: fx.Graph) -> None:
    """Dropout outside training, or of probability 0, returns its input itself: its users read the input
    instead. Exact, aliasing included: ``F.dropout(h, training=False).relu_()`` writes into ``h`` (which AOT
    autograd, taking the dropout's result for a new tensor, would not do)."""
    for target in RANDOM_IN_TRAINING:
        for node in graph.find_nodes(op="call_function", target=target):
            if not may_draw(node) and node.args and isinstance(node.args[0], fx.Node):
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)


#: what ``new_full``, ``torch.full`` and ``torch.full_like`` take besides the shape and the value
_FULL_KWARGS = {"dtype", "device", "layout", "pin_memory", "requires_grad"}


def _fill_new_tensor(graph: fx.Graph, node: fx.Node) -> bool:
    """Make ``t.fill_(v)`` or ``t.zero_()`` of a new tensor ``t`` that nothing else reads (``x.new(1, d).fill_(0.)``,
    a leaf's zero state) the one call that makes the filled tensor (``x.new_full((1, d), 0.)``); whether it did."""
    if node.op != "call_method" or node.target not in ("fill_", "zero_") or node.kwargs:
        return False
    t = node.args[0]
    value = node.args[1:] if node.target == "fill_" else (0,)
    if (len(value) != 1 or type(value[0]) not in (int, float, bool) or not isinstance(t, fx.Node)
            or list(t.users) != [node] or tensor_info(t) is None or not set(t.kwargs) <= _FULL_KWARGS):
        return False
    info = tensor_info(t)
    if not makes_tensor(t):   # (fill_ replaces all its values: any factory's, arange's too)
        return False
    if t.op == "call_method":
        node.target, node.args = "new_full", (t.args[0], info.shape, value[0])
    elif t.target.__name__.endswith("_like"):
        node.op, node.target, node.args = "call_function", torch.full_like, (t.args[0], value[0])
    else:
        node.op, node.target, node.args = "call_function", torch.full, (info.shape, value[0])
    node.kwargs = {**t.kwargs, "dtype": info.dtype}   # full's dtype follows its value's type, not t's
    graph.erase_node(t)
    return True


def _new_leaf(graph: fx.Graph, node: fx.Node) -> bool:
    """Make ``t.requires_grad_()`` of a new tensor ``t`` that nothing else reads (a leaf's zero state,
    ``x.new(1, d).fill_(0.).requires_grad_()``) the call that makes ``t`` with ``requires_grad=True``: the
    same leaf; whether it did."""
    if node.op != "call_method" or node.target != "requires_grad_":
        return False
    t = node.args[0]
    flag = node.args[1] if len(node.args) > 1 else node.kwargs.get("requires_grad", True)
    if flag is not True or len(node.args) + len(node.kwargs) > 2 or not isinstance(t, fx.Node) \
            or list(t.users) != [node] or not makes_tensor(t) or (t.op, t.target) == ("call_method", "new"):
        return False   # (the legacy x.new(n, d) takes no requires_grad)
    t.kwargs = {**t.kwargs, "requires_grad": True}
    node.replace_all_uses_with(t)
    graph.erase_node(node)
    return True


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    _read_through_idle_dropouts(gm.graph)
    for node in list(gm.graph.nodes):
        if not writes(node):
            continue
        if _fill_new_tensor(gm.graph, node) or _new_leaf(gm.graph, node):
            continue
        call = _pure_call(node)
        target = node.args[0] if node.args else None
        if (call is not None and isinstance(target, fx.Node)
                and _fresh_temporary(target, node) and tensor_info(node) == tensor_info(target)):
            node.op, node.target = call[0], call[1]
            if dict(node.kwargs) != call[2]:
                node.kwargs = call[2]
            continue
        ctx.keep_order.append(f"in-place op {node.name} ({node.target})")
    if not ctx.keep_order:
        _drop_read_only_clones(gm.graph)
    return gm
