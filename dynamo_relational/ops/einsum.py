"""``torch.einsum`` inside one neuron (``torch.einsum("i,ijk,k->j", x, B, y)``): the group is one einsum
whose batched operands and output carry one more subscript, a label the equation does not use.

Legal because that label only indexes the members: every member's contraction is computed exactly as
before, and operands shared by the group (the weights) have no such label, so they are read by every
member. Only equations with an explicit output (``->``) are grouped.
"""
from __future__ import annotations

import string
from typing import Sequence

import torch
import torch.fx as fx

from .base import NeuronOp, OpFamily, register, tensor_info


class Einsum(OpFamily):
    name = "einsum"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        if node.kwargs or not node.args or type(node.args[0]) is not str:
            return "einsum with unexpected arguments"
        equation = node.args[0].replace(" ", "")
        operands = node.args[1:]
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        infos, info = [tensor_info(o) for o in operands], tensor_info(node)
        if "->" not in equation or equation.count(",") != len(operands) - 1:
            return f"einsum {equation!r} without an explicit output"
        if info is None or not operands or any(i is None for i in infos):
            return "einsum of something other than tensors of static shape"
        return NeuronOp(node, self, (self.name, equation, tuple(infos), info), tuple(operands), info, (), equation)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        equation = members[0].template
        slots = [b.slot([m.operands[j] for m in members]) for j in range(len(members[0].operands))]
        if not any(batched for _, batched in slots):
            return None   # the same contraction for every member: it is merged, not batched
        label = next(c for c in string.ascii_letters if c not in equation)
        inputs, output = equation.split("->")
        subscripts = [label + s if batched else s for s, (_, batched) in zip(inputs.split(","), slots)]
        batched_equation = ",".join(subscripts) + "->" + label + output
        return b.graph.call_function(torch.einsum, (batched_equation, *(value for value, _ in slots)))


EINSUM = register(Einsum(), functions=[torch.einsum])
