"""Matrix products of one neuron: ``W @ h``, ``h @ W``, ``torch.dot``, ``F.linear``, ``torch.outer``,
``F.bilinear``.

A weight shared by every member stays one operand: the group becomes a single
``mm``/``linear`` over the stacked rows. Per-member weights with a few
distinct values (``W[type] @ h``, one ``nn.Linear`` per type; at most
``max_typed_groups``) become one ``linear`` per weight over that weight's rows;
beyond that, the weights are gathered into ``[k, out, in]`` and multiplied
with a batched matmul.
Supported member ranks: vector/matrix combinations up to 2-D, and products of
batches of matrices (``c @ V @ c.T`` by a ``[d, n, n]`` tensor, as a neural
tensor layer writes it), which broadcast as ``matmul`` does: a member's
operands get the group's dim in front of their batch dims, where a shared
operand's batch dims, fewer than the result's, broadcast over it. An outer
product of vectors becomes a broadcast product of the batched vectors.
"""
from __future__ import annotations

import operator
from typing import Any, NamedTuple, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from .base import NeuronOp, OpFamily, node_args, register, tensor_info


def _rank(node) -> int:
    """The rank of a described operand (-1 where it has no static shape)."""
    info = tensor_info(node)
    return info.rank if info is not None else -1


def _same_dtype(*infos) -> bool:
    return len({i.dtype for i in infos if i is not None}) == 1


class Matmul(OpFamily):
    name = "matmul"
    fresh = True

    def describe(self, node: fx.Node) -> NeuronOp | str:
        if len(node.args) != 2 or node.kwargs:
            return "matmul with extra arguments"
        a, b = node.args
        ai, bi, info = tensor_info(a), tensor_info(b), tensor_info(node)
        if ai is None or bi is None or info is None:
            return "matmul operand is not a tensor of static shape"
        if not (1 <= ai.rank <= 2 and 1 <= bi.rank <= 2 or ai.rank >= 2 and bi.rank >= 2):
            return f"matmul of ranks {ai.rank} and {bi.rank} (a vector beside a batch of matrices is not grouped)"
        if ai.dtype != bi.dtype:
            return "matmul of mixed dtypes"
        return NeuronOp(node, self, (self.name, ai, bi), (a, b), info)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        g = b.graph
        (a, ba), (v, bv) = (b.slot([m.operands[j] for m in members]) for j in (0, 1))
        ra, rv = (_rank(members[0].operands[j]) for j in (0, 1))
        if max(ra, rv) >= 3:   # batches of matrices: the group's dim before each member's batch dims
            if not (ba or bv):
                return None   # one product for every member: it is merged, not batched
            rank, k = members[0].info.rank, len(members)
            a, v = (b.align(value, tensor_info(members[0].operands[j]), rank, k) if varies else value
                    for j, (value, varies) in enumerate(((a, ba), (v, bv))))
            return g.call_function(torch.matmul, (a, v))
        if ra == 1 and rv == 1:
            if ba and bv:
                return g.call_method("sum", (g.call_function(torch.mul, (a, v)), -1))
            return g.call_function(torch.matmul, (a, v) if ba else (v, a))
        if ra == 2 and rv == 1:
            if not ba:  # shared weight: one mm over all rows
                return g.call_function(F.linear, (v, a))
            typed = b.typed_rows([m.operands[0] for m in members], lambda weight, rows: g.call_function(
                F.linear, (b.gather([members[i].operands[1] for i in rows]), b.value(weight))), members[0].info)
            if typed is not None:  # a few weights (W[type] @ h): one mm per weight
                return typed
            if bv:
                return g.call_method("squeeze", (g.call_function(
                    torch.matmul, (a, g.call_method("unsqueeze", (v, -1)))), -1))
            return g.call_function(torch.matmul, (a, v))
        if ra == 1 and rv == 2 and ba and bv:
            return g.call_method("squeeze", (g.call_function(
                torch.matmul, (g.call_method("unsqueeze", (a, 1)), v)), 1))
        return g.call_function(torch.matmul, (a, v))


class Linear(OpFamily):
    name = "linear"
    fresh = True

    def describe(self, node: fx.Node) -> NeuronOp | str:
        args = node_args(node, ("input", "weight", "bias"))
        if args is None or "weight" not in args:
            return "linear with unexpected arguments"
        x, w, bias = args["input"], args["weight"], args.get("bias")
        xi, wi, info = tensor_info(x), tensor_info(w), tensor_info(node)
        bi = tensor_info(bias)
        if xi is None or wi is None or info is None or (bias is not None and bi is None):
            return "linear operand is not a tensor of static shape"
        if not (1 <= xi.rank <= 2 and wi.rank == 2 and (bi is None or bi.rank == 1)):
            return "linear of ranks other than vector/matrix input, matrix weight, vector bias"
        if not _same_dtype(xi, wi, bi):
            return "linear of mixed dtypes"
        return NeuronOp(node, self, (self.name, xi, wi, bi), (x, w, bias), info)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        g, k, info = b.graph, len(members), members[0].info
        (x, bx), (w, bw) = (b.slot([m.operands[j] for m in members]) for j in (0, 1))
        x_rank = _rank(members[0].operands[0])
        has_bias = members[0].operands[2] is not None
        bias, bb = b.slot([m.operands[2] for m in members]) if has_bias else (None, False)
        if not bw:
            if not bb:
                return g.call_function(F.linear, (x, w, bias))
            out = g.call_function(F.linear, (x, w))
        elif x_rank == 1 and (typed := b.typed_rows(
                [(m.operands[1], m.operands[2]) for m in members],
                lambda key, rows: g.call_function(F.linear, (b.gather([members[i].operands[0] for i in rows]),
                                                             b.value(key[0]), b.value(key[1]))),
                info)) is not None:  # a few (weight, bias) pairs, e.g. one nn.Linear per type
            return typed
        elif x_rank == 1 and bx:
            out = g.call_method("squeeze", (g.call_function(
                torch.matmul, (w, g.call_method("unsqueeze", (x, -1)))), -1))
        elif x_rank == 1:
            out = g.call_function(torch.matmul, (w, x))
        else:
            out = g.call_function(torch.matmul, (x, g.call_method("transpose", (w, -1, -2))))
        if not has_bias:
            return out
        if bb:
            bias = b.align(bias, tensor_info(members[0].operands[2]), info.rank, k)
        return g.call_function(operator.add, (out, bias))


class Outer(OpFamily):
    """``torch.outer(a, b)`` of vectors: ``a[:, None] * b[None, :]`` row by row, the same products."""
    name = "outer"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        if len(node.args) != 2 or node.kwargs:
            return "outer with extra arguments"
        a, b = node.args
        ai, bi, info = tensor_info(a), tensor_info(b), tensor_info(node)
        if ai is None or bi is None or info is None or ai.rank != 1 or bi.rank != 1 or ai.dtype != bi.dtype:
            return "outer of something other than two vectors of one dtype"
        return NeuronOp(node, self, (self.name, ai, bi, info), (a, b), info)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        (left, batched_left), (right, batched_right) = (b.slot([m.operands[j] for m in members]) for j in (0, 1))
        if not (batched_left or batched_right):
            return None   # one product for every member: it is merged, not batched
        g = b.graph
        return g.call_function(torch.mul, (g.call_method("unsqueeze", (left, -1)),
                                           g.call_method("unsqueeze", (right, -2))))


class Bilinear(OpFamily):
    """``F.bilinear(a, b, W, bias)`` (``nn.Bilinear``; a neural tensor network's score of two neurons) with one
    weight and bias for the group: the same call on the batched inputs, which it takes row by row. An input
    shared by the group is expanded to the group's rows (bilinear does not broadcast)."""
    name = "bilinear"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        args = node_args(node, ("input1", "input2", "weight", "bias"))
        if args is None or any(not isinstance(args.get(n), fx.Node) for n in ("input1", "input2", "weight")):
            return "bilinear with unexpected arguments"
        x1, x2, w, bias = args["input1"], args["input2"], args["weight"], args.get("bias")
        infos = [tensor_info(v) for v in (x1, x2, w)]
        bi, info = tensor_info(bias), tensor_info(node)
        if None in infos or info is None or (bias is not None and bi is None):
            return "bilinear operand is not a tensor of static shape"
        if _rank(x1) != 1 or _rank(x2) != 1 or not _same_dtype(*infos, bi):
            return "bilinear of something other than two vectors of one dtype"
        return NeuronOp(node, self, (self.name, *infos, bi), (x1, x2, w, bias), info)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        first, k = members[0], len(members)
        (weight, per_member_weight), (bias, per_member_bias) = (
            b.slot([m.operands[j] for m in members]) if first.operands[j] is not None else (None, False)
            for j in (2, 3))
        (x1, batched1), (x2, batched2) = (b.slot([m.operands[j] for m in members]) for j in (0, 1))
        if per_member_weight or per_member_bias or not (batched1 or batched2):
            return None   # a weight (or bias) per member is no one bilinear map; one product is merged, not batched

        def rows(value, batched):
            return value if batched else b.graph.call_method("expand", (value, k, -1))
        return b.graph.call_function(F.bilinear, (rows(x1, batched1), rows(x2, batched2), weight, bias))


MATMUL = register(Matmul(), functions=[operator.matmul, torch.matmul, torch.mm, torch.mv, torch.dot],
                  methods=["matmul", "mm", "mv", "dot", "__matmul__"])
LINEAR = register(Linear(), functions=[F.linear])
OUTER = register(Outer(), functions=[torch.outer, torch.ger], methods=["outer", "ger"])
BILINEAR = register(Bilinear(), functions=[F.bilinear])


# ---------------------------------------------------------------- the operands of products, as the passes read them
#: ``linear(input, weight, bias=None)``'s parameters: Dynamo records an absent bias as ``bias=None``
_PARAMETERS = ("input", "weight", "bias")


class LinearArgs(NamedTuple):
    """The operands of one ``linear``: ``x @ weight.T + bias``."""
    x: Any
    weight: Any
    #: None where the linear adds no bias
    bias: Any

    def on_rows(self) -> bool:
        """``x`` and the weight are 2-D tensors: rows times a matrix, the form the passes rewrite."""
        x, weight = tensor_info(self.x), tensor_info(self.weight)
        return x is not None and weight is not None and x.rank == 2 and weight.rank == 2


def linear_args(node: Any) -> LinearArgs | None:
    """The operands of ``node`` if it is a call of ``F.linear``, else None (also where its
    arguments are not ones ``F.linear`` accepts: an unknown keyword, one given twice, a missing one)."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is F.linear) \
            or len(node.args) > len(_PARAMETERS):
        return None
    bound = dict(zip(_PARAMETERS, node.args))
    for name, value in node.kwargs.items():
        if name not in _PARAMETERS or name in bound:
            return None
        bound[name] = value
    if "input" not in bound or "weight" not in bound:
        return None
    return LinearArgs(bound["input"], bound["weight"], bound.get("bias"))


#: two-operand matrix products (``mm``, ``bmm``, ``matmul``, ``@``), as functions and as methods
_PRODUCTS = frozenset((torch.mm, torch.bmm, torch.matmul, operator.matmul, "mm", "bmm", "matmul", "__matmul__"))
#: and those of a sparse matrix by a dense one
_SPARSE_PRODUCTS = frozenset((torch.spmm, torch.sparse.mm))


def product_operands(node: Any, sparse: bool = False) -> tuple[Any, Any] | None:
    """``(a, b)`` of a call ``a @ b`` (``mm``, ``bmm``, ``matmul``, as a function or a method; with ``sparse``,
    also ``torch.spmm`` / ``torch.sparse.mm`` of a sparse ``a``) recorded without keywords, else None."""
    if not isinstance(node, fx.Node) or node.op not in ("call_function", "call_method") or node.kwargs \
            or len(node.args) != 2:
        return None
    return (node.args[0], node.args[1]) if is_product(node.target, sparse) else None


def is_product(target: Any, sparse: bool = False) -> bool:
    """Whether calls of ``target`` (a function or a method's name) are two-operand matrix products (with
    ``sparse``, also those of a sparse first operand)."""
    try:
        return target in _PRODUCTS or sparse and target in _SPARSE_PRODUCTS
    except TypeError:   # unhashable target
        return False
