"""The torch-scatter provider of ``segment_reduce`` (``options["segment_provider"] = "torch_scatter"``).

It must give what the default ATen provider gives (values, gradients, empty
segments, NaN and infinities), run to run identically, and reach the kernel
of a compiled graph. The tests that run it skip when torch-scatter is not
installed (CI does not install it); the error for a missing package is tested
everywhere, with the package hidden.
"""
import sys

import pytest
import torch

import dynamo_relational
from dynamo_relational.errors import OptionsError
from dynamo_relational.kernels.segment import SEGMENT_PROVIDERS, csr_offsets, segment_reduce
from dynamo_relational.options import Options
from examples.data import graph_batch
from examples.styles import EdgeConcat
from tests.helpers import assert_compiled_matches_eager

REDUCTIONS = ("sum", "mean", "amax", "amin")
# empty segments first, in the middle and last; a single row; a longer run
COUNTS = [0, 3, 1, 0, 4, 2, 7, 0]


@pytest.fixture
def scatter_calls(monkeypatch):
    """torch_scatter (skipping without it), its ``segment_csr`` counting calls: a list of the reductions."""
    torch_scatter = pytest.importorskip("torch_scatter")
    calls = []
    real = torch_scatter.segment_csr

    def spy(src, indptr, *args, **kwargs):
        calls.append(kwargs.get("reduce", args[-1] if args else "sum"))
        return real(src, indptr, *args, **kwargs)

    monkeypatch.setattr(torch_scatter, "segment_csr", spy)
    return calls


def _hide_torch_scatter(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_scatter", None)   # `import torch_scatter` raises ImportError


# --------------------------------------------------------------------------- without torch-scatter

def test_missing_package_is_an_options_error_naming_the_option_and_install(monkeypatch):
    _hide_torch_scatter(monkeypatch)
    install = r"segment_provider.*pip install --no-build-isolation torch-scatter.*\[scatter\]"
    with pytest.raises(OptionsError, match=install):
        Options.from_mapping({"segment_provider": "torch_scatter"})
    with pytest.raises(OptionsError, match=r"segment_provider.*pip install .*torch-scatter"):
        dynamo_relational.compile(torch.nn.Linear(2, 2), torch.randn(3, 2), segment_provider="torch_scatter")


def test_missing_package_at_run_time_is_the_same_error(monkeypatch):
    """A graph that names the provider (compiled where it was installed) fails clearly without it."""
    _hide_torch_scatter(monkeypatch)
    with pytest.raises(OptionsError, match=r"segment_provider.*pip install .*torch-scatter"):
        segment_reduce(torch.randn(4, 2), csr_offsets([1, 3]), "amax", "torch_scatter")


def test_default_provider_is_aten_and_needs_no_package(monkeypatch):
    _hide_torch_scatter(monkeypatch)
    assert Options().segment_provider == "aten" == SEGMENT_PROVIDERS[0]
    assert Options.from_mapping({"segment_provider": "aten"}).segment_provider == "aten"
    out = segment_reduce(torch.ones(4, 2), csr_offsets([1, 3]), "sum")
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0], [3.0, 3.0]]))


def test_unknown_provider_is_named():
    with pytest.raises(OptionsError, match="segment_provider.*'aten', 'torch_scatter'"):
        Options.from_mapping({"segment_provider": "scatter"})
    with pytest.raises(ValueError, match="provider must be one of"):
        segment_reduce(torch.ones(2, 2), csr_offsets([2]), "sum", "scatter")


# --------------------------------------------------------------------------- with torch-scatter

def _both(data: torch.Tensor, counts: list[int], reduce: str):
    """Output and gradient of ``data`` under each provider, for the same upstream gradient."""
    offsets = csr_offsets(counts)
    results = []
    torch.manual_seed(1)
    weights = torch.randn((len(counts), *data.shape[1:]), dtype=data.dtype)
    for provider in SEGMENT_PROVIDERS:
        leaf = data.detach().clone().requires_grad_()
        out = segment_reduce(leaf, offsets, reduce, provider)
        (grad,) = torch.autograd.grad(out, leaf, weights)
        results.append((out.detach(), grad))
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("shape", [(5,), (2, 3)], ids=["2d", "3d"])
def test_provider_matches_aten_with_empty_segments(scatter_calls, reduce, dtype, shape):
    torch.manual_seed(0)
    data = torch.randn(sum(COUNTS), *shape, dtype=dtype)
    (aten_out, aten_grad), (scatter_out, scatter_grad) = _both(data, COUNTS, reduce)
    assert scatter_calls == [{"amax": "max", "amin": "min"}.get(reduce, reduce)] + (
        ["sum"] if reduce in ("amax", "amin") else [])   # forward; the tie count of max/min's backward
    torch.testing.assert_close(scatter_out, aten_out, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(scatter_grad, aten_grad, rtol=0, atol=0)
    empty = torch.tensor(COUNTS) == 0
    expected_empty = {"sum": 0.0, "mean": float("nan"), "amax": float("-inf"), "amin": float("inf")}[reduce]
    torch.testing.assert_close(scatter_out[empty], torch.full_like(scatter_out[empty], expected_empty),
                               equal_nan=True)


@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_ties_split_the_gradient_as_aten(scatter_calls, reduce):
    data = torch.tensor([[1.0], [1.0], [0.5], [2.0], [2.0], [2.0]], dtype=torch.float64)
    data = data if reduce == "amax" else -data
    (aten_out, aten_grad), (scatter_out, scatter_grad) = _both(data, [3, 3], reduce)
    torch.testing.assert_close(scatter_out, aten_out)
    torch.testing.assert_close(scatter_grad, aten_grad)
    assert scatter_calls


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_nan_and_infinities_match_aten(scatter_calls, reduce):
    """torch-scatter's max/min skip NaN and start from the finite extremes; the provider maps that back."""
    inf = float("inf")
    data = torch.tensor([[1.0, float("nan")], [2.0, 3.0],      # NaN in a segment
                         [-inf, inf], [-inf, inf],             # only -inf / +inf
                         [torch.finfo(torch.float32).min, 0.0]], dtype=torch.float32)
    (aten_out, aten_grad), (scatter_out, scatter_grad) = _both(data, [2, 2, 1], reduce)
    torch.testing.assert_close(scatter_out, aten_out, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(scatter_grad, aten_grad, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_no_rows_at_all_matches_aten(scatter_calls, reduce):
    (aten_out, _), (scatter_out, _) = _both(torch.empty(0, 3, dtype=torch.float64), [0, 0], reduce)
    torch.testing.assert_close(scatter_out, aten_out, rtol=0, atol=0, equal_nan=True)


def test_other_dtypes_use_aten(scatter_calls):
    data = torch.randn(6, 3).to(torch.bfloat16)
    offsets = csr_offsets([2, 0, 4])
    torch.testing.assert_close(segment_reduce(data, offsets, "amax", "torch_scatter"),
                               segment_reduce(data, offsets, "amax"))
    assert scatter_calls == []


@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_run_to_run_deterministic(scatter_calls, reduce):
    torch.manual_seed(0)
    counts = torch.randint(0, 9, (20_000,)).tolist()
    data = torch.randn(sum(counts), 16)
    offsets = csr_offsets(counts)
    first = segment_reduce(data, offsets, reduce, "torch_scatter")
    for _ in range(4):
        assert torch.equal(segment_reduce(data, offsets, reduce, "torch_scatter").nan_to_num(), first.nan_to_num())


def test_opcheck_with_provider(scatter_calls):
    data = torch.randn(6, 2, requires_grad=True)
    for reduce in REDUCTIONS:
        torch.library.opcheck(torch.ops.dynamo_relational.segment_reduce.default,
                              (data, csr_offsets([2, 3, 1]), reduce, "torch_scatter"))


def _segment_calls(report) -> list[tuple]:
    target = torch.ops.dynamo_relational.segment_reduce.default
    return [n.args for g in report.graphs for n in g.graph_module.graph.nodes
            if n.op == "call_function" and n.target is target]


@pytest.mark.parametrize("inductor", [False, True], ids=["aten_graph", "inductor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_model_with_torch_scatter_matches_eager(scatter_calls, dtype, inductor):
    """EdgeConv-style max over a variable number of edges: the grouped graph's segment_reduce."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=dtype)
    model = EdgeConcat(batch).to(dtype)
    report = assert_compiled_matches_eager(model, batch.x, inductor=inductor, segment_provider="torch_scatter")
    calls = _segment_calls(report)
    assert calls and all(args[2] == "amax" and args[3] == "torch_scatter" for args in calls)
    assert "max" in scatter_calls          # the compiled graph ran torch-scatter's kernel
    assert report.graphs[0].stats["segment_provider"] == "torch_scatter"


def test_models_compiled_with_different_providers_run_side_by_side(scatter_calls):
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2)
    model = EdgeConcat(batch)
    with_aten = dynamo_relational.compile(model, batch.x, inductor=False)
    with_scatter = dynamo_relational.compile(model, batch.x, inductor=False, segment_provider="torch_scatter")
    expected = model(batch.x)
    torch.testing.assert_close(with_aten(batch.x), expected)
    assert scatter_calls == []
    torch.testing.assert_close(with_scatter(batch.x), expected)
    assert "max" in scatter_calls
    scatter_calls.clear()
    torch.testing.assert_close(with_aten(batch.x), expected)
    assert scatter_calls == []


def test_default_graph_does_not_name_a_provider():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    report = assert_compiled_matches_eager(EdgeConcat(batch).double(), batch.x, inductor=False)
    calls = _segment_calls(report)
    assert calls and all(len(args) == 3 for args in calls)
    assert "segment_provider" not in report.graphs[0].stats
