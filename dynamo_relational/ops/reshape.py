"""Shape and layout ops inside one neuron.

Shape-only ops (view, reshape, unsqueeze, squeeze, flatten): a group is one
reshape of the batched operand to ``[k, *member_shape]``. Layout ops (expand,
repeat, tile, flip, roll, transpose, permute, t, ``.T``, ``.mT``): the same op on the batched
operand with the members' dimensions shifted by one.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

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


#: layout ops -> their argument names (``*sizes`` and ``*dims`` arrive as one tuple or as many ints)
_LAYOUT: dict[Callable[..., Any] | str, tuple[str, ...]] = {
    "expand": ("input", "size"), "expand_as": ("input", "other"), "repeat": ("input", "repeats"),
    torch.tile: ("input", "dims"), "tile": ("input", "dims"), torch.flip: ("input", "dims"),
    "flip": ("input", "dims"), torch.roll: ("input", "shifts", "dims"), "roll": ("input", "shifts", "dims"),
    torch.transpose: ("input", "dim0", "dim1"), "transpose": ("input", "dim0", "dim1"),
    torch.swapaxes: ("input", "axis0", "axis1"), "swapaxes": ("input", "axis0", "axis1"),
    torch.permute: ("input", "dims"), "permute": ("input", "dims"), torch.t: ("input",), "t": ("input",),
    getattr: ("input", "name")}   # h.T, h.mT
_VARIADIC = {"expand", "repeat", "tile", "flip", "permute"}   # methods that also take the ints unpacked


class Layout(OpFamily):
    """Ops that move or copy a neuron's elements (expand, repeat, tile, flip, roll, transpose,
    permute, t, ``.T``, ``.mT``): the same op on the batched ``[k, *shape]`` operand, its dimensions
    shifted by one and the leading ``k`` kept. Each row of the result is its member's own result."""
    name = "layout"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        target = node.target
        op = target if isinstance(target, str) else target.__name__
        if target is getattr:
            attribute = node.args[1] if len(node.args) == 2 else None
            if not isinstance(attribute, str) or attribute not in ("T", "mT"):
                return f"attribute {attribute!r}"
            op = attribute
        args = node.args
        if op in _VARIADIC and isinstance(target, str) and len(args) >= 2 and all(type(a) is int for a in args[1:]):
            args = (args[0], tuple(args[1:]))   # h.repeat(2, 3) is h.repeat((2, 3))
        names = _LAYOUT[target]
        if len(args) > len(names) or set(node.kwargs) - set(names):
            return f"{op} with unexpected arguments"
        named = {**dict(zip(names, args)), **node.kwargs}
        x = named.pop("input", None)
        xi, info = tensor_info(x), tensor_info(node)
        if xi is None or info is None or not isinstance(x, fx.Node):
            return f"{op} of something other than a tensor of static shape"
        plan = _plan(op, named, xi, info)
        if type(plan) is str:
            return plan
        return NeuronOp(node, self, (self.name, plan, xi, info), (x,), info, (), plan)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        x, batched = b.slot([m.operands[0] for m in members])
        if not batched:
            return None
        k, first = len(members), members[0]
        op, *params = first.template
        xi, out = tensor_info(first.operands[0]), first.info
        g = b.graph
        if op == "expand":
            return g.call_method("expand", (b.align(x, xi, out.rank, k), (k, *out.shape)))
        if op == "repeat":
            repeats, = params
            return g.call_method("repeat", (b.align(x, xi, len(repeats), k), (1, *repeats)))
        if op == "flip":
            return g.call_function(torch.flip, (x, [d + 1 for d in params[0]]))
        if op == "roll":
            shifts, dims = params
            if dims is None:   # the member's elements rolled as one flat row
                flat = g.call_method("reshape", (x, (k, -1)))
                return g.call_method("reshape", (g.call_function(torch.roll, (flat, shifts, 1)), (k, *out.shape)))
            return g.call_function(torch.roll, (x, shifts, [d + 1 for d in dims]))
        return g.call_method("permute", (x, (0, *[d + 1 for d in params[0]])))   # transpose, permute, t


def _plan(op: str, named: dict, xi, info) -> tuple | str:
    """The group's recipe for one member: (kind, constant parameters), or why there is none."""
    rank = xi.rank

    def dims_of(value):
        dims = (value,) if type(value) is int else tuple(value) if isinstance(value, (list, tuple)) else None
        if dims is None or not all(type(d) is int and -max(rank, 1) <= d < max(rank, 1) for d in dims):
            return None
        return tuple(d % max(rank, 1) for d in dims)

    if op in ("expand", "expand_as"):
        return ("expand",)
    if op in ("repeat", "tile"):
        repeats = named.get("repeats", named.get("dims"))
        if not isinstance(repeats, (list, tuple)) or not all(type(r) is int and r >= 0 for r in repeats):
            return f"{op} with repeats {repeats!r}"
        repeats = (1,) * (rank - len(repeats)) + tuple(repeats)   # tile pads on the left; repeat needs no pad
        return ("repeat", repeats) if len(repeats) >= rank else f"{op} with fewer repeats than dimensions"
    if rank == 0:
        return f"{op} of a 0-d value"
    if op == "flip":
        dims = dims_of(named.get("dims"))
        return ("flip", dims) if dims is not None else f"flip along {named.get('dims')!r}"
    if op == "roll":
        shifts, dims = named.get("shifts"), named.get("dims")
        if not (type(shifts) is int or isinstance(shifts, (list, tuple)) and all(type(s) is int for s in shifts)):
            return f"roll by {shifts!r}"
        shifts = tuple(shifts) if isinstance(shifts, (list, tuple)) else shifts
        if dims is None or dims == ():
            return ("roll", shifts, None) if isinstance(shifts, int) or len(shifts) == 1 else "roll without dims"
        dims = dims_of(dims)
        return ("roll", shifts, dims) if dims is not None else f"roll along {named.get('dims')!r}"
    if op in ("t", "T"):
        return ("permute", tuple(reversed(range(rank))))
    if op == "mT":
        return ("permute", (*range(rank - 2), rank - 1, rank - 2)) if rank >= 2 else "mT of a value of rank 1"
    if op == "permute":
        dims = dims_of(named.get("dims"))
        return ("permute", dims) if dims is not None and sorted(dims) == list(range(rank)) else "permute of bad dims"
    first, second = (named.get("dim0"), named.get("dim1")) if op == "transpose" else (named.get("axis0"),
                                                                                     named.get("axis1"))
    dims = dims_of((first, second))
    if dims is None:
        return f"{op} of dims {first!r}, {second!r}"
    order = list(range(rank))
    order[dims[0]], order[dims[1]] = order[dims[1]], order[dims[0]]
    return ("permute", tuple(order))


LAYOUT = register(Layout(), functions=[t for t in _LAYOUT if not isinstance(t, str)],
                  methods=[t for t in _LAYOUT if isinstance(t, str)])
