"""Elementwise neuron ops (``a + b``, ``w * x``, ``sigmoid(h)``, ``x + 0.3``).

A group becomes the same call on batched operands ``[k, *shape]``; operands
shared by all members (a weight, a bias) are passed once and broadcast.
Python scalars of arithmetic ops may differ between members (per-neuron
offsets): they become a ``[k, 1, ...]`` constant of the result dtype. So may
the scalars of comparisons, ``pow``, ``clamp``, ``where`` and ``masked_fill``
on floating tensors (per-neuron thresholds, exponents, bounds, fill values):
a constant of the tensors' dtype, which is the dtype PyTorch converts the
scalar to for them; ``masked_fill`` then becomes ``where(mask, values, h)``,
which computes the same values and gradient.
Comparisons, logical and bitwise ops, ``masked_fill`` with a constant,
dtype casts (``h.to(torch.float64)``, ``m.float()``) and dropout outside
training (the identity) group the same way; so does dropout in training
with the ``group_dropout`` option (one mask for the group's rows).
"""
from __future__ import annotations

import operator
from typing import Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from .base import NeuronOp, OpFamily, freeze, hashable_const, is_scalar, node_args, register, tensor_info


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _VaryingConst(_Slot):
    pass


#: low-precision dtypes whose products and quotients with a Python scalar eager computes in float32
_OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
_SCALED = {operator.mul, operator.truediv, torch.mul, torch.div, "mul", "div", "__rmul__", "__rtruediv__"}
_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.sub,
               torch.mul, torch.div, "add", "sub", "mul", "div", "__radd__", "__rsub__", "__rmul__",
               "__rtruediv__"}


class Elementwise(OpFamily):
    name = "elementwise"

    def describe(self, node: fx.Node, *, group_dropout: bool = False) -> NeuronOp | str:
        """``group_dropout``: a dropout in training is a member too (the ``group_dropout`` option)."""
        info = tensor_info(node)
        if info is None:
            return "output is not a tensor of static shape"
        node_kwargs = node.kwargs
        if node_kwargs and (node_kwargs.get("inplace") or node_kwargs.get("out") is not None):
            return "in-place or out= variant"
        varying, column_dtype = _varying_scalars(node, info)
        operands: list[fx.Node] = []
        consts: list = []
        frozen: list = []
        try:
            args = tuple([_template(a, i in varying, operands, consts, frozen) for i, a in enumerate(node.args)])
            kwargs = {k: _template(v, k in varying, operands, consts, frozen) for k, v in node_kwargs.items()}
        except _Unsupported as e:
            return str(e)
        if not operands:
            return "no tensor operand"
        if not group_dropout and node.target in RANDOM_IN_TRAINING and in_training(node):
            return "dropout in training mode draws eager's random numbers in eager's order (option group_dropout)"
        if node.target in _SCALAR_VALUE:
            value = node.args[2] if len(node.args) > 2 else node_kwargs.get("value")
            if isinstance(value, fx.Node):
                return "masked_fill with a tensor value"   # batched, the value would not be 0-d
        if len(operands) > 1 and info.rank > 0:
            infos = [tensor_info(o) for o in operands]
            if len({i.dtype for i in infos}) > 1 and any(i.rank == 0 for i in infos):
                # 0-d tensors take part in type promotion like scalars; batched they would not.
                return "mixed dtypes with a 0-d operand"
        key = (self.name, node.op, node.target, tuple(frozen), tuple(kwargs), info)
        return NeuronOp(node, self, key, tuple(operands), info, tuple(consts), (args, kwargs, column_dtype))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        first = members[0]
        args, kwargs, column_dtype = first.template
        k, out = len(members), first.info
        values = []
        for j in range(len(first.operands)):
            value, batched = b.slot([m.operands[j] for m in members])
            if batched:
                value = b.align(value, tensor_info(first.operands[j]), out.rank, k)
            values.append(value)
        consts = []
        for j in range(len(first.consts)):
            column = [m.consts[j] for m in members]
            if all(c == column[0] and type(c) is type(column[0]) for c in column):
                consts.append(column[0])
            else:
                table = torch.tensor(column, dtype=column_dtype, device=out.device)
                consts.append(b.constant(table.reshape((k,) + (1,) * out.rank), "offsets"))

        def fill(value):
            if isinstance(value, _VaryingConst):
                return consts[value.index]
            if isinstance(value, _Slot):
                return values[value.index]
            return value

        new_args = tuple(fill(a) for a in args)
        new_kwargs = {key: fill(v) for key, v in kwargs.items()}
        if first.node.target in _BOUNDS and any(isinstance(c, fx.Node) for c in consts):
            # clamp takes two numbers or two tensors: a shared bound beside a column becomes a 0-d tensor
            def as_tensor(value):
                if not is_scalar(value):
                    return value
                return b.constant(torch.tensor(value, dtype=column_dtype, device=out.device), "offsets")
            new_args = new_args[:1] + tuple(as_tensor(a) for a in new_args[1:])
            new_kwargs = {key: as_tensor(v) for key, v in new_kwargs.items()}
        if first.node.target in _SCALAR_VALUE and any(isinstance(c, fx.Node) for c in consts):
            # a fill value per member: masked_fill takes one scalar, where takes the column
            named = {**dict(zip(("input", "mask", "value"), new_args)), **new_kwargs}
            return b.graph.call_function(torch.where, (named["mask"], named["value"], named["input"]))
        result = b.graph.create_node(first.node.op, first.node.target, new_args, new_kwargs)
        if column_dtype is not out.dtype and first.node.target in _ARITHMETIC \
                and any(isinstance(c, fx.Node) for c in consts):
            result = b.graph.call_method("to", (result, out.dtype))   # a float32 column: round back once
        return result


class _Unsupported(Exception):
    pass


_BOUNDS = (torch.clamp, torch.clip, "clamp", "clip")
#: ops other than arithmetic whose Python scalars may differ between members -> their positions and keywords
_VARYING_SCALARS = {**{t: (0, 1) for t in (operator.gt, operator.lt, operator.ge, operator.le, operator.eq,
                                          operator.ne, torch.gt, torch.lt, torch.ge, torch.le, torch.eq, torch.ne,
                                          "gt", "lt", "ge", "le", "eq", "ne", operator.pow, torch.pow, "pow")},
                    **{t: (1, 2, "min", "max") for t in _BOUNDS},
                    **{t: (1, 2, "other", "input") for t in (torch.where, "where")},
                    **{t: (2, "value") for t in (torch.masked_fill, "masked_fill")}}


def _varying_scalars(node: fx.Node, info) -> tuple[tuple, torch.dtype | None]:
    """Which arguments of ``node`` (positions, keywords) may be a scalar that differs between members,
    and the dtype of the ``[k, 1, ...]`` constant they become: for floating arithmetic the result's (float32
    for products and quotients of float16 and bfloat16 values, which eager computes with the scalar in
    float32, where it rounds a summand to the result's dtype first: the result is rounded back);
    for the ops of :data:`_VARYING_SCALARS` the one floating dtype of their tensors (PyTorch converts
    the scalar to it), else none."""
    target = node.target
    if target in _ARITHMETIC:
        column = _OPMATH.get(info.dtype, info.dtype) if target in _SCALED else info.dtype
        return ((0, 1) if info.dtype.is_floating_point else ()), column
    places = _VARYING_SCALARS.get(target)
    if places is None:
        return (), None
    dtypes = {i.dtype for a in (*node.args, *node.kwargs.values()) if (i := tensor_info(a)) is not None}
    floating = [d for d in dtypes if d.is_floating_point]
    if len(floating) != 1 or (info.dtype.is_floating_point and info.dtype != floating[0]):
        return (), None
    return places, floating[0]


def _template(value, varying: bool, operands: list, consts: list, frozen: list):
    """``value``, one argument of an elementwise node, as it appears in the group's template:
    a node becomes a slot (its operand), a Python scalar of a floating arithmetic op a
    per-member constant (``varying``: positional arguments of such ops), anything else stays
    (a constant every member must share). ``frozen`` collects what the signature compares."""
    if isinstance(value, fx.Node):
        value_info = tensor_info(value)
        if value_info is None:
            raise _Unsupported(f"operand {value.name} is not a tensor of static shape")
        operands.append(value)
        frozen.append(("slot", value_info))
        return _Slot(len(operands) - 1)
    if varying and is_scalar(value) and type(value) is not bool:
        consts.append(value)
        frozen.append(("const",))
        return _VaryingConst(len(consts) - 1)
    if not hashable_const(value):
        raise _Unsupported(f"argument {value!r} is not a constant")
    frozen.append(freeze(value))
    return value


_UNARY = [torch.relu, torch.sigmoid, torch.tanh, torch.exp, torch.log, torch.neg, torch.abs,
          torch.sqrt, torch.rsqrt, torch.sin, torch.cos, torch.square, torch.erf, torch.log1p,
          torch.expm1, torch.reciprocal, torch.sign, torch.clamp, torch.clip, torch.nn.functional.relu,
          F.sigmoid, F.tanh, F.leaky_relu, F.elu, F.gelu, F.silu, F.softplus, F.relu6, F.hardtanh,
          F.mish, F.selu, F.celu, F.logsigmoid, operator.neg, torch.special.expit, torch.detach,
          # rounding, trigonometric, hyperbolic, exponential and special functions
          torch.floor, torch.ceil, torch.round, torch.trunc, torch.frac, torch.tan, torch.asin, torch.acos,
          torch.atan, torch.sinh, torch.cosh, torch.asinh, torch.acosh, torch.atanh, torch.log2, torch.log10,
          torch.exp2, torch.erfc, torch.erfinv, torch.sinc, torch.logit, torch.special.logit, torch.lgamma,
          torch.digamma, torch.special.i0, torch.sgn, torch.nan_to_num, torch.clamp_min, torch.clamp_max,
          torch.isnan, torch.isinf, torch.isfinite, torch.deg2rad, torch.rad2deg,
          # more activations
          F.hardsigmoid, F.hardswish, F.softsign, F.tanhshrink, F.threshold, torch.threshold, F.hardshrink,
          F.softshrink]
_BINARY = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, torch.add,
           torch.sub, torch.mul, torch.div, torch.pow, torch.maximum, torch.minimum, torch.where,
           torch.lerp, torch.addcmul, torch.addcdiv, torch.true_divide, operator.mod, operator.floordiv,
           torch.remainder, torch.fmod, torch.floor_divide, torch.atan2, torch.arctan2, torch.hypot, torch.copysign,
           torch.xlogy, torch.special.xlogy, torch.logaddexp, torch.logaddexp2, torch.fmax, torch.fmin]
_COMPARE = [operator.gt, operator.lt, operator.ge, operator.le, operator.eq, operator.ne, torch.gt, torch.lt,
            torch.ge, torch.le, torch.eq, torch.ne]
_LOGICAL = [operator.and_, operator.or_, operator.xor, operator.invert, torch.logical_and, torch.logical_or,
            torch.logical_xor, torch.logical_not, torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor,
            torch.bitwise_not, torch.masked_fill]
_METHODS = ["relu", "sigmoid", "tanh", "exp", "log", "neg", "abs", "sqrt", "rsqrt", "sin", "cos",
            "square", "clamp", "clip", "add", "sub", "mul", "div", "pow", "maximum", "minimum",
            "__radd__", "__rsub__", "__rmul__", "__rtruediv__", "erf", "log1p", "expm1",
            "reciprocal", "detach", "gt", "lt", "ge", "le", "eq", "ne", "__and__", "__or__", "__xor__",
            "__invert__", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and", "bitwise_or",
            "bitwise_xor", "bitwise_not", "masked_fill", "where", "lerp", "addcmul", "addcdiv", "true_divide",
            "floor", "ceil", "round", "trunc", "frac", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
            "acosh", "atanh", "log2", "log10", "exp2", "erfc", "erfinv", "sinc", "logit", "lgamma", "digamma",
            "sign", "sgn", "nan_to_num", "clamp_min", "clamp_max", "isnan", "isinf", "isfinite", "deg2rad",
            "rad2deg", "hardshrink", "__mod__", "__rmod__", "__floordiv__", "__rfloordiv__", "remainder", "fmod",
            "floor_divide", "atan2", "arctan2", "hypot", "copysign", "xlogy", "logaddexp", "logaddexp2", "fmax",
            "fmin",
            # casts: a constant dtype (or another tensor's, ``type_as``) applies row by row
            "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "bool"]
#: dropout: the identity outside training (grouped), random numbers in training (left alone, in order)
RANDOM_IN_TRAINING = {F.dropout: ("input", "p", "training", "inplace"), torch.dropout: ("input", "p", "train")}


def in_training(node: fx.Node) -> bool:
    """Whether a dropout ``node`` may be in training mode (anything but a literal ``training=False``)."""
    names = RANDOM_IN_TRAINING[node.target]
    args = node_args(node, names)
    return args is None or args.get(names[2], True) is not False


def draws_random_numbers(node: fx.Node) -> bool:
    """Whether ``node`` is a dropout that may be in training: every call draws a new mask, so two equal
    calls, or two equal rows of one call, are not equal values (CSE and value compression must not merge them)."""
    if node.op != "call_function":
        return False
    try:
        return node.target in RANDOM_IN_TRAINING and in_training(node)
    except TypeError:   # unhashable target
        return False


#: ops whose ``value`` argument (third) must be one Python scalar, not a tensor per member
_SCALAR_VALUE = {torch.masked_fill, "masked_fill"}

ELEMENTWISE = register(Elementwise(), functions=_UNARY + _BINARY + _COMPARE + _LOGICAL + list(RANDOM_IN_TRAINING),
                       methods=_METHODS)
