"""Property tests over random per-graph programs that work on all of a sample's rows at once: layers over the
node-feature matrix, elementwise ops and joins of two values with a row per node, ops within each row, sums and
means of the rows of each node's in-neighbours by the graph's edge list (``index_add``), their mean, maximum or
minimum (``scatter_reduce_``), products by the graph's adjacency matrix, and a reduction over the rows or a loss
against per-node targets. ``batch`` runs each as one union over all samples'
rows, and equals eager: outputs and gradients, sample by sample."""
import os
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from tests.helpers import assert_shuffled_batches_match_eager

EXAMPLES = int(os.environ.get("RELATIONAL_FUZZ_EXAMPLES", "8"))
WIDTH = 3

_UNARY = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "neg": torch.neg}
_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}
_RESULTS = ["sum rows", "mean rows", "max rows", "sum", "mean", "mse", "cross entropy"]

_step = st.one_of(
    st.tuples(st.just("linear"), st.integers(0, 99)),
    st.tuples(st.just("unary"), st.sampled_from(sorted(_UNARY)), st.integers(0, 99)),
    st.tuples(st.just("binary"), st.sampled_from(sorted(_BINARY)), st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.just("join"), st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.just("mask"), st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.just("softmax"), st.integers(0, 99)),
    st.tuples(st.just("scaled by row sum"), st.integers(0, 99)),
    st.tuples(st.just("neighbour sum"), st.integers(0, 99)),
    st.tuples(st.just("neighbour mean"), st.sampled_from(["broadcast", "expand_as"]), st.integers(0, 99)),
    st.tuples(st.just("neighbour reduction"), st.sampled_from(["mean", "amax", "amin"]), st.integers(0, 99)),
    st.tuples(st.just("adjacency product"), st.integers(0, 99)),
)
programs = st.tuples(st.lists(_step, min_size=1, max_size=6), st.sampled_from(_RESULTS))


class RowsProgram(nn.Module):
    """``steps`` over the values ``[x, y]`` (each ``[nodes, WIDTH]``; a step's operands are indices modulo the
    values so far), then ``result`` of the last value (its labels: -100 for some nodes, but never all, which
    ``F.cross_entropy`` ignores)."""

    def __init__(self, steps: list, result: str):
        super().__init__()
        self.steps, self.result = steps, result
        self.linears = nn.ModuleList(nn.Linear(WIDTH, WIDTH, dtype=torch.float64) for _ in steps)
        self.joins = nn.ModuleList(nn.Linear(2 * WIDTH, WIDTH, dtype=torch.float64) for _ in steps)

    def forward(self, x, y, labels, edges):
        values = [x, y]
        src, dst = edges[:, 0], edges[:, 1]
        for k, (kind, *args) in enumerate(self.steps):
            pick = [values[a % len(values)] for a in args if isinstance(a, int)]
            if kind == "linear":
                out = self.linears[k](pick[0])
            elif kind == "unary":
                out = _UNARY[args[0]](pick[0])
            elif kind == "binary":
                out = _BINARY[args[0]](pick[0], pick[1])
            elif kind == "join":
                out = self.joins[k](torch.cat([pick[0], pick[1]], 1))
            elif kind == "mask":
                out = pick[0] * (pick[1] > 0)
            elif kind == "softmax":
                out = torch.softmax(pick[0], 1)
            elif kind == "neighbour sum":
                out = torch.zeros_like(pick[0]).index_add(0, dst, pick[0][src])
            elif kind == "neighbour mean":   # (PyG's mean: the sums divided by the in-degrees, at least 1)
                counts = torch.zeros(len(x), 1, dtype=x.dtype).index_add(0, dst, torch.ones(len(dst), 1, dtype=x.dtype))
                sums = torch.zeros_like(pick[0]).index_add(0, dst, pick[0][src])
                counts = counts.clamp(min=1)
                out = sums / (counts if args[0] == "broadcast" else counts.expand_as(sums))
            elif kind == "neighbour reduction":   # (PyG's mean, max and min of messages)
                messages = pick[0][src]
                out = messages.new_zeros(pick[0].shape).scatter_reduce_(
                    0, dst.view(-1, 1).expand_as(messages), messages, args[0], include_self=False)
            elif kind == "adjacency product":   # (a dense adjacency made from the edges, repeated edges counted)
                adjacency = torch.zeros(len(x), len(x), dtype=x.dtype).index_put_(
                    (dst, src), torch.ones(len(dst), dtype=x.dtype), accumulate=True)
                out = adjacency @ pick[0]
            else:
                out = pick[0] * pick[0].sum(1, keepdim=True)
            values.append(out)
        last = values[-1]
        return {"sum rows": lambda: last.sum(0), "mean rows": lambda: last.mean(0),
                "max rows": lambda: last.amax(0), "sum": lambda: last.sum(), "mean": lambda: last.mean(),
                "mse": lambda: F.mse_loss(last, y), "cross entropy": lambda: F.cross_entropy(last, labels),
                }[self.result]()


def _samples(seed: int) -> list[tuple]:
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(6):
        n = rng.randint(1, 5)
        labels = torch.randint(-1, WIDTH, (n,), generator=generator)
        labels[0] = labels[0].clamp(min=0)   # (a sample whose labels are all ignored has a NaN loss)
        samples.append((torch.randn(n, WIDTH, dtype=torch.float64, generator=generator),
                        torch.randn(n, WIDTH, dtype=torch.float64, generator=generator),
                        torch.where(labels >= 0, labels, -100),
                        torch.randint(0, n, (rng.randint(1, 2 * n), 2), generator=generator)))
    return samples


def _check(program, seed):
    steps, result = program
    torch.manual_seed(seed)
    assert_shuffled_batches_match_eager(RowsProgram(steps, result), _samples(seed), seed)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs, st.integers(0, 2 ** 16))
def test_random_programs_over_all_of_a_samples_rows_batch_as_eager(program, seed):
    _check(program, seed)


@pytest.mark.fuzz
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs, st.integers(0, 2 ** 16))
def test_three_hundred_random_programs_over_all_of_a_samples_rows_batch_as_eager(program, seed):
    _check(program, seed)
