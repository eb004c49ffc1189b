"""Parts of (values, indices) pairs (``max``/``min`` along a dimension, a stable ``sort``) become ops of
their own that group, with eager's gradients where values tie (``passes/values_indices.py``)."""
import pytest
import torch
from torch import nn

from tests.helpers import (POOLING_NEIGHBORS as NEIGHBORS, Pooling, assert_fast_compile_matches_eager,
                           report_matching_eager)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_values_and_indices_group_and_match_eager_with_ties(front_end):
    torch.manual_seed(0)
    x = torch.randn(len(NEIGHBORS), 4, dtype=torch.float64)
    report = report_matching_eager(front_end, Pooling(), x, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 4


def test_values_and_indices_through_inductor_match_eager():
    torch.manual_seed(0)
    assert_fast_compile_matches_eager(Pooling(), torch.randn(len(NEIGHBORS), 4, dtype=torch.float64))


def test_an_unstable_sort_and_topk_stay_as_they_are():
    """They order ties as their kernel happens to (on CUDA, differently for a batch than for one
    neuron's value): batching could change the indices."""
    class Unstable(nn.Module):
        def forward(self, x):
            return torch.stack([x[v].sort(descending=True).values + torch.topk(x[v], 4)[1] for v in range(10)])

    torch.manual_seed(0)
    report = report_matching_eager("fast", Unstable(), torch.randn(10, 4, dtype=torch.float64), inductor=False)
    assert report.stats["values_indices"] == 0


def test_a_max_of_two_tensors_and_a_max_over_everything_are_not_pairs():
    class Plain(nn.Module):
        def forward(self, x):
            return torch.stack([torch.max(x[v], x[(v + 1) % 10]) + x[v].max() + x.max(0)[0] for v in range(10)])

    torch.manual_seed(0)
    report = report_matching_eager("fast", Plain(), torch.randn(10, 4, dtype=torch.float64), inductor=False)
    assert report.stats["values_indices"] == 10   # x.max(0)[0], once per neuron (before CSE merges them)


def test_a_part_read_after_an_in_place_write_has_the_value_from_before_it():
    """The parts are computed where the op ran, not where they are read: ``h.add_(1)`` between them
    (an in-place write, so the graph keeps its order) must not change the maximum."""
    class WriteBetween(nn.Module):
        def forward(self, x):
            out = []
            for v in range(len(NEIGHBORS)):
                h = x[v] * 2
                pair = h.max(0)
                h.add_(1)
                out.append(pair[0] + h + pair.indices)
            return torch.stack(out)

    torch.manual_seed(0)
    for front_end in ("backend", "fast"):
        report_matching_eager(front_end, WriteBetween(), torch.randn(len(NEIGHBORS), 4, dtype=torch.float64),
                              inductor=False)
