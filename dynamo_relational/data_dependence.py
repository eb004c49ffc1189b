"""Ops whose output, or output shape, depends on tensor values (``nonzero``, boolean masks, ``unique``,
``.item()``): the tracer computes each node's value to know its shape, and refuses these, since a graph traced
once cannot follow values that change from call to call.

The common per-neuron ops are known to be shape-static (:func:`needs_check`); every other op runs under
:class:`RejectDataDependentOps`, which looks at the ATen ops' tags."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

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


#: call_function / call_method targets whose output shape never depends on tensor values (the
#: hot per-neuron ops); every other op runs under :class:`RejectDataDependentOps`
_SHAPE_STATIC = frozenset([
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.matmul, operator.pow,
    torch.add, torch.sub, torch.mul, torch.div, torch.matmul, torch.mm, torch.mv, torch.dot, torch.nn.functional.linear,
    torch.relu, torch.sigmoid, torch.tanh, torch.exp, torch.log, torch.stack, torch.cat, torch.sum, torch.mean,
    torch.squeeze, torch.unsqueeze, torch.reshape, torch.flatten, torch.nn.functional.relu, torch.nn.functional.sigmoid,
    torch.nn.functional.tanh,
    "add", "sub", "mul", "div", "matmul", "relu", "sigmoid", "tanh", "exp", "log", "sum", "mean", "squeeze",
    "unsqueeze", "view", "reshape", "flatten", "t", "transpose",
])


def needs_check(node: fx.Node) -> bool:
    """Whether computing ``node`` may run an op with a value-dependent output (shape)."""
    if node.target is operator.getitem:   # only tensor indices (boolean masks) can be
        return any(isinstance(a, fx.Node) for a in pytree.tree_leaves(node.args[1:]))
    try:
        return node.target not in _SHAPE_STATIC
    except TypeError:   # unhashable target
        return True


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
