"""Recurrent cells of one neuron: ``nn.GRUCell`` and ``nn.RNNCell`` (``torch.gru_cell``,
``torch.rnn_tanh_cell``, ``torch.rnn_relu_cell``), as in gated graph networks' node updates.

A member's input ``[B, F]`` and state ``[B, H]`` (``B`` is 1 for one neuron's
row) become ``[k * B, F]`` and ``[k * B, H]``: one call of the cell for the
group, with the weights it shares, reshaped back to ``[k, B, H]``. Legal
because a cell computes each row of its batch from that row alone. A state
shared by every member (zeros to start with) is gathered, a copy per member.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.fx as fx

from .base import NeuronOp, OpFamily, register, tensor_info

_CELLS = (torch.gru_cell, torch.rnn_tanh_cell, torch.rnn_relu_cell)


class Cell(OpFamily):
    name = "cell"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        args, target = node.args, node.target
        assert not isinstance(target, str)   # (cells are functions)
        if node.kwargs or len(args) not in (4, 6) or not all(isinstance(a, fx.Node) for a in args):
            return f"{target.__name__} with unexpected arguments"
        infos = [i for i in map(tensor_info, args) if i is not None]
        info = tensor_info(node)
        if info is None or len(infos) != len(args) or infos[0].rank != 2 or infos[1].rank != 2:
            return f"{target.__name__} of something other than [batch, features] tensors"
        return NeuronOp(node, self, (self.name, node.target, tuple(infos), info), tuple(args), info)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        first, k, g = members[0], len(members), b.graph
        xi = tensor_info(first.operands[0])
        assert xi is not None   # (describe checked)
        rows, features = xi.shape
        hidden = first.info.shape[1]
        (x, x_varies), (state, state_varies), *weights = (b.slot([m.operands[j] for m in members])
                                                          for j in range(len(first.operands)))
        if any(varies for _, varies in weights) or not (x_varies or state_varies):
            return None   # the members' own weights, or one cell for every member (merged, not batched)

        def batch_rows(j: int, value, varies: bool, width: int) -> fx.Node:   # [k * rows, width]
            if not varies:   # (a state every member starts from: a row per member, which a batch restricts)
                value = b.gather([m.operands[j] for m in members])
            return g.call_method("reshape", (value, (k * rows, width)))

        out = g.call_function(first.node.target, (batch_rows(0, x, x_varies, features),
                                                  batch_rows(1, state, state_varies, hidden), *(w for w, _ in weights)))
        return g.call_method("reshape", (out, (k, rows, hidden)))


CELL = register(Cell(), functions=list(_CELLS))
