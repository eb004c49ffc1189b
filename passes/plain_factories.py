"""A tensor's ``new_*`` factories and the ``*_like`` functions become the plain factories:
``x.new_zeros(1, d)`` -> ``torch.zeros((1, d), dtype=x.dtype, device=x.device)``; likewise ``new_ones``,
``new_empty`` and ``new_full`` (which the in-place pass makes of ``x.new(1, d).fill_(0.)``),
``x.new_tensor(data)`` of Python data -> ``torch.tensor(data, dtype=x.dtype, device=x.device)``, and
``torch.zeros_like(x)`` -> ``torch.zeros(x.shape, dtype=x.dtype, device=x.device)`` (``ones_like``,
``empty_like``, ``full_like`` of a Python number).

Legal because ``x`` gives the new tensor only its shape, dtype and device,
which are static, and the call's own ``dtype=`` / ``device=`` still win; the
values and ``requires_grad`` are the factory's own. (A ``*_like`` tensor also
takes ``x``'s strides; the plain factory's are contiguous, with the same
values.) Calls with another layout or memory format are left alone.

What it saves: the call no longer reads ``x``. A per-sample model that makes a
leaf's zero state with ``x.new_zeros`` would otherwise read its whole input
``x``, which ``dynamo_relational.batch`` cannot split into the samples' rows;
one that starts each node's sum with ``torch.zeros_like(h[v])`` would read a
row of one sample per node, ungrouped where no message follows; and the
factory is a constant that moves freely in the schedule.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from dynamo_relational.ops import tensor_info

from .context import PassContext

#: ``new_*`` method -> the factory it calls with the tensor's dtype and device
_PLAIN = {"new_zeros": torch.zeros, "new_ones": torch.ones, "new_empty": torch.empty, "new_full": torch.full,
          "new_tensor": torch.tensor}


#: ``torch.*_like`` function -> the factory it calls with the tensor's shape, dtype and device
_LIKE = {torch.zeros_like: torch.zeros, torch.ones_like: torch.ones, torch.empty_like: torch.empty,
         torch.full_like: torch.full}
#: the ``*_like`` keywords the plain factory takes as they are (others, such as a layout, keep the call)
_LIKE_KWARGS = frozenset(("dtype", "device", "requires_grad"))


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    rewritten = _plain_likes(gm)
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


def _plain_likes(gm: fx.GraphModule) -> int:
    """``torch.zeros_like(x)`` and its kin as plain factories; how many."""
    rewritten = 0
    for like, factory in _LIKE.items():
        for node in list(gm.graph.find_nodes(op="call_function", target=like)):
            x, *fill = node.args
            info = tensor_info(x) if isinstance(x, fx.Node) else None
            kwargs = {k: v for k, v in node.kwargs.items() if v is not None}
            if kwargs.get("memory_format") in (torch.preserve_format, torch.contiguous_format):
                del kwargs["memory_format"]
            if info is None or not set(kwargs) <= _LIKE_KWARGS or len(fill) != (factory is torch.full) \
                    or _reads_nodes(fill):
                continue
            node.target, node.args = factory, (tuple(info.shape), *fill)
            node.kwargs = {"dtype": info.dtype, "device": info.device, **kwargs}
            rewritten += 1
    return rewritten


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
