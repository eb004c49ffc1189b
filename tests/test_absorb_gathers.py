"""passes/absorb_gathers.py: a row gather after a reduction (through row-wise ops) becomes segments of the
reduction where that touches fewer elements, and the compiled model equals eager."""
import re

import pytest
import torch
from torch import nn

from examples.data import graph_batch
from examples.styles import STYLES
from tests.helpers import assert_fast_compile_matches_eager


class RepeatedSums(nn.Module):
    """Two long sums, each read out many times: absorbing the readout would reduce them again and again."""

    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        sums = [torch.relu(sum(x[u] for u in range(start, start + 40)) + self.bias) for start in (0, 40)]
        return torch.stack([sums[i % 2] for i in range(60)])


def _absorbed(compiled) -> int:
    return compiled.report.graphs[0].stats["gathers_absorbed"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_copy_of_a_shared_row_becomes_empty_segments(dtype):
    """AccumulatorGCN: the nodes without in-neighbours share one ``tanh(bias)`` row that a final gather
    copied out; absorbed, the reduction has one (possibly empty) segment per node and no gather follows."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=6, dtype=dtype)
    model = STYLES["accumulator"](batch).to(dtype)
    compiled = assert_fast_compile_matches_eager(model, batch.x, autotune=False)
    assert _absorbed(compiled) == 1


def test_a_readout_that_repeats_long_segments_keeps_its_gather():
    torch.manual_seed(0)
    compiled = assert_fast_compile_matches_eager(RepeatedSums(5).double(), torch.randn(80, 5, dtype=torch.float64),
                                                 autotune=False)
    assert _absorbed(compiled) == 0


def test_explain_prints_both_estimates_of_the_choice():
    import dynamo_relational

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2)
    text = str(dynamo_relational.explain(STYLES["accumulator"](batch), batch.x, inductor=False))
    # (traced by Dynamo, the zero accumulator stays a term of every sum, so absorbing may not pay here)
    found = re.search(r"absorb_gathers \S+ +(absorbed|kept) "
                      r"\(estimated unfused ([\d.e+-]+) us, absorbed ([\d.e+-]+) us\)", text)
    assert found, text
    choice, unfused, absorbed = found.group(1), float(found.group(2)), float(found.group(3))
    assert (choice == "absorbed") == (absorbed < unfused) or unfused == absorbed
