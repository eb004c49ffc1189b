"""Recompute tagging: edge-sized gathers are gathered again in the backward pass instead of saved.

Tags every row gather that expands its source (more rows out than in, as
``h[src]`` over the edges of a graph) with ``meta["recompute"] =
CheckpointPolicy.MUST_RECOMPUTE``, the tag of selective activation
checkpointing. AOT autograd copies the tag into its joint graph, and its
partitioner then saves the O(|V|) source rows for the backward pass instead of
the O(|E|) gathered rows, and gathers them again there (the memory half of
``seeds/004``: keep the vertex values, recompute the edge intermediates).
There is no partitioner of our own.

Legal because a gather is pure: gathering again reads the same rows. Saves
``|E| - |V|`` rows of saved activations for each tagged gather whose rows the
backward needs (an edge-wise product's operands, say); costs one more gather
in the backward. Gathers that reduce (``gather_reduce``) are left alone:
their output is vertex-sized already. The tag matters only to Inductor's
training graphs; the ATen executor and inference ignore it.
"""
from __future__ import annotations

import torch.fx as fx
from torch.utils.checkpoint import CheckpointPolicy

from .context import PassContext
from .gather_nodes import as_gather, rows


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    tagged = 0
    for node in gm.graph.nodes:
        gather = as_gather(gm, node)
        if gather is None or gather.reduces:
            continue
        source_rows = rows(gather.base)
        if source_rows is not None and gather.index.shape[0] > source_rows:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
            tagged += 1
    ctx.stats["gathers_recomputed"] = tagged
    return gm
