"""The linear_layout pass: a grouped ``linear`` becomes ``(W x^T)^T`` where its timing says so, the
compiled model equals eager either way, and it stays put when told, when slower, or when too small.

The decision is fed fixed timings (``_measure`` patched), so the tests do not depend on this
machine's BLAS; the real timing is exercised once, for its shape of result only.
"""
import pytest
import torch
from torch import nn

import dynamo_relational
from dynamo_relational.passes import linear_layout
from tests.helpers import assert_compiled_matches_eager


class RowsThenSum(nn.Module):
    """One ``nn.Linear`` per row (grouped into one linear of ``rows`` rows), then a sum per pair
    of rows: the sum reads rows in place, so the transposed result is made contiguous."""

    def __init__(self, rows: int, width: int = 16, bias: bool = True):
        super().__init__()
        self.rows = rows
        self.lin = nn.Linear(width, width, bias=bias)

    def forward(self, x):
        h = [torch.tanh(self.lin(x[i])) for i in range(self.rows)]
        return torch.stack([h[i] + h[(i + 1) % self.rows] for i in range(self.rows)])


class RowsThenLinear(nn.Module):
    """Linear, elementwise, linear: every consumer takes any layout until the final stack."""

    def __init__(self, rows: int, width: int = 16):
        super().__init__()
        self.rows = rows
        self.first = nn.Linear(width, width)
        self.second = nn.Linear(width, width, bias=False)

    def forward(self, x):
        return torch.stack([self.second(torch.relu(self.first(x[i]))) for i in range(self.rows)])


def _measured(plain: float, transposed: float):
    def measure(*key):
        return plain, transposed
    return measure


@pytest.fixture
def forced(monkeypatch):
    """Make the pass see the given timings, with nothing remembered from earlier compiles."""
    def force(plain: float, transposed: float):
        monkeypatch.setattr(linear_layout, "_MEASURED", {})
        monkeypatch.setattr(linear_layout, "_measure", _measured(plain, transposed))
    return force


def _choices(report):
    return [c for g in report.graphs for c in g.stats.get("linear_layout", [])]


def _targets(report):
    """Names of the ops in the grouped graphs, in order (``linear``, ``mm``, ``t``, ``contiguous``, ...)."""
    return [getattr(n.target, "__name__", str(n.target)) for g in report.graphs for n in g.graph_module.graph.nodes]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("model", [RowsThenSum(96), RowsThenSum(96, bias=False), RowsThenLinear(96)],
                         ids=["contiguous_copy", "no_bias", "layout_free_chain"])
def test_transposed_where_measured_faster_matches_eager(forced, model, dtype):
    forced(plain=1.0, transposed=0.5)
    model = model.to(dtype)
    report = assert_compiled_matches_eager(model, torch.randn(96, 16, dtype=dtype), inductor=False)
    choices = _choices(report)
    assert choices and all(c["layout"] == "transposed" for c in choices)
    targets = _targets(report)
    assert "linear" not in targets and ("mm" in targets or "addmm" in targets)


def test_contiguous_only_where_a_consumer_needs_rows_in_place(forced):
    forced(plain=1.0, transposed=0.5)
    free = dynamo_relational.explain(RowsThenLinear(96), torch.randn(96, 16), inductor=False, strict=True)
    copied = dynamo_relational.explain(RowsThenSum(96), torch.randn(96, 16), inductor=False, strict=True)
    # first linear -> relu -> second linear: no copy; the second's rows are reshaped into the output
    assert len(_choices(free)) == 2 and _targets(free).count("contiguous") == 1
    assert _targets(copied).count("contiguous") == 1


@pytest.mark.parametrize("timings, options", [((1.0, 0.95), {}), ((1.0, 0.5), {"autotune": False}),
                                              ((1.0, 0.5), {"disable": ("linear_layout",)})],
                         ids=["slower_than_margin", "autotune_off", "disabled"])
def test_plain_linear_stays(forced, timings, options):
    forced(*timings)
    report = assert_compiled_matches_eager(RowsThenSum(96), torch.randn(96, 16), inductor=False, **options)
    assert all(c["layout"] == "plain" for c in _choices(report))
    assert any("linear" in t for t in _targets(report))


def test_small_products_are_not_timed(forced):
    forced(plain=1.0, transposed=0.5)
    report = assert_compiled_matches_eager(RowsThenSum(8, width=4), torch.randn(8, 4), inductor=False)
    assert _choices(report) == []


def test_the_linears_of_a_graph_with_nothing_grouped_are_not_timed(forced):
    """An ordinary layer: its graph stays as the user wrote it, the same on every compile."""
    forced(plain=1.0, transposed=0.5)
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    report = assert_compiled_matches_eager(model, torch.randn(96, 16), inductor=False)
    assert _choices(report) == [] and report.graphs[0].vectorized_groups == 0


def test_real_timing_decides_and_matches_eager(monkeypatch):
    monkeypatch.setattr(linear_layout, "_MEASURED", {})
    report = assert_compiled_matches_eager(RowsThenSum(96), torch.randn(96, 16), inductor=False)
    (choice,) = _choices(report)
    assert choice["shape"] == "96x16x16" and choice["plain_ms"] > 0 and choice["transposed_ms"] > 0
    faster = choice["transposed_ms"] <= (1 - linear_layout.MARGIN) * choice["plain_ms"]
    assert choice["layout"] == ("transposed" if faster else "plain")
    assert list(linear_layout._MEASURED) == [(128, 16, 16, True, False, True, torch.float32)]   # rows rounded up


def test_timing_leaves_the_random_generator_alone(monkeypatch):
    monkeypatch.setattr(linear_layout, "_MEASURED", {})
    model, x = RowsThenSum(96), torch.randn(96, 16)
    before = torch.random.get_rng_state()
    compiled = dynamo_relational.compile(model, x, inductor=False)
    assert [c["shape"] for c in compiled.report.graphs[0].stats["linear_layout"]] == ["96x16x16"]   # timed
    assert torch.equal(torch.random.get_rng_state(), before)


def test_choices_are_printed_by_explain(forced):
    forced(plain=1.0, transposed=0.5)
    report = dynamo_relational.explain(RowsThenSum(96), torch.randn(96, 16), inductor=False, strict=True)
    assert "linear layout" in str(report) and "transposed" in str(report)


def test_a_graph_compiled_under_no_grad_is_timed_too(monkeypatch):
    """An inference call compiles under ``no_grad``; the measurement still times the backward."""
    monkeypatch.setattr(linear_layout, "_MEASURED", {})
    model, x = RowsThenSum(96), torch.randn(96, 16)
    with torch.no_grad():
        report = dynamo_relational.explain(model, x, inductor=False, strict=True)
        torch.testing.assert_close(report.compiled(x), model(x))
    (choice,) = _choices(report)
    assert choice["plain_ms"] > 0 and choice["transposed_ms"] > 0
