"""Padded gather-reductions: ``gather_reduce`` as ATen ops that Inductor lowers and fuses (opt-in).

With ``options={"gather_reduce_form": "padded"}``, rewrites every
``gather_reduce(source, csr, rows, reduce, transpose)`` into
``gather_reduce_padded(source, slots, weights)`` (``kernels/padded.py``): a
gather over the index padded to the widest segment, weighted, then summed over
the padded width. Inductor has no kernel for our custom op and calls it as it
is; it lowers this form into one reduction loop, fused with the elementwise op
that produced ``source``.

Legal because the two compute the same sum of weighted rows (only the order
of additions may differ, within rounding); padding entries have weight 0 and
read row 0 (a ``source`` without rows has no entries, so it is left alone).
Costs ``rows x width`` reads instead of one per entry: a segment much wider
than the others pads every row to its width, so a node whose padded index would
exceed ``MAX_PADDING`` times its entries keeps the CSR product (counted in
``stats["padded_gathers_kept"]``). Measured slower than MKL's product on CPU
(docs/BENCHMARKS.md, "Kernel providers"), so the default form is ``"csr"`` and
this pass then does nothing.
"""
from __future__ import annotations

from collections import Counter

import logging

import torch
import torch.fx as fx

from dynamo_relational.kernels.padded import ell_layout, gather_reduce_padded
from dynamo_relational.ops import tensor_info

from .context import PassContext
from .gather_nodes import add_constant, constant_value, rows

log = logging.getLogger("dynamo_relational")

_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default
#: the most padded slots per entry a rewritten node may have
MAX_PADDING = 4


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    if ctx.options.gather_reduce_form != "padded":
        return gm
    rewritten = 0
    kept: Counter = Counter()   # why gathers keep the CSR product -> how many (logged once per reason)
    for node in list(gm.graph.find_nodes(op="call_function", target=_GATHER_REDUCE)):
        layout = _padded_layout(gm, node)
        if isinstance(layout, str):
            kept[layout] += 1
            continue
        slots, weights = layout
        with gm.graph.inserting_before(node):
            padded = gm.graph.call_function(gather_reduce_padded, (
                node.args[0], add_constant(gm, slots, "slots"), add_constant(gm, weights, "weights")))
        padded.meta.update(node.meta)
        node.replace_all_uses_with(padded)
        gm.graph.erase_node(node)   # (its packed index, now unread, is dropped by ``cleanup``, which runs next)
        rewritten += 1
    for reason, count in kept.items():
        log.info("relational: %d gather(s) keep the CSR product: %s", count, reason)
    ctx.stats["padded_gathers"] = rewritten
    ctx.stats["padded_gathers_kept"] = sum(kept.values())
    return gm


def _padded_layout(gm: fx.GraphModule, node: fx.Node):
    """``(slots, weights)`` for ``node``, or why it keeps the CSR product."""
    source, csr_node, out_rows, reduce = node.args[:4]
    transpose = node.args[4] if len(node.args) > 4 else node.kwargs.get("transpose", False)
    csr, columns, info = constant_value(gm, csr_node), rows(source), tensor_info(source)
    if csr is None or columns is None or info is None or columns == 0:
        return "its index or source rows are not known, or it has no source rows"
    slots, weights = ell_layout(csr, out_rows, columns, transpose, reduce)
    entries = int((weights != 0).sum())
    if slots.numel() > MAX_PADDING * max(entries, 1):
        return f"padding would read more than {MAX_PADDING}x as many entries"
    return slots, weights.to(info.dtype)

