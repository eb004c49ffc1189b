"""Reading a ``linear`` node's operands (``dynamo_relational/ops/matmul.py``): the same ``(x, W, b)`` whether
they were recorded by position or by keyword, None for anything ``F.linear`` would not accept."""
import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops.matmul import linear_args


def _graph(*calls):
    """A graph with placeholders ``x``, ``w``, ``b`` and one call of F.linear per ``(args, kwargs)``
    (names refer to the placeholders); returns the placeholders and the calls' nodes."""
    graph = fx.Graph()
    inputs = {name: graph.placeholder(name) for name in "xwb"}
    nodes = [graph.call_function(F.linear, tuple(inputs[a] for a in args),
                                 {k: inputs[v] if v is not None else None for k, v in kwargs.items()})
             for args, kwargs in calls]
    return inputs, nodes


def test_positional_and_keyword_arguments_read_alike():
    inputs, nodes = _graph((("x", "w"), {}), (("x", "w", "b"), {}), (("x", "w"), {"bias": None}),
                           (("x",), {"weight": "w", "bias": "b"}), ((), {"input": "x", "weight": "w"}))
    x, w, b = inputs.values()
    assert [tuple(linear_args(n)) for n in nodes] == [(x, w, None), (x, w, b), (x, w, None), (x, w, b),
                                                      (x, w, None)]


def test_other_nodes_and_arguments_linear_would_reject_are_not_read():
    inputs, nodes = _graph((("x", "w"), {"weight": "w"}), (("x",), {}), (("x", "w"), {"scale": "b"}))
    assert [linear_args(n) for n in nodes] == [None, None, None]
    graph = nodes[0].graph
    assert linear_args(graph.call_function(torch.matmul, (inputs["x"], inputs["w"]))) is None
    assert linear_args(inputs["x"]) is None and linear_args(3) is None


def test_on_rows_needs_two_dimensional_input_and_weight():
    inputs, (node,) = _graph((("x", "w"), {}))
    for name, shape in (("x", (5, 3)), ("w", (4, 3))):
        inputs[name].meta["val"] = torch.empty(shape)
    assert linear_args(node).on_rows()
    inputs["x"].meta = {"val": torch.empty(3)}
    assert not linear_args(node).on_rows()
