"""Row and scalar reads ``x[i]``, ``x[i, j]``, ``x[i, :4]``: a group becomes one gather.

Members must read the same tensor with the same number of integer indices,
followed by the same constant basic indices (slices ``x[i, :4]``, ``...``,
``None``; a row kept two-dimensional, ``x[i:i + 1]``, is ``x[i, None]``); the
integer indices differ per member and become a constant index
tensor: ``index_select(x, 0, idx)`` for one index, advanced indexing
``x[idx0, idx1]`` for more, then the shared slices apply after the member
dimension. Indexing a neuron's value by constants only (``h[1:3]``,
``h[[0, 2]]``, ``h[idx]`` with one index tensor for all members) applies the
same index after the member dimension. An embedding of a constant index made
in ``forward`` (``emb(torch.tensor(t))``, as in knowledge-graph models) is the
row read ``emb.weight[t]``; an embedding of an index each neuron reads or
computes (``emb(tokens[v])``) is one embedding of the members' indices
(:class:`Lookup`); likewise ``F.one_hot`` of such an index (:class:`OneHot`).
"""
from __future__ import annotations

import operator
from typing import Any, Hashable, Sequence

import torch
import torch.fx as fx
import torch.nn.functional as F

from .base import NeuronOp, OpFamily, TensorInfo, node_args, register, tensor_info
from .facts import is_forward_constant, is_sample_constant

_FULL = slice(None, None, None)


class Select(OpFamily):
    name = "select"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        if node.target is F.embedding:
            return self._describe_embedding(node)
        source, index = node.args
        src, info = tensor_info(source), tensor_info(node)
        if src is None or info is None:
            return "indexes something other than a tensor of static shape"
        if type(index) is int:   # x[i], the common case: what the general code below does for one int
            if src.rank < 1:
                return f"index {index!r} is not integers followed by constant slices"
            size = src.shape[0]
            if not -size <= index < size:
                return f"index {index} out of range for dimension 0 of size {size}"
            return NeuronOp(node, self, (self.name, _rows_key(source, src), 1, (), info), (source,), info,
                            (index % size,), ())
        parts = index if isinstance(index, tuple) else (index,)
        first = parts[0] if parts else None
        if isinstance(first, slice) and _one_row(first, src.shape[0] if src.rank else 0):   # x[a:a + 1]: x[a, None]
            parts = (first.start, None, *parts[1:])
        elif parts and all(isinstance(p, slice) for p in parts) and len(parts) <= src.rank:
            return SLICE.describe_slices(node, source, src, parts, info)
        if isinstance(index, (list, fx.Node)):   # (fx keeps lists as immutable_list)
            return SLICE.describe_constant_index(node, source, index, info)
        ints = []
        for part in parts:
            if type(part) is not int:
                break
            ints.append(part)
        rest = parts[len(ints):]
        if not ints or len(ints) > src.rank or not all(_basic_constant(p) for p in rest):
            return f"index {index!r} is not integers followed by constant slices"
        normalized = []
        for dim, i in enumerate(ints):
            size = src.shape[dim]
            if not -size <= i < size:
                return f"index {i} out of range for dimension {dim} of size {size}"
            normalized.append(i % size)
        rest = () if all(p == _FULL or p is Ellipsis for p in rest) else rest   # x[i, :] is x[i]
        key = (self.name, _rows_key(source, src) if len(ints) == 1 else src, len(ints), tuple(_bounds(p) for p in rest),
               info)
        return NeuronOp(node, self, key, (source,), info, tuple(normalized), rest)

    def _describe_embedding(self, node: fx.Node) -> NeuronOp | str:
        args = node_args(node, ("input", "weight", "padding_idx", "max_norm", "norm_type", "scale_grad_by_freq",
                                "sparse"))
        if args is None or "weight" not in args:
            return "embedding with unexpected arguments"
        if args.get("padding_idx") is not None or args.get("max_norm") is not None \
                or args.get("scale_grad_by_freq") or args.get("sparse"):
            return "embedding with padding_idx, max_norm, scale_grad_by_freq or sparse"
        weight, constant = args["weight"], _constant_index(args.get("input"))
        src, info = tensor_info(weight), tensor_info(node)
        if constant is None and src is not None and info is not None and src.rank == 2:
            return LOOKUP.describe_lookup(node, args.get("input"), weight, info)
        if constant is None or src is None or info is None or src.rank != 2:
            return "embedding of an index that is not one integer made in forward"
        index, shape = constant
        if not 0 <= index < src.shape[0]:
            return f"embedding index {index} out of range for {src.shape[0]} rows"
        rest = (None,) * len(shape)   # emb(torch.tensor([w])): the row with a leading 1
        return NeuronOp(node, self, (self.name, src, 1, rest, info), (weight,), info, (index,), rest)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        first = members[0]
        sources = [m.operands[0] for m in members]
        if len(first.consts) == 1 and is_sample_constant(first.operands[0]) and len(set(sources)) > 1:
            rows = b.rows_of_sources(sources, [m.consts[0] for m in members], b.row_info(first.operands[0]))
            return rows if not first.template else \
                b.graph.call_function(operator.getitem, (rows, (_FULL, *first.template)))
        source, batched = b.slot(sources)
        src = tensor_info(first.operands[0])
        device = first.info.device
        if len(first.consts) == 1 and not batched:
            assert src is not None   # (describe checked)
            b.size.setdefault(source, src.shape[0])
            rows = b.take(source, [m.consts[0] for m in members], b.row_info(first.operands[0]))
        else:
            columns = [b.index([m.consts[d] for m in members], device) for d in range(len(first.consts))]
            if batched:
                columns.insert(0, b.index(list(range(len(members))), device))
            rows = b.graph.call_function(operator.getitem, (source, tuple(columns)))
        if not first.template:
            return rows
        return b.graph.call_function(operator.getitem, (rows, (_FULL, *first.template)))


def _rows_key(source: Any, src: TensorInfo) -> Hashable:
    """What the rows read from ``source`` (of info ``src``) share in a group: its info; for the samples' own
    constants in a union (each sample's edge counts, of its own length), which are read from their
    concatenation, the info of a row."""
    return (src.shape[1:], src.dtype, src.device) if is_sample_constant(source) else src


def _constant_index(node) -> tuple[int, tuple] | None:
    """``(value, shape)`` of an integer tensor of one element, shape ``()`` or ``(1,)``, built from a Python int
    inside ``forward``: Dynamo's ``torch.tensor(3)``, ``torch.tensor([3])`` or ``torch.LongTensor([3])``, or the
    constant the fast front-end records for each (never a model buffer, whose value may change between calls)."""
    if not isinstance(node, fx.Node):
        return None
    if node.op == "call_function" and node.target in (torch.LongTensor, torch.IntTensor):
        value = node.args[0] if len(node.args) == 1 and not node.kwargs else None
        if isinstance(value, (list, tuple)) and len(value) == 1 and type(value[0]) is int:
            return value[0], (1,)
        return None   # (torch.LongTensor(3) is three uninitialized entries)
    if node.op == "call_function" and node.target is torch.tensor:
        value = node.args[0] if len(node.args) == 1 else None
        dtype = node.kwargs.get("dtype", torch.long)
        if not set(node.kwargs) <= {"dtype", "device"} or dtype not in (torch.long, torch.int):
            return None
        if type(value) is int:
            return value, ()
        if isinstance(value, (list, tuple)) and len(value) == 1 and type(value[0]) is int:
            return value[0], (1,)
        return None
    if is_forward_constant(node) and node.graph.owning_module is not None:
        value = getattr(node.graph.owning_module, str(node.target), None)
        if (isinstance(value, torch.Tensor) and value.dim() <= 1 and value.numel() == 1
                and value.dtype in (torch.long, torch.int)):
            return int(value.reshape(())), tuple(value.shape)
    return None


def _one_row(part: slice, rows: int) -> bool:
    """Whether ``part`` indexes one row of ``rows`` keeping the dim: ``a:a + 1``."""
    return part.step in (None, 1) and type(part.start) is int and 0 <= part.start < rows \
        and part.stop == part.start + 1


def _basic_constant(part) -> bool:
    """A constant basic index (a view, the same for every member): ``...``, ``None``, a slice of ints."""
    if part is Ellipsis or part is None:
        return True
    return isinstance(part, slice) and all(v is None or type(v) is int for v in (part.start, part.stop, part.step))


def _bounds(part):
    """A hashable stand-in for a basic index (slices are unhashable before Python 3.12)."""
    return (part.start, part.stop, part.step) if isinstance(part, slice) else part


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

    def describe_constant_index(self, node, source, index, info) -> NeuronOp | str:
        """``h[[0, 2]]`` or ``h[idx]``: one list of ints, or one index tensor, for every member."""
        if isinstance(index, fx.Node):
            idx = tensor_info(index)
            if idx is None or idx.dtype not in (torch.long, torch.int, torch.bool):
                return f"index {index.name} is not an integer or boolean tensor of static shape"
            return NeuronOp(node, self, (self.name, "tensor", idx, info), (source, index), info, (), (index,))
        if not all(type(i) is int for i in index):
            return f"index {index!r} is not a list of ints"
        return NeuronOp(node, self, (self.name, "list", tuple(index), info), (source,), info, (), (list(index),))

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        source, batched = b.slot([m.operands[0] for m in members])
        if not batched:
            return None
        index = members[0].template
        if len(members[0].operands) > 1:   # an index tensor: the same one for every member
            value, varies = b.slot([m.operands[1] for m in members])
            if varies:
                return None
            index = (value,)
        return b.graph.call_function(operator.getitem, (source, (slice(None), *index)))


SLICE = Slice()


class Lookup(OpFamily):
    """``F.embedding(i, W)`` of an integer index ``i`` that each neuron computes or reads (``emb(tokens[v])``)
    from a shared table ``W``: a group is one embedding of the members' indices, ``F.embedding(I, W)`` with
    ``I[m]`` member ``m``'s index, whose rows are the members' rows of ``W``."""
    name = "lookup"

    def describe_lookup(self, node: fx.Node, index, weight, info) -> NeuronOp | str:
        index_info = tensor_info(index)
        if not isinstance(index, fx.Node) or index_info is None or index_info.dtype not in (torch.long, torch.int):
            return "embedding of something other than an integer tensor"
        key = (self.name, tensor_info(weight), index_info, info)
        return NeuronOp(node, self, key, (index, weight), info)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        index = b.gather([m.operands[0] for m in members])
        weight, gathered = b.slot([m.operands[1] for m in members])
        if gathered:   # (the signature holds the table: members of a group read one)
            return None
        return b.graph.call_function(F.embedding, (index, weight))


LOOKUP = Lookup()
SELECT = register(Select(), functions=[operator.getitem, F.embedding])


class OneHot(OpFamily):
    """``F.one_hot(i, c)`` of an int64 index that each neuron reads or computes (a node's label), with its class
    count given: a group is one ``one_hot`` of the members' indices, each member's row its own. (Without the
    count, the shape would depend on the values.)"""
    name = "one_hot"

    def describe(self, node: fx.Node) -> NeuronOp | str:
        args = node_args(node, ("tensor", "num_classes"))
        index, classes = (args.get("tensor"), args.get("num_classes", -1)) if args else (None, None)
        index_info, info = tensor_info(index), tensor_info(node)
        if index_info is None or info is None or index_info.dtype != torch.int64:
            return "one_hot of something other than an int64 tensor of static shape"
        if type(classes) is not int or classes < 0:
            return f"one_hot with num_classes={classes!r} (a count given as a number groups)"
        return NeuronOp(node, self, (self.name, classes, index_info), (index,), info, (), classes)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        index, batched = b.slot([m.operands[0] for m in members])
        if not batched:
            return None   # one for every member: merged, not batched
        return b.graph.call_function(F.one_hot, (index, members[0].template))


ONE_HOT = register(OneHot(), functions=[F.one_hot])
