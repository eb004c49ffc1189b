"""Ops whose output, or output shape, depends on tensor values (``nonzero``, boolean masks, ``unique``,
``.item()``): the tracer computes each node's value to know its shape, and refuses these, since a graph traced
once cannot follow values that change from call to call.

Ops that PyTorch's tags and dispatch table show to be shape-static run as they are (:func:`needs_check`), unless
an operand may be read as a number; every other op runs under :class:`RejectDataDependentOps`, which looks at the
tags of the ATen ops it runs."""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from .ops.base import tensor_info
from .ops.facts import target_shape_static

_DATA_DEPENDENT = torch.Tag.data_dependent_output
_DYNAMIC_SHAPE = torch.Tag.dynamic_output_shape


def _static_despite_tag(func, args, kwargs) -> bool:
    """Ops tagged dynamic_output_shape whose output shape is static for these arguments."""
    if func is torch.ops.aten.index.Tensor:   # integer (not boolean) index tensors
        return all(i is None or i.dtype not in (torch.bool, torch.uint8) for i in args[1])
    if func is torch.ops.aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is not None
    if func is torch.ops.aten.one_hot.default:
        return (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) >= 0
    return False


#: composites whose decompositions are shape-static, among the hot per-neuron ops (the ATen ops that run as
#: one kernel are found by :func:`~dynamo_relational.ops.facts.target_shape_static`), and Python's operators
_STATIC_COMPOSITES = frozenset([
    torch.nn.functional.linear, torch.matmul, torch.reshape, torch.flatten, torch.split, torch.chunk,
    "matmul", "reshape", "flatten", "split", "chunk",
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.matmul, operator.pow,
])


def static_target(op: str, target) -> bool:
    """Whether calls of ``target`` have a static output shape unless an operand is read as a number
    (:func:`reads_a_number`); ``x[i]`` is not (a boolean mask), :func:`needs_check` looks at its index."""
    try:
        return target is not operator.getitem and (target in _STATIC_COMPOSITES or target_shape_static(op, target))
    except TypeError:   # unhashable target
        return False


def reads_a_number(node: fx.Node) -> bool:
    """Whether an operand is a 0-dim integer tensor: PyTorch reads it as a number where a call takes one
    (``x.reshape(n)``, ``torch.zeros(n)``), which makes the result's shape depend on its value."""
    for operand in node.all_input_nodes:
        info = tensor_info(operand)
        if info is not None and info.number:
            return True
    return False


def numbers_in_index(index: Any, traced: Callable[[torch.Tensor], bool]) -> Any:
    """``index`` (of ``x[index]``) with each 0-dim integer tensor that is not ``traced`` replaced by its value, as
    PyTorch's indexing reads it: ``x[u]`` for ``u`` in a constant ``nbrs`` (``for u in nbrs``) is ``x[int(u)]``,
    a row of ``x``, not a read of a value. A boolean mask that is not ``traced`` is replaced by the indices of its
    true elements (``x[m]`` is ``x[m.nonzero(as_tuple=True)]``): a mask computed from the structure alone (PyG's
    ``edge_attr[mask]`` of the edges that are not self-loops) selects rows known while tracing."""
    if isinstance(index, torch.Tensor):
        if _constant_mask(index, traced):
            found = index.nonzero(as_tuple=True)
            return found[0] if len(found) == 1 else found
        whole = not (index.is_floating_point() or index.is_complex() or index.dtype in (torch.bool, torch.uint8))
        return int(index) if index.dim() == 0 and whole and not traced(index) else index
    if type(index) is tuple:
        items: list[Any] = []
        for i in index:
            if isinstance(i, torch.Tensor) and _constant_mask(i, traced):
                items.extend(i.nonzero(as_tuple=True))
            else:
                items.append(numbers_in_index(i, traced))
        return tuple(items)
    return index


def _constant_mask(index: torch.Tensor, traced: Callable[[torch.Tensor], bool]) -> bool:
    return index.dtype is torch.bool and index.dim() > 0 and not traced(index)


def _plain_slice(index: slice) -> bool:
    return all(type(bound) is int or bound is None for bound in (index.start, index.stop, index.step))


def needs_check(node: fx.Node) -> bool:
    """Whether computing ``node`` may run an op with a value-dependent output (shape)."""
    if node.target is operator.getitem:   # only tensor indices (boolean masks) can be
        index = node.args[1]
        if type(index) is int or type(index) is slice and _plain_slice(index):
            return False
        return any(isinstance(a, fx.Node) for a in pytree.tree_leaves(node.args[1:]))
    if node.target is torch.nn.functional.one_hot:
        # with its class count given, one_hot's shape is static (its input's, and the count), whatever the
        # classes are (a 0-dim one too: an index, not a number); its own min / max only check their range
        classes = node.args[1] if len(node.args) > 1 else node.kwargs.get("num_classes", -1)
        if type(classes) is int and classes >= 0:
            return False
    return not static_target(node.op, node.target) or reads_a_number(node)


class DataDependentOp(Exception):
    """Raised by :class:`RejectDataDependentOps`; the tracer turns it into a FrontendError naming the line."""


class RejectDataDependentOps(TorchDispatchMode):
    """Raises on ATen ops whose output, or output shape, depends on tensor values."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tags = func.tags
        if _DATA_DEPENDENT in tags or (_DYNAMIC_SHAPE in tags and not _static_despite_tag(func, args, kwargs)):
            raise DataDependentOp(str(func))
        return func(*args, **kwargs)
