"""The row_writes pass: rows written (``out = torch.zeros(n, d); out[v] = h``) or accumulated (``out[v] += m``) one
by one into a new tensor become one stack, so the graph is grouped instead of kept in order, through both
front-ends, and match eager."""
import pytest
import torch
from torch import nn

import dynamo_relational
from tests.helpers import report_matching_eager

N = 12
NEIGHBORS = [[(v + 1) % N, (v + 5) % N] for v in range(N)]


class RowWrites(nn.Module):
    """A layer that writes each neuron's row into a new tensor (rows ``rows``, in a shuffled order, one of
    them twice and one through a negative index); its readout reads the tensor after the last write."""

    def __init__(self, make: str, rows=range(N), dtype=torch.float64):
        super().__init__()
        self.make, self.rows, self.dtype = make, list(rows), dtype
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        make = {"zeros": lambda: torch.zeros(N, 4, dtype=x.dtype), "new_zeros": lambda: x.new_zeros(N, 4),
                "zeros_like": lambda: torch.zeros_like(x), "empty": lambda: torch.empty(N, 4, dtype=x.dtype),
                "legacy": lambda: torch.DoubleTensor(N, 4)}
        out = make[self.make]()
        order = self.rows[::2] + self.rows[1::2]
        for v in order + order[:1]:
            out[v - N if v == order[-1] else v] = torch.tanh(sum(self.lin(x[u]) for u in NEIGHBORS[v])).to(self.dtype)
        return torch.sigmoid(out) * 2


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("make", ["zeros", "new_zeros", "zeros_like", "empty"])
def test_rows_written_into_a_new_tensor_become_one_stack_and_match_eager(make, front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, RowWrites(make), torch.randn(N, 4, dtype=torch.float64))
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


def test_rows_written_into_a_legacy_constructors_tensor_become_one_stack_through_dynamo():
    """``torch.DoubleTensor(n, d)``, uninitialized as ``torch.empty``: every row written, the rows group."""
    torch.manual_seed(0)
    report = report_matching_eager("backend", RowWrites("legacy"), torch.randn(N, 4, dtype=torch.float64))
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 5


class VariableRows(RowWrites):
    def forward(self, x):
        out = torch.autograd.Variable(torch.zeros(N, 4, dtype=x.dtype))
        for v in range(N):
            out[v] = torch.tanh(self.lin(x[v]))
        return out


@pytest.mark.parametrize("model, message", [(RowWrites("legacy"), "legacy constructor such as torch.Tensor"),
                                            (VariableRows("zeros"), r"Variable\(t\) gives t back")])
def test_the_fast_front_end_names_legacy_tensor_code_it_cannot_trace(model, message):
    from dynamo_relational.frontend import FrontendError
    with pytest.raises(FrontendError, match=message):
        dynamo_relational.compile(model, torch.randn(N, 4, dtype=torch.float64))


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_rows_left_unwritten_keep_their_zeros(front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, RowWrites("zeros", rows=range(1, N, 2)),
                                   torch.randn(N, 4, dtype=torch.float64), inductor=False)
    assert report.stats["row_writes"] == 1 and report.nodes_after < report.nodes_before / 3


class Accumulated(nn.Module):
    """Messages added into their neuron's row (``out[v] += m``), some rows first set (``out[v] = h``), the
    first row left untouched; with ``make="empty"``, the additions land on uninitialized memory."""

    def __init__(self, make: str = "zeros"):
        super().__init__()
        self.make = make
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        out = torch.zeros(N, 4, dtype=x.dtype) if self.make == "zeros" else torch.empty(N, 4, dtype=x.dtype)
        for v in range(1, N):
            if v % 3 == 0:
                out[v] = torch.tanh(self.lin(x[v]))
            for u in NEIGHBORS[v]:
                out[v] += self.lin(x[u])
        return torch.relu(out)[1:]


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_rows_accumulated_into_a_new_tensor_become_sums_and_one_stack(front_end):
    torch.manual_seed(0)
    report = report_matching_eager(front_end, Accumulated(), torch.randn(N, 4, dtype=torch.float64))
    assert set(report.ungrouped) == {"no vectorizer for call_function index_put"}   # (row 0 keeps its zeros)
    assert report.stats["row_writes"] == 1 and report.nodes_after < report.nodes_before / 5


class ReadBetweenWrites(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        out, totals = torch.zeros(N, 4, dtype=x.dtype), []
        for v in range(N):
            out[v] = torch.tanh(self.lin(x[v]))
            totals.append(out.sum())   # reads the rows written so far
        return torch.stack(totals) + out.sum(1)


class ChangedAfterItsWrite(nn.Module):
    """A row's value changed in place after its write copied it: the tensor keeps the value from before."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        out, values = torch.zeros(N, 4, dtype=x.dtype), [self.lin(x[v]) + 1.0 for v in range(N)]
        for v in range(N):
            out[v] = values[v]
            if v == 3:
                values[0].mul_(2)
        return out + values[0]


class HalfWithoutGradients(nn.Module):
    """Half the rows written under ``torch.no_grad()``: they carry no gradient, the others do."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        out = torch.zeros(N, 4, dtype=x.dtype)
        for v in range(N):
            if v >= N // 2:   # (the last write too: the stack would run without gradients)
                with torch.no_grad():
                    out[v] = torch.tanh(self.lin(x[v]))
            else:
                out[v] = torch.tanh(self.lin(x[v]))
        return out * 3


class EvenRows(RowWrites):
    """Rows of uninitialized memory (``torch.empty``), half of them written: eager's others hold any values."""

    def __init__(self):
        super().__init__("empty", rows=range(0, N, 2))

    def forward(self, x):
        return super().forward(x)[0::2]


@pytest.mark.parametrize("make", [ReadBetweenWrites, lambda: RowWrites("zeros", dtype=torch.float32), EvenRows,
                                  ChangedAfterItsWrite, HalfWithoutGradients],
                         ids=["read_between", "cast", "empty", "changed_after", "half_without_gradients"])
@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_writes_it_cannot_prove_to_be_one_stack_keep_their_order_and_match_eager(make, front_end):
    """A read between the writes, a row of another dtype (setitem casts it), rows of uninitialized memory, a
    row's value changed after its write, rows written in two grad modes."""
    torch.manual_seed(0)
    model = make()
    cast = getattr(model, "dtype", None) == torch.float32
    report = report_matching_eager(front_end, model, torch.randn(N, 4, dtype=torch.float64), inductor=False,
                                   tolerance=dict(rtol=1e-6, atol=1e-7) if cast else None)
    assert report.stats["row_writes"] == 0
    assert any("in-place op" in reason or "mode" in reason for reason in report.ungrouped), report.ungrouped


def test_additions_to_uninitialized_memory_stay_as_they_are():
    """``torch.empty`` then ``out[v] += m``: eager adds to whatever the memory held (no value to compare)."""
    compiled = dynamo_relational.compile(Accumulated("empty"), torch.randn(N, 4, dtype=torch.float64), inductor=False)
    report = compiled.report.graphs[0]
    assert report.stats["row_writes"] == 0 and any("in-place op" in reason for reason in report.ungrouped)
