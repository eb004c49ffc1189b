"""Making the FX nodes of graphs whose shapes are static (traces, and the passes' rewrites of them), faster
than ``Graph.create_node``: each node of a trace is made once, and tracing makes tens of thousands."""
from __future__ import annotations

from typing import Any

import torch.fx as fx

_TARGET_NAMES: dict[Any, str] = {}


def node_name(graph: fx.Graph, target: Any) -> str:
    """fx's name for nodes calling ``target`` (fx runs a regex per node; cached here)."""
    try:
        name = _TARGET_NAMES.get(target)
    except TypeError:   # unhashable target
        return graph._target_to_str(target)
    if name is None:
        if len(_TARGET_NAMES) > 4096:   # (targets are few; a bound for functions made anew per trace)
            _TARGET_NAMES.clear()
        name = _TARGET_NAMES[target] = graph._target_to_str(target)
    return name


def new_node(graph: fx.Graph, kind: str, target: Any, args: tuple, kwargs: dict, name: str | None = None,
             type_expr: Any = None) -> fx.Node:
    """``graph.create_node`` for a trace's static shapes, faster: the arguments are set after creation, as
    the args setter does, without Graph.create_node's pytree walk looking for SymInts (~15% of tracing) and
    Node.__setattr__'s removal and reinsertion of the node in the graph's table by op and target, which
    arguments do not change (~10%); the name is fx's for ``target`` unless given, found once per target."""
    node = graph.create_node(kind, target, (), {}, node_name(graph, target) if name is None else name, type_expr)
    if args or kwargs:
        node._update_args_kwargs(args, kwargs)
    return node
