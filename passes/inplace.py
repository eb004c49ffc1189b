"""Turn in-place ops on fresh temporaries into pure ops; find the in-place ops that remain.

Rewrites ``acc += t`` (``operator.iadd`` and friends, ``Tensor.add_`` without
``alpha``) into ``acc + t``, an activation with ``inplace=True``
(``nn.ReLU(inplace=True)``) into the plain call, and an in-place method or
function whose plain form is in the neuron-op catalog (``h.relu_()``,
``torch.sigmoid_(h)``) into that form, and ``t.fill_(v)`` or ``t.zero_()`` of a
new tensor ``t`` into the call that makes it filled (``x.new(1, d).fill_(0.)`` into
``x.new_full((1, d), 0.)``). Legal when ``acc`` (``h``) is a fresh
temporary: produced by an arithmetic op, ``torch.zeros`` or ``torch.clone``
(not a view, input or parameter, nor a cast, ``detach`` or dropout, which may
return their input itself) whose only user is the in-place op, and the
result has its shape and dtype. Then nothing else can observe the mutation,
and the plain op computes the same values. Every other in-place op is
recorded in ``ctx.keep_order``; the grouping pass then leaves the graph as it
is, since grouping copies values that in-place ops may alias. When none is
left, a ``clone`` that is only read is replaced by its input (same value, one
node less). Dropout outside training, which returns its input itself, is
first replaced by that input.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import REGISTRY, tensor_info
from dynamo_relational.ops.elementwise import ELEMENTWISE, RANDOM_IN_TRAINING, in_training
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
#: their method forms (``t.__setitem__(i, v)``, as fx records a write into a tensor it holds as a constant)
_IN_PLACE_DUNDERS = {"__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ipow__", "__imatmul__",
                     "__ifloordiv__", "__imod__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"}
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
        if target in _IN_PLACE_DUNDERS:
            return True
        name = target
    return _in_place_name(name)


def _in_place_name(name: str) -> bool:
    """PyTorch's naming of in-place variants: ``relu_``, ``add_`` (not dunders such as ``__add__``)."""
    return name.endswith("_") and not name.endswith("__")


#: catalog ops that may return their input itself or a view of it (a cast to the same dtype, ``detach``,
#: dropout outside training): writing into their result writes into their input
_MAY_ALIAS = {"detach", torch.detach, "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long",
              "short", "char", "byte", "bool", "cfloat", "cdouble", "chalf", *RANDOM_IN_TRAINING}


def _fresh_temporary(node: fx.Node, user: fx.Node) -> bool:
    fresh = (node.op in ("call_function", "call_method") and REGISTRY.family_of(node) in _FRESH_FAMILIES
             and node.target not in _MAY_ALIAS) \
        or is_zeros(node) or (node.op == "call_function" and node.target is torch.clone)
    return fresh and list(node.users) == [user] and not is_in_place(node)


def is_zeros(node) -> bool:
    """A new tensor of zeros on every call (an accumulator's start): ``torch.zeros(...)``,
    ``torch.zeros_like(...)``, ``x.new_zeros(...)``, or the constant the fast front-end records for a tensor that
    ``forward`` builds from Python values alone (``_tensor_constant*``; a model's buffers are not)."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_function":
        return node.target in (torch.zeros, torch.zeros_like)
    if node.op == "call_method":
        return node.target == "new_zeros"
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


def _pure_call(node: fx.Node):
    """``(op, target, kwargs)`` of the plain call that computes ``node``'s value, if known, else None."""
    try:
        pure = _PURE_FORM.get(node.target)
    except TypeError:   # unhashable target
        return None
    if pure is not None:
        return ("call_function", pure, {}) if len(node.args) == 2 and not node.kwargs else None
    kwargs = node.kwargs
    if kwargs.get("out") is not None:
        return None
    if kwargs.get("inplace") is True:   # F.relu(h, inplace=True)
        if REGISTRY.family_of(node) is not ELEMENTWISE or node.target in RANDOM_IN_TRAINING:
            return None
        return node.op, node.target, {k: v for k, v in kwargs.items() if k != "inplace"}
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if not _in_place_name(name):
        return None
    if node.op == "call_method":
        plain = name[:-1]
        return (node.op, plain, dict(kwargs)) if REGISTRY.knows(node.op, plain) else None
    for module in (torch, F):   # torch.relu_ -> torch.relu, F.elu_ -> F.elu
        if getattr(module, name, None) is node.target:
            plain = getattr(module, name[:-1], None)
            if plain is not None and REGISTRY.knows(node.op, plain):
                return node.op, plain, dict(kwargs)
    return None


def _read_through_eval_dropouts(graph: fx.Graph) -> None:
    """Dropout outside training returns its input itself: its users read the input instead. Exact,
    aliasing included: ``F.dropout(h, training=False).relu_()`` writes into ``h`` (which AOT autograd,
    taking the dropout's result for a new tensor, would not do)."""
    for target in RANDOM_IN_TRAINING:
        for node in graph.find_nodes(op="call_function", target=target):
            if not in_training(node) and node.args and isinstance(node.args[0], fx.Node):
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)


#: calls that make a new tensor, whose values a ``fill_`` or ``zero_`` of the whole tensor then replaces
_NEW_TENSOR_METHODS = {"new", "new_empty", "new_zeros", "new_ones", "new_full"}
_NEW_TENSOR_FUNCTIONS = {torch.empty, torch.zeros, torch.ones, torch.full}
_NEW_TENSOR_LIKE = {torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like}
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
    shape = tuple(tensor_info(t).shape)
    if t.op == "call_method" and t.target in _NEW_TENSOR_METHODS:
        node.target, node.args = "new_full", (t.args[0], shape, value[0])
    elif t.op == "call_function" and t.target in _NEW_TENSOR_FUNCTIONS:
        node.op, node.target, node.args = "call_function", torch.full, (shape, value[0])
    elif t.op == "call_function" and t.target in _NEW_TENSOR_LIKE:
        node.op, node.target, node.args = "call_function", torch.full_like, (t.args[0], value[0])
    else:
        return False
    node.kwargs = dict(t.kwargs)
    graph.erase_node(t)
    return True


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    _read_through_eval_dropouts(gm.graph)
    for node in gm.graph.nodes:
        if not is_in_place(node):
            continue
        if _fill_new_tensor(gm.graph, node):
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
