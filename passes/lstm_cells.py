"""LSTM cells become their gate arithmetic: ``torch.lstm_cell`` (``nn.LSTMCell``) -> linears and gates.

Rewrites ``hy, cy = torch.lstm_cell(x, (hx, cx), w_ih, w_hh, b_ih, b_hh)``,
where only ``hy`` and ``cy`` are read, into the ops ATen's CPU kernel runs::

    gates = F.linear(hx, w_hh, b_hh) + F.linear(x, w_ih, b_ih)
    i, f, g, o = sigmoid(gates[:, :H]), sigmoid(gates[:, H:2H]), tanh(gates[:, 2H:3H]), sigmoid(gates[:, 3H:])
    cy = f * cx + i * g
    hy = o * tanh(cy)

Legal because that is the cell's definition (the same formula, the same
order of additions). What it saves: the cell returns a tuple, which grouping
cannot batch, so every cell ran on its own; its ops group like any other.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import TensorInfo, tensor_info

from .context import PassContext


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    graph = gm.graph
    cells = graph.find_nodes(op="call_function", target=torch.lstm_cell)   # in order: states come first
    for cell in cells:
        _unpack_state(graph, cell)
    rewritten = 0
    for cell in cells:
        parts = _parts(cell)
        if parts is None:
            continue
        with graph.inserting_before(cell):
            hy, cy = _gate_arithmetic(graph, cell, *parts)
        for user in list(cell.users):
            user.replace_all_uses_with(hy if user.args[1] == 0 else cy)
            graph.erase_node(user)
        graph.erase_node(cell)
        rewritten += 1
    ctx.stats["lstm_cells"] = rewritten
    return gm


def _unpack_state(graph: fx.Graph, cell: fx.Node) -> None:
    """``lstm_cell(x, previous, ...)`` with the whole output of another cell as its state: read its two
    parts instead (``previous[0]``, ``previous[1]``), as a cell whose outputs alone are read."""
    state = cell.args[1] if len(cell.args) > 1 else None
    if not (isinstance(state, fx.Node) and state.target is torch.lstm_cell and len(state.args) in (4, 6)):
        return
    x, w_hh = tensor_info(state.args[0]), tensor_info(state.args[3])
    if x is None or w_hh is None or x.rank != 2:
        return
    parts = []
    with graph.inserting_before(cell):
        for j in (0, 1):
            part = graph.call_function(operator.getitem, (state, j))
            part.meta["rel_info"] = TensorInfo((x.shape[0], w_hh.shape[1]), x.dtype, x.device)
            parts.append(part)
    cell.args = (cell.args[0], tuple(parts), *cell.args[2:])


def _parts(cell: fx.Node):
    """(x, hx, cx, w_ih, w_hh, b_ih, b_hh, hidden) of a cell whose two outputs alone are read, else None."""
    if cell.kwargs or len(cell.args) not in (4, 6):
        return None
    x, state, *weights = cell.args
    if not (isinstance(state, (list, tuple)) and len(state) == 2):
        return None
    hx, cx = state
    if len(weights) == 2:
        weights += [None, None]
    nodes = [x, hx, cx, *weights]
    infos = [tensor_info(n) for n in nodes if n is not None]
    if not all(isinstance(n, fx.Node) for n in nodes if n is not None) or None in infos \
            or tensor_info(x).rank != 2 or tensor_info(hx).rank != 2:
        return None
    if not all(u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1) and not u.kwargs
               for u in cell.users):
        return None
    return (*nodes, tensor_info(hx).shape[1])


def _gate_arithmetic(graph: fx.Graph, cell: fx.Node, x, hx, cx, w_ih, w_hh, b_ih, b_hh, hidden: int):
    rows, like = tensor_info(hx).shape[0], tensor_info(hx)
    trace = cell.meta.get("stack_trace")

    def call(target, args, width):
        node = graph.call_function(target, args)
        node.meta["rel_info"] = TensorInfo((rows, width), like.dtype, like.device)
        if trace is not None:
            node.meta["stack_trace"] = trace   # the cell's source line: a grouping hint, as for the cell
        return node

    gates = call(operator.add, (call(F.linear, (hx, w_hh, b_hh), 4 * hidden),
                                call(F.linear, (x, w_ih, b_ih), 4 * hidden)), 4 * hidden)
    i, f, g, o = (call(operator.getitem, (gates, (slice(None), slice(j * hidden, (j + 1) * hidden))), hidden)
                  for j in range(4))
    i, f, o = (call(torch.sigmoid, (gate,), hidden) for gate in (i, f, o))
    g = call(torch.tanh, (g,), hidden)
    cy = call(operator.add, (call(operator.mul, (f, cx), hidden), call(operator.mul, (i, g), hidden)), hidden)
    hy = call(operator.mul, (o, call(torch.tanh, (cy,), hidden)), hidden)
    return hy, cy
