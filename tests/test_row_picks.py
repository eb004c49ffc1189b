"""An element picked out of each row by an index per row, ``x[torch.arange(k), labels]``, becomes a gather
within each row by that row's index: the same values and gradients, and per-node parts that group."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers import report_matching_eager

NODES = 5


class PickedLabels(nn.Module):
    """Every node's log-probability of its label, picked out of the stacked scores by advanced indexing
    (``rows`` "arange": ``torch.arange(n)``; "range": a Python range; "reversed": the rows in the other
    order, left as it is)."""

    def __init__(self, rows: str):
        super().__init__()
        self.rows = rows
        self.lin = nn.Linear(4, 3, dtype=torch.float64)

    def forward(self, x, labels):
        logp = F.log_softmax(torch.stack([self.lin(x[v]) for v in range(NODES)]), 1)
        rows = torch.arange(NODES) if self.rows == "arange" else range(NODES) if self.rows == "range" else \
            torch.arange(NODES).flip(0)
        return -logp[rows, labels]


@pytest.mark.parametrize("rows", ["arange", "range", "reversed"])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_an_element_picked_from_each_row_by_its_index_becomes_a_gather(front_end, rows):
    torch.manual_seed(0)
    x, labels = torch.randn(NODES, 4, dtype=torch.float64), torch.randint(0, 3, (NODES,))
    report = report_matching_eager(front_end, PickedLabels(rows), x, labels, inductor=False)
    assert report.stats["rows_picked"] == (rows != "reversed")
