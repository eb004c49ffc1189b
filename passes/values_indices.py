"""Parts of a (values, indices) pair become ops of their own: ``torch.max(h, 0)[0]``, ``h.max(0).values``,
``h.min(0)`` unpacked, ``h.sort(stable=True).indices``.

Rewrites each ``getitem`` (``[0]``/``[1]``) or attribute read (``.values``/``.indices``)
of the tuple that ``max``/``min`` along a dimension or a stable ``sort`` returns
into one call of :func:`dynamo_relational.ops.along.values_or_indices`, which
runs the same op and returns that part. The tuple's node is erased once
nothing else reads it.

Legal because each new node computes exactly that part: the same op on the
same input, whose choice among ties is fixed (``max``/``min`` return the first
maximal entry, a stable sort keeps ties in order), so batching members
cannot change it. The values' gradient flows to the selected entries as in
eager, ties included, which ``amax`` would share out instead. An unstable
``sort`` and ``topk`` order ties as their kernel happens to (on CUDA the
order depends on the shape: a batched sort returned other indices than the
neuron's own), so they stay as they are. The parts are computed where the
op ran, not where they are read, so an in-place write in between cannot
change them. Only constant arguments are rewritten; a tuple used whole
(passed on, returned) stays as it is.

What it saves: a tuple output cannot be batched, so the op and its reads ran
node by node, and a model max-pooling its neighbours' messages with
``torch.max(torch.stack(messages), 0)[0]`` grouped none of its pooling. The
parts group along the members' dimensions (the ``along`` family); an op whose
values and indices are both read runs twice.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.ops.along import PAIR_OPS, values_or_indices
from dynamo_relational.ops.base import node_args

from .context import PassContext

_PARTS = {0: 0, 1: 1, "values": 0, "indices": 1}


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    graph = gm.graph
    candidates = [n for target in (torch.max, torch.min, torch.sort)
                  for n in graph.find_nodes(op="call_function", target=target, sort=False)]
    candidates += [n for n in graph.find_nodes(op="call_method", sort=False) if n.target in PAIR_OPS]
    rewritten = 0
    for pair in candidates:
        op = pair.target if isinstance(pair.target, str) else pair.target.__name__
        args = node_args(pair, PAIR_OPS[op])
        if args is None or not isinstance(args.get("input"), fx.Node) or args.pop("out", None) is not None \
                or not all(_constant(v) for k, v in args.items() if k != "input"):
            continue
        if op in ("max", "min") and "dim" not in args:
            continue   # max(h): one tensor; max(h, g): elementwise
        if op == "sort" and args.get("stable") is not True:
            continue   # ties in the order the kernel happens to take
        parts = [_part(user) for user in pair.users]
        if not parts or None in parts:
            continue   # the tuple is used whole
        x = args.pop("input")
        for user, part in zip(list(pair.users), parts):
            with graph.inserting_before(pair):   # where the op ran: an in-place write may follow it
                piece = graph.call_function(values_or_indices, (x, op, part), args)
            piece.meta.update(user.meta)   # its value: the part's
            user.replace_all_uses_with(piece)
            graph.erase_node(user)
            rewritten += 1
        graph.erase_node(pair)
    ctx.stats["values_indices"] = rewritten
    return gm


def _constant(value) -> bool:
    return value is None or type(value) in (int, bool)


def _part(user: fx.Node) -> int | None:
    """0 or 1 where ``user`` reads the values or the indices of the pair, else None."""
    if user.op != "call_function" or user.kwargs or len(user.args) != 2:
        return None
    key = user.args[1]
    if user.target is operator.getitem and type(key) is int or user.target is getattr and type(key) is str:
        return _PARTS.get(key)
    return None
