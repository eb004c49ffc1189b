"""Robustness: isolation of compiled models, determinism, Dynamo's guards on the Python structure,
calls with other shapes and dtypes."""
import pytest
import torch

from examples.data import graph_batch
from examples.gcn import ScalarGCN
from examples.sage import ScalarSAGE


def _compile(model, **options):
    return torch.compile(model, backend="relational", options={"strict": True, **options})


def _counting_compile(model):
    """``model`` compiled with the relational backend (grouped graph run eagerly), and the list
    that gets one entry per graph Dynamo hands to the backend."""
    from dynamo_relational.backend import relational

    compiles = []

    def counting_backend(gm, example_inputs):
        compiles.append(1)
        return relational(gm, example_inputs, options={"inductor": False})

    return torch.compile(model, backend=counting_backend), compiles


def test_two_compiled_models_do_not_interfere():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3)
    gcn, sage = ScalarGCN(batch, 7), ScalarSAGE(batch, 7)
    compiled_gcn, compiled_sage = _compile(gcn), _compile(sage)
    for _ in range(2):
        torch.testing.assert_close(compiled_gcn(batch.x), gcn(batch.x))
        torch.testing.assert_close(compiled_sage(batch.x), sage(batch.x))


def test_forward_and_backward_are_deterministic():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=4)
    model = ScalarGCN(batch, 7)
    compiled = _compile(model)
    runs = []
    for _ in range(3):
        out = compiled(batch.x)
        grads = torch.autograd.grad(out.square().sum(), list(model.parameters()))
        runs.append((out.detach(), grads))
    for out, grads in runs[1:]:
        assert torch.equal(out, runs[0][0])
        assert all(torch.equal(g, g0) for g, g0 in zip(grads, runs[0][1]))


def test_rewiring_the_structure_recompiles_and_stays_right():
    """Dynamo guards the Python lists that hold the structure by value: a rewired edge is a new graph."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    compiled = _compile(model, inductor=False)
    torch.testing.assert_close(compiled(batch.x), model(batch.x))
    target = next(v for v, nbrs in enumerate(model.in_nbrs) if nbrs)
    model.in_nbrs[target] = model.in_nbrs[target][1:] + [0]
    torch.testing.assert_close(compiled(batch.x), model(batch.x))


def test_structure_passed_as_an_argument_recompiles_through_inductor_and_stays_right():
    """Neighbour lists passed to a compiled function: the second structure's ints become Dynamo's dynamic
    inputs (symbolic ints among the example inputs), which the executor timing cannot run on; it is skipped."""
    torch.manual_seed(0)
    weight = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)

    def messages(x, in_nbrs):
        return torch.stack([torch.tanh(sum(weight @ x[u] for u in nbrs)) for nbrs in in_nbrs])

    compiled = torch.compile(messages, backend="relational", options={"strict": True})
    x = torch.randn(4, 3, dtype=torch.float64)
    for in_nbrs in ([[1, 2], [0], [0, 1, 3], [2]], [[1], [0, 2], [3], [2, 0]]):
        got, want = compiled(x, in_nbrs), messages(x, in_nbrs)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), weight), torch.autograd.grad(want.sum(), weight),
                                   rtol=1e-9, atol=1e-12)


@torch._dynamo.config.patch(recompile_limit=2)
def test_past_the_recompile_limit_the_model_runs_eagerly_and_stays_right():
    """Every rewiring is a recompile; past ``recompile_limit`` Dynamo stops compiling this
    frame and runs it eagerly: slower, never stale."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    compiled, compiles = _counting_compile(model)
    rewirable = [v for v, nbrs in enumerate(model.in_nbrs) if len(nbrs) > 1]
    for v in rewirable[:4]:
        torch.testing.assert_close(compiled(batch.x), model(batch.x))
        model.in_nbrs[v] = model.in_nbrs[v][1:]   # drop an edge: the guards on the lists fail
    torch.testing.assert_close(compiled(batch.x), model(batch.x))
    assert len(compiles) == 2


def test_the_guard_filter_drops_the_structure_guards_and_keeps_the_input_guards():
    """``options={"guard_filter_fn": skip_guard_on_all_nn_modules_unsafe}`` (docs/guards.md): the grad
    mode and the inputs' dtypes still pick or make the right graph, but a rewired structure is not
    noticed (the unsafety the name warns of), so the old structure's result comes back."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    compiled = _compile(model, inductor=False,
                        guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe)
    out = compiled(batch.x)
    torch.testing.assert_close(out, model(batch.x))
    grads = torch.autograd.grad(out.sum(), list(model.parameters()))
    expected = torch.autograd.grad(model(batch.x).sum(), list(model.parameters()))
    torch.testing.assert_close(grads, expected)
    with torch.no_grad():
        torch.testing.assert_close(compiled(batch.x), model(batch.x))
    assert compiled(batch.x).requires_grad   # the grad-mode guard still tells the two graphs apart
    model.float()
    x32 = batch.x.float()
    torch.testing.assert_close(compiled(x32), model(x32))   # the input's dtype guard: a new graph
    model.double()
    before = model(batch.x)
    target = next(v for v, nbrs in enumerate(model.in_nbrs) if nbrs)
    model.in_nbrs[target] = model.in_nbrs[target][1:] + [0]
    assert not torch.allclose(model(batch.x), before)
    torch.testing.assert_close(compiled(batch.x), before)   # stale: the structure's guards were dropped


def test_new_input_values_reuse_the_compiled_graph():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    compiled, counts = _counting_compile(model)
    for _ in range(3):
        x = torch.randn_like(batch.x)
        torch.testing.assert_close(compiled(x), model(x))
    assert len(counts) == 1


def test_a_call_with_more_rows_or_another_dtype_is_right_or_an_error():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    compiled = _compile(model, inductor=False)
    compiled(batch.x)
    bigger = torch.cat([batch.x, torch.randn(5, 7, dtype=torch.float64)])
    torch.testing.assert_close(compiled(bigger), model(bigger))
    with pytest.raises(Exception):
        model(batch.x.float())
    with pytest.raises(Exception):
        compiled(batch.x.float())
