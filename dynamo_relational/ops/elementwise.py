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

Besides the hand tables, any torch function or Tensor method whose ATen
overloads are tagged ``torch.Tag.pointwise`` is a member (``torch.special.*``,
``heaviside``, ``float_power``, ``ldexp``, ``polygamma``; ``torch.max(a, b)``
but not ``torch.max(a)``): see :func:`_resolve_pointwise`. Its tensor
arguments broadcast to its output's shape, which the batched call keeps
(``[k, *shape]``); its other arguments are constants shared by the group.
"""
from __future__ import annotations

import operator
import types
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from .base import (REGISTRY, NeuronOp, OpFamily, TensorInfo, freeze, hashable_const, is_scalar, node_args, register,
                   register_resolver, tensor_info)


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _VaryingConst(_Slot):
    pass


#: low-precision dtypes whose products and quotients with a Python scalar eager computes in float32
_OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
#: the targets of an addition of two values, as functions and as methods
ADDITIONS = frozenset((operator.add, torch.add, "add", "__add__", "__radd__"))
_SCALED = {operator.mul, operator.truediv, torch.mul, torch.div, "mul", "div", "__rmul__", "__rtruediv__"}
_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, torch.add, torch.sub,
               torch.mul, torch.div, "add", "sub", "mul", "div", "__radd__", "__rsub__", "__rmul__",
               "__rtruediv__"}


class Elementwise(OpFamily):
    name = "elementwise"
    fresh = True

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
        if not group_dropout and node.target in RANDOM_IN_TRAINING and may_draw(node):
            return "dropout in training mode draws eager's random numbers in eager's order (option group_dropout)"
        if node.target in _SCALAR_VALUE:
            value = node.args[2] if len(node.args) > 2 else node_kwargs.get("value")
            if isinstance(value, fx.Node):
                return "masked_fill with a tensor value"   # batched, the value would not be 0-d
        if len(operands) > 1 and info.rank > 0:
            condition = _where_condition(node)   # (a where's condition takes no part in type promotion)
            infos = [_operand_info(o) for o in operands if o is not condition]
            if len({i.dtype for i in infos}) > 1 and any(i.rank == 0 for i in infos):
                # 0-d tensors take part in type promotion like scalars; batched they would not.
                return "mixed dtypes with a 0-d operand"
        if _resolved(node) and _broadcast_shape([_operand_info(o).shape for o in operands]) != info.shape:
            return "output shape is not the operands' broadcast shape"
        key = (self.name, node.op, node.target, tuple(frozen), tuple(kwargs), info)
        return NeuronOp(node, self, key, tuple(operands), info, tuple(consts), (args, kwargs, column_dtype))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        first = members[0]
        args, kwargs, column_dtype = first.template
        k, out = len(members), first.info
        values, shared = [], []
        for j in range(len(first.operands)):
            value, batched = b.slot([m.operands[j] for m in members])
            if batched:
                value = b.align(value, tensor_info(first.operands[j]), out.rank, k)
            else:
                shared.append(j)
            values.append(value)
        if out.rank == 0 and shared and len({_operand_info(o).dtype for o in first.operands}) > 1:
            # 0-d tensors take part in type promotion like scalars: beside batched rows, which are not 0-d,
            # a shared 0-d operand of another dtype would count for less than it did in each member
            for j in shared:
                values[j] = b.graph.call_method("reshape", (values[j], (1,)))
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


def _where_condition(node: fx.Node) -> Any:
    """The condition of ``torch.where(condition, x, y)`` or ``x.where(condition, y)``; None for other ops."""
    if node.op == "call_function" and node.target is torch.where:
        return node.args[0] if node.args else node.kwargs.get("condition")
    if node.op == "call_method" and node.target == "where":
        return node.args[1] if len(node.args) > 1 else node.kwargs.get("condition")
    return None


def _operand_info(operand: fx.Node) -> TensorInfo:
    """The info of a member's operand: a tensor of static shape (see :func:`_template`)."""
    info = tensor_info(operand)
    assert info is not None
    return info


def _resolved(node: fx.Node) -> bool:
    """Whether ``node`` is a member by torch's pointwise tag (see :func:`_resolve_pointwise`), not a hand table."""
    table: dict[Any, OpFamily] = REGISTRY.functions if node.op == "call_function" else REGISTRY.methods
    return table.get(node.target) is not ELEMENTWISE


def _broadcast_shape(shapes: list) -> tuple | None:
    """The shape ``shapes`` broadcast to, None if they do not."""
    out = [1] * max(map(len, shapes))
    for shape in shapes:
        for i, size in enumerate(shape, len(out) - len(shape)):
            if out[i] == 1:
                out[i] = size
            elif size != 1 and size != out[i]:
                return None
    return tuple(out)


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


# The hand tables: calls the family groups that torch's pointwise tags do not cover (see
# ``_resolve_pointwise`` below for all the others), or whose semantics need handling of their own.
#: Python's operators, and ``torch.nn.functional``'s Python functions: neither is an ATen op's binding, so
#: no tag reaches them (``F.relu6`` calls ``hardtanh``, ``F.threshold`` takes ``inplace``)
_PYTHON = [operator.neg, operator.add, operator.sub, operator.mul, operator.truediv, operator.pow, operator.mod,
           operator.floordiv, F.relu, F.sigmoid, F.tanh, F.leaky_relu, F.elu, F.silu, F.relu6, F.hardtanh, F.mish,
           F.selu, F.celu, F.hardsigmoid, F.hardswish, F.softsign, F.tanhshrink, F.threshold]
#: elementwise, but untagged: aliases and composites (``special.expit`` is ``sigmoid``, ``arctan2`` ``atan2``),
#: ``true_divide`` and ``rsub`` (their Scalar and Tensor overloads respectively), ``isclose``; and ``detach``,
#: which returns its input's data (not pointwise to torch: no new values)
_UNTAGGED = [F.logsigmoid, torch.special.expit, torch.special.logit, torch.special.i0, torch.special.xlogy,
             torch.special.ndtr, torch.special.polygamma, torch.arctan2, torch.floor_divide, torch.true_divide,
             torch.rsub, torch.isclose, torch.detach]
#: scalars that may differ per neuron (``_ARITHMETIC``, ``_VARYING_SCALARS``), clamp's bounds (``_BOUNDS``),
#: a fill value per neuron (``_SCALAR_VALUE``); ``where`` and ``masked_fill`` also have untagged overloads
_SPECIAL = [torch.add, torch.sub, torch.mul, torch.div, torch.pow, torch.clamp, torch.clip, torch.where,
            torch.masked_fill]
_COMPARE = [operator.gt, operator.lt, operator.ge, operator.le, operator.eq, operator.ne, torch.gt, torch.lt,
            torch.ge, torch.le, torch.eq, torch.ne]
_LOGICAL = [operator.and_, operator.or_, operator.xor, operator.invert]
_METHODS = [# scalars per neuron, bounds, fill values (as above)
            "add", "sub", "mul", "div", "pow", "clamp", "clip", "where", "masked_fill", "gt", "lt", "ge", "le", "eq",
            "ne", "__radd__", "__rsub__", "__rmul__", "__rtruediv__",
            # dunders: their bindings are not by name (``__and__`` calls ``bitwise_and``); ``__rdiv__`` and
            # ``__rpow__`` are Python methods
            "__and__", "__or__", "__xor__", "__invert__", "__mod__", "__rmod__", "__floordiv__", "__rfloordiv__",
            "__rdiv__", "__rpow__",
            # untagged (as above)
            "true_divide", "floor_divide", "arctan2", "isclose", "detach",
            # casts: a constant dtype (or another tensor's, ``type_as``) applies row by row
            "to", "type", "type_as", "float", "double", "half", "bfloat16", "int", "long", "short", "char", "byte",
            "bool", "cfloat", "cdouble", "chalf"]
#: dropout: the identity outside training (grouped), random numbers in training (left alone, in order)
RANDOM_IN_TRAINING: dict[Callable[..., Any], tuple[str, ...]] = {F.dropout: ("input", "p", "training", "inplace"),
                                                                  torch.dropout: ("input", "p", "train")}


def may_draw(node: fx.Node) -> bool:
    """Whether a dropout ``node`` may draw a mask: anything but a literal ``training=False`` or ``p=0``, with which
    it draws nothing and returns its input itself (``nn.Dropout(0.0)``, layers' default ``dropout=0``)."""
    assert not isinstance(node.target, str)   # (dropouts are functions)
    names = RANDOM_IN_TRAINING[node.target]
    args = node_args(node, names)
    if args is None:
        return True
    p = args.get(names[1], 0.5)
    return args.get(names[2], True) is not False and not (type(p) in (int, float) and p == 0)


def draws_random_numbers(node: fx.Node) -> bool:
    """Whether ``node`` is a dropout that may be in training: every call draws a new mask, so two equal
    calls, or two equal rows of one call, are not equal values (CSE and value compression must not merge them)."""
    if node.op != "call_function":
        return False
    try:
        return node.target in RANDOM_IN_TRAINING and may_draw(node)
    except TypeError:   # unhashable target
        return False


#: ops whose ``value`` argument (third) must be one Python scalar, not a tensor per member
_SCALAR_VALUE = {torch.masked_fill, "masked_fill"}

ELEMENTWISE = register(Elementwise(), functions=_PYTHON + _UNTAGGED + _SPECIAL + _COMPARE + _LOGICAL
                       + list(RANDOM_IN_TRAINING), methods=_METHODS)


# ----------------------------------------------------------------------- ops torch tags pointwise

#: modules of torch's generated bindings of ATen ops, which bear the ops' names (``torch.exp``; ``torch.special.entr``
#: is ``torch._C._special.special_entr``, ``F.gelu`` ``torch._C._nn.gelu``); Tensor methods of ``TensorBase``
#: are bindings too, where ``torch.Tensor`` does not replace them with Python methods (``__rsub__``, ``split``)
_BINDINGS = frozenset(("torch", "torch._C._special", "torch._C._nn", "torch._C._linalg"))
_BOUND_METHODS = frozenset(name for name in vars(torch._C.TensorBase) if name not in vars(torch.Tensor))
#: tagged pointwise, but not grouped as such: ``clone`` makes a copy to write into (two equal ones stay two)
_NOT_RESOLVED = frozenset(("clone",))
_PLAIN_TYPES = (torch.TensorType, torch.NumberType, torch.IntType, torch.FloatType, torch.BoolType, torch.StringType)


def _resolve_pointwise(op: str, target) -> "OpFamily | _PointwiseCalls | None":
    """This family for every call of ``target`` (outside the hand tables) whose ATen overloads taking tensors
    are all tagged ``pointwise`` (``torch.special.entr``, ``h.heaviside(g)``): elementwise with broadcasting,
    one new tensor of the operands' broadcast shape; not random (``nondeterministic_seeded``, as ``rrelu``);
    arguments that are tensors or constants. Where only some are (``torch.max(a, b)``, not ``torch.max(a)``),
    for the calls that bind to those alone (:class:`_PointwiseCalls`). Out= and in-place overloads are not
    looked at: such calls are never members."""
    if op == "call_method":
        name = target if target in _BOUND_METHODS else None
    else:
        name = target.__name__ if type(target) is types.BuiltinFunctionType \
            and getattr(target, "__module__", None) in _BINDINGS else None
    if name is None or name.startswith("_") or name in _NOT_RESOLVED:   # (dunders: not bound by name)
        return None
    packet = getattr(torch.ops.aten, name, None)
    if not isinstance(packet, torch._ops.OpOverloadPacket):
        return None
    overloads = []
    for overload_name in packet.overloads():
        # (getattr, not packet.__getattr__: that makes a new overload object in place of the one the
        # dispatcher may hold on to, and frees the old one)
        overload = getattr(packet, overload_name)
        kind = _overload_kind(overload)
        if kind is not None:
            overloads.append((overload._schema, kind == "pointwise"))
    if not any(pointwise for _, pointwise in overloads):
        return None
    return ELEMENTWISE if all(pointwise for _, pointwise in overloads) else _PointwiseCalls(overloads)


def _overload_kind(overload) -> str | None:
    """``"pointwise"`` for an overload that may be a member, None for one that no tensor call binds to (out= and
    in-place overloads, TorchScript's ops on numbers and lists: ``add.int``), else ``"other"``."""
    schema = overload._schema
    if schema.is_mutable or not any("Tensor" in str(a.type) for a in schema.arguments):
        return None
    tags, returns = overload.tags, schema.returns
    if torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags and len(returns) == 1 \
            and isinstance(returns[0].type, torch.TensorType) and returns[0].alias_info is None \
            and all(isinstance(_optional(a.type), _PLAIN_TYPES) for a in schema.arguments):
        return "pointwise"
    return "other"


def _optional(t):
    return t.getElementType() if isinstance(t, torch.OptionalType) else t


class _PointwiseCalls:
    """The family of the calls of a target that bind only to its pointwise overloads, as Python's argument
    parser binds them (by argument types): ``torch.max(a, b)`` (``max.other``), not ``torch.max(a)`` or
    ``torch.max(a, 0)``. Decided once per form of call (the kinds of its arguments)."""

    def __init__(self, overloads: list):
        self.overloads = overloads   # (schema, pointwise)
        self.forms: dict = {}

    def __call__(self, node: fx.Node) -> "OpFamily | None":
        method = node.op == "call_method"
        form = (method, tuple(map(_kind, node.args)),
                tuple((k, _kind(v)) for k, v in node.kwargs.items() if not (k == "out" and v is None)))
        pointwise = self.forms.get(form)
        if pointwise is None:
            bound = [p for schema, p in self.overloads if _binds(schema, *form)]
            pointwise = self.forms[form] = bool(bound) and all(bound)
        return ELEMENTWISE if pointwise else None


def _kind(value):
    """What argument binding looks at: a tensor, or a plain constant's type."""
    if isinstance(value, fx.Node):
        return "Tensor" if tensor_info(value) is not None else "?"
    return type(value) if value is None or type(value) in (int, float, bool, str) else "?"


def _binds(schema, method: bool, args: tuple, kwargs: tuple) -> bool:
    """Whether a call with arguments of these kinds (see :func:`_kind`) binds to ``schema``."""
    params = schema.arguments
    positional = [p.name for p in params if not p.kwarg_only]
    if len(args) > len(positional):
        return False
    bound = dict(zip(positional, args))
    names = {p.name for p in params}
    for name, kind in kwargs:
        if name == "input" and not method and "input" not in names:
            name = "self"   # functions call their tensor ``input``, ATen ``self``
        if name not in names or name in bound:
            return False
        bound[name] = kind
    return all(_accepts(p.type, bound[p.name]) if p.name in bound else p.has_default_value() for p in params)


#: the Python types that Python's argument parser takes for each type of ATen argument other than a tensor
_ACCEPTED = {torch.NumberType: (int, float, bool), torch.FloatType: (int, float), torch.IntType: (int,),
             torch.BoolType: (bool,), torch.StringType: (str,)}


def _accepts(t, kind) -> bool:
    if isinstance(t, torch.OptionalType):
        return kind is type(None) or _accepts(t.getElementType(), kind)
    if isinstance(t, torch.TensorType):
        return kind == "Tensor"
    return kind in _ACCEPTED.get(type(t), ())


register_resolver(_resolve_pointwise)


def row_wise(node: fx.Node) -> bool:
    """Whether ``node`` calls a function of this family that draws no random numbers: each element of its
    result comes from the same element of each operand (broadcast), so it commutes with reading rows
    (``passes/postpone_gathers.py``, ``passes/absorb_gathers.py``)."""
    return node.op == "call_function" and REGISTRY.family_of(node) is ELEMENTWISE \
        and node.target not in RANDOM_IN_TRAINING
