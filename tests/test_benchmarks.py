"""The benchmark suite (benchmarks/): PyG peers equal the scalar models; a tiny run of the
whole command writes the expected JSON and markdown; the compile cap kills a slow child.

Inductor is switched off for the relational systems here (``--options``), so
the smoke run compiles nothing with a C++ compiler and stays well under a minute.
"""
import json

import pytest
import torch

from benchmarks import run
from benchmarks.harness import OUTPUT_ATOL
from benchmarks.session import run_session
from benchmarks.workloads import Workload


@pytest.mark.parametrize("model", ["gcn", "sage", "gin", "gcn_acc"])
def test_pyg_peer_equals_scalar_model(model):
    built = Workload(model, "mutagenesis", 4).build()
    nbrs = built.model.adj.values() if model == "gcn_acc" else built.model.in_nbrs
    assert any(not n for n in nbrs), "the batch should have a node without in-neighbours"
    torch.testing.assert_close(built.peer(built.x), built.model(built.x), rtol=0, atol=OUTPUT_ATOL)
    # the weights are copies, not shared: training one model leaves the other alone
    assert not {id(p) for p in built.peer.parameters()} & {id(p) for p in built.model.parameters()}


def test_tiny_run_writes_results(tmp_path):
    systems = ["eager", "relational", "relational_unguarded", "relational_filtered", "relational_fast", "pyg"]
    results = run.main(["--workloads", "gcn/mutagenesis[2]", "--systems", ",".join(systems), "--runs", "2",
                        "--warmup", "1", "--options", '{"inductor": false}', "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["meta"]["num_threads"] == torch.get_num_threads() and saved["meta"]["torch"] == torch.__version__
    [gcn] = saved["workloads"]
    assert gcn["name"] == "gcn/mutagenesis[2]" and list(gcn["systems"]) == systems
    for name, entry in gcn["systems"].items():
        assert entry["status"] == "ok", (name, entry)
        assert entry["check"]["passed"] and entry["check"]["output_max_abs_diff"] <= OUTPUT_ATOL
        assert entry["runs"] == 2 and 0 < entry["forward_ms"] and 0 < entry["forward_backward_ms"]
        assert entry["peak_memory_bytes"] > 0
    rel, fast = gcn["systems"]["relational"], gcn["systems"]["relational_fast"]
    assert rel["session"] == "child" and set(rel["vs"]) == {"pyg"}   # the child's own PyG run
    assert fast["session"] == "main" and set(fast["vs"]) == {"pyg", "eager"}
    assert rel["compile"]["fx_nodes_after"] < rel["compile"]["fx_nodes_before"]
    for entry in (rel, fast):
        assert entry["check"]["grad_max_rel_diff"] <= 1e-4
        parts = entry["compile"]
        assert parts["trace"] + parts["grouping"] + parts["passes"] <= parts["total"]

    md = (tmp_path / "results.md").read_text()
    table, targets = md.split("## Targets")
    for system in ("eager (scalar)", "relational", "relational, guards skipped",
                   "relational, structure guards filtered", "relational (fast front-end)", "PyG"):
        assert f"| gcn/mutagenesis[2] | {system} | " in table
    for system in ("relational, guards skipped", "relational, structure guards filtered",
                   "relational (fast front-end)"):
        assert f"| gcn/mutagenesis[2] | {system} | " in targets


@pytest.mark.slow   # (Inductor compiles PyG's model in the child: most of a minute)
def test_a_capped_system_is_compared_with_compiled_pyg_in_its_child_when_asked(tmp_path):
    results = run.main(["--workloads", "gcn/mutagenesis[2]", "--systems", "relational_filtered,pyg,pyg_compile",
                        "--runs", "2", "--warmup", "1", "--options", '{"inductor": false}', "--out", str(tmp_path)])
    entry = results["workloads"][0]["systems"]["relational_filtered"]
    assert entry["status"] == "ok" and set(entry["vs"]) == {"pyg", "pyg_compile"}
    assert set(entry["child_references"]) == {"pyg", "pyg_compile"}
    targets = (tmp_path / "results.md").read_text().split("## Targets")[1]
    row = next(line for line in targets.splitlines() if "structure guards filtered" in line)
    assert "—" not in row   # every target has its ratio


def test_session_without_peer_compares_with_eager():
    result = run_session(Workload.parse("tree_lstm/2x8"), ["eager", "relational_fast"], runs=2, warmup=1,
                         options={"inductor": False})
    assert result["size"] == dict(trees=2, nodes=8, edges=6)
    fast = result["systems"]["relational_fast"]
    assert fast["status"] == "ok" and set(fast["vs"]) == {"eager"}


def test_compile_cap_stops_a_slow_system(tmp_path):
    results = run.main(["--workloads", "gcn/mutagenesis[2]", "--systems", "inductor", "--runs", "2",
                        "--cap", "0.5", "--out", str(tmp_path)])
    entry = results["workloads"][0]["systems"]["inductor"]
    assert entry["status"] == "> cap (0.5 s)"
    assert "> cap (0.5 s)" in (tmp_path / "results.md").read_text()


def test_tiny_sweep_plots_scaling(tmp_path):
    results = run.main(["--sweep", "1e3", "--systems", "relational_fast,pyg", "--runs", "1", "--warmup", "0",
                        "--options", '{"inductor": false}', "--out", str(tmp_path)])
    [point] = results["workloads"]
    assert point["name"].startswith("gcn/mutagenesis[") and point["systems"]["relational_fast"]["status"] == "ok"
    assert point["systems"]["relational_fast"]["compile"]["grouping"] > 0   # the plot's passes line
    png = tmp_path / "scaling.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_precision_arbitration_on_a_small_batch():
    from benchmarks.precision import relative_errors

    errors = relative_errors(graphs=4)
    assert set(errors) == {"eager_float32", "relational_float32"}
    assert 0 <= errors["relational_float32"] < 1e-5 and 0 <= errors["eager_float32"] < 1e-5


class _LongSum(torch.nn.Module):
    """``w * x[0] + w * x[1] + ...``: eager float32 accumulates ``w``'s gradient term by term."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([0.5]))

    def forward(self, x):
        acc = self.w * x[0]
        for i in range(1, x.shape[0]):
            acc = acc + self.w * x[i]
        return acc


@pytest.mark.parametrize("scale, passes", [(1.0, True), (1.0 + 1e-3, False)], ids=["exact_sum", "wrong_gradient"])
def test_gradient_check_arbitrates_with_float64(monkeypatch, scale, passes):
    from benchmarks import harness
    from benchmarks.systems import Prepared

    monkeypatch.setattr(harness, "GRAD_RTOL", 0.0)   # force the float64 arbitration
    torch.manual_seed(0)
    model, x = _LongSum(), torch.rand(4000) / 40
    expected, grads = harness.reference(model, x)
    # a "compiled" system that sums in float64 (the first case), or gets the gradient wrong (the second)
    system = Prepared("relational", lambda v: (model.w.double() * v.double().sum() * scale).float(), model)
    result = harness.check(system, x, expected * scale, grads)
    assert result["grad_max_rel_diff"] > 0 and "float64_rel_diff" in result
    assert result["passed"] is passes


def test_compile_scale_reports_the_grouping_of_a_small_batch():
    import dynamo_relational.passes
    from benchmarks import compile_scale

    pipeline = dynamo_relational.passes.PIPELINE
    row = compile_scale.measure(2, inductor=False, repeats=2, floor=True)
    assert dynamo_relational.passes.PIPELINE is pipeline   # the floor's extra pass is gone again
    assert row["repeats"] == 2 and row["nodes_before"] > 10 * row["nodes_after"]
    assert row["passes_s"] > 0 and row["trace_s"] > 0 and row["peak_added_mb"] >= 0
    assert row["max_abs_diff"] < 1e-5
    # the per-pass times add up to the passes' (medians of two compiles are means: they add up too), the
    # floor's time apart
    parts = [row[f"{name}_s"] for name in compile_scale.REQUIRED_PASSES] + [row["optimizer_s"]]
    assert all(t > 0 for t in parts[:6]) and sum(parts) == pytest.approx(row["passes_s"])
    assert row["floor_s"] > 0
    floor = row["floor_counts"]   # read on the traced graph: the products W @ h[u] repeat per edge
    assert floor["nodes"] == row["nodes_before"] and floor["distinct"] < floor["nodes"] and floor["sums"] > 0


def test_pass_floor_merges_duplicates_and_sums_and_leaves_the_graph_as_it_is():
    from benchmarks import pass_floor
    from dynamo_relational import Options
    from dynamo_relational.passes import PassContext

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(3, 3))

        def forward(self, x):
            return torch.relu(self.w @ x[0] + self.w @ x[0] + self.w @ x[1])

    gm = torch.fx.symbolic_trace(Model())
    graph = str(gm.graph)
    ctx = PassContext(Options())
    assert pass_floor.run(gm, ctx) is gm and str(gm.graph) == graph and len(gm.graph.nodes) == 12
    # x[0] and its product, written twice, are one value each; (a + a) + b is one sum of three terms; the two
    # rows and their products share a level and a signature: x, w, rows, products, two additions, relu, output
    assert ctx.stats["floor"] == dict(nodes=12, distinct=10, sums=1, absorbed=1, groups=8)


def test_recurrent_benchmark_measures_a_chain_against_eager():
    from benchmarks import recurrent

    row = recurrent.measure(rows=20, steps=6, width=4, repeats=2)
    assert row["nodes_before"] > 6 * 3 and row["max_abs_diff"] < 1e-5   # a linear, add and tanh per step
    assert row["compiled_ms"] > 0 and row["eager_ms"] > 0


def test_guard_benchmark_measures_every_call_path():
    from benchmarks import guards

    row = guards.measure(2)
    assert row["neurons"] > 0
    for key in ("whole_ms", "graph_ms", "unsafe_ms", "filtered_ms", "frontend_ms", "filtered_train_ms",
                "frontend_train_ms"):
        assert row[key] > 0, key


def test_idioms_benchmark_groups_every_idiom_and_matches_eager():
    from benchmarks import idioms

    rows = idioms.main(["--graphs", "1", "--repeats", "1", "--no-inductor"])
    assert [r["idiom"] for r in rows] == list(idioms.IDIOMS)
    for r in rows:
        assert r["ungrouped"] == 0 and r["nodes_after"] < r["nodes_before"] / 3, r
        assert r["max_abs_diff"] < 1e-5 and r["compiled_ms"] > 0 and r["eager_ms"] > 0, r


def test_dropout_benchmark_groups_dropout_only_with_the_option():
    from benchmarks import dropout

    eager, in_order, grouped = dropout.main(["--graphs", "1", "--repeats", "1", "--no-inductor"])
    assert (eager["variant"], in_order["variant"], grouped["variant"]) == ("eager", "in eager's order", "group_dropout")
    assert in_order["ungrouped"] > 0 and grouped["ungrouped"] == 0, (in_order, grouped)
    assert grouped["nodes_after"] < in_order["nodes_after"] / 3 and grouped["step_ms"] > 0


@pytest.mark.parametrize("kind", ["treelstm", "childsum_objects"])
def test_dynamic_benchmark_trains_batched_and_by_hand_as_eager(kind):
    """(``childsum_objects``: the trees as node objects holding their states; eager calls store them on trees
    of their own, the batched module on none.)"""
    from benchmarks import dynamic

    [result] = dynamic.main(["--models", kind, "--samples", "12", "--batch", "4", "--epochs", "3"])
    assert set(result["weight_diff"]) == {"batched", "by hand"}
    assert max(result["weight_diff"].values()) < 1e-5, result["weight_diff"]
    assert result["report"].unbatched == 0 and result["report"].structures == 12
    assert len(result["epochs"]) == 3 and all(r > 0 for r in result["steady_ratio"].values())
    assert result["assembly_us_per_node"] > 0 and min(result["resident_mb"]) > 0
    assert result["no_grad_assembly_us_per_node"] > 0 and result["report"].structures == 12   # (no new traces)


def test_treebank_trees_are_binary_parse_trees_of_sst_shaped_sentences():
    from examples.per_sample import dataset

    data = dataset("childsum", 300, treebank=True)
    for children, x in data:
        words = sum(1 for c in children if not c)
        assert 4 <= words <= 48 and len(children) == 2 * words - 1 == x.shape[0]
        assert all(len(c) in (0, 2) and all(v < u for u in c) for v, c in enumerate(children))
        assert sorted(u for c in children for u in c) == list(range(1, len(children)))   # one tree, rooted at 0
    assert 15 < sum((len(c) + 1) / 2 for c, _ in data) / len(data) < 23
    with pytest.raises(ValueError, match="molecules"):
        dataset("gcn", 2, treebank=True)


def test_dynamic_benchmark_trains_the_child_sum_tree_lstm_on_a_treebank():
    from benchmarks import dynamic

    [result] = dynamic.main(["--models", "childsum", "--samples", "10", "--batch", "5", "--epochs", "3",
                             "--treebank"])
    assert max(result["weight_diff"].values()) < 1e-5, result["weight_diff"]
    assert result["report"].unbatched == 0 and result["report"].structures == 10


@pytest.mark.parametrize("kind", ["treelstm", "childsum"])
def test_level_batched_tree_lstm_equals_the_per_tree_model(kind):
    from benchmarks.dynamic import level_batched_tree_lstm
    from examples.per_sample import MODELS, dataset

    torch.manual_seed(0)
    data = dataset(kind, 6, features=4, dtype=torch.float64)
    model = MODELS[kind][0](4, hidden=5).double()
    got, want = level_batched_tree_lstm(model, data), [model(*s).reshape(-1) for s in data]
    torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-10, atol=1e-12)
    grads = [torch.autograd.grad(torch.stack(outs).square().sum(), list(model.parameters())) for outs in (got, want)]
    for g, w in zip(*grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["gcn", "gin", "sage", "sage_edges", "gat"])
def test_pyg_molecules_equal_the_per_molecule_model(kind):
    pytest.importorskip("torch_geometric")
    from benchmarks.dynamic import KINDS, pyg_molecules
    from examples.per_sample import dataset

    torch.manual_seed(0)
    data = dataset("gcn" if kind == "gat" else kind, 5, features=4, dtype=torch.float64)
    model = KINDS[kind][0](4, hidden=5).double()
    got, want = pyg_molecules(model, data)(data[::-1]), [model(*s) for s in data[::-1]]
    torch.testing.assert_close(torch.stack(got), torch.stack(want), rtol=1e-10, atol=1e-12)
    grads = [torch.autograd.grad(torch.stack(outs).square().sum(), list(model.parameters())) for outs in (got, want)]
    for g, w in zip(*grads):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_dynamic_benchmark_trains_a_model_of_pyg_layers_batched_and_with_pyg_as_eager():
    pytest.importorskip("torch_geometric")
    from benchmarks import dynamic

    [result] = dynamic.main(["--models", "gat", "--samples", "12", "--batch", "4", "--epochs", "3"])
    assert result["report"].unbatched == 0 and result["report"].unions == 1, result["report"]
    assert max(result["weight_diff"].values()) < 1e-5, result["weight_diff"]


def test_ordinary_benchmark_compiles_a_cell_loop_with_both_backends():
    from benchmarks import ordinary

    rows = ordinary.measure(steps=2, batch=2, width=3, repeats=2)
    assert all(rows[name]["train_ms"] > 0 for name in ("eager", "inductor", "relational"))
    assert set(rows["ratio"]) == {"compile_s", "forward_ms", "train_ms"}
