"""Debug output as PyTorch users expect: logs from the environment, per-pass dumps, report tables,
graph drawing, and optimizer passes that fail without changing the result."""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import dynamo_relational
from dynamo_relational.passes import postpone_gathers
from tests.helpers import assert_compiled_matches_eager


class TwoHop(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.nbrs = [[1, 2], [0], [0, 1, 3], [2]]

    def forward(self, x):
        h = [torch.relu(sum(self.lin(x[u]) for u in nbrs)) for nbrs in self.nbrs]
        return torch.stack([torch.sigmoid(sum(h[u] for u in nbrs)) for nbrs in self.nbrs])


def test_dump_dir_writes_the_graph_after_every_pass_and_a_summary(tmp_path):
    report = assert_compiled_matches_eager(TwoHop().double(), torch.randn(4, 4, dtype=torch.float64),
                                           inductor=False, dump_dir=str(tmp_path))
    names = sorted(p.name for p in tmp_path.iterdir())
    for step in ("input", "aggregation", "grouping", "vectorize", "postpone_gathers", "cleanup"):
        assert any(n.endswith(f"_{step}.py") for n in names), (step, names)
    summary = next(p for p in tmp_path.iterdir() if p.name.endswith("_summary.txt")).read_text()
    assert "FX nodes after grouping" in summary
    assert "def forward" in (tmp_path / next(n for n in names if n.endswith("_vectorize.py"))).read_text()
    assert report.nodes_after < report.nodes_before


def test_report_lists_groups_with_signatures_and_every_ungrouped_node():
    class WithUnknownOp(TwoHop):
        def forward(self, x):
            return super().forward(torch.fft.fft(x).real)

    report = assert_compiled_matches_eager(WithUnknownOp().double(), torch.randn(4, 4, dtype=torch.float64),
                                           inductor=False)
    table = report.groups_table()
    assert "linear -> [4]" in table and "float64" in table
    assert "no vectorizer" in report.ungrouped_table() and "fft" in report.ungrouped_table()
    assert "nodes after vectorize" in str(report)


@pytest.mark.parametrize("variable, value", [("TORCH_LOGS", "+dynamo_relational"), ("DYNAMO_RELATIONAL_LOGS", "info")])
def test_logs_switch_on_from_the_environment_with_the_graphs_id(variable, value):
    code = ("import torch\n"   # the backend found through its entry point, the package imported by torch.compile
            "m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Tanh())\n"
            "torch.compile(m, backend='relational', options={'inductor': False})(torch.randn(2, 3))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "DYNAMO_RELATIONAL_LOGS")}
    env.update({variable: value, "PYTHONPATH": os.getcwd()})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if "relational:" in line]
    assert lines, out.stderr[-2000:]
    assert all("[0/0]" in line for line in lines), lines   # Dynamo's frame 0, first compilation


def test_bad_log_level_is_named():
    from dynamo_relational.logs import configure_from_env

    with pytest.raises(ValueError, match="DYNAMO_RELATIONAL_LOGS='loud'"):
        configure_from_env({"DYNAMO_RELATIONAL_LOGS": "loud"})


def test_a_failing_optimizer_pass_is_skipped_and_the_result_is_unchanged(monkeypatch):
    def broken(gm, ctx):
        for node in gm.graph.nodes:  # damage the graph, then fail: the backend must not keep it
            if node.op == "call_function":
                node.args = ()
                break
        raise RuntimeError("broken pass")

    import dynamo_relational.passes as passes

    pipeline = tuple(dataclasses.replace(p, run=broken) if p.name == "postpone_gathers" else p for p in passes.PIPELINE)
    monkeypatch.setattr(passes, "PIPELINE", pipeline)
    report = assert_compiled_matches_eager(TwoHop().double(), torch.randn(4, 4, dtype=torch.float64),
                                           inductor=False, strict=False)
    assert report.graphs[0].stats["skipped_passes"] == ["postpone_gathers"]
    assert postpone_gathers.run is not broken


def test_draw_writes_a_picture(tmp_path):
    pytest.importorskip("pydot")
    import shutil

    if shutil.which("dot") is None:
        pytest.skip("Graphviz 'dot' is not installed")
    report = dynamo_relational.explain(TwoHop(), torch.randn(4, 4), inductor=False)
    report.draw(str(tmp_path / "grouped.svg"))
    assert (tmp_path / "grouped.svg").stat().st_size > 0


@pytest.mark.parametrize("enabled", [True, False])
def test_long_compiles_show_a_progress_bar_over_their_steps(enabled, monkeypatch, capsys):
    from dynamo_relational import progress

    monkeypatch.setattr(progress, "DELAY", 0.0)   # every compile counts as long here
    model, x = TwoHop().double(), torch.randn(4, 4, dtype=torch.float64)
    compiled = dynamo_relational.compile(model, x, inductor=False, progress=enabled)
    torch.testing.assert_close(compiled(x), model(x))
    err = capsys.readouterr().err
    assert ("relational compile" in err and "cleanup" in err) == enabled
    assert err == "" or enabled


def test_strict_lints_the_graph_after_every_pass_and_names_the_pass(monkeypatch):
    def misordering(gm, ctx):   # returns normally, with a node that reads a value defined after it
        nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
        nodes[-1].append(nodes[0])
        return gm

    import dynamo_relational.passes as passes

    pipeline = tuple(dataclasses.replace(p, run=misordering) if p.name == "fold_bias" else p for p in passes.PIPELINE)
    monkeypatch.setattr(passes, "PIPELINE", pipeline)
    with pytest.raises(Exception, match="after pass fold_bias is malformed"):
        dynamo_relational.compile(TwoHop().double(), torch.randn(4, 4, dtype=torch.float64), inductor=False,
                                  strict=True)
