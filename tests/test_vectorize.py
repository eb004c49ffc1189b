"""vectorize: which groups become one vectorized node. A group too small to vectorize for its own sake, of
stacks or sums over rows of groups, is one gather where that copies at most twice the rows it reads, or
where gathering from each source first saves reading many rows one by one."""
import operator

import torch
from torch import nn

from tests.helpers import Recurrent, assert_fast_compile_matches_eager

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


class LoneNeuron(nn.Module):
    """Neuron 0 has no in-neighbours: its output is its own scaled message, one row of the group of all
    edges' messages, beside the group of the other neurons' sums."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x):
        out = [self.lin(x[0]) / 2.0]
        for v in range(1, ROWS):
            out.append(sum(self.lin(x[u]) / (u + v + 1) ** 0.5 for u in range(ROWS) if u != v))
        return torch.stack(out)


def test_a_readout_of_a_group_and_one_row_of_a_large_group_gathers_the_rows_it_reads():
    """Concatenating both groups would copy every edge's message to read one of them; the stack instead
    gathers that row from its group and the sums from theirs, rather than reading all rows one by one."""
    torch.manual_seed(0)
    compiled = assert_fast_compile_matches_eager(LoneNeuron(), torch.randn(ROWS, 3, dtype=torch.float64),
                                                 inductor=False)
    row_reads = [n for n in compiled.graph.graph.nodes if n.target is operator.getitem and type(n.args[1]) is int]
    assert not row_reads and torch.stack not in _targets(compiled)
