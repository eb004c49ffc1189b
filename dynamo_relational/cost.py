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
overlap, which is what ranking alternatives needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


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
