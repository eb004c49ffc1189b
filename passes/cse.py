"""Common subexpression elimination over pure neuron ops.

Scalar-granular code reads the same row many times (``x[u]`` once per edge)
and Dynamo records every read. Two nodes with the same target and the same
arguments (nodes by identity, constants by type and value) compute the same
value when the op is pure: every op in the neuron-op catalog is (but dropout
in training, which draws new random numbers at each call), so are
layout views such as ``W.T`` (merged so that a weight stays one shared
operand), and in-place variants are excluded. Equal small tensor constants
and equal calls of deterministic factories (``torch.zeros(8)`` or
``x.new_zeros(8)`` once per neuron) merge. Merging shrinks the graph before grouping. Graphs that keep
in-place ops are left alone.
"""
from __future__ import annotations

from typing import Any, Hashable

import torch
import torch.fx as fx
from torch.fx.immutable_collections import immutable_list

from dynamo_relational.ops import REGISTRY
from dynamo_relational.ops.elementwise import RANDOM_IN_TRAINING, draws_random_numbers

from dynamo_relational.ops.facts import (is_factory, is_forward_constant, is_view, target_is_view, target_makes_tensor,
                                         target_writes, writes)

from .context import PassContext


class _Unhashable(Exception):
    pass


_Node = fx.Node
#: constants keyed as (type name, value) without further checks: hashable, compared by value
_PLAIN = {int: "int", float: "float", bool: "bool", str: "str", type(None): "NoneType"}
#: sequences keyed as (type name, frozen items); fx stores a node's lists as immutable_list
_SEQUENCES = {tuple: "tuple", list: "list", immutable_list: "immutable_list"}


def _freeze(value):
    """A hashable key for ``value``: nodes by identity, constants by type and value.

    The common cases (a node, a plain constant, a list or tuple of them) are answered first;
    they give exactly the key that the general case below would."""
    kind = type(value)
    if kind is _Node:
        return value
    name = _PLAIN.get(kind)
    if name is not None:
        return (name, value)
    name = _SEQUENCES.get(kind)
    if name is not None:
        return (name, tuple([v if type(v) is _Node else _freeze(v) for v in value]))
    return _freeze_general(value)


def _freeze_general(value):
    if isinstance(value, fx.Node):
        return value
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", _freeze(value.start), _freeze(value.stop), _freeze(value.step))
    try:
        hash(value)
    except TypeError:
        raise _Unhashable
    return (type(value).__name__, value)


#: Constants up to this many bytes are compared by value.
_CONSTANT_BYTES = 1 << 16


def _constant_key(gm: fx.GraphModule, node: fx.Node):
    """Equal small constants made for the graph (``torch.zeros(8)`` written once per neuron
    becomes one ``_tensor_constant`` each) merge: keyed by their exact bytes. Parameters and
    buffers of the model never do; they are named after their module."""
    if not is_forward_constant(node):
        return None
    value = getattr(gm, node.target, None)
    if not isinstance(value, torch.Tensor) or value.requires_grad or value.is_sparse \
            or value.numel() * value.element_size() > _CONSTANT_BYTES:
        return None
    # (a copy: a tensor of one element, or of none, counts as contiguous with any stride, which a byte view refuses)
    data = value.detach().reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8).cpu().numpy()
    data = data.tobytes()
    return ("constant", value.dtype, tuple(value.shape), value.device, data)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    if ctx.keep_order:
        return gm
    graph = gm.graph
    seen: dict = {}
    removed = 0
    skipped: dict = {}   # (op, target) -> whether nodes of that op and target are never merged
    no_kwargs = _freeze({})
    for node in list(graph.nodes):
        op = node.op
        if op == "get_attr":
            key = _constant_key(gm, node)
            if key is None:
                continue
        elif op == "placeholder" or op == "output":
            continue
        else:
            target, kwargs = node.target, node.kwargs
            try:
                skip = skipped.get((op, target))
                if skip is None:
                    skip = skipped[(op, target)] = skipped_by_target(op, target)
            except TypeError:   # unhashable target
                skip = _DEPENDS
            if skip is _DEPENDS:
                skip = _skipped(node)
            elif not skip and kwargs and (kwargs.get("inplace") is True or kwargs.get("out") is not None):
                skip = True   # writes' check of the keywords, the rest of it is in skipped_by_target
            if skip:
                continue
            try:
                key = (op, target, _freeze(node.args), _freeze(kwargs) if kwargs else no_kwargs)
            except _Unhashable:
                continue
        twin = seen.setdefault(key, node)
        if twin is not node:
            node.replace_all_uses_with(twin)
            graph.erase_node(node)
            removed += 1
    ctx.stats["cse_removed"] = removed
    return gm


def value_key(node: fx.Node, args: tuple, kwargs: dict) -> Hashable | None:
    """The key under which ``node``, called with ``args`` and ``kwargs`` (its own, or those of a copy in another
    graph), merges with another call: equal keys, equal values. None for a node that never merges
    (:func:`_skipped`) and for arguments with no key."""
    if _skipped(node):
        return None
    try:
        return (node.op, node.target, _freeze(args), _freeze(kwargs))
    except _Unhashable:
        return None


def _skipped(node: fx.Node) -> bool:
    """Nodes that never merge: ops outside the catalog that are not known pure views or
    factories, in-place ops, and dropout in training (two calls, two masks)."""
    return (REGISTRY.family_of(node) is None and not is_view(node) and not is_factory(node)) \
        or writes(node) or draws_random_numbers(node)


def _is_dropout(target) -> bool:
    try:
        return target in RANDOM_IN_TRAINING
    except TypeError:   # unhashable target
        return False


#: what :func:`skipped_by_target` answers where a call's arguments decide (``getattr(W, "T")``)
_DEPENDS = "depends on the arguments"


def skipped_by_target(op: str, target: Any):
    """:func:`_skipped` for every call of ``target`` (``op`` ``call_function`` or ``call_method``), leaving out the
    check of the ``inplace=``/``out=`` keywords (made per call); :data:`_DEPENDS` where the arguments decide.
    Every part of it depends on the op and target alone except ``is_view`` of ``getattr``, whether a dropout is
    in training, whether a factory's arguments are constants, and the family of a target whose calls are in
    the catalog by their arguments (:meth:`Registry.per_call`)."""
    if op != "call_function" and op != "call_method":
        return True
    if op == "call_function" and (target is getattr or _is_dropout(target)) or target_makes_tensor(op, target):
        return _DEPENDS
    if REGISTRY.per_call(op, target):
        return _DEPENDS   # (torch.max(a, b) is in the catalog, torch.max(a) not)
    return (not REGISTRY.knows(op, target) and not target_is_view(op, target)) or target_writes(op, target)


def merges_by_target(op: str, target: Any) -> bool:
    """Whether every call of ``target`` without keywords merges with a call of equal arguments."""
    try:
        return skipped_by_target(op, target) is False
    except TypeError:   # unhashable target
        return False
