"""vectorize: which groups become one vectorized node. A group too small to vectorize for its own sake, of
stacks or sums over rows of groups, is one gather only where that does not copy more rows than it reads."""
import operator

import torch
from torch import nn

from tests.test_frontend import Recurrent, assert_fast_compile_matches_eager

ROWS = 12


def _targets(compiled):
    return [node.target for node in compiled.graph.graph.nodes if node.op == "call_function"]


class Readout(nn.Module):
    """One readout over the rows of two layers (two groups): concatenating them copies only the rows it sums."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(3, 3, dtype=torch.float64)
        self.second = nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x):
        h = [torch.tanh(self.first(x[v])) for v in range(ROWS)]
        g = [torch.sigmoid(self.second(h[v])) for v in range(ROWS)]
        return torch.stack(h + g).sum(0)


def test_a_recurrent_cell_reads_its_input_rows_without_concatenating_them():
    """``h = tanh(W h + x[t])``: each step's sum reads one row of the input, whose rows form a group."""
    torch.manual_seed(0)
    model = Recurrent(steps=40)
    compiled = assert_fast_compile_matches_eager(model, torch.randn(ROWS, 3, dtype=torch.float64), inductor=False)
    report = compiled.report.graphs[0]
    assert torch.cat not in _targets(compiled)   # (each step used to concatenate its cell's output and all of x)
    assert report.nodes_after <= report.nodes_before


def test_a_readout_over_all_rows_of_two_groups_is_one_gather():
    torch.manual_seed(0)
    compiled = assert_fast_compile_matches_eager(Readout(), torch.randn(ROWS, 3, dtype=torch.float64),
                                                 inductor=False)
    targets = _targets(compiled)
    assert targets.count(torch.ops.dynamo_relational.gather_reduce.default) == 1
    assert targets.count(operator.getitem) == 1   # the readout's own row; no term read one at a time
