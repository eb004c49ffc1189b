"""Linear layout: run a tall, narrow ``linear`` as the transposed product where that is measured faster.

Rewrites ``linear(x, W)`` (``x`` of shape ``[M, K]``, ``W`` of ``[N, K]``) into
``mm(W, x.t()).t()``, and ``linear(x, W, b)`` into
``addmm(b[:, None], W, x.t()).t()``: the same products and sums, computed as
``(W x^T)^T``. The result is a transposed view. It stays one where every
consumer takes any layout (``cat``, ``stack``, the input of another
``linear``, or elementwise ops whose own consumers do); otherwise
``.contiguous()`` follows, and is timed with it.

Why: the grouped graph of a message-passing layer multiplies thousands of
rows by one small weight. CPU BLAS kernels for such an ``[M, K] x [K, N]``
product can be several times slower than for the transposed problem (MKL,
one thread, N = 10: 4-12x for K = 7..64, M = 3,000..30,000), while for other
widths the plain call wins; no rule on the shape predicts it. So the pass
times both forms, forward and forward+backward, on random data of each
linear's shape (once per shape and process, rows rounded up to a power of two) and rewrites where the
transposed form takes at most ``1 - MARGIN`` of the plain one's time. The
measurements are in the report (``stats["linear_layout"]``, printed by
``explain()``).

Legal always: the values are the same up to floating-point summation order;
only the memory layout differs, and a consumer that needs rows in place gets
a contiguous copy. Runs with ``options.autotune`` on CPU graphs where grouping
vectorized something; elsewhere (CUDA's BLAS handles both layouts alike; a
graph as the user wrote it) it leaves the graph alone.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import unset_fake_temporarily

from dynamo_relational.autotune import median_ms
from dynamo_relational.ops import REGISTRY, TensorInfo, tensor_info
from dynamo_relational.ops.elementwise import ELEMENTWISE
from dynamo_relational.ops.matmul import linear_args

from .context import PassContext

#: the transposed form must save at least this fraction of the plain form's time
MARGIN = 0.1
#: products smaller than this many multiply-adds are not worth timing
MIN_WORK = 1 << 14
#: rounds per measurement (each a forward and a forward+backward of both forms)
ROUNDS = 5

_LAYOUT_FREE = {torch.cat, torch.stack}
#: (M, K, N, bias, x needs grad, made contiguous, dtype) -> (plain ms, transposed ms)
_MEASURED: dict[tuple, tuple[float, float]] = {}


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    # a graph where nothing was vectorized is the model's own: its linears stay as written, and its compiled
    # graph does not depend on timings
    if not ctx.options.autotune or not ctx.stats.get("vectorized_groups"):
        return gm
    choices = []
    for node in list(gm.graph.nodes):
        shapes = _candidate(node)
        if shapes is None:
            continue
        x, weight, bias = linear_args(node)
        info = tensor_info(node)
        contiguous = not _layout_free(node)
        x_grad = x.op not in ("placeholder", "get_attr")   # inputs and constants need no gradient
        m, k, n = shapes
        # rows rounded up to a power of two: one measurement serves similar sizes, so the next
        # grounding (another batch) makes the same choice and can share compiled code
        key = (1 << (m - 1).bit_length(), k, n, bias is not None, x_grad, contiguous, info.dtype)
        plain, transposed = _MEASURED.get(key) or _MEASURED.setdefault(key, _measure(*key))
        chosen = transposed <= (1 - MARGIN) * plain
        choices.append(dict(node=node.name, shape="x".join(map(str, shapes)), plain_ms=round(plain, 4),
                            transposed_ms=round(transposed, 4), layout="transposed" if chosen else "plain"))
        if chosen:
            _rewrite(gm.graph, node, x, weight, bias, contiguous, info)
    ctx.stats["linear_layout"] = choices
    return gm


def _candidate(node: fx.Node) -> tuple[int, int, int] | None:
    """``(M, K, N)`` of a 2-D ``linear`` on a CPU floating tensor worth timing, else None."""
    linear, out = linear_args(node), tensor_info(node)
    if linear is None or not linear.on_rows() or out is None or out.device.type != "cpu" \
            or not out.dtype.is_floating_point:
        return None
    (m, k), (n, _) = tensor_info(linear.x).shape, tensor_info(linear.weight).shape
    return (m, k, n) if m * k * n >= MIN_WORK else None


def _layout_free(node: fx.Node, depth: int = 0) -> bool:
    """Whether every consumer of ``node`` takes its value in any memory layout."""
    for user in node.users:
        if user.op == "call_function" and user.target in _LAYOUT_FREE:
            continue
        linear = linear_args(user)
        if linear is not None and linear.x is node and linear.weight is not node and linear.bias is not node:
            continue
        if (depth < 4 and user.op in ("call_function", "call_method") and REGISTRY.family_of(user) is ELEMENTWISE
                and user.kwargs.get("inplace") is not True and _layout_free(user, depth + 1)):
            continue
        return False
    return True


def _transposed(x, weight, bias):
    if bias is None:
        return torch.mm(weight, x.t()).t()
    return torch.addmm(bias.unsqueeze(1), weight, x.t()).t()


def _measure(m: int, k: int, n: int, has_bias: bool, x_grad: bool, contiguous: bool,
             dtype: torch.dtype) -> tuple[float, float]:
    """Median ms of (forward + forward+backward) of the plain and the transposed form."""
    def transposed():
        out = _transposed(x, weight, bias)
        return out.contiguous() if contiguous else out

    def plain():
        return F.linear(x, weight, bias)

    def both(form):
        with torch.no_grad():
            form()
        with torch.enable_grad():   # (the graph may be compiled under no_grad, an inference call)
            form().backward(grad)

    own = torch.Generator().manual_seed(0)   # not the default one: compiling leaves the user's random stream alone
    with unset_fake_temporarily():   # real tensors even when called inside TorchDynamo's compilation
        x = torch.randn(m, k, dtype=dtype, generator=own).requires_grad_(x_grad)
        weight = torch.randn(n, k, dtype=dtype, generator=own).requires_grad_()
        bias = torch.randn(n, dtype=dtype, generator=own).requires_grad_() if has_bias else None
        grad = torch.randn(m, n, dtype=dtype, generator=own)
        times = median_ms({"plain": lambda: both(plain), "transposed": lambda: both(transposed)}, ROUNDS)
    return times["plain"], times["transposed"]


def _rewrite(graph: fx.Graph, node: fx.Node, x: fx.Node, weight: fx.Node, bias: Any, contiguous: bool,
             info: TensorInfo) -> None:
    m, n = info.shape
    with graph.inserting_before(node):
        x_t = _with_info(graph.call_method("t", (x,)), tuple(reversed(tensor_info(x).shape)), info)
        if bias is None:
            product = graph.call_function(torch.mm, (weight, x_t))
        else:
            column = _with_info(graph.call_method("unsqueeze", (bias, 1)), (n, 1), info)
            product = graph.call_function(torch.addmm, (column, weight, x_t))
        out = _with_info(graph.call_method("t", (_with_info(product, (n, m), info),)), (m, n), info)
        if contiguous:
            out = _with_info(graph.call_method("contiguous", (out,)), (m, n), info)
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def _with_info(node: fx.Node, shape: tuple[int, ...], like: TensorInfo) -> fx.Node:
    node.meta["rel_info"] = TensorInfo(shape, like.dtype, like.device)
    return node
