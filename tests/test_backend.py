"""The backend as users meet it: registration, options, fallback, in-place code."""
import logging
import subprocess
import sys

import pytest
import torch
from torch import nn

import dynamo_relational
from dynamo_relational import Options, OptionsError
from dynamo_relational.ops.aggregate import aggregate
from tests.helpers import assert_compiled_matches_eager, report_matching_eager


def test_backend_is_found_in_a_fresh_interpreter():
    code = ("import torch\n"
            "m = torch.nn.Linear(3, 2)\n"
            "x = torch.randn(4, 3)\n"
            "y = torch.compile(m, backend='relational', options={'inductor': False})(x)\n"
            "assert torch.allclose(y, m(x))\n"
            "import sys; assert 'torch' in sys.modules\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_unknown_option_is_a_clear_error():
    with pytest.raises(OptionsError, match="unknown option 'inductr'.*did you mean 'inductor'"):
        Options.from_mapping({"inductr": False})
    with pytest.raises(OptionsError, match="'min_group_size' must be >= 1"):
        Options.from_mapping({"min_group_size": 0})
    with pytest.raises(OptionsError, match="'scheduler'"):
        Options.from_mapping({"scheduler": "fastest"})


def test_unknown_option_reaches_the_user_through_torch_compile():
    compiled = torch.compile(nn.Linear(2, 2), backend="relational", options={"bogus": 1})
    with pytest.raises(Exception, match="unknown option 'bogus'"):
        compiled(torch.randn(1, 2))


def test_a_forward_compiled_again_for_each_samples_structure_points_to_batch(caplog):
    class PerTree(nn.Module):   # (a code object of its own: Dynamo's frame counts start here)
        def __init__(self):
            super().__init__()
            self.W = nn.Linear(3, 3)

        def forward(self, children, x):
            h = [None] * len(children)
            for v in reversed(range(len(children))):
                h[v] = torch.tanh(self.W(x[v]) + sum((h[c] for c in children[v]), torch.zeros(3)))
            return h[0]

    torch._dynamo.reset()
    model = PerTree()
    compiled = torch.compile(model, backend="relational", options={"inductor": False})
    trees = [[[1], []], [[1, 2], [], []], [[1], [2], []], [[1, 2, 3], [], [], []]]
    with caplog.at_level(logging.WARNING, logger="dynamo_relational"):
        for i, children in enumerate(trees):
            x = torch.randn(len(children), 3)
            torch.testing.assert_close(compiled(children, x), model(children, x))
            told = [r for r in caplog.records if "dynamo_relational.batch(model)" in r.getMessage()]
            assert len(told) == (i >= 2), (i, [r.getMessage() for r in caplog.records])
    assert "compiled frame" in told[0].getMessage() and " 3 times" in told[0].getMessage()


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_torch_compile_mode_applies_while_the_grouped_graph_compiles(front_end, monkeypatch):
    """``torch.compile(..., mode=...)`` reaches the backend (``Options.mode``): Inductor compiles the grouped
    graph with that mode's settings, and only then."""
    from torch._inductor import compile_fx as compile_fx_module, config

    real, max_autotune_seen = compile_fx_module.compile_fx, []

    def spy(*args, **kwargs):
        max_autotune_seen.append(config.max_autotune)
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", spy)
    torch.manual_seed(0)
    model, x = Mixed().double(), torch.randn(4, 5, dtype=torch.float64)
    if front_end == "backend":
        compiled = torch.compile(model, backend="relational", mode="max-autotune-no-cudagraphs")
    else:
        compiled = dynamo_relational.compile(model, x, mode="max-autotune-no-cudagraphs")
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-9, atol=1e-12)
    assert max_autotune_seen and all(max_autotune_seen) and not config.max_autotune


def test_unknown_mode_is_a_clear_error():
    with pytest.raises(OptionsError, match="option 'mode' must be one of 'default', 'reduce-overhead', "
                                           "'max-autotune', 'max-autotune-no-cudagraphs' or None, got 'fastest'"):
        Options.from_mapping({"mode": "fastest"})


class Mixed(nn.Module):
    """A standard encoder, scalar-granular message passing, a standard readout."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 8), nn.ReLU())
        self.W = nn.Parameter(torch.randn(8, 8) / 3)
        self.nbrs = [[1, 2], [0], [0, 1, 3], [2]]
        self.readout = nn.Linear(8, 1)

    def forward(self, x):
        h = self.encoder(x)
        rows = [torch.tanh(sum(self.W @ h[u] for u in nbrs)) for nbrs in self.nbrs]
        return self.readout(torch.stack(rows)).sum()


@pytest.mark.parametrize("model,inputs", [
    (nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3)), (torch.randn(4, 6),)),
    (nn.Sequential(nn.Conv2d(2, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)), (torch.randn(2, 2, 8, 8),)),
    (nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), (torch.randn(2, 5, 16),)),
    (Mixed(), (torch.randn(4, 5),)),
], ids=["mlp", "convnet", "transformer", "mixed"])
def test_non_relational_and_mixed_models_match_eager(model, inputs):
    model.eval()
    assert_compiled_matches_eager(model, *inputs, inductor=False)


def test_mlp_through_inductor_matches_plain_inductor():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 2))
    x = torch.randn(3, 6)
    ours = torch.compile(model, backend="relational")(x)
    torch._dynamo.reset()
    stock = torch.compile(model, backend="inductor")(x)
    torch.testing.assert_close(ours, stock)


class InPlace(nn.Module):
    def __init__(self, accumulate_only: bool):
        super().__init__()
        self.W = nn.Parameter(torch.randn(3, 3))
        self.accumulate_only = accumulate_only

    def forward(self, x):
        out = []
        for v in range(4):
            acc = self.W @ x[v]
            acc += self.W @ x[(v + 1) % 4]
            if not self.accumulate_only:
                x[v].mul_(0.5)    # mutates the input seen by later neurons
            out.append(torch.relu(acc))
        return torch.stack(out)


def test_in_place_accumulation_is_grouped():
    report = assert_compiled_matches_eager(InPlace(True).double(), torch.randn(4, 3, dtype=torch.float64),
                                           inductor=False)
    assert report.nodes_after < report.nodes_before


def test_other_in_place_ops_leave_the_graph_ungrouped_with_a_reason():
    torch.manual_seed(0)
    model, x = InPlace(False), torch.randn(4, 3)
    with torch.no_grad():
        report = dynamo_relational.explain(model, x.clone(), inductor=False, strict=True)
        got = report.compiled(x.clone())
        want = model(x.clone())
    torch.testing.assert_close(got, want)
    assert any("in-place" in reason for reason in report.ungrouped)


class SumIntoZeros(nn.Module):
    """Rows summed by a fixed index into a new tensor of zeros, in place (``index_add_``), between per-node code."""

    def __init__(self):
        super().__init__()
        self.W = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
        self.register_buffer("index", torch.tensor([0, 1, 1, 3]))

    def forward(self, x):
        h = torch.stack([torch.tanh(self.W @ x[v]) for v in range(4)])
        sums = torch.zeros(4, 3, dtype=x.dtype).index_add_(0, self.index, h)
        return torch.stack([torch.relu(self.W @ sums[v]) for v in range(4)])


def test_a_sum_of_rows_into_new_zeros_in_place_is_the_plain_sum_and_the_rest_groups():
    report = assert_compiled_matches_eager(SumIntoZeros(), torch.randn(4, 3, dtype=torch.float64), inductor=False)
    assert report.nodes_after < report.nodes_before
    assert not any("in-place" in reason for reason in report.ungrouped), report.ungrouped


class SumAcrossAWrite(nn.Module):
    """``s = a + b``, then ``a`` is written in place, then ``r = s + c``: one sum tree around a write.
    ``t = a + 0`` (a sum of one term) is then written in place too: it is a new tensor, not ``a``."""

    def forward(self, x):
        a, b, c = x[0] * 1.5, x[1] * 2, x[2] * 3
        s = a + b
        a.add_(1)
        r = s + c
        t = a + 0
        t.div_(2.0)
        return torch.stack([r, a, t])


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("inductor", [False, True])
def test_a_sum_is_not_merged_across_an_in_place_write_of_its_terms(front_end, inductor):
    """Merged into one aggregate at the root, the sum read ``a`` after its write: ``r`` was off by 1,
    and ``a + 0`` became ``a`` itself, so ``t.div_`` halved ``a``."""
    report = report_matching_eager(front_end, SumAcrossAWrite(), torch.randn(3, 4, dtype=torch.float64),
                                   inductor=inductor)
    assert report.stats.get("aggregations", 0) == 0


def test_an_aggregate_of_one_term_is_a_new_tensor():
    term = torch.randn(3)
    assert aggregate([term], "sum") is not term and aggregate([term], "sum").data_ptr() != term.data_ptr()


def test_report_prints_a_table_and_graphs():
    report = assert_compiled_matches_eager(Mixed(), torch.randn(4, 5), inductor=False)
    text = str(report)
    for row in ("FX nodes before grouping", "FX nodes after grouping", "groups", "lower bound", "pass grouping"):
        assert row in text
    assert "def forward" in report.graphs[0].before and "def forward" in report.graphs[0].after
    assert report.lower_bound <= report.groups
