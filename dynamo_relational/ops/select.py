"""Row and scalar reads ``x[i]``, ``x[i, j]``: a group becomes one gather.

Members must read the same tensor with the same number of integer indices
(trailing full slices ``x[i, :]`` are allowed); the indices themselves differ
per member and become a constant index tensor: ``index_select(x, 0, idx)``
for one index, advanced indexing ``x[idx0, idx1]`` for more.
"""
from __future__ import annotations

import operator
from typing import Sequence

import torch.fx as fx

from .base import NeuronOp, OpFamily, register, tensor_info

_FULL = slice(None, None, None)


class Select(OpFamily):
    name = "select"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        source, index = node.args
        src, info = tensor_info(source), tensor_info(node)
        if src is None or info is None:
            return "indexes something other than a tensor of static shape"
        if type(index) is int:   # x[i], the common case: what the general code below does for one int
            if src.rank < 1:
                return f"index {index!r} is not integers followed by full slices"
            size = src.shape[0]
            if not -size <= index < size:
                return f"index {index} out of range for dimension 0 of size {size}"
            return NeuronOp(node, self, (self.name, src, 1, info), (source,), info, (index % size,))
        parts = index if isinstance(index, tuple) else (index,)
        if parts and all(isinstance(p, slice) for p in parts) and len(parts) <= src.rank:
            return SLICE.describe_slices(node, source, src, parts, info)
        ints = []
        for j, part in enumerate(parts):
            if type(part) is int and len(ints) == j:
                ints.append(part)
            elif not (part == _FULL or part is Ellipsis) or isinstance(part, fx.Node):
                return f"index {index!r} is not integers followed by full slices"
        if not ints or len(ints) > src.rank:
            return f"index {index!r} is not integers followed by full slices"
        normalized = []
        for dim, i in enumerate(ints):
            size = src.shape[dim]
            if not -size <= i < size:
                return f"index {i} out of range for dimension {dim} of size {size}"
            normalized.append(i % size)
        key = (self.name, src, len(ints), info)
        return NeuronOp(node, self, key, (source,), info, tuple(normalized))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        source, batched = b.slot([m.operands[0] for m in members])
        device = members[0].info.device
        if len(members[0].consts) == 1 and not batched:
            b.size.setdefault(source, tensor_info(members[0].operands[0]).shape[0])
            return b.take(source, [m.consts[0] for m in members], members[0].info)
        columns = [b.index([m.consts[d] for m in members], device) for d in range(len(members[0].consts))]
        if batched:
            rows = b.index(list(range(len(members))), device)
            return b.graph.call_function(operator.getitem, (source, (rows, *columns)))
        return b.graph.call_function(operator.getitem, (source, tuple(columns)))


class Slice(OpFamily):
    """Constant slices inside one neuron (``iou[:h]``): the group slices the same
    ranges after the member dimension."""
    name = "slice"

    def describe_slices(self, node, source, src, parts, info) -> NeuronOp | str:
        bounds = []
        for p in parts:
            if not all(v is None or type(v) is int for v in (p.start, p.stop, p.step)):
                return f"slice {p!r} with non-constant bounds"
            bounds.append((p.start, p.stop, p.step))
        return NeuronOp(node, self, (self.name, src, tuple(bounds), info), (source,), info, (), parts)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        source, batched = b.slot([m.operands[0] for m in members])
        if not batched:
            return None
        return b.graph.call_function(operator.getitem, (source, (slice(None), *members[0].template)))


SLICE = Slice()
SELECT = register(Select(), functions=[operator.getitem])
