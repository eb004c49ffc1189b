"""Reductions inside one neuron (``(a * b).sum()``, ``h.mean(0)``, ``torch.stack(body).prod(0)``): the
group reduces the same dimensions shifted by one, keeping the member dimension."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import torch
import torch.fx as fx

from .base import NeuronOp, OpFamily, TensorInfo, node_args, register, tensor_info

_NAMES: dict[Callable[..., Any], str] = {torch.sum: "sum", torch.mean: "mean", torch.amax: "amax", torch.amin: "amin",
                                         torch.prod: "prod"}
#: the reduction each target makes, by function or method name (``torch.sum``, ``h.sum``: ``"sum"``)
REDUCTION_OF: dict[Callable[..., Any] | str, str] = {target: name for target, name in _NAMES.items()}
REDUCTION_OF.update({name: name for name in _NAMES.values()})


class Reduce(OpFamily):
    name = "reduce"
    fresh = True

    def describe(self, node: fx.Node) -> NeuronOp | str:
        r = reduced(node)
        if isinstance(r, str):
            return r
        info = tensor_info(node)
        assert info is not None   # (reduced checked)
        return NeuronOp(node, self, (self.name, r.name, r.dims, r.keepdim, r.info, info), (r.input,), info, (),
                        (r.name, r.dims, r.keepdim))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        x, batched = b.slot([m.operands[0] for m in members])
        name, dims, keepdim = members[0].template
        if not batched:
            return None
        xi = tensor_info(members[0].operands[0])
        assert xi is not None   # (describe checked)
        if xi.rank == 0:
            return x  # reducing a 0-d value is the identity
        shifted = tuple(d + 1 for d in dims)
        if name != "prod":
            return b.graph.call_method(name, (x, shifted, keepdim))
        if len(shifted) == 1:
            return b.graph.call_method("prod", (x, shifted[0], keepdim))
        # prod takes one dim; several are all of a member's (``h.prod()``, which has no keepdim): flatten them
        return b.graph.call_method("prod", (b.graph.call_method("flatten", (x, 1)), 1))


class Reduced(NamedTuple):
    """What a call of :class:`Reduce` reduces."""
    input: fx.Node
    #: the input's
    info: TensorInfo
    #: ``"sum"``, ``"mean"``, ``"amax"``, ``"amin"`` or ``"prod"``
    name: str
    #: the dims reduced, each in ``[0, rank)``, sorted
    dims: tuple[int, ...]
    keepdim: bool


def reduced(node: fx.Node) -> Reduced | str:
    """The arguments of ``node``, a call of this family, read and normalized; or why it is not a reduction of
    a floating tensor of static shape over constant dims."""
    args = node_args(node, ("input", "dim", "keepdim"))
    if args is None:
        return "reduction with unexpected arguments"
    x, xi, info = args.get("input"), tensor_info(args.get("input")), tensor_info(node)
    if xi is None or info is None or not xi.dtype.is_floating_point or not isinstance(x, fx.Node):
        return "reduction of something other than a floating tensor of static shape"
    dim, keepdim = args.get("dim"), args.get("keepdim", False)
    if type(keepdim) is not bool:
        return "reduction with non-constant keepdim"
    if dim is None or dim == [] or dim == ():
        dims = tuple(range(xi.rank))
    else:
        given = dim if isinstance(dim, (list, tuple)) else (dim,)
        if not all(type(d) is int for d in given):
            return "reduction over non-constant dims"
        dims = tuple(sorted(d % max(xi.rank, 1) for d in given))
    name = node.target if isinstance(node.target, str) else _NAMES[node.target]
    return Reduced(x, xi, name, dims, keepdim)


REDUCE = register(Reduce(), functions=list(_NAMES), methods=list(_NAMES.values()))
