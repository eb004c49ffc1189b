"""Choose how to run a grouped graph by timing it: Inductor's code, or plain ATen kernels.

Inductor fuses the elementwise ops of a grouped graph, but on CPU a graph of
a few large gathers, products and segment reductions can run faster as the
plain ATen calls of the FX graph itself (DESIGN.md section 3 measured both
cases). :func:`fastest` times the forward pass of every candidate on the
example inputs, a few interleaved rounds each (under ``no_grad`` unless the
code was compiled for training), and returns the fastest. Only the forward is
timed: running a backward pass here would compile Inductor's backward graph
inside TorchDynamo's compilation, and the forward is where the two differ (the
backward graph is mostly the same extern kernels either way). On CUDA each
timed call waits for the device, so the time is the kernels', not the launches'.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable, Sequence

import torch

ROUNDS = 7


def fastest(candidates: dict[str, Callable], inputs: Sequence[Any],
            grad: bool = False) -> tuple[str, dict[str, float]]:
    """The name of the fastest candidate and every candidate's median forward time in milliseconds.
    ``grad`` runs the forwards with autograd recording (their outputs are dropped, never backpropagated)."""
    cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    with torch.set_grad_enabled(grad):
        medians = median_ms({name: functools.partial(_call, fn, inputs, cuda) for name, fn in candidates.items()})
    return min(medians, key=lambda name: medians[name]), medians


def _call(fn: Callable, inputs: Sequence[Any], cuda: bool) -> None:
    fn(*inputs)
    if cuda:
        torch.cuda.synchronize()


def median_ms(calls: dict[str, Callable[[], Any]], rounds: int = ROUNDS) -> dict[str, float]:
    """Median milliseconds of each zero-argument call over ``rounds`` rounds that call each once, in
    turn (so that they share the machine's noise), after one warm-up round (allocations, caches)."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(rounds + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}
