"""Remove dead nodes (unused row reads, gathers and constants) and check the graph.

Legal because the removed nodes are pure and unused. Saves nodes and buffers
that the vectorizer may leave behind when a group's rows are never read.
"""
from __future__ import annotations

import torch.fx as fx

from .context import PassContext


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    gm.graph.eliminate_dead_code()
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name in [name for name, _ in gm.named_buffers() if name.startswith("_relational_") and name not in used]:
        delattr(gm, name)
    gm.graph.lint()
    gm.recompile()
    return gm
