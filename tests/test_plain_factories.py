"""plain_factories: ``x.new_zeros(...)`` and its kin read only ``x``'s dtype and device, and become the plain
factories, which read no value; compiled equal to eager, dtypes included."""
import pytest
import torch
from torch import nn

from tests.helpers import ZeroStartedSums, assert_rows_batch_as_eager, report_matching_eager


class NewTensors(nn.Module):
    """Per row: states made with every ``new_*`` form, sizes given unpacked, as a tuple and with dtypes."""

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            zero = x.new_zeros(1, x.shape[1])
            one = x.new_ones((1, x.shape[1]))
            half = x.new_full((1, x.shape[1]), 0.5)
            count = x.new_ones(1, x.shape[1], dtype=torch.int32)   # its own dtype wins
            blank = x.new(1, x.shape[1]).fill_(2.)                  # new_full, made so by the in-place pass
            data = x.new_tensor([[1, 2, 3]])                        # x's dtype, not the ints'
            out.append((x[v] + zero + one) * half + count + blank + x.new_empty(1, x.shape[1]).zero_() + data)
        return torch.cat(out)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_new_factories_read_no_value_and_match_eager(front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, NewTensors(), torch.randn(4, 3, dtype=torch.float64), inductor=False)
    assert report.stats["plain_factories"] >= 5 * 4
    assert not report.ungrouped, report.ungrouped


def test_a_sample_making_a_tensor_with_new_tensor_batches():
    """``x.new_tensor(data)`` read all of ``x``, a sample's input, which a union cannot split into rows."""
    assert_rows_batch_as_eager(NewTensors())


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_like_factories_read_no_value_and_match_eager(front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, ZeroStartedSums(), torch.randn(4, 3, dtype=torch.float64),
                                   inductor=False)
    assert report.stats["plain_factories"] >= 4 * 4
    assert not report.ungrouped, report.ungrouped


def test_sums_started_from_zeros_like_of_a_row_batch():
    """The last node gets no message: its ``zeros_like(h[v])`` read a row of one sample, which a union cannot
    restrict to a batch's samples."""
    assert_rows_batch_as_eager(ZeroStartedSums())
