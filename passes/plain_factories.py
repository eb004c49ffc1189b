"""A tensor's ``new_*`` factories become the plain factories: ``x.new_zeros(1, d)`` ->
``torch.zeros((1, d), dtype=x.dtype, device=x.device)``; likewise ``new_ones``, ``new_empty`` and
``new_full`` (which the in-place pass makes of ``x.new(1, d).fill_(0.)``), and ``x.new_tensor(data)`` of
Python data -> ``torch.tensor(data, dtype=x.dtype, device=x.device)``.

Legal because ``x`` gives the new tensor only its dtype and device, which are
static, and the call's own ``dtype=`` / ``device=`` still win; the values and
``requires_grad`` are the factory's own.

What it saves: the call no longer reads ``x``. A per-sample model that makes a
leaf's zero state with ``x.new_zeros`` would otherwise read its whole input
``x``, which ``dynamo_relational.batch`` cannot split into the samples' rows;
and the factory is a constant that moves freely in the schedule.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from dynamo_relational.ops import tensor_info

from .context import PassContext

#: ``new_*`` method -> the factory it calls with the tensor's dtype and device
_PLAIN = {"new_zeros": torch.zeros, "new_ones": torch.ones, "new_empty": torch.empty, "new_full": torch.full,
          "new_tensor": torch.tensor}


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    rewritten = 0
    for node in gm.graph.find_nodes(op="call_method", sort=False):
        factory = _PLAIN.get(node.target) if isinstance(node.target, str) else None
        if factory is None or not node.args or {"size", "fill_value"} & set(node.kwargs):
            continue
        x, *rest = node.args
        info = tensor_info(x)
        if info is None:
            continue
        args = _plain_args(factory, rest, node.kwargs)
        if args is None:
            continue
        node.op, node.target, node.args = "call_function", factory, args
        node.kwargs = {"dtype": info.dtype, "device": info.device, **{k: v for k, v in node.kwargs.items()
                                                                      if v is not None}}
        rewritten += 1
    ctx.stats["plain_factories"] = rewritten
    return gm


def _plain_args(factory, rest: list, kwargs) -> tuple | None:
    """The plain factory's positional arguments for the ``new_*`` call's ``rest``, or None if it has none."""
    if factory is torch.tensor:   # x.new_tensor(data): Python data alone (a tensor's would be read)
        return None if len(rest) != 1 or "data" in kwargs or _reads_nodes(rest[0]) else (rest[0],)
    full = factory is torch.full
    if full and len(rest) != 2:
        return None
    size: tuple | list = rest[:1] if full else rest
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    if not all(type(s) is int for s in size):
        return None
    return (tuple(size), rest[1]) if full else (tuple(size),)


def _reads_nodes(data) -> bool:
    found: list = []
    fx.node.map_arg(data, found.append)
    return bool(found)
