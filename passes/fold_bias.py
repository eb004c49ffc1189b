"""Fold a bias into its linear map: ``add(linear(x, W), b)`` -> ``linear(x, W, b)``.

Models often add a layer's bias after the aggregation (``acc + self.bias``,
``tanh(sum(msgs) + b)``). Once the aggregation has commuted with the linear map
(``commute_linear``), the grouped graph multiplies, then adds the bias in a
second pass over the ``[rows, features]`` result. BLAS's ``addmm`` starts from
the bias and accumulates the product into it, so the add disappears: one read
and one write of the result, and its allocation. ``linear_layout`` keeps the
bias in its transposed form too (``addmm(b[:, None], W, x^T)``).

Legal when the ``linear`` has no bias and no other user (its value
disappears), the add has no ``alpha`` and ``b`` is a 1-D tensor of the
linear's output width with the result's dtype and device, so that
broadcasting adds it to every row, as ``linear``'s bias is. Results differ
from eager only by rounding (the bias enters the sum first); the gradients
are the same maps (the bias's is the row sum of the output's).
"""
from __future__ import annotations


import torch.fx as fx
import torch.nn.functional as F

from dynamo_relational.ops import tensor_info
from dynamo_relational.ops.elementwise import ADDITIONS
from dynamo_relational.ops.matmul import LinearArgs, linear_args

from .context import PassContext



def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    folded = 0
    for node in list(gm.graph.nodes):
        match = _match(node)
        if match is None:
            continue
        product, linear, bias = match
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(F.linear, (linear.x, linear.weight, bias))
        fused.meta.update(node.meta)
        node.replace_all_uses_with(fused)
        gm.graph.erase_node(node)
        gm.graph.erase_node(product)
        folded += 1
    ctx.stats["fold_bias"] = folded
    return gm


def _match(node: fx.Node) -> tuple[fx.Node, LinearArgs, fx.Node] | None:
    """``(product, its operands, bias)`` of an ``add`` that the module docstring's conditions allow
    folding, else None."""
    if node.op not in ("call_function", "call_method") or node.target not in ADDITIONS or len(node.args) != 2 \
            or node.kwargs:
        return None
    for product, bias in (node.args, reversed(node.args)):
        linear = _bias_free_linear(product)
        # (``linear + linear`` has the linear as its own bias: not one to fold)
        if linear is not None and isinstance(bias, fx.Node) and bias is not product and _fits(bias, product, node):
            return product, linear, bias
    return None


def _bias_free_linear(node) -> LinearArgs | None:
    """The operands of ``linear(x, W)`` (or with ``bias=None``, as Dynamo records it) whose only user
    is the add, else None."""
    linear = linear_args(node)
    return linear if linear is not None and linear.bias is None and len(node.users) == 1 else None


def _fits(bias: fx.Node, linear: fx.Node, add: fx.Node) -> bool:
    """Whether ``bias`` is a bias for ``linear``: one entry per output feature, of its dtype and
    device, and the add's result is the linear's (``TensorInfo``s are interned: ``is`` compares them)."""
    b, out = tensor_info(bias), tensor_info(linear)
    return (b is not None and out is not None and out.rank >= 1 and tensor_info(add) is out
            and b.shape == (out.shape[-1],) and b.dtype == out.dtype and b.device == out.device)
