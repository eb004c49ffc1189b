"""Choose how to run a grouped graph by timing it: Inductor's code, or plain ATen kernels.

Inductor fuses the elementwise ops of a grouped graph, but on CPU a graph of
a few large gathers, products and segment reductions can run faster as the
plain ATen calls of the FX graph itself (DESIGN.md section 3 measured both
cases). :func:`fastest` times the forward pass of every candidate on the
example inputs, a few interleaved rounds each (under ``no_grad`` unless the
code was compiled for training), and returns the fastest. Only the forward is
timed: running a backward pass here would compile Inductor's backward graph
inside TorchDynamo's compilation, and the forward is where the two differ (the
backward graph is mostly the same extern kernels either way).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch

ROUNDS = 7


def fastest(candidates: dict[str, Callable], inputs: Sequence[Any],
            grad: bool = False) -> tuple[str, dict[str, float]]:
    """The name of the fastest candidate and every candidate's median forward time in milliseconds.
    ``grad`` runs the forwards with autograd recording (their outputs are dropped, never backpropagated)."""
    times: dict[str, list[float]] = {name: [] for name in candidates}
    with torch.set_grad_enabled(grad):
        for round_ in range(ROUNDS + 1):
            for name, fn in candidates.items():
                start = time.perf_counter()
                fn(*inputs)
                if round_:  # the first round warms up (allocations, caches)
                    times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return min(medians, key=medians.get), medians
