"""split_views: the pieces of ``chunk``, ``split`` and ``unbind`` become slices of the split tensor, which
group like any other neuron op (a split's tuple cannot be batched)."""
import pytest
import torch
from torch import nn

from tests.helpers import assert_fast_compile_matches_eager, report_matching_eager

ROWS, HIDDEN = 10, 3


class Gates(nn.Module):
    """An LSTM-like cell per neuron whose gates are pieces of one product, split several ways."""

    def __init__(self):
        super().__init__()
        self.gates = nn.Linear(HIDDEN, 4 * HIDDEN, dtype=torch.float64)

    def forward(self, x):
        out = []
        for v in range(ROWS):
            z = self.gates(x[v])
            i, f, o, u = z.chunk(4)
            a, b = torch.split(z, [HIDDEN, 3 * HIDDEN])
            first, *_ = z.view(4, HIDDEN).unbind(0)
            left, right = torch.chunk(z.view(2, 2 * HIDDEN), 2, dim=-1)
            c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f) * x[v]
            out.append(torch.sigmoid(o) * torch.tanh(c) + a * b.split(HIDDEN)[2] + first + (left * right).sum(0)[:3])
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_pieces_of_splits_group_and_match_eager(front_end):
    torch.manual_seed(0)
    x = torch.randn(ROWS, HIDDEN, dtype=torch.float64)
    report = report_matching_eager(front_end, Gates(), x, inductor=False)
    # every piece read is rewritten (the fast front-end unpacks all four pieces of `first, *_`)
    assert report.stats["split_views"] >= ROWS * (4 + 2 + 1 + 2 + 1)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


def test_a_split_whose_tuple_is_used_as_a_whole_stays_and_is_right():
    """``torch.cat(h.chunk(2)[::-1])`` reads the tuple itself: the split stays, and so does eager's value."""
    class Swap(nn.Module):
        def forward(self, x):
            return torch.stack([torch.cat(x[v].chunk(2)[::-1]) + x[v].unbind(0)[1] for v in range(ROWS)])

    torch.manual_seed(0)
    report = assert_fast_compile_matches_eager(Swap(), torch.randn(ROWS, 4, dtype=torch.float64)).report.graphs[0]
    assert report.stats["split_views"] == ROWS   # each unbind's piece; each chunk's tuple is read whole


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_narrow_becomes_a_slice_and_groups(front_end):
    class Narrowed(nn.Module):
        def forward(self, x, planes):
            return torch.stack([torch.cat([x[v].narrow(0, 1, 2), torch.narrow(planes[v], 1, -2, 2).flatten(),
                                           planes[v].narrow(-1, 0, 1).flatten()]) for v in range(x.shape[0])])

    torch.manual_seed(0)
    inputs = torch.randn(10, 4, dtype=torch.float64), torch.randn(10, 2, 3, dtype=torch.float64)
    report = report_matching_eager(front_end, Narrowed(), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5
