"""lstm_cells: ``nn.LSTMCell`` per neuron becomes its gate arithmetic, which groups, and matches eager."""
import pytest
import torch
from torch import nn

from tests.helpers import assert_fast_compile_matches_eager, report_matching_eager

NEIGHBORS = [[1, 2], [0], [0, 1, 3], [2], [5], [4, 0], [7, 8, 9], [6], [1], [2, 3]]
WIDTH = 4


class GraphLSTM(nn.Module):
    """Two steps of an LSTM update per neuron from its summed messages, after a first from a zero state;
    each step passes the previous cell's output on whole, as its state."""

    def __init__(self, bias: bool = True):
        super().__init__()
        self.message = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.cell = nn.LSTMCell(WIDTH, WIDTH, bias=bias, dtype=torch.float64)

    def forward(self, x):
        h = [x[v] for v in range(len(NEIGHBORS))]
        state = [self.cell(h[v].unsqueeze(0)) for v in range(len(NEIGHBORS))]
        for _ in range(2):
            m = [sum(self.message(state[u][0][0]) for u in nbrs) for nbrs in NEIGHBORS]
            state = [self.cell(m[v].unsqueeze(0), state[v]) for v in range(len(NEIGHBORS))]
        return torch.stack([hy[0] + cy[0] for hy, cy in state])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_lstm_cells_per_neuron_group_and_match_eager(front_end, bias):
    torch.manual_seed(0)
    x = torch.randn(len(NEIGHBORS), WIDTH, dtype=torch.float64)
    report = report_matching_eager(front_end, GraphLSTM(bias), x, inductor=False)
    assert report.stats["lstm_cells"] == 3 * len(NEIGHBORS)
    assert not any("lstm" in reason or "indexes" in reason for reason in report.ungrouped), report.ungrouped
    assert report.nodes_after < report.nodes_before / 2


def test_lstm_cells_through_inductor_match_eager():
    torch.manual_seed(0)
    assert_fast_compile_matches_eager(GraphLSTM(), torch.randn(len(NEIGHBORS), WIDTH, dtype=torch.float64))
