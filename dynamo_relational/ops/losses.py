"""Losses of one neuron: a node's ``F.cross_entropy(scores, label)`` (or ``nll_loss``), and the elementwise
losses ``mse_loss``, ``l1_loss``, ``smooth_l1_loss`` and ``binary_cross_entropy_with_logits`` of a node's
output and its target, as per-node code computes a loss at every node of a tree.

A group computes every member's loss at once with ``reduction="none"``: a
loss per row (class losses: ``[k, C]`` scores and ``k`` labels) or per
element (elementwise losses, then their mean or sum over each member's
elements). A member's ``"mean"`` over one row of scores is that row's loss:
divided by whether its label counts (``label != ignore_index``), a label
that eager ignores gives its ``0 / 0`` too. Legal because these losses
compute each row (each element) from that row alone; class weights and
``pos_weight`` are left as they are (their mean would divide by the weight).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from .base import NeuronOp, OpFamily, node_args, register, tensor_info

#: class losses (scores and a label, or class probabilities, per row) -> their arguments' names
_CLASS: dict[Any, tuple[str, ...]] = {
    F.cross_entropy: ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                      "label_smoothing"),
    F.nll_loss: ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction"),
}
#: elementwise losses of an input and a target of its shape -> their arguments' names
_ELEMENTWISE: dict[Any, tuple[str, ...]] = {
    F.mse_loss: ("input", "target", "size_average", "reduce", "reduction", "weight"),
    F.l1_loss: ("input", "target", "size_average", "reduce", "reduction", "weight"),
    F.smooth_l1_loss: ("input", "target", "size_average", "reduce", "reduction", "beta"),
    F.binary_cross_entropy_with_logits: ("input", "target", "weight", "size_average", "reduce", "reduction",
                                         "pos_weight"),
}
#: the options a group passes on as they are (part of its key: the same for every member)
_PASSED = ("ignore_index", "label_smoothing", "beta")


class LossCall(NamedTuple):
    """A loss call's arguments, read and checked."""
    input: fx.Node
    target: fx.Node
    #: ``"mean"``, ``"sum"`` or ``"none"``
    reduction: str
    #: the options of :data:`_PASSED` given, as (name, value)
    passed: tuple
    #: a class loss (scores and labels), not an elementwise one
    classes: bool


def loss_call(node: fx.Node) -> LossCall | str:
    """The arguments of ``node``, a call of this family, or why a group cannot compute it row by row (class
    weights, options that are not constants)."""
    target = node.target
    names = _CLASS.get(target) or _ELEMENTWISE.get(target)
    args = node_args(node, names) if names is not None else None
    if args is None:
        return "a loss with unexpected arguments"
    x, y = args.get("input"), args.get("target")
    if not isinstance(x, fx.Node) or not isinstance(y, fx.Node):
        return "a loss of values that are not tensors"
    if any(args.get(name) is not None for name in ("weight", "pos_weight", "size_average", "reduce")):
        return "a loss with class weights (its mean divides by them) or deprecated options"
    reduction = args.get("reduction", "mean")
    passed = tuple((name, args[name]) for name in _PASSED if name in args)
    if reduction not in ("mean", "sum", "none") or not all(type(v) in (int, float) for _, v in passed):
        return "a loss with options that are not constants"
    return LossCall(x, y, reduction, passed, target in _CLASS)


class Loss(OpFamily):
    name = "loss"
    fresh = True

    def describe(self, node: fx.Node) -> NeuronOp | str:
        call = loss_call(node)
        if isinstance(call, str):
            return call
        x, y, reduction, passed, _ = call
        xi, yi, info = tensor_info(x), tensor_info(y), tensor_info(node)
        if xi is None or yi is None or info is None:
            return "a loss of values that are not tensors"
        target = node.target
        if target in _CLASS:
            labels = not yi.dtype.is_floating_point
            one_row = (xi.rank == 1 and yi.rank == (0 if labels else 1)) or \
                (xi.rank == 2 and xi.shape[0] == 1 and yi.shape == ((1,) if labels else xi.shape))
            if not one_row or not labels and yi.shape != xi.shape:
                return "a class loss of more than one row of scores"
        elif xi.shape != yi.shape:
            return "an elementwise loss of an input and a target of other shapes"
        key = (self.name, target, xi, yi, reduction, passed, info)
        return NeuronOp(node, self, key, (x, y), info, (), (reduction, passed))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        first, k, g = members[0], len(members), b.graph
        inputs, targets = ([m.operands[j] for m in members] for j in range(2))
        (x, x_varies), (y, y_varies) = b.slot(inputs), b.slot(targets)
        if not (x_varies or y_varies):
            return None   # (a loss of shared values: one value for every member, merged, not batched)
        xi, yi = tensor_info(first.operands[0]), tensor_info(first.operands[1])
        assert xi is not None and yi is not None   # (describe checked)
        shared_target = None if y_varies else y
        # a value that every member reads (a label or target they share): gathered, a row per member
        x, y = (x if x_varies else b.gather(inputs)), (y if y_varies else b.gather(targets))
        reduction, passed = first.template
        target = first.node.target
        if target in _CLASS:
            scores = g.call_method("reshape", (x, (k, xi.shape[-1])))
            labels = g.call_method("reshape", (y, (k, *yi.shape[-1:]) if yi.dtype.is_floating_point else (k,)))
            loss = g.call_function(target, (scores, labels), {**dict(passed), "reduction": "none"})
            if reduction == "mean" and not yi.dtype.is_floating_point:   # over the one row, if its label counts
                counted = g.call_function(torch.ne, (labels if shared_target is None else shared_target,
                                                     dict(passed).get("ignore_index", -100)))
                loss = g.call_function(torch.div, (loss, g.call_method("to", (counted, first.info.dtype))))
        else:
            loss = g.call_function(target, (x, y), {**dict(passed), "reduction": "none"})
            if reduction != "none" and xi.rank:
                loss = g.call_function(torch.mean if reduction == "mean" else torch.sum,
                                       (loss, tuple(range(1, xi.rank + 1))))
        return g.call_method("reshape", (loss, (k, *first.info.shape)))

    @staticmethod
    def per_row(node: fx.Node) -> bool:
        """Whether ``node`` (a call of this family) computes each row of its result from that row of its
        operands alone: a loss without reduction and without weights."""
        call = loss_call(node)
        return not isinstance(call, str) and call.reduction == "none"


LOSS = Loss()
register(LOSS, functions=[*_CLASS, *_ELEMENTWISE])
