"""Shape-only ops inside one neuron (view, reshape, unsqueeze, squeeze, flatten):
a group is one reshape of the batched operand to ``[k, *member_shape]``."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.fx as fx

from .base import NeuronOp, OpFamily, register, tensor_info


class Reshape(OpFamily):
    name = "reshape"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        x = node.args[0] if node.args else None
        xi, info = tensor_info(x), tensor_info(node)
        if xi is None or info is None or xi.numel != info.numel or xi.dtype != info.dtype:
            return "reshape of something other than a tensor of static shape"
        return NeuronOp(node, self, (self.name, xi, info), (x,), info)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        x, batched = b.slot([m.operands[0] for m in members])
        if not batched:
            return None
        return b.graph.call_method("reshape", (x, (len(members), *members[0].info.shape)))


RESHAPE = register(Reshape(), functions=[torch.reshape, torch.unsqueeze, torch.squeeze, torch.flatten],
                   methods=["view", "reshape", "unsqueeze", "squeeze", "flatten"])
