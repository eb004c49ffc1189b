"""Making the FX nodes of graphs whose shapes are static (traces, and the passes' rewrites of them), faster
than ``Graph.create_node``: each node of a trace is made once, and tracing makes tens of thousands."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.fx.graph import _illegal_names, _name_regex

_Node = fx.Node
_new = fx.Node.__new__
_init_base = torch._C._NodeBase.__init__
_LEGAL_OPS = fx.node._legal_ops
_TARGET_NAMES: dict[Any, str] = {}
#: a name fx's namespace was asked for -> (its base, whether it ends in a number, whether it is reserved)
_PARSED: dict[str, tuple[str, bool, bool]] = {}


def _node_name(graph: fx.Graph, target: Any) -> str:
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
    """``graph.create_node`` for a trace's static shapes, about three times faster: no pytree walk over the
    arguments looking for SymInts, and fx's unique name (``add``, ``add_1``, ...) found without its regex
    where the name asked for is a plain identifier, its parse cached, and the node made past ``fx.Node``'s
    Python ``__init__``. The node is the one ``graph.create_node`` makes: named, inserted at the insert point
    and in the graph's table by op and target, the owning module's node hooks called (it reads fx's internals
    for that: ``tests/test_nodes.py`` compares the two)."""
    candidate = _node_name(graph, target) if name is None else name
    parsed = _PARSED.get(candidate)
    if parsed is None:
        if len(_PARSED) > 4096:
            _PARSED.clear()
        match = _name_regex.match(candidate)
        parsed = _PARSED[candidate] = (candidate, True, True) if match is None else \
            (match.group(1), match.group(2) is not None, _illegal_names.get(candidate) is not None)
    base, numbered, reserved = parsed
    if numbered:   # (rare: left to fx)
        return graph.create_node(kind, target, args, kwargs, candidate, type_expr)
    namespace = graph._graph_namespace
    used = namespace._used_names
    num = namespace._base_count.get(base, 0)
    if reserved:   # a builtin's or keyword's name (``sum``) is never a node's: ``sum_1``
        num += 1
        candidate = f"{base}_{num}"
    while candidate in used:
        num += 1
        candidate = f"{base}_{num}"
    used.add(candidate)
    namespace._base_count[base] = num
    if not (callable(target) if kind == "call_function" else kind in _LEGAL_OPS and isinstance(target, str)):
        return fx.Node(graph, candidate, kind, target, args, kwargs, type_expr)   # (fx's error)
    node = _new(_Node)   # (what fx.Node.__init__ does past those checks of op and target)
    _init_base(node, graph, candidate, kind, target, type_expr)
    node._update_args_kwargs(args, kwargs)
    hooks = getattr(graph._owning_module, "_create_node_hooks", None)
    for hook in hooks or ():
        hook(node)
    namespace._obj_to_name[node] = candidate   # (associate_name_with_obj)
    graph._insert(node)
    # (the graph's table by op and target: _FindNodesLookupTable.insert)
    graph._find_nodes_lookup_table.table[(kind, target if kind == "call_function" else None)][node] = None
    graph._len += 1
    return node


def set_args(node: fx.Node, args: tuple, kwargs: dict) -> None:
    """``node.args, node.kwargs = args, kwargs`` without ``Node.__setattr__``'s removal and reinsertion of the
    node in the graph's table by op and target, which arguments do not change."""
    node._update_args_kwargs(args, kwargs)


def meta_without_value(node: fx.Node) -> dict:
    """``node``'s meta (source lines, module stack) for a node that computes another value in its place."""
    return {k: v for k, v in node.meta.items() if k not in ("val", "example_value", "tensor_meta", "rel_info")}
