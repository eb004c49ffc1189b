"""Layout ops inside one neuron (expand, repeat, tile, flip, roll, transpose, swapaxes, permute, t, .T, .mT)
group as the same op on the batched operand, dimensions shifted by one, and match eager."""
import pytest
import torch

from tests.helpers import LAYOUT_ROWS as ROWS, Layouts, report_matching_eager

@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_layout_ops_group_and_match_eager(front_end):
    torch.manual_seed(0)
    inputs = torch.randn(ROWS, 3, dtype=torch.float64), torch.randn(ROWS, 2, 3, dtype=torch.float64)
    report = report_matching_eager(front_end, Layouts(), *inputs, inductor=False)
    assert not report.ungrouped, report.ungrouped   # (.T is a getattr call)
    assert report.nodes_after < report.nodes_before / 4
