"""Ops along dimensions of one neuron's value: ``softmax``, ``log_softmax``, ``softmin``, ``cumsum``,
``cumprod``, ``logsumexp``, ``logcumsumexp``, ``F.glu``, ``F.normalize``, vector norms, ``std`` and
``var``, ``argmax`` and ``argmin`` along a dim (``att = torch.softmax(scores, 0)``, ``h / h.norm()``,
``torch.stack(messages).std(0)``, a prediction ``scores.argmax(1)``);
``torch.gather`` of a value by an index of its own (``scores.gather(1, label)``);
``F.layer_norm`` / ``F.rms_norm`` over a neuron's trailing dimensions; and comparisons of two values
along a dimension (``F.cosine_similarity``, ``F.pairwise_distance``).

A group applies the op to the batched operand ``[k, *shape]`` along the
members' dimensions shifted by one. Legal because each of these ops treats
the slices along its dimensions independently of every other dimension, so
row ``r`` of the result is member ``r``'s own result. A norm over all
dimensions (``h.norm()``) becomes ``linalg.vector_norm`` over all of a
member's dimensions; ``torch.norm``'s ``"fro"`` is the vector 2-norm there. So does ``std``
or ``var`` without ``dim``; their ``unbiased`` flag becomes the ``correction`` it means.
Layer norms normalize the trailing dimensions, which batching leaves last;
their weight and bias must be shared by the group.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from .base import NeuronOp, OpFamily, hashable_const, node_args, register, tensor_info

#: op -> (the function a group calls, the extra arguments it takes besides input and dim, with defaults)
_OPS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "softmax": (torch.softmax, {"dtype": None}),
    "log_softmax": (torch.log_softmax, {"dtype": None}),
    "softmin": (F.softmin, {"dtype": None}),
    "cumsum": (torch.cumsum, {"dtype": None}),
    "cumprod": (torch.cumprod, {"dtype": None}),
    "logsumexp": (torch.logsumexp, {"keepdim": False}),
    "logcumsumexp": (torch.logcumsumexp, {}),
    "glu": (F.glu, {}),
    "normalize": (F.normalize, {"p": 2.0, "eps": 1e-12}),
    "norm": (torch.linalg.vector_norm, {"ord": 2, "keepdim": False}),
    "std": (torch.std, {"correction": 1, "keepdim": False}),
    "var": (torch.var, {"correction": 1, "keepdim": False}),
    "argmax": (torch.argmax, {"keepdim": False}),
    "argmin": (torch.argmin, {"keepdim": False}),
}
#: ops that reduce over all of a member's dimensions without ``dim``, or over a list of them
_OVER_DIMS = ("norm", "std", "var")
#: the ``dim`` of ops that have a default one
_DEFAULT_DIM = {"normalize": 1, "glu": -1}
#: ops whose ``dim=None`` means torch's legacy implicit choice (``nn.LogSoftmax()``): 0 for a value of
#: rank 0, 1 or 3, else 1 (``torch.nn.functional._get_softmax_dim``)
_IMPLICIT_DIM = ("softmax", "log_softmax", "softmin")
#: target -> (op, the target's argument names; ``input`` is the operand, ``p`` of a norm its ``ord``)
_TARGETS = {
    torch.softmax: ("softmax", ("input", "dim", "dtype")),
    F.softmax: ("softmax", ("input", "dim", "_stacklevel", "dtype")),
    "softmax": ("softmax", ("input", "dim", "dtype")),
    torch.log_softmax: ("log_softmax", ("input", "dim", "dtype")),
    F.log_softmax: ("log_softmax", ("input", "dim", "_stacklevel", "dtype")),
    "log_softmax": ("log_softmax", ("input", "dim", "dtype")),
    F.softmin: ("softmin", ("input", "dim", "_stacklevel", "dtype")),
    F.glu: ("glu", ("input", "dim")),
    torch.logcumsumexp: ("logcumsumexp", ("input", "dim", "out")), "logcumsumexp": ("logcumsumexp", ("input", "dim")),
    torch.cumsum: ("cumsum", ("input", "dim", "dtype", "out")), "cumsum": ("cumsum", ("input", "dim", "dtype")),
    torch.cumprod: ("cumprod", ("input", "dim", "dtype", "out")), "cumprod": ("cumprod", ("input", "dim", "dtype")),
    torch.logsumexp: ("logsumexp", ("input", "dim", "keepdim", "out")),
    "logsumexp": ("logsumexp", ("input", "dim", "keepdim")),
    F.normalize: ("normalize", ("input", "p", "dim", "eps", "out")),
    torch.norm: ("norm", ("input", "p", "dim", "keepdim", "out", "dtype")),
    "norm": ("norm", ("input", "p", "dim", "keepdim", "dtype")),
    torch.linalg.vector_norm: ("norm", ("input", "ord", "dim", "keepdim", "dtype", "out")),
    torch.std: ("std", ("input", "dim", "unbiased", "keepdim", "correction", "out")),
    "std": ("std", ("input", "dim", "unbiased", "keepdim", "correction")),
    torch.var: ("var", ("input", "dim", "unbiased", "keepdim", "correction", "out")),
    "var": ("var", ("input", "dim", "unbiased", "keepdim", "correction")),
    torch.argmax: ("argmax", ("input", "dim", "keepdim", "out")), "argmax": ("argmax", ("input", "dim", "keepdim")),
    torch.argmin: ("argmin", ("input", "dim", "keepdim", "out")), "argmin": ("argmin", ("input", "dim", "keepdim")),
}


class Along(OpFamily):
    name = "along"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        op, names = _TARGETS[node.target]
        args = node_args(node, names)
        if args is None or "input" not in args:
            return f"{op} with unexpected arguments"
        x = args.pop("input")
        xi, info = tensor_info(x), tensor_info(node)
        if xi is None or info is None or not xi.dtype.is_floating_point:
            return f"{op} of something other than a floating tensor of static shape"
        args.pop("_stacklevel", None)
        if args.pop("out", None) is not None:
            return f"{op} with out="
        if op == "norm" and args.get("dtype", 0) is None:
            del args["dtype"]   # the default
        if op == "norm":
            p = args.pop("p", args.pop("ord", "fro" if node.target is not torch.linalg.vector_norm else 2))
            if p == "fro" or p is None:
                p = 2
            if type(p) not in (int, float):
                return f"norm with p={p!r} (only vector norms are grouped)"
            args["ord"] = p
        if op in ("std", "var"):
            if type(args.get("dim")) is bool:   # std(x, True): the overload whose second argument is unbiased
                args["unbiased"] = args.pop("dim")
            unbiased = args.pop("unbiased", None)
            if unbiased is not None:
                if type(unbiased) is not bool or args.get("correction") is not None:
                    return f"{op} with unbiased={unbiased!r}, correction={args.get('correction')!r}"
                args["correction"] = int(unbiased)
            elif args.get("correction", 0) is None:
                del args["correction"]   # the default
        dim = args.pop("dim", _DEFAULT_DIM.get(op))
        dims: int | tuple[int, ...]
        if dim is None and op in _IMPLICIT_DIM:
            dim = 0 if xi.rank in (0, 1, 3) else 1
        if dim is None and op in _OVER_DIMS:
            dims = tuple(range(xi.rank))
        elif type(dim) is int and -max(xi.rank, 1) <= dim < max(xi.rank, 1):
            dims = dim % max(xi.rank, 1)
        elif op in _OVER_DIMS and isinstance(dim, (list, tuple)) and dim and all(type(d) is int for d in dim):
            dims = tuple(sorted(d % max(xi.rank, 1) for d in dim))
        else:
            return f"{op} along dim={dim!r}"
        if xi.rank == 0:
            return f"{op} of a 0-d value"
        extra = dict(_OPS[op][1])
        for key, value in args.items():
            if key not in extra or not hashable_const(value):
                return f"{op} with {key}={value!r}"
            extra[key] = value
        frozen = tuple(sorted(extra.items()))
        return NeuronOp(node, self, (self.name, op, dims, frozen, xi, info), (x,), info, (), (op, dims, extra))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        x, batched = b.slot([m.operands[0] for m in members])
        if not batched:
            return None
        function, kwargs = self.call(members[0].template, 1)
        return b.graph.call_function(function, (x,), kwargs)

    @staticmethod
    def call(template: tuple, shift: int) -> tuple[Callable[..., Any], dict[str, Any]]:
        """The function and keywords of a described op (its ``template``) on a value whose dims are the
        member's shifted by ``shift`` (1 for a group's rows in front)."""
        op, dims, extra = template
        shifted = dims + shift if type(dims) is int else tuple(d + shift for d in dims)
        return _OPS[op][0], {"dim": shifted, **extra}


ALONG = register(Along(), functions=[t for t in _TARGETS if not isinstance(t, str)],
                 methods=[t for t in _TARGETS if isinstance(t, str)])


class TrailingNorm(OpFamily):
    """``F.layer_norm(h, shape, weight, bias, eps)`` and ``F.rms_norm(h, shape, weight, eps)``."""
    name = "trailing_norm"
    _NAMES: dict[Callable[..., Any], tuple[str, ...]] = {
        F.layer_norm: ("input", "normalized_shape", "weight", "bias", "eps"),
        torch.layer_norm: ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"),
        F.rms_norm: ("input", "normalized_shape", "weight", "eps"),
        torch.rms_norm: ("input", "normalized_shape", "weight", "eps")}

    def describe(self, node: fx.Node) -> NeuronOp | str:
        assert not isinstance(node.target, str)   # (norms are functions)
        args = node_args(node, self._NAMES[node.target])
        op = node.target.__name__   # layer_norm or rms_norm
        if args is not None:
            args.pop("cudnn_enable", None)   # (a backend hint)
        if args is None or not isinstance(args.get("input"), fx.Node):
            return f"{op} with unexpected arguments"
        x, shape, eps = args["input"], args.get("normalized_shape"), args.get("eps")
        xi, info = tensor_info(x), tensor_info(node)
        if xi is None or info is None or not xi.dtype.is_floating_point:
            return f"{op} of something other than a floating tensor of static shape"
        if not hashable_const(shape) or not (eps is None or type(eps) is float):
            return f"{op} with normalized_shape={shape!r}, eps={eps!r}"
        affine = (args.get("weight"), args.get("bias"))
        if any(a is not None and tensor_info(a) is None for a in affine):
            return f"{op} with a weight or bias that is not a tensor of static shape"
        key = (self.name, op, tuple(shape) if isinstance(shape, (list, tuple)) else shape, eps, xi, info,
               tuple(tensor_info(a) if a is not None else None for a in affine))
        return NeuronOp(node, self, key, (x, *affine), info, (), (op, shape, eps))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        first = members[0]
        x, batched = b.slot([m.operands[0] for m in members])
        affine: list[fx.Node | None] = []
        for j in (1, 2):
            if first.operands[j] is None:
                affine.append(None)
                continue
            value, varies = b.slot([m.operands[j] for m in members])
            if varies:
                return None   # one weight (or bias) per member: not one layer norm
            affine.append(value)
        if not batched:
            return None
        op, shape, eps = first.template
        if op == "layer_norm":
            return b.graph.call_function(F.layer_norm, (x, shape, *affine, 1e-5 if eps is None else eps))
        return b.graph.call_function(F.rms_norm, (x, shape, affine[0], eps))


TRAILING_NORM = register(TrailingNorm(), functions=list(TrailingNorm._NAMES))


class Similarity(OpFamily):
    """``F.cosine_similarity(a, b, dim, eps)`` and ``F.pairwise_distance(a, b, p, eps, keepdim)`` of two
    values of one shape. Both compare the slices along one dimension (the last for a distance), so
    operands batched along a new first dimension (or one of them shared, broadcast) compare row by row."""
    name = "similarity"
    _NAMES: dict[Callable[..., Any], tuple[str, ...]] = {torch.cosine_similarity: ("x1", "x2", "dim", "eps"),
                                                         torch.pairwise_distance: ("x1", "x2", "p", "eps", "keepdim")}

    def describe(self, node: fx.Node) -> NeuronOp | str:
        assert not isinstance(node.target, str)   # (similarities are functions)
        op = node.target.__name__
        args = node_args(node, self._NAMES[node.target])
        if args is None or not isinstance(args.get("x1"), fx.Node) or not isinstance(args.get("x2"), fx.Node):
            return f"{op} with unexpected arguments"
        x1, x2 = args.pop("x1"), args.pop("x2")
        xi, info = tensor_info(x1), tensor_info(node)
        if xi is None or info is None or tensor_info(x2) is not xi or not xi.dtype.is_floating_point or xi.rank == 0:
            return f"{op} of values other than two floating tensors of one static shape of rank 1 or more"
        if op == "cosine_similarity":
            dim = args.get("dim", 1)
            if type(dim) is not int or not -xi.rank <= dim < xi.rank:
                return f"{op} along dim={dim!r}"
            args["dim"] = dim % xi.rank
        for key, value in args.items():
            if not hashable_const(value):
                return f"{op} with {key}={value!r}"
        template = (op, tuple(sorted(args.items())))
        return NeuronOp(node, self, (self.name, *template, xi, info), (x1, x2), info, (), template)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        x1, batched1 = b.slot([m.operands[0] for m in members])
        x2, batched2 = b.slot([m.operands[1] for m in members])
        if not (batched1 or batched2):
            return None
        op, args = members[0].template
        kwargs = {key: value + 1 if key == "dim" else value for key, value in args}
        return b.graph.call_function(getattr(torch, op), (x1, x2), kwargs)


SIMILARITY = register(Similarity(), functions=list(Similarity._NAMES))


class GatherAlong(OpFamily):
    """``torch.gather(x, dim, index)`` (``x.gather(dim, index)``) within one neuron's value: a label's score
    out of a node's scores (``scores.gather(1, label)``). The group gathers the batched values along the
    members' ``dim`` shifted by one, each row by its own row of the batched indices (an index or a value that
    the group shares is expanded to its rows: gather does not broadcast). Legal because gather reads each
    index's element from the slice of ``x`` at the same position of the other dims, which is the member's
    own row."""
    name = "gather_along"
    _NAMES = ("input", "dim", "index", "sparse_grad", "out")

    def describe(self, node: fx.Node) -> NeuronOp | str:
        args = node_args(node, self._NAMES)
        if args is None or not isinstance(args.get("input"), fx.Node) or not isinstance(args.get("index"), fx.Node) \
                or args.get("sparse_grad", False) is not False or args.get("out") is not None:
            return "gather with unexpected arguments"
        x, dim, index = args["input"], args.get("dim"), args["index"]
        xi, ii, info = tensor_info(x), tensor_info(index), tensor_info(node)
        if xi is None or ii is None or info is None or xi.rank == 0 or ii.rank != xi.rank or ii.dtype != torch.int64:
            return "gather of something other than values and int64 indices of one static rank"
        if type(dim) is not int or not -xi.rank <= dim < xi.rank:
            return f"gather along dim={dim!r}"
        return NeuronOp(node, self, (self.name, dim % xi.rank, xi, ii), (x, index), info, (), dim % xi.rank)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        (x, x_varies), (index, index_varies) = (b.slot([m.operands[j] for m in members]) for j in (0, 1))
        if not (x_varies or index_varies):
            return None   # one gather for every member: it is merged, not batched
        x, index = (value if varies else b.gather([m.operands[j] for m in members])
                    for j, (value, varies) in enumerate(((x, x_varies), (index, index_varies))))
        return b.graph.call_function(torch.gather, (x, members[0].template + 1, index))


GATHER_ALONG = register(GatherAlong(), functions=[torch.gather], methods=["gather"])


#: ops that return (values, indices) along a dimension -> their argument names (method and function alike)
PAIR_OPS = {"max": ("input", "dim", "keepdim", "out"), "min": ("input", "dim", "keepdim", "out"),
            "sort": ("input", "dim", "descending", "stable", "out")}


def values_or_indices(input: torch.Tensor, op: str, part: int, **kwargs) -> torch.Tensor:
    """Part ``part`` (0: the values, 1: the indices) of ``torch.<op>(input, **kwargs)``: one part of
    ``max``/``min`` along a dimension or a stable ``sort`` as an op of its own
    (``passes/values_indices.py``)."""
    return getattr(torch, op)(input, **kwargs)[part]


class ValuesOrIndices(OpFamily):
    """:func:`values_or_indices`: the op along the members' dimension shifted by one."""
    name = "values_or_indices"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        x, op, part = node.args
        xi, info = tensor_info(x), tensor_info(node)
        if xi is None or info is None or xi.rank == 0:
            return f"{op} of something other than a tensor of static shape and rank 1 or more"
        kwargs = dict(node.kwargs)
        dim = kwargs.pop("dim", -1)
        if type(dim) is not int or not -xi.rank <= dim < xi.rank:
            return f"{op} along dim={dim!r}"
        frozen = tuple(sorted(kwargs.items()))
        return NeuronOp(node, self, (self.name, op, part, dim % xi.rank, frozen, xi, info), (x,), info, (),
                        (op, part, dim % xi.rank, kwargs))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        x, batched = b.slot([m.operands[0] for m in members])
        if not batched:
            return None
        op, part, dim, kwargs = members[0].template
        return b.graph.call_function(values_or_indices, (x, op, part), {**kwargs, "dim": dim + 1})


VALUES_OR_INDICES = register(ValuesOrIndices(), functions=[values_or_indices])
