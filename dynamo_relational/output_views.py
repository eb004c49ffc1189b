"""Outputs that are views are taken outside the compiled code.

AOT autograd returns an output that is a view of an intermediate, or of
another output, by replaying a recorded sequence of views on a base it picks,
and in torch 2.13 it picks the wrong base in some graphs: ``r = h[0]``
returned with ``r.detach()`` failed with "shape '[2, 3, 3]' is invalid for
input of size 3". The grouped graph's outputs are often such views
(``passes/distinct_outputs.py`` replays eager's views on purpose). So Inductor
compiles the graph up to the views' bases, and the views are taken from its
results in Python: the same ops as eager's, on the tensors they view. So are
the copies that give outputs memory of their own, which Inductor would merge.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from dynamo_relational.passes.distinct_outputs import replayable_view, view_base


def compile_with_views_outside(compile_fn: Callable, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """``compile_fn(graph, example_inputs)`` (Inductor's ``compile_fx``) on ``gm``, or where outputs of ``gm`` are
    views, on a copy that returns their bases instead; the returned callable then takes the views, as ``gm``
    does."""
    split = _split(gm)
    if split is None:
        return compile_fn(gm, example_inputs)
    core, views = split
    compiled = compile_fn(core, example_inputs)
    take = views.forward   # bound: skips nn.Module.__call__ on every call

    def run(*args):
        return take(*compiled(*args), *args)
    return run


def _split(gm: fx.GraphModule) -> tuple[fx.GraphModule, fx.GraphModule] | None:
    """``(core, views)``: ``core`` computes ``gm``'s outputs that are not views or copies, then the computed
    bases of those that are; ``views(*core's outputs, *gm's inputs)`` gives ``gm``'s outputs. None where no
    output is one (or the outputs are no flat sequence)."""
    graph = gm.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = output.args[0]
    if not isinstance(values, (list, tuple)):
        return None
    bases = [_outside_base(v) for v in values]
    if all(base is v for base, v in zip(bases, values)):
        return None
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    returned: dict = {}   # node -> its position among core's outputs
    for base in bases:
        if isinstance(base, fx.Node) and base.op != "placeholder":
            returned.setdefault(base, len(returned))

    core_graph = fx.Graph()
    env: dict = {}
    for node in graph.nodes:
        if node.op != "output":
            env[node] = core_graph.node_copy(node, env.__getitem__)
    core_graph.output(tuple(env[node] for node in returned))
    core = fx.GraphModule(gm, core_graph)

    views_graph = fx.Graph()
    env = {node: views_graph.placeholder(f"base_{k}") for node, k in returned.items()}
    env.update((node, views_graph.placeholder(f"input_{i}")) for i, node in enumerate(placeholders))

    def taken(value):
        if not isinstance(value, fx.Node):
            return value
        copy = env.get(value)
        if copy is None:   # a view: of its operand, taken first
            copy = env[value] = views_graph.node_copy(value, taken)
        return copy

    views_graph.output(type(values)(taken(v) for v in values))
    return core, fx.GraphModule(torch.nn.Module(), views_graph)


def _outside_base(value):
    """The tensor that ``value`` is computed from by views and copies: the clones by which
    ``passes/distinct_outputs.py`` gives outputs memory of their own are taken outside too, as Inductor
    returns one buffer for two clones of one tensor (torch 2.13), which would make those outputs share it."""
    base = view_base(value, sizes_from_inputs=True)
    while isinstance(base, fx.Node) and _is_clone(base) and _read_by_views_only(base):
        base = view_base(base.args[0], sizes_from_inputs=True)
    return base


def _is_clone(node: fx.Node) -> bool:
    return ((node.op == "call_method" and node.target == "clone")
            or (node.op == "call_function" and node.target in (torch.clone, torch.ops.aten.clone.default))) \
        and len(node.args) == 1 and not node.kwargs


def _read_by_views_only(node: fx.Node) -> bool:
    """Whether only outputs and views read ``node``, and their views in turn (nothing writes into it)."""
    return all(user.op == "output" or (replayable_view(user, sizes_from_inputs=True) and _read_by_views_only(user))
               for user in node.users)
