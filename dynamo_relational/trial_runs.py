"""Runs of a graph made while compiling it leave no trace.

Compiling runs the grouped graph on the caller's real tensors: the executor
choice times its forward a few rounds (:mod:`dynamo_relational.autotune`),
and code shared across groundings is compiled by a first call
(:mod:`dynamo_relational.schemas`). A graph can change state: running
statistics that ``F.batch_norm`` updates, ``self.steps += 1`` on a buffer,
an in-place op on an input, draws from the random generators. Those runs
would advance that state once per run, unseen by the caller: BatchNorm's
running mean would be off after the first call. :func:`leaving_no_trace`
puts it back.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Sequence

import torch
from torch import nn


@contextlib.contextmanager
def leaving_no_trace(graph: nn.Module, inputs: Sequence[Any]) -> Iterator[None]:
    """Run ``graph`` on ``inputs`` inside as often as needed: on exit every tensor it can reach (its
    parameters and buffers, the tensor inputs) has its value from before again, and the default random
    generators (CPU, and each CUDA device in use) their state.

    Only tensors whose value changed are written back, so the others keep their version counters
    (an autograd graph the caller built from them stays valid). Costs one copy of those tensors.
    Sparse tensors (adjacency buffers, read by the graph's products) are left out: ``torch.equal``
    cannot compare them, and a dense copy of one could be larger than the machine."""
    reachable = {id(t): t for t in (*graph.parameters(), *graph.buffers(), *inputs)
                 if isinstance(t, torch.Tensor) and t.layout is torch.strided}
    saved = [(t, t.detach().clone()) for t in reachable.values()]
    with torch.random.fork_rng(devices=cuda_devices()):
        try:
            yield
        finally:
            with torch.no_grad():
                for tensor, before in saved:
                    if not torch.equal(tensor, before):
                        tensor.copy_(before)


def cuda_devices() -> list[int]:
    """The CUDA devices whose default generators may be drawn from: all of them once CUDA is in use."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
