"""Layout ops inside one neuron (expand, repeat, tile, flip, roll, transpose, swapaxes, permute, t, .T, .mT)
group as the same op on the batched operand, dimensions shifted by one, and match eager."""
import pytest
import torch
from torch import nn

from tests.test_frontend import report_matching_eager

ROWS = 12


class Layouts(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x, planes):
        out = []
        for v in range(ROWS):
            h, p = self.lin(x[v]), planes[v]   # a row of 3 and a 2 x 3 plane
            grid = h.unsqueeze(1).expand(3, 2) * h.unsqueeze(0).expand(2, -1).t()      # 3 x 2
            wide = h.expand((4, 3)) + h.expand_as(p.repeat(2, 1)) + torch.tile(h, (4, 1))   # 4 x 3
            moved = (p.flip(1) + torch.flip(p, [0, 1]) + p.roll(1) + torch.roll(p, 1, 1) + p.roll((1, 2), (0, 1))
                     + p.transpose(0, 1).t() + torch.swapaxes(p, 0, 1).T + p.permute(1, 0).permute((1, 0))
                     + p.mT.mT)   # 2 x 3
            out.append(torch.cat([grid.flatten(), wide.sum(0), moved.flatten(), h.repeat(2), h.flip(0), h.t()]))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_layout_ops_group_and_match_eager(front_end):
    torch.manual_seed(0)
    inputs = torch.randn(ROWS, 3, dtype=torch.float64), torch.randn(ROWS, 2, 3, dtype=torch.float64)
    report = report_matching_eager(front_end, Layouts(), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped   # (.T is a getattr call)
    assert report.nodes_after < report.nodes_before / 4
