"""The CUDA path: the Triton CSR kernel, the custom ops on CUDA (Triton and cuSPARSE providers),
and compiled models on a GPU against eager.

Everything here needs a CUDA device, except two checks of the Triton path (the
kernels, and the ops and their derivatives through them), which also run on
CPU in Triton's interpreter when Triton is installed.
"""
import copy
import importlib
import itertools
import os
import subprocess
import sys

import pytest
import torch

import dynamo_relational
from dynamo_relational.kernels import triton_csr
from dynamo_relational.kernels.gather_reduce import gather_reduce, gather_rows, pack_csr, unit_offsets
from dynamo_relational.kernels.segment import csr_offsets, segment_reduce
from benchmarks.idioms import IDIOMS
from examples.data import graph_batch
from examples.per_sample import MODELS as PER_SAMPLE_MODELS, ObjectChildSumTreeLSTM, dataset, object_tree
from examples.styles import STYLES
from tests.helpers import (BUILDERS, ELEMENTWISE_ROWS, ELEMENTWISE_WIDTH, LAYOUT_ROWS, POOLING_NEIGHBORS,
                           STATISTICS_NEIGHBORS, TOLERANCE, EveryNodesState, Layouts, PerNeuronScalars, Pooling,
                           Statistics, TypedGRUMessages, VectorTreeRNN, ZeroStartedSums, assert_batches_match_eager,
                           assert_compiled_matches_eager, assert_fast_compile_matches_eager,
                           assert_shuffled_batches_match_eager, compressed_rows, fact_gcn, typed_graphs, vector_tree)

# (the package exports the op under the module's name)
gather_reduce_module = importlib.import_module("dynamo_relational.kernels.gather_reduce")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
ATEN = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}


def check_csr_reduce(device: str, dtypes=(torch.float32, torch.float64)) -> None:
    """The Triton kernels against ATen's segment_reduce (on CPU, float64) for every reduction, with
    and without an index: short segments (the row-block kernel) and long ones (the one-row kernel),
    empty segments, segments longer than a tile, features wider than a block."""
    generator = torch.Generator().manual_seed(0)
    for counts in ([0, 1, 3, 2, 0, 2, 4, 5] * 5, [0, 1, 3, 70, 0, 2, 1029, 5]):
        offsets = csr_offsets(counts)
        entries = int(offsets[-1])
        for features, dtype in ((1, dtypes[0]), (10, dtypes[-1]), *((130, d) for d in dtypes)):
            # inputs rounded to ``dtype`` first: what is left is the kernels' own rounding
            source = torch.randn(40, features, generator=generator, dtype=torch.float64).to(dtype).double()
            index = torch.randint(0, 40, (entries,), generator=generator)
            rows = torch.randn(entries, features, generator=generator, dtype=torch.float64).to(dtype).double()
            for reduce, aten in ATEN.items():
                # longest=0 takes the row-block kernel, a huge one the one-row kernel: each kernel on each
                # distribution (but the interpreter's row-block kernel is too slow for the long one)
                kernels = (0, 10 ** 9) if device == "cuda" or max(counts) < 100 else (10 ** 9,)
                for (with_index, data), longest in itertools.product(((True, source[index]), (False, rows)), kernels):
                    want = torch.segment_reduce(data, aten, offsets=offsets, axis=0)
                    got = triton_csr.csr_reduce(
                        (source if with_index else rows).to(device, dtype), offsets.to(device, torch.int32),
                        index.to(device, torch.int32) if with_index else None, len(counts), reduce,
                        empty_mean_is_zero=False, longest=longest)
                    torch.testing.assert_close(
                        got.cpu().double(), want, equal_nan=True,
                        **TOLERANCE.get(dtype, dict(rtol=1e-2, atol=1e-2)),
                        msg=lambda m: f"{reduce} {dtype} {features} {counts[:4]} index={with_index} "
                                      f"longest={longest}: {m}")


@pytest.mark.skipif(not triton_csr.AVAILABLE, reason="needs Triton")
@pytest.mark.skipif(torch.cuda.is_available(), reason="runs on the GPU instead (test below)")
def test_csr_kernel_matches_aten_in_the_triton_interpreter():
    """Runs in a child process: Triton reads TRITON_INTERPRET when it is imported. (Triton 3.8's
    interpreter runs the kernels; 3.6's cannot take a reduction as a loop bound.)"""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    code = "from tests.test_cuda import check_csr_reduce; check_csr_reduce('cpu')"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@needs_cuda
@pytest.mark.skipif(not triton_csr.AVAILABLE, reason="needs Triton")
def test_csr_kernel_matches_aten_on_cuda():
    check_csr_reduce("cuda", dtypes=(torch.float32, torch.float64, torch.bfloat16))


def check_triton_products_equal_sparse_products() -> None:
    """``gather_reduce``, its eager form, and their first and second derivatives, through the Triton
    kernel against ``torch.sparse.mm``, on CPU: run under Triton's interpreter, with the Triton path
    taken for CPU tensors. This checks the wiring around the kernel, e.g. a mean's backward, which
    the Triton path computes by dividing the source rows by the forward's segment sizes, then summing."""
    counts = [3, 0, 2, 4, 1]
    csr = pack_csr(csr_offsets(counts), torch.tensor([0, 4, 2, 1, 1, 3, 0, 4, 2, 5]), 6)
    generator = torch.Generator().manual_seed(1)
    cases = []
    for op, reduce, (rows, columns, transpose) in itertools.product(
            (gather_reduce, gather_reduce_module.gather_reduce_eager), ("sum", "mean"),
            ((len(counts), 6, False), (6, len(counts), True))):
        source, weight, direction = (torch.randn(shape, dtype=torch.float64, generator=generator)
                                     for shape in ((columns, 3), (rows, 3), (columns, 3)))
        cases.append((op, reduce, rows, transpose, source, weight, direction))

    def derivatives():
        gather_reduce_module._MATRICES.clear()
        gather_reduce_module._PLANS.clear()
        results = []
        for op, reduce, rows, transpose, source, weight, direction in cases:
            source, weight = source.clone().requires_grad_(), weight.clone().requires_grad_()
            out = op(source, csr, rows, reduce, transpose)
            grad, = torch.autograd.grad((out * weight).sum(), source, create_graph=True)
            second, = torch.autograd.grad((grad * direction).sum(), weight)
            results.append((f"{op.__name__} {reduce} transpose={transpose}", out, grad, second))
        return results

    want = derivatives()
    uses_triton = gather_reduce_module._multiplies_with_triton
    gather_reduce_module._multiplies_with_triton = lambda device, dtype: True
    try:
        got = derivatives()
        matrices = [matrix for _, matrix in gather_reduce_module._MATRICES.values()]
        assert matrices and all(isinstance(m, gather_reduce_module.TritonCSR) for m in matrices)
    finally:
        gather_reduce_module._multiplies_with_triton = uses_triton
    for (case, *expected), (_, *actual) in zip(want, got):
        for name, e, a in zip(("output", "gradient", "second derivative"), expected, actual):
            torch.testing.assert_close(a.detach(), e.detach(), msg=lambda m: f"{case}, {name}: {m}")


@pytest.mark.skipif(not triton_csr.AVAILABLE, reason="needs Triton")
@pytest.mark.skipif(torch.cuda.is_available(), reason="runs on the GPU instead (test_gather_ops_on_cuda_equal_cpu)")
def test_triton_products_equal_sparse_products_in_the_triton_interpreter():
    """(A child process, as above; Triton 3.6's interpreter cannot run these kernels either.)"""
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    code = "from tests.test_cuda import check_triton_products_equal_sparse_products as c; c()"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(params=["triton", "cusparse"])
def provider(request, monkeypatch):
    if request.param == "triton" and not triton_csr.AVAILABLE:
        pytest.skip("needs Triton")
    monkeypatch.setattr(gather_reduce_module, "cuda_provider", request.param)
    return request.param


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_gather_ops_on_cuda_equal_cpu(provider, reduce, dtype):
    torch.manual_seed(0)
    counts = [3, 0, 2, 4, 1]
    index = torch.tensor([0, 4, 2, 1, 1, 3, 0, 4, 2, 5])
    csr = pack_csr(csr_offsets(counts), index, 6)
    for device in ("cpu", "cuda"):
        source = torch.randn(6, 3, 2, dtype=dtype, generator=torch.Generator().manual_seed(1)).to(device)
        source.requires_grad_()
        packed = csr.to(device)
        out = gather_reduce(source, packed, len(counts), reduce)
        back = gather_reduce(out, packed, 6, "sum", True)
        rows = gather_rows(source, pack_csr(unit_offsets(len(index)), index, 6).to(device))
        grad, = torch.autograd.grad(out.square().sum() + back.sum() + rows.sum(), source)
        if device == "cpu":
            want = [t.detach() for t in (out, back, rows, grad)]
        else:
            for got, expected in zip((out, back, rows, grad), want):
                assert got.is_cuda
                torch.testing.assert_close(got.detach().cpu(), expected, **TOLERANCE[dtype])


@needs_cuda
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin"])
def test_segment_reduce_on_cuda_equals_cpu(reduce):
    offsets = csr_offsets([2, 1, 4, 3])
    data = torch.randn(10, 3, dtype=torch.float64)
    data[3, 1] = data[4, 1]        # a tie for max/min: the gradient is shared
    results = []
    for device in ("cpu", "cuda"):
        leaf = data.to(device).requires_grad_()
        out = segment_reduce(leaf, offsets.to(device), reduce)
        grad, = torch.autograd.grad((out * torch.arange(1.0, 4.0, dtype=out.dtype, device=device)).sum(), leaf)
        results.append((out.detach().cpu(), grad.cpu()))
    for got, want in zip(results[1], results[0]):
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])


def _on_cuda(model: torch.nn.Module, batch):
    return model.cuda(), batch.x.cuda()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_fast_compiled_model_on_cuda_matches_eager(name, dtype, provider):
    """The fast front-end with Inductor generating CUDA code around the custom ops."""
    torch.manual_seed(0)
    batch = graph_batch("enzymes" if name == "lrnn" else "mutagenesis", graphs=3, dtype=dtype)
    model, x = _on_cuda(BUILDERS[name](batch).to(dtype), batch)
    compiled = assert_fast_compile_matches_eager(model, x)
    assert compiled.report.nodes_after <= 60 < compiled.report.nodes_before


@needs_cuda
@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_dynamo_compiled_model_on_cuda_matches_eager(name):
    """``torch.compile(backend="relational")`` on CUDA tensors, float32."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2)
    model, x = _on_cuda(BUILDERS[name](batch), batch)
    report = assert_compiled_matches_eager(model, x)
    assert report.nodes_after <= 60 < report.nodes_before


@needs_cuda
@pytest.mark.parametrize("name", sorted(STYLES))
def test_styles_written_by_others_run_on_cuda(name):
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3)
    assert_fast_compile_matches_eager(*_on_cuda(STYLES[name](batch), batch))


@needs_cuda
@pytest.mark.parametrize("name", sorted(IDIOMS))
def test_idioms_on_cuda_match_eager_and_group(name):
    """Every idiom of ``benchmarks.idioms`` (in-place activations, masks, chunked gates, attention, norms,
    cells, einsum, embeddings, slices) on the GPU in float64: the index constants and the ops
    that the idiom families emit run on CUDA, grouped as on CPU."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model, x = _on_cuda(IDIOMS[name](batch).double(), batch)
    compiled = assert_fast_compile_matches_eager(model, x)
    report = compiled.report.graphs[0]
    assert report.nodes_after <= 120 < report.nodes_before


@needs_cuda
@pytest.mark.parametrize("name", ["scalars64", "scalars32", "layouts", "pooling", "statistics"])
def test_per_neuron_scalars_layouts_and_value_index_pairs_on_cuda_match_eager(name):
    """Per-neuron scalar columns (and a clamp bound as a 0-d constant), layout ops, ``values_or_indices``
    and ``std`` on the GPU, through Inductor."""
    torch.manual_seed(0)
    d = dict(device="cuda", dtype=torch.float64)
    if name.startswith("scalars"):
        dtype = torch.float64 if name == "scalars64" else torch.float32
        x = ((torch.randn(ELEMENTWISE_ROWS, ELEMENTWISE_WIDTH) * 10).round() / 10   # on the thresholds too
             ).to(device="cuda", dtype=dtype)
        model, inputs = PerNeuronScalars(dtype), (x,)
    elif name == "layouts":
        model, inputs = Layouts(), (torch.randn(LAYOUT_ROWS, 3, **d), torch.randn(LAYOUT_ROWS, 2, 3, **d))
    elif name == "pooling":
        model, inputs = Pooling(), (torch.randn(len(POOLING_NEIGHBORS), 4, **d),)
    else:
        model, inputs = Statistics(), (torch.randn(len(STATISTICS_NEIGHBORS), 4, **d),
                                       torch.randn(len(STATISTICS_NEIGHBORS), 2, 3, **d))
    assert_fast_compile_matches_eager(model.cuda(), *inputs)


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_value_compression_on_cuda_matches_eager(dtype):
    """``value_compression`` numbers the rows on the CPU and puts its index constants on the GPU."""
    model = fact_gcn(dtype).cuda()
    compiled = assert_fast_compile_matches_eager(model, value_compression=True)
    assert compressed_rows(compiled), "no node was compressed"


@needs_cuda
def test_value_compression_through_torch_compile_on_cuda():
    """Under Dynamo the facts buffer arrives as a graph input on the GPU, and is still read by value."""
    model = fact_gcn(graphs=2).cuda()
    report = assert_compiled_matches_eager(model, value_compression=True)
    assert any(g.stats.get("rows_compressed") for g in report.graphs)


@needs_cuda
@pytest.mark.parametrize("kind", sorted(PER_SAMPLE_MODELS))
def test_batches_of_samples_on_cuda_equal_eager(kind):
    """``dynamo_relational.batch`` on the GPU: each batch's index tensors, made in numpy, reach the device; the
    tensor code of a molecule (over its edge index or adjacency) runs on all samples' rows joined."""
    torch.manual_seed(0)
    data = [(s, x.cuda()) for s, x in dataset(kind, 12, features=4, dtype=torch.float64)]
    model = PER_SAMPLE_MODELS[kind][0](4).double().cuda()
    batched = dynamo_relational.batch(model)
    for batch in (data[:6], data[6:]):   # new structures: traced, run eagerly
        assert_batches_match_eager(batched, model, batch, through_union=False)
    for batch in (data[::2], data[1::3]):
        assert_batches_match_eager(batched, model, batch)
    assert batched.report.unbatched == 0 and batched.report.groupings == 1, batched.report


class _UnreadEdges(torch.nn.Module):
    """An MLP baseline whose edge index no sample reads: the union takes no such input."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 4, dtype=torch.float64)

    def forward(self, x, edge_index):
        return torch.relu(self.lin(x)).mean(0)


def _per_node_code(name: str) -> tuple[torch.nn.Module, list[tuple]]:
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randn(n, 3, dtype=torch.float64, generator=generator) for n in (2, 3, 2, 4)]
    if name == "typed GRU messages":
        return TypedGRUMessages(), typed_graphs()
    if name == "sums from zeros_like":
        return ZeroStartedSums(), [(x,) for x in rows]
    if name == "unread edge index":
        return _UnreadEdges(), [(x, torch.randint(0, len(x), (2, len(x) + 1), generator=generator)) for x in rows]
    if name == "every node's state returned":   # (a result tensor per node: packed by kind)
        return EveryNodesState(), dataset("treernn", 8, features=3, dtype=torch.float64)
    if name == "nodes holding vectors":   # (a tensor argument per node: packed by kind)
        return VectorTreeRNN(), [(vector_tree(children, x.cuda()),)
                                 for children, x in dataset("treernn", 8, features=3, dtype=torch.float64)]
    trees = [(object_tree(children), x) for children, x in dataset("childsum", 8, features=4, dtype=torch.float64)]
    return ObjectChildSumTreeLSTM(4, hidden=3).double(), trees


@needs_cuda
@pytest.mark.parametrize("name", ["typed GRU messages", "sums from zeros_like", "unread edge index", "node objects",
                                  "nodes holding vectors", "every node's state returned"])
def test_per_node_code_batches_on_cuda(name):
    """Per-node code as public repositories write it, batched on the GPU: sums started from zeros feeding a GRU
    cell, ``zeros_like`` factories, an argument no sample reads, trees of node objects run on copies, trees
    whose nodes hold their own vectors, and a list of every node's state returned."""
    torch.manual_seed(0)
    model, samples = _per_node_code(name)
    samples = [tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in sample) for sample in samples]
    assert_shuffled_batches_match_eager(model.cuda(), samples)


@needs_cuda
@pytest.mark.parametrize("layer", ["GCNConv", "SAGEConv max", "GATConv", "TAGConv"])
def test_pytorch_geometric_layers_on_one_graph_batch_on_cuda(layer):
    """PyG layers called on one graph, batched on the GPU: the joined rows' gathers, segment sums and segment
    maxima (``scatter_reduce_`` into zeros, the attention's softmax) with their masks on the device."""
    pyg = pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    class OneGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = {"GCNConv": lambda: pyg.nn.GCNConv(3, 4), "TAGConv": lambda: pyg.nn.TAGConv(3, 4),
                         "SAGEConv max": lambda: pyg.nn.SAGEConv(3, 4, aggr="max"),
                         "GATConv": lambda: pyg.nn.GATConv(3, 4, heads=2)}[layer]()

        def forward(self, data):
            return torch.relu(self.conv(data.x, data.edge_index)).mean(0)

    generator = torch.Generator().manual_seed(0)
    graphs = [(Data(x=torch.randn(n, 3, dtype=torch.float64, generator=generator),
                    edge_index=torch.randint(0, n, (2, n + 1), generator=generator)).cuda(),) for n in (3, 4, 2, 5, 3)]
    assert_shuffled_batches_match_eager(OneGraph().double().cuda(), graphs)


@needs_cuda
@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("name", ["gcn", "sage"])
def test_cuda_graphs_train_and_infer_as_eager(front_end, name):
    """``mode="reduce-overhead"`` records the compiled graph in CUDA graphs (no skips) once, and later training
    steps and inference calls replay it with eager's numbers (no ``cudagraph_mark_step_begin`` needed, as with
    ``torch.compile``): the gathers' matrices are built before recording, the index buffers are static inputs."""
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model, x = _on_cuda(BUILDERS[name](batch).double(), batch)
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    counters.clear()
    options = dict(mode="reduce-overhead", autotune=False)
    compiled = (torch.compile(model, backend="relational", options=options) if front_end == "backend"
                else dynamo_relational.compile(model, x, **options))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, eager)]
    recorded = []   # the inputs of the graphs recorded so far: a step that records nothing adds none
    for step in range(4):
        recorded.append(counters["inductor"]["cudagraph_recorded_non_static_inputs"])
        losses = [fn(x).square().mean() for fn in (compiled, eager)]
        torch.testing.assert_close(losses[0], losses[1], **TOLERANCE[torch.float64])
        for loss, optimizer in zip(losses, optimizers):
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, **TOLERANCE[torch.float64])
    assert recorded[2] == recorded[3], f"training steps record again: {recorded}"
    with torch.no_grad():
        for _ in range(4):
            recorded.append(counters["inductor"]["cudagraph_recorded_non_static_inputs"])
            torch.testing.assert_close(compiled(x), eager(x), **TOLERANCE[torch.float64])
    assert recorded[-2] == recorded[-1], f"inference calls record again: {recorded}"
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
