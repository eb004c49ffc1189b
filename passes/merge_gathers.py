"""Gathers of one value, merged: ``X[I_1], ..., X[I_k]`` -> ``torch.split(X[cat(I_1, ..., I_k)])``.

A union's levels each read their rows of values computed once for all of them
(a TreeLSTM's ``W x`` of every node, gathered by every level). Each gather's
backward zeroes a buffer of ``X``'s size, scatters into it, and adds it to
``X``'s gradient: per level. One gather of all the rows, split into each
reader's (views), backpropagates through one buffer and one scatter instead.

Legal because the split's part ``k`` holds row ``I_k[i]`` of ``X`` at ``i``,
as ``X[I_k]`` did. For ``dynamo_relational.batch``'s unions only
(``Pass.unions_only``): their code runs as ATen calls, while Inductor fuses a
gather into its reader, which a merged gather would prevent. The index is a
``torch.cat`` of the readers' index tensors, so that a batch restricts each
reader's index as before (:mod:`dynamo_relational.row_plan`) and the split's
sizes are the readers' row counts in the batch. Gathers of shared values
(computed from parameters alone) stay: a batch keeps their index as it is.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .context import PassContext
from .gather_nodes import add_constant, as_gather, rows, set_rows_info


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    readers: dict[fx.Node, list] = {}
    from_inputs: set[fx.Node] = set()   # values computed from the inputs (rows of samples, not shared values)
    for node in gm.graph.nodes:
        if node.op == "placeholder" or any(a in from_inputs for a in node.all_input_nodes):
            from_inputs.add(node)
        gather = as_gather(gm, node)
        if gather is not None and not gather.reduces and gather.base in from_inputs and rows(gather.base) \
                and gather.index.numel():
            readers.setdefault(gather.base, []).append(gather)
    merged = 0
    for base, gathers in readers.items():
        if len(gathers) > 1:
            _merge(gm, base, gathers)
            merged += len(gathers)
    ctx.stats["gathers_merged"] = merged
    return gm


def _merge(gm: fx.GraphModule, base: fx.Node, gathers: list) -> None:
    graph = gm.graph
    counts = [int(g.index.shape[0]) for g in gathers]
    with graph.inserting_before(gathers[0].node):   # (the first reader in the graph's order)
        indices = [add_constant(gm, g.index.long(), "index") for g in gathers]
        index = graph.call_function(torch.cat, (indices,))
        gathered = graph.call_function(torch.index_select, (base, 0, index))
        parts = graph.call_function(torch.split, (gathered, counts))
    set_rows_info(gathered, base, sum(counts))
    for k, g in enumerate(gathers):
        with graph.inserting_before(g.node):
            part = graph.call_function(operator.getitem, (parts, k))
        part.meta = dict(g.node.meta)
        g.node.replace_all_uses_with(part)
        graph.erase_node(g.node)
