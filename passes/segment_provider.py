"""Name the segment-reduction provider in the graph: ``options.segment_provider`` becomes the ``provider``
argument of every ``segment_reduce`` call.

The provider is an argument of the op (not a process-wide switch) so that it is part of this graph: models
compiled with different providers run side by side, and the code-sharing cache (:mod:`dynamo_relational.schemas`,
keyed by the graph's code) never mixes them. The default ``"aten"`` is left implicit, so default graphs read as
before. Always legal: every provider computes the same reduction.
"""
from __future__ import annotations

import torch.fx as fx

from dynamo_relational.kernels.segment import segment_reduce

from .context import PassContext


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    provider = ctx.options.segment_provider
    if provider == "aten":
        return gm
    target = segment_reduce._opoverload
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]
    for node in calls:
        node.args = (*node.args[:3], provider)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "provider"}
    if calls:
        gm.recompile()
        ctx.stats["segment_provider"] = provider
    return gm
