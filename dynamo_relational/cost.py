"""The cost model: floating-point operations plus bytes moved, as estimated seconds on a device.

Passes that choose between equivalent graphs without running them
(``fuse_linear``, ``absorb_gathers``) compare :class:`Cost` estimates of
the alternatives; ``explain()`` prints every such choice with both estimates.
Choices the model cannot predict are measured instead (``autotune``: the
executor and ``linear_layout``; MKL's speed on a tall, narrow product
depends on more than its FLOPs and bytes).

A device's rates come from a table, not from timing at compile time, so
that the compiled graph does not depend on how busy the machine is:

* CPU: 70 GFLOP/s per thread (a float32 ``256 x 256 x 256`` product, best
  of five, on this project's 2-core machine) and 30 GB/s (a 16 MB copy,
  read plus written), whatever the thread count;
* CUDA: 60 TFLOP/s (float32 without tensor cores, an H100's nominal rate)
  and 3 TB/s (an H100's device-to-device copy rate, as this workplace's
  machine notes record it).

Estimates are ``flops / flop_rate + bytes / byte_rate``: a roofline without
overlap, which is what ranking alternatives needs. :func:`graph_cost` sums
them over a whole vectorized graph (the forward pass; the backward of each
op does the same kind of work again, transposed), for the rewrite search
(``passes/rewrite_search.py``).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from .ops import tensor_info
from .ops.facts import is_cast, is_view
from .ops.matmul import linear_args, product_operands


@dataclass(frozen=True)
class Cost:
    flops: float = 0.0
    bytes: float = 0.0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def seconds(self, device: torch.device | str) -> float:
        flop_rate, byte_rate = rates(torch.device(device))
        return self.flops / flop_rate + self.bytes / byte_rate


def linear(rows: int, k: int, n: int, itemsize: int) -> Cost:
    """``[rows, k] @ [k, n]``."""
    return Cost(2.0 * rows * k * n, itemsize * (rows * k + k * n + rows * n))


def gather_reduce(entries: int, rows: int, width: int, itemsize: int) -> Cost:
    """Sum ``entries`` gathered rows of ``width`` into ``rows`` rows (reading a 4-byte index per entry)."""
    return Cost(float(entries * width), itemsize * (entries + rows) * width + 4.0 * entries)


def gather(rows: int, width: int, itemsize: int) -> Cost:
    """Copy ``rows`` indexed rows of ``width``."""
    return Cost(0.0, 2.0 * itemsize * rows * width + 4.0 * rows)


def elementwise(rows: int, width: int, itemsize: int) -> Cost:
    """One elementwise op over ``rows`` rows of ``width`` (read and written once)."""
    return Cost(float(rows * width), 2.0 * itemsize * rows * width)


#: (FLOP/s, bytes/s) per device type; the CPU's FLOP/s are per thread (see the module docstring)
RATES = {"cpu": (70e9, 30e9), "cuda": (60e12, 3e12)}


def rates(device: torch.device) -> tuple[float, float]:
    """(FLOP/s, bytes/s) of ``device`` in float32; devices not in :data:`RATES` are costed as a CPU."""
    flop_rate, byte_rate = RATES.get(device.type, RATES["cpu"])
    if device.type == "cpu":
        flop_rate *= torch.get_num_threads()
    return flop_rate, byte_rate


def node_cost(gm: fx.GraphModule, node: fx.Node) -> Cost:
    """The estimated forward cost of one node of a vectorized graph (zero for views and unknown shapes)."""
    from dynamo_relational.passes.gather_nodes import constant_value   # (passes import this module)

    out = tensor_info(node)
    if node.op not in ("call_function", "call_method") or out is None:
        return Cost()
    item, target = out.dtype.itemsize, node.target
    if target is operator.getitem or is_view(node) and not is_cast(node):
        return Cost()
    rows, width = (out.shape[0], math.prod(out.shape[1:])) if out.rank else (1, 1)
    name = getattr(target, "__name__", "")
    linear_call, product = linear_args(node), product_operands(node)
    if linear_call is not None:   # [rows, k] x [k, width]
        x, n = tensor_info(linear_call.x), out.shape[-1] if out.rank else 1
        return linear(out.numel // max(n, 1), x.shape[-1] if x is not None and x.rank else 1, n, item)
    if product is not None:
        a, b = map(tensor_info, product)
        k = a.shape[-1] if a is not None and a.rank else 1
        inputs = sum(i.numel for i in (a, b) if i is not None)
        return Cost(2.0 * out.numel * k, item * (inputs + out.numel))
    if name.startswith("gather_reduce"):
        csr = constant_value(gm, node.args[1])
        source = tensor_info(node.args[0])
        columns = source.shape[0] if source is not None and source.rank else 0
        entries = (csr.shape[0] - rows - columns - 2) // 2 if csr is not None else rows
        return gather_reduce(entries, rows, width, item)
    if name.startswith("gather_rows") or target is torch.index_select:
        return gather(rows, width, item)
    if name.startswith("segment_reduce"):
        data = tensor_info(node.args[0])
        read = data.numel if data is not None else out.numel
        return Cost(float(read), item * (read + out.numel))
    if target in (torch.cat, torch.stack):
        return Cost(0.0, 2.0 * item * out.numel)
    return elementwise(rows, width, item)


def graph_cost(gm: fx.GraphModule) -> Cost:
    """The estimated forward cost of a vectorized graph: the sum of :func:`node_cost` over its nodes."""
    return sum((node_cost(gm, node) for node in gm.graph.nodes), Cost())

