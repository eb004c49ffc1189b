"""Commute a linear map with a sum/mean gather-reduction: distribute or factor a sum-product.

* distribute: ``linear(gather_reduce(x, A), W, b)`` -> ``gather_reduce(linear(x, W), A) + b``;
* factor: ``gather_reduce(linear(x, W), A)`` -> ``linear(gather_reduce(x, A), W)``.

Legal because a per-segment sum or mean is a linear map of the rows:
``(A x) W^T = A (x W^T)``. A bias is added once per output row, so it stays
outside the reduction (and a linear with a bias is not factored in). Empty
segments reduce to 0 in both orders. The reduction and the linear must have
no other user, since their value disappears.

Which order is cheaper depends on the widths and on how many rows each side
has: a GCN layer reduces ``E`` gathered rows into ``V`` and multiplies ``V``
(or ``|x|``) rows, so distributing pays when the linear narrows the rows
(``n < k`` features) and factoring when it widens them. This is the
factor-or-distribute choice that SPORES makes for sum-product expressions.
It is not a greedy pass: the rewrite search (``rewrite_search``) applies it
in both directions and keeps what the cost model estimates cheaper for the
whole graph, so the choice also sees the rewrites it enables (a distributed
linear can fuse with the one before it, a factored reduction can absorb a
gather).
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import TensorInfo, tensor_info
from dynamo_relational.ops.matmul import LinearArgs, linear_args

from .gather_nodes import as_gather

_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default


def sites(gm: fx.GraphModule) -> list[tuple[fx.Node, ...]]:
    """``(linear, reduction)`` pairs to distribute and ``(reduction, linear)`` pairs to factor."""
    found = []
    for node in gm.graph.nodes:
        linear = _bias_free_linear(node, bias_ok=True)
        if linear is not None and _reduction(gm, linear.x):
            found.append((node, linear.x))
        if _reduction(gm, node) and _bias_free_linear(node.args[0], bias_ok=False) is not None \
                and len(node.args[0].users) == 1:
            found.append((node, node.args[0]))
    return found


def apply(gm: fx.GraphModule, first: fx.Node, second: fx.Node) -> bool:
    """Swap the linear and the reduction of a pair from :func:`sites` (``first`` is the later node)."""
    graph = gm.graph
    with graph.inserting_before(first):
        if first.target is F.linear:     # distribute: linear(reduce(x)) -> reduce(linear(x)) + b
            _, weight, bias = _bias_free_linear(first, bias_ok=True)
            x = second.args[0]
            inner = _with_info(graph.call_function(F.linear, (x, weight)), x, weight)
            result = _with_info(graph.call_function(_GATHER_REDUCE, (inner, *second.args[1:]), dict(second.kwargs)),
                                second, weight)
            if bias is not None:
                result = _with_info(graph.call_function(torch.add, (result, bias)), second, weight)
        else:                            # factor: reduce(linear(x)) -> linear(reduce(x))
            x, weight, _ = _bias_free_linear(second, bias_ok=False)
            inner = _with_info(graph.call_function(_GATHER_REDUCE, (x, *first.args[1:]), dict(first.kwargs)),
                               first, None, tensor_info(x).shape[1])
            result = _with_info(graph.call_function(F.linear, (inner, weight)), first, weight)
    first.replace_all_uses_with(result)
    graph.erase_node(first)
    graph.erase_node(second)
    return True


def _bias_free_linear(node, bias_ok: bool) -> LinearArgs | None:
    """``(x, W, b)`` of ``linear`` on 2-D rows (without a bias unless ``bias_ok``), else None."""
    linear = linear_args(node)
    if linear is None or (linear.bias is not None and not bias_ok) or not linear.on_rows():
        return None
    out = tensor_info(node)
    return linear if out is not None and out.rank == 2 else None


def _reduction(gm: fx.GraphModule, node) -> bool:
    """A sum/mean ``gather_reduce`` (not transposed) of 2-D rows with one user."""
    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is _GATHER_REDUCE):
        return False
    info = tensor_info(node)
    return (len(node.users) == 1 and as_gather(gm, node) is not None and node.args[3] in ("sum", "mean")
            and info is not None and info.rank == 2)


def _with_info(new: fx.Node, rows_like: fx.Node, weight: fx.Node | None, width: int | None = None) -> fx.Node:
    """Record ``new``'s shape: the rows of ``rows_like``, ``weight``'s output features (or ``width``)."""
    like = tensor_info(rows_like)
    features = tensor_info(weight).shape[0] if weight is not None else width
    new.meta["rel_info"] = TensorInfo((like.shape[0], features), like.dtype, like.device)
    return new
