"""``new_node`` makes the node ``Graph.create_node`` makes: its name, its place, the graph's tables."""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from dynamo_relational.nodes import new_node

#: (op, target, name asked for): plain targets, repeated names, names ending in a number, reserved names
_CALLS = [("call_function", operator.add, None), ("call_function", operator.add, None), ("call_method", "sum", None),
          ("call_function", torch.relu, None), ("call_function", operator.add, "add_1"),
          ("call_function", operator.mul, "sum"), ("call_method", "sum", "x"), ("call_function", torch.cat, "for"),
          ("call_function", operator.add, "add_7"), ("call_function", operator.add, None),
          ("call_method", "add", None)]


def _build(make) -> fx.Graph:
    graph = fx.Graph()
    x = graph.placeholder("x")
    first = None
    for op, target, name in _CALLS:
        node = make(graph, op, target, (x, x if first is None else first), {}, name)
        first = first or node
        if target is torch.relu:   # the later nodes go before the first one, and read x alone
            graph.inserting_before(first).__enter__()
            first = x
    return graph


def test_new_node_makes_the_node_create_node_makes():
    made = _build(new_node)
    created = _build(lambda graph, op, target, args, kwargs, name: graph.create_node(op, target, args, kwargs, name))
    made.lint()
    assert [(n.name, n.op, n.target, str(n.args)) for n in made.nodes] == \
        [(n.name, n.op, n.target, str(n.args)) for n in created.nodes]
    for op, target in [("call_function", operator.add), ("call_method", None), ("call_function", torch.cat)]:
        assert [n.name for n in made.find_nodes(op=op, target=target)] == \
            [n.name for n in created.find_nodes(op=op, target=target)]
    assert made.create_node("call_function", operator.add, (), {}).name == \
        created.create_node("call_function", operator.add, (), {}).name
    assert [list(map(str, n.users)) for n in made.nodes] == [list(map(str, n.users)) for n in created.nodes]


def test_new_node_calls_the_owning_modules_node_hooks():
    gm = fx.symbolic_trace(torch.nn.ReLU())
    seen = []
    gm._register_create_node_hook(seen.append)
    x = next(iter(gm.graph.nodes))
    with gm.graph.inserting_after(x):
        node = new_node(gm.graph, "call_function", torch.neg, (x,), {})
    assert seen == [node]
