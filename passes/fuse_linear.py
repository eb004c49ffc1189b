"""Linear-operator fusion: two linear maps with nothing nonlinear in between become one.

Rewrites, where the cost model below says the fused form multiplies less:

* ``linear(linear(x, W1, b1), W2, b2)`` -> ``linear(x, W2 @ W1, W2 @ b1 + b2)``;
* ``linear(gather_reduce(linear(x, W1), csr, sum|mean), W2, b2)`` ->
  ``gather_reduce(linear(x, W2 @ W1), csr, sum|mean) + b2``, also through a
  chain of such gathers: a sum or mean over rows is itself linear, so it
  commutes with ``W2`` (layers without an activation, as in SGC).

Legal because matrix products are associative and a per-segment sum or mean
is a linear map of the rows. The inner ``linear`` must have no other user
(its value disappears), and, through a reduction, no bias: a sum would count
the bias once per row. ``W2 @ W1`` is computed in the graph at every call,
so gradients reach both weights; results differ from eager only by the
rounding of the reassociated products.

Cost (:mod:`dynamo_relational.cost`, FLOPs plus bytes on the graph's device;
rows ``R`` of ``x``, ``k -> m -> n`` features): unfused, the products
``[R, k] x [k, m]`` and ``[R', m] x [m, n]`` and the reductions on ``m``
features; fused, ``[n, m] x [m, k]``, ``[R, k] x [k, n]`` and the reductions
on ``n`` features. The cheaper is taken, so a bottleneck (``m`` smaller than
``k`` and ``n``) stays as it is. What it saves: a product and the ``[R, m]``
intermediate (and its copy in the backward pass). Every candidate's two
estimates are in ``stats["cost_choices"]`` (printed by ``explain()``).
:func:`sites` and :func:`apply` offer the fusions the estimate rejected to the
rewrite search (``rewrite_search``), which judges the whole graph.
"""
from __future__ import annotations

import torch
import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational import cost
from dynamo_relational.ops import TensorInfo, tensor_info
from dynamo_relational.ops.matmul import linear_args

from .context import PassContext
from .gather_nodes import as_gather

_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    fused, estimates = [], {}
    changed = True
    while changed:   # a chain of three linears fuses in two rounds
        changed = False
        for node in list(gm.graph.nodes):
            decision = _fusion(gm, node)
            if decision is None:
                continue
            record = decision.pop("record")
            estimates[node.name] = record
            if record["choice"] == "fused":
                fused.append(record)
                _rewrite(gm.graph, node, **decision)
                changed = True
                break
    ctx.stats["linears_fused"] = fused
    ctx.stats.setdefault("cost_choices", []).extend(estimates.values())
    return gm


def sites(gm: fx.GraphModule) -> list[tuple[fx.Node]]:
    """Every outer ``linear`` that :func:`apply` can fuse with the linear before it."""
    return [(node,) for node in gm.graph.nodes if _fusion(gm, node) is not None]


def apply(gm: fx.GraphModule, outer: fx.Node) -> bool:
    """Fuse ``outer`` with the linear before it, whatever the estimate says."""
    decision = _fusion(gm, outer)
    if decision is None:
        return False
    del decision["record"]
    _rewrite(gm.graph, outer, **decision)
    return True


def _fusion(gm: fx.GraphModule, outer: fx.Node) -> dict | None:
    """How to fuse ``outer`` with the linear before it, where legal (None where not), with the
    estimates of both forms and the choice between them in ``record``."""
    outer_linear = linear_args(outer)
    if outer_linear is None or not outer_linear.on_rows():
        return None
    inner, w2, b2 = outer_linear
    chain, reductions = [], []   # the sum/mean gathers between the two linears, last first
    while inner.op == "call_function" and inner.target is _GATHER_REDUCE:
        gather = as_gather(gm, inner)
        if gather is None or inner.args[3] not in ("sum", "mean") or len(inner.users) != 1 \
                or tensor_info(inner) is None:
            return None
        chain.append(inner)
        reductions.append((gather.index.shape[0], tensor_info(inner).shape[0]))
        inner = inner.args[0]
    inner_linear = linear_args(inner)
    if inner_linear is None or not inner_linear.on_rows() or len(inner.users) != 1 \
            or any(a is inner for a in (w2, b2)):
        return None
    x, w1, b1 = inner_linear
    if chain and b1 is not None:
        return None
    rows, (m, k), (n, _) = tensor_info(x).shape[0], tensor_info(w1).shape, tensor_info(w2).shape
    out = tensor_info(outer)
    item = out.dtype.itemsize

    def reduced(width: int) -> cost.Cost:
        return sum((cost.gather_reduce(entries, count, width, item) for entries, count in reductions), cost.Cost())

    unfused = cost.linear(rows, k, m, item) + reduced(m) + cost.linear(out.shape[0], m, n, item)
    fused = cost.linear(n, m, k, item) + cost.linear(rows, k, n, item) + reduced(n)
    unfused_us, fused_us = unfused.seconds(out.device) * 1e6, fused.seconds(out.device) * 1e6
    record = dict(pass_="fuse_linear", node=outer.name, choice="fused" if fused_us < unfused_us else "kept",
                  through=[g.args[3] for g in reversed(chain)], features=f"{k}->{m}->{n}",
                  estimates_us={"unfused": unfused_us, "fused": fused_us})
    return dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2, chain=chain, inner=inner, record=record)


def _rewrite(graph: fx.Graph, outer: fx.Node, x, w1, b1, w2, b2, chain, inner) -> None:
    out_info, x_info, w_info = tensor_info(outer), tensor_info(x), tensor_info(w2)
    dtype, device = out_info.dtype, out_info.device
    n, k = w_info.shape[0], tensor_info(w1).shape[1]

    def info(node: fx.Node, shape) -> fx.Node:
        node.meta["rel_info"] = TensorInfo(tuple(shape), dtype, device)
        return node

    with graph.inserting_before(outer):
        weight = info(graph.call_function(torch.mm, (w2, w1)), (n, k))
        if b1 is not None:   # W2 (W1 x + b1) + b2 = (W2 W1) x + (W2 b1 + b2)
            bias = info(graph.call_function(F.linear, (b1, w2, b2)), (n,))
        else:
            bias = None if chain else b2
        result = info(graph.call_function(F.linear, (x, weight) if bias is None else (x, weight, bias)),
                      (x_info.shape[0], n))
        for gather in reversed(chain):   # the same reductions, now of n features instead of m
            result = info(graph.call_function(_GATHER_REDUCE, (result, *gather.args[1:]), dict(gather.kwargs)),
                          (tensor_info(gather).shape[0], n))
        if chain and b2 is not None:
            result = info(graph.call_function(torch.add, (result, b2)), out_info.shape)
    outer.replace_all_uses_with(result)
    for node in (outer, *chain, inner):
        graph.erase_node(node)
