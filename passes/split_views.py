"""Pieces of a split become slices: ``h.chunk(3)[j]``, ``torch.split(h, s)[j]``, ``h.unbind(0)[j]``;
so does ``h.narrow(dim, start, length)``.

Rewrites each ``getitem`` of the tuple that ``chunk``, ``split`` (a size or a
list of sizes) or ``unbind`` (along dimension 0) returns into an index of the
split tensor itself: ``h[a:b]`` along the split's dimension, or ``h[j]``. The
split node is erased once nothing else reads it. A ``narrow`` with constant
arguments becomes that slice itself.

Legal because each piece *is* that view of ``h``: the same values, strides
and storage. Only constant sizes, dimensions and piece numbers are rewritten.

What it saves: a split returns a tuple, which grouping cannot batch, so it
runs node by node and keeps the graph's order around it; a TreeLSTM written
with ``i, o, u = iou.chunk(3)`` grouped nothing. The slices group like any
other neuron op.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops import tensor_info
from dynamo_relational.ops.base import node_args

from .context import PassContext

#: split target -> (kind, argument names); methods name the sizes differently from the functions
_SPLITS = {torch.chunk: ("chunk", ("input", "chunks", "dim")), "chunk": ("chunk", ("input", "chunks", "dim")),
           torch.split: ("split", ("tensor", "split_size_or_sections", "dim")),
           "split": ("split", ("self", "split_size", "dim")),
           torch.unbind: ("unbind", ("input", "dim")), "unbind": ("unbind", ("self", "dim"))}


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    graph = gm.graph
    splits = [n for target in _SPLITS if not isinstance(target, str)
              for n in graph.find_nodes(op="call_function", target=target, sort=False)]
    splits += [n for n in graph.find_nodes(op="call_method", sort=False) if n.target in _SPLITS]
    rewritten = 0
    for split in splits:
        pieces = _pieces(split)
        if pieces is None:
            continue
        for user in list(split.users):
            if user.op == "call_function" and user.target is operator.getitem and not user.kwargs \
                    and type(user.args[1]) is int and -len(pieces) <= user.args[1] < len(pieces):
                user.args = (split.args[0], pieces[user.args[1]])
                rewritten += 1
        if not split.users:
            graph.erase_node(split)
    narrows = graph.find_nodes(op="call_function", target=torch.narrow, sort=False)
    narrows += [n for n in graph.find_nodes(op="call_method", sort=False) if n.target == "narrow"]
    for narrow in narrows:
        index = _narrowed(narrow)
        if index is not None:
            narrow.op, narrow.target, narrow.args, narrow.kwargs = "call_function", operator.getitem, index, {}
            rewritten += 1
    ctx.stats["split_views"] = rewritten
    return gm


def _narrowed(narrow: fx.Node) -> tuple | None:
    """``(h, index)`` such that ``h[index]`` is ``narrow``'s view, or None if its arguments are not constant."""
    args = node_args(narrow, ("input", "dim", "start", "length"))
    info = tensor_info(args.get("input")) if args else None
    if info is None or info.rank == 0 or not all(type(args.get(k)) is int for k in ("dim", "start", "length")):
        return None
    dim, start, length = args["dim"], args["start"], args["length"]
    if not -info.rank <= dim < info.rank:
        return None
    dim %= info.rank
    start = start + info.shape[dim] if start < 0 else start
    if not (0 <= start and length >= 0 and start + length <= info.shape[dim]):
        return None
    piece = slice(start, start + length)
    return args["input"], (piece if dim == 0 else (*[slice(None)] * dim, piece))


def _pieces(split: fx.Node) -> list | None:
    """The index of ``split``'s input that gives each of its pieces, or None if they are not constant."""
    kind, names = _SPLITS[split.target]
    args = node_args(split, names)
    info = tensor_info(split.args[0]) if split.args else None
    if args is None or info is None or info.rank == 0:
        return None
    dim = args.get("dim", 0)
    if type(dim) is not int or not -info.rank <= dim < info.rank:
        return None
    dim %= info.rank
    size = info.shape[dim]
    if kind == "unbind":
        return list(range(size)) if dim == 0 else None
    if kind == "chunk":
        chunks = args.get("chunks")
        if type(chunks) is not int or chunks < 1 or size == 0:
            return None
        sizes = [-(-size // chunks)]   # chunk's pieces are ceil(size / chunks) long, the last one shorter
    else:
        sizes = args.get(names[1])
        sizes = [sizes] if type(sizes) is int else list(sizes) if isinstance(sizes, (list, tuple)) else None
        if sizes is None or not all(type(s) is int and s > 0 for s in sizes) or size == 0:
            return None
    if len(sizes) == 1:   # one size for every piece
        sizes = [min(sizes[0], size - start) for start in range(0, size, sizes[0])]
    if sum(sizes) != size:
        return None
    pieces, start = [], 0
    for s in sizes:
        piece = slice(start, start + s)
        pieces.append(piece if dim == 0 else (*[slice(None)] * dim, piece))
        start += s
    return pieces
