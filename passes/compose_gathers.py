"""Compose gathers: read the original rows instead of a copy of them.

Rewrites, for every gather ``G`` (``gather_rows``, ``index_select``,
``gather_reduce``; see :mod:`gather_nodes`):

* ``G(gather(C, I), J)`` -> ``G(C, I[J])``: a gather of a gather;
* ``G(cat([B_1, .., gather(C, I), .., B_n]), J)`` -> ``G(cat([B_1, .., C, .., B_n]), J')``
  when every user of the ``cat`` is a gather (all are remapped) and ``C`` has
  at most twice the rows of ``gather(C, I)``, so the ``cat`` grows by at most
  the copy that the inner gather made anyway.

Legal because row ``J[i]`` of ``gather(C, I)`` *is* row ``I[J[i]]`` of ``C``
(and likewise inside a ``cat``, up to the block's offset); gathers are pure.
Saves one gather (a full copy of the gathered rows, and an index_add or
transposed product in the backward pass) per composition. Typical source: the
vectorizer gathers operand rows for a linear map, and ``postpone_gathers``
moves the gather below it, next to the segment reduction that reads it.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .context import PassContext
from .gather_nodes import as_gather, is_cat0, rows, set_rows_info, set_source

#: compose through a cat only when the composed block has at most this many times the rows
MAX_GROWTH = 2


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    composed = 0
    for node in list(gm.graph.nodes):
        gather = as_gather(gm, node)
        if gather is None:
            continue
        inner = as_gather(gm, gather.base)
        if inner is not None and not inner.reduces and rows(inner.base) is not None:
            set_source(gm, gather, inner.base, inner.index[gather.index])
            composed += 1
        elif is_cat0(gather.base) and _open_cat(gm, gather.base):
            composed += 1
    _erase_dead(gm)
    ctx.stats["gathers_composed"] = composed
    return gm


def _open_cat(gm: fx.GraphModule, cat: fx.Node) -> bool:
    """Replace gathered blocks of ``cat`` by their sources and remap every gather that reads ``cat``."""
    readers = [as_gather(gm, user) for user in cat.users]
    blocks = list(cat.args[0])
    sizes = [rows(b) for b in blocks]
    if not readers or any(r is None or r.base is not cat for r in readers) or None in sizes:
        return False
    inner = [as_gather(gm, b) for b in blocks]
    opened = [g if g is not None and not g.reduces and rows(g.base) is not None
              and rows(g.base) <= MAX_GROWTH * rows(g.node) else None for g in inner]
    if not any(opened):
        return False
    # new position of every old row of the cat
    parts, start = [], 0
    new_blocks = []
    for block, size, g in zip(blocks, sizes, opened):
        if g is None:
            parts.append(torch.arange(start, start + size))
            new_blocks.append(block)
            start += size
        else:
            parts.append(start + g.index.to("cpu"))
            new_blocks.append(g.base)
            start += rows(g.base)
    position = torch.cat(parts)
    with gm.graph.inserting_before(cat):
        new_cat = gm.graph.call_function(torch.cat, (new_blocks,))
    set_rows_info(new_cat, cat, start)
    for reader in readers:
        set_source(gm, reader, new_cat, position.to(reader.index.device)[reader.index])
    return True


def _erase_dead(gm: fx.GraphModule) -> None:
    for node in reversed(list(gm.graph.nodes)):
        if not node.users and node.op == "call_function" and (as_gather(gm, node) or is_cat0(node)):
            gm.graph.erase_node(node)
