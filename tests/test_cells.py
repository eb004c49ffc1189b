"""The cell family: ``nn.GRUCell`` and ``nn.RNNCell`` updates of one neuron (gated graph networks) run as one
cell call per group and match eager."""
import pytest
import torch
from torch import nn

from tests.helpers import assert_fast_compile_matches_eager, report_matching_eager

NEIGHBORS = [[1, 2], [0], [0, 1, 3], [2], [5], [4, 0], [7, 8, 9], [6], [1], [2, 3]]
WIDTH = 4


class GatedGraph(nn.Module):
    """Two GGNN steps (a GRU update from the summed messages), then an RNN cell started from zeros."""

    def __init__(self):
        super().__init__()
        self.message = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.gru = nn.GRUCell(WIDTH, WIDTH, dtype=torch.float64)
        self.rnn = nn.RNNCell(WIDTH, WIDTH, nonlinearity="relu", dtype=torch.float64)

    def forward(self, x):
        h = [x[v] for v in range(len(NEIGHBORS))]
        for _ in range(2):
            m = [sum(self.message(h[u]) for u in nbrs) for nbrs in NEIGHBORS]
            h = [self.gru(m[v], h[v]) for v in range(len(NEIGHBORS))]   # 1-d rows: GRUCell's unbatched form
        return torch.stack([self.rnn(h[v].unsqueeze(0))[0] for v in range(len(NEIGHBORS))])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_gru_and_rnn_cells_per_neuron_group_and_match_eager(front_end):
    torch.manual_seed(0)
    x = torch.randn(len(NEIGHBORS), WIDTH, dtype=torch.float64)
    report = report_matching_eager(front_end, GatedGraph(), x, inductor=False)
    assert not any("cell" in reason for reason in report.ungrouped), report.ungrouped   # (the zeros are one node)
    assert report.nodes_after < report.nodes_before / 4


def test_a_cell_per_neuron_with_its_own_weights_is_left_ungrouped_and_right():
    class OwnCells(nn.Module):
        def __init__(self):
            super().__init__()
            self.cells = nn.ModuleList(nn.GRUCell(WIDTH, WIDTH, dtype=torch.float64) for _ in range(3))

        def forward(self, x):
            return torch.stack([self.cells[v % 3](x[v], x[v - 1]) for v in range(len(NEIGHBORS))])

    torch.manual_seed(0)
    assert_fast_compile_matches_eager(OwnCells(), torch.randn(len(NEIGHBORS), WIDTH, dtype=torch.float64))
