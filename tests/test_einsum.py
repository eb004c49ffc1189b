"""The einsum family: a contraction per neuron becomes one einsum over the group, its batched operands and
output carrying one more subscript."""
import pytest
import torch
from torch import nn

from tests.helpers import report_matching_eager

NEIGHBORS = [[1, 2], [0], [0, 1, 3], [2], [0]]


class Bilinear(nn.Module):
    """Bilinear messages x_v B x_u, a shared matrix product and a batched contraction over an ellipsis."""

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
        self.B = nn.Parameter(torch.randn(3, 3, 3, dtype=torch.float64))

    def forward(self, x, planes):
        out = []
        for v, nbrs in enumerate(NEIGHBORS):
            h = torch.einsum("ij,j->i", self.W, x[v]) + torch.einsum("...i,i->...", planes[v], x[v])[:3]
            for u in nbrs:
                h = h + torch.einsum("i, ijk, k -> j", x[v], self.B, x[u])
            out.append(h)
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_einsums_per_neuron_group_and_match_eager(front_end):
    torch.manual_seed(0)
    inputs = torch.randn(len(NEIGHBORS), 3, dtype=torch.float64), torch.randn(len(NEIGHBORS), 4, 3, dtype=torch.float64)
    report = report_matching_eager(front_end, Bilinear(), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped
