"""Turn in-place accumulation into pure ops; find the in-place ops that remain.

Rewrites ``acc += t`` (``operator.iadd`` and friends, ``Tensor.add_`` without
``alpha``) into ``acc + t``. Legal when ``acc`` is a fresh temporary: produced
by an arithmetic op, ``torch.zeros`` or ``torch.clone`` (not a view, input or
parameter) whose only user is the in-place op, and the result has ``acc``'s
shape and dtype. Then nothing else can observe the mutation. Every other in-place op is recorded in
``ctx.keep_order``; the grouping pass then leaves the graph as it is, since
grouping copies values that in-place ops may alias. When none is left, a
``clone`` that is only read is replaced by its input (same value, one node less).
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import REGISTRY, tensor_info
from dynamo_relational.ops.elementwise import ELEMENTWISE
from dynamo_relational.ops.matmul import LINEAR, MATMUL
from dynamo_relational.ops.aggregate import AGGREGATE
from dynamo_relational.ops.reduce import REDUCE

from .context import PassContext

_PURE_FORM = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
              operator.itruediv: operator.truediv, "add_": operator.add, "sub_": operator.sub,
              "mul_": operator.mul, "div_": operator.truediv}
_IN_PLACE_FUNCTIONS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ipow,
                       operator.imatmul, operator.ifloordiv, operator.imod, operator.setitem,
                       operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift}
_FRESH_FAMILIES = (ELEMENTWISE, MATMUL, LINEAR, AGGREGATE, REDUCE)


def is_in_place(node: fx.Node) -> bool:
    op = node.op
    if op != "call_function" and op != "call_method":
        return False
    kwargs = node.kwargs
    if kwargs and (kwargs.get("inplace") is True or kwargs.get("out") is not None):   # (out=None is no output)
        return True
    return target_in_place(op, node.target)


def target_in_place(op: str, target) -> bool:
    """:func:`is_in_place` for a call (``op`` ``call_function`` or ``call_method``) of ``target``
    without keyword arguments: computed once per op and target, not once per node."""
    if op != "call_function" and op != "call_method":
        return False
    cache = _IN_PLACE_FUNCTION_TARGETS if op == "call_function" else _IN_PLACE_METHOD_TARGETS
    try:
        return cache[target]
    except KeyError:
        pass
    except TypeError:   # unhashable target
        return _in_place_target(op, target)
    result = cache[target] = _in_place_target(op, target)
    if len(cache) > 4096:   # targets are few; a bound keeps a long-lived process from collecting them
        cache.clear()
    return result


_IN_PLACE_FUNCTION_TARGETS: dict = {}
_IN_PLACE_METHOD_TARGETS: dict = {}


def _in_place_target(op: str, target) -> bool:
    """Whether calling ``target`` (a function, or a method name) mutates its first operand."""
    if op == "call_function":
        try:
            if target in _IN_PLACE_FUNCTIONS:
                return True
        except TypeError:
            return False
        if getattr(target, "__module__", None) == "_operator":
            return False   # operator's in-place functions are listed above; and_, or_, not_ are pure
        name = getattr(target, "__name__", "")
    else:
        name = target
    return name.endswith("_") and not name.endswith("__")


def _fresh_temporary(node: fx.Node, user: fx.Node) -> bool:
    fresh = (node.op in ("call_function", "call_method") and REGISTRY.family_of(node) in _FRESH_FAMILIES) \
        or is_zeros(node) or (node.op == "call_function" and node.target is torch.clone)
    return fresh and list(node.users) == [user] and not is_in_place(node)


def is_zeros(node) -> bool:
    """A new tensor of zeros on every call (an accumulator's start): ``torch.zeros(...)``,
    ``torch.zeros_like(...)``, or the constant the fast front-end records for a tensor that
    ``forward`` builds from Python values alone (``_tensor_constant*``; a model's buffers are not)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return node.target in (torch.zeros, torch.zeros_like)
    value = node.meta.get("example_value")
    return (node.op == "get_attr" and node.target.startswith("_tensor_constant")
            and isinstance(value, torch.Tensor) and not value.any())


def _drop_read_only_clones(graph: fx.Graph) -> None:
    """``clone(x)`` that is only read (its ``+=`` became ``+`` above) has ``x``'s value: use ``x``.
    Called only when no in-place op is left, so nothing can change ``x`` in between."""
    for node in list(graph.nodes):
        if (node.op == "call_function" and node.target is torch.clone and len(node.args) == 1 and not node.kwargs
                and isinstance(node.args[0], fx.Node)
                and all(u.op != "output" and not is_in_place(u) for u in node.users)):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    for node in gm.graph.nodes:
        if not is_in_place(node):
            continue
        pure = _PURE_FORM.get(node.target)
        target = node.args[0] if node.args else None
        if (pure is not None and len(node.args) == 2 and not node.kwargs and isinstance(target, fx.Node)
                and _fresh_temporary(target, node) and tensor_info(node) == tensor_info(target)):
            node.op, node.target = "call_function", pure
            continue
        ctx.keep_order.append(f"in-place op {node.name} ({node.target})")
    if not ctx.keep_order:
        _drop_read_only_clones(gm.graph)
    return gm
