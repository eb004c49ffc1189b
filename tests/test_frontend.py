"""``dynamo_relational.compile``, the fast front-end: eager's numbers and gradients, clear errors."""
import collections
import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from dynamo_relational import OptionsError
from dynamo_relational.frontend import FrontendError
from examples.data import graph_batch, random_forest
from examples.gcn import ScalarGCN
from examples.sage import ScalarSAGE
from examples.tree_lstm import ScalarTreeLSTM
from tests.helpers import BUILDERS, TOLERANCE, Recurrent, assert_fast_compile_matches_eager, assert_rows_batch_as_eager


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_graph_example_matches_eager(name, dtype):
    torch.manual_seed(0)
    # (LRNN's scalar neurons make ~2,000 FX nodes per ENZYMES graph: one graph is plenty)
    batch = graph_batch("enzymes", graphs=1, dtype=dtype) if name == "lrnn" else \
        graph_batch("mutagenesis", graphs=3, dtype=dtype)
    model = BUILDERS[name](batch).to(dtype)
    report = assert_fast_compile_matches_eager(model, batch.x, inductor=False).report
    assert report.nodes_after <= 60 < report.nodes_before


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_tree_lstm_matches_eager(dtype):
    torch.manual_seed(0)
    model = ScalarTreeLSTM(random_forest(3, 20), 6).to(dtype)
    report = assert_fast_compile_matches_eager(model, torch.randn(20, 6, dtype=dtype), inductor=False).report
    assert report.nodes_after < report.nodes_before / 2


def test_groups_as_well_as_dynamo_graphs():
    """The traced graph groups into as few groups as Dynamo's graph of the same model."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=1)
    model = ScalarSAGE(batch, 7)
    fast = dynamo_relational.compile(model, batch.x, inductor=False, detailed=True).report
    dynamo = dynamo_relational.explain(model, batch.x, inductor=False)
    assert (fast.nodes_after, fast.groups) == (dynamo.nodes_after, dynamo.groups)
    assert fast.groups <= 1.2 * fast.lower_bound


class Idioms(nn.Module):
    """Python structure read from static shapes, buffers, in-place accumulation, iteration, a constant."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([0.5, 2.0, 1.0]))
        self.nbrs = [[1, 2], [0], [0, 1, 3], [2]]

    def forward(self, x, y):
        assert x.dim() == 2 and x.dtype == y.dtype and x.device == y.device
        rows = [self.lin(row) for row in x]                                 # iteration over a tensor
        out = []
        for v in range(len(x)):
            acc = torch.zeros(x.shape[1] - 1, dtype=x.dtype, device=x.device)   # a constant
            for u in self.nbrs[v]:
                acc += rows[u] * self.scale                                  # in-place accumulation
            out.append(torch.tanh(acc) + y[v].sum())
        return torch.stack(out), y.mean()


@pytest.mark.parametrize("inductor", [False, True])
def test_python_idioms_and_tuple_output(inductor):
    torch.manual_seed(0)
    model = Idioms().double()
    x, y = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 2, dtype=torch.float64)
    with torch.no_grad():   # (an inference graph compiles faster)
        compiled = dynamo_relational.compile(model, (x, y), inductor=inductor, strict=True)
        got, want = compiled(x, y), model(x, y)
    assert isinstance(got, tuple) and len(got) == 2
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    assert not any(name.startswith("_tensor_constant") for name in vars(model)), "the model was modified"
    assert [n for n, _ in model.named_buffers()] == ["scale"]


def test_a_dataclass_output_is_a_clear_error_unless_registered_with_pytree():
    """fx made a graph node constructing the dataclass, and Inductor failed on it ("FunctionalTensor on its own")."""
    @dataclasses.dataclass
    class Result:   # (made here: registering it below changes no other test)
        h: torch.Tensor

    class Returning(nn.Module):
        def forward(self, x):
            return Result(torch.stack([row * 2 for row in x]))

    model, x = Returning(), torch.randn(3, 2)
    with pytest.raises(FrontendError, match="returns a Result holding tensors.*register_dataclass"):
        dynamo_relational.compile(model, x)
    torch.utils._pytree.register_dataclass(Result)
    got = dynamo_relational.compile(model, x, strict=True)(x)
    assert type(got) is Result and torch.equal(got.h, model(x).h)


Pair = collections.namedtuple("Pair", "total parts")


class NestedOutputs(nn.Module):
    """Returns a dict holding a tensor, a namedtuple and a list with a Python constant."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        h = torch.stack([torch.tanh(self.lin(x[v])) for v in range(x.shape[0])])
        return {"h": h, "pair": Pair(h.sum(), [h.mean(0), 3])}


@pytest.mark.parametrize("inductor", [False, True])
def test_nested_outputs_come_back_as_forward_built_them(inductor):
    """A namedtuple in the output failed through Inductor (fx made it a node of the graph), and dicts and
    lists came back as fx's immutable ones."""
    torch.manual_seed(0)
    model, x = NestedOutputs(), torch.randn(5, 4, dtype=torch.float64)
    got, want = dynamo_relational.compile(model, x, strict=True, inductor=inductor)(x), model(x)
    assert type(got) is dict and type(got["pair"]) is Pair and type(got["pair"].parts) is list
    assert got["pair"].parts[1] == 3
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])


class NumpyStructure(nn.Module):
    """Structure read from numpy arrays: node ids are ``numpy.int64``, a scale a ``numpy.float32``, and
    one index an array."""

    def __init__(self):
        super().__init__()
        self.edges = np.array([[0, 1], [1, 2], [2, 0], [3, 1], [4, 3], [5, 4], [0, 5]])
        self.W = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        messages = [[] for _ in range(x.shape[0])]
        for u, v in self.edges:
            messages[v].append(self.W @ x[u] * np.float32(0.5))
        h = torch.stack([torch.tanh(sum(m, x[np.int64(v)])) for v, m in enumerate(messages)])
        return h + x[np.array([5, 4, 3, 2, 1, 0])]


def test_structure_from_numpy_arrays_traces_like_python_numbers():
    torch.manual_seed(0)
    model = NumpyStructure().double()
    compiled = assert_fast_compile_matches_eager(model, torch.randn(6, 4, dtype=torch.float64))
    assert compiled.report.nodes_after < compiled.report.nodes_before


class _Recurrent(nn.Module):
    """A recurrent layer over the sequence, then a readout of its last state."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer, self.readout = layer, nn.Linear(5, 3)

    def forward(self, x):
        return self.readout(self.layer(x)[0][:, -1])


@pytest.mark.parametrize("model", [
    nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3)),
    nn.TransformerEncoderLayer(6, 2, 16, dropout=0.0, batch_first=True).eval(),
    _Recurrent(nn.LSTM(6, 5, batch_first=True)),
    _Recurrent(nn.GRU(6, 5, num_layers=2, batch_first=True)),
], ids=["mlp", "transformer", "lstm", "gru"])
def test_standard_modules_trace_through(model):
    """Recurrent layers cache their weights (``_flat_weights``, rebuilt where they are not the tensors cached:
    while tracing, the weights' proxies): stored as the weights themselves, as eager's call keeps them."""
    torch.manual_seed(0)
    assert_fast_compile_matches_eager(model, torch.randn(2, 4, 6), inductor=False)
    for layer in model.modules():
        if isinstance(layer, nn.RNNBase):
            assert all(w is getattr(layer, n) for w, n in zip(layer._flat_weights, layer._flat_weights_names))


class _EvenRows(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2, dtype=torch.float64)

    def forward(self, x):
        mask = torch.arange(x.shape[0]) % 2 == 0   # (from the shape alone: a constant)
        return self.lin(x[mask]).relu() + x[:, mask[:3]].sum()


def test_rows_selected_by_a_constant_mask_trace_as_their_indices():
    """``x[mask]`` of a mask made without a traced value selects rows known while tracing (its indices), not rows
    that depend on values."""
    torch.manual_seed(0)
    assert_fast_compile_matches_eager(_EvenRows(), torch.randn(5, 3, dtype=torch.float64), inductor=False)


class DataDependent(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, x):
        h = x * 2
        if self.kind == "if":
            if h[0].sum() > 0:  # LINE:if
                h = h + 1
        elif self.kind == "item":
            h = h + h[0, 0].item()  # LINE:item
        elif self.kind == "tolist":
            h = h[h[:, 0].long().tolist()]  # LINE:tolist
        elif self.kind == "range":
            h = torch.stack([h[i] for i in range(h[0, 0].long())])  # LINE:range
        elif self.kind == "mask":
            h = h[h > 0]  # LINE:mask
        elif self.kind == "nonzero":
            h = torch.nonzero(h)  # LINE:nonzero
        elif self.kind == "reshape":   # a size read from a 0-dim integer tensor
            h = h.reshape(h[0, 0].long().abs() + 1, -1)  # LINE:reshape
        return h


@pytest.mark.parametrize("kind", ["if", "item", "tolist", "range", "mask", "nonzero", "reshape"])
def test_data_dependent_code_is_a_clear_error_naming_the_line(kind):
    with open(__file__) as f:
        line = next(i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# LINE:{kind}"))
    with pytest.raises(FrontendError) as error:
        dynamo_relational.compile(DataDependent(kind), torch.randn(3, 2), inductor=False)
    message = str(error.value)
    assert message.startswith("data-dependent control flow at ")
    assert f"{__file__}:{line} in forward" in message
    assert f"# LINE:{kind}" in message   # the source text of that line


class OneHotOfArgmax(nn.Module):
    """Each node's state masked by the one-hot code of its largest entry; ``classes=None`` leaves the count to
    the values."""

    def __init__(self, classes: int | None = 3):
        super().__init__()
        self.lin, self.classes = nn.Linear(3, 3, dtype=torch.float64), classes

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            h = self.lin(x[v])
            code = F.one_hot(h.argmax(), self.classes) if self.classes else F.one_hot(h.argmax())  # LINE:one_hot
            out.append(code.to(h.dtype) * h)
        return torch.stack(out)


def test_one_hot_with_its_class_count_traces_and_without_it_is_a_clear_error():
    """With the count given, one_hot's shape is static: the values it reads only check their range."""
    torch.manual_seed(0)
    assert_fast_compile_matches_eager(OneHotOfArgmax(), torch.randn(5, 3, dtype=torch.float64), inductor=False)
    assert_rows_batch_as_eager(OneHotOfArgmax(), through_union=False)
    with pytest.raises(FrontendError, match=r"data-dependent control flow at .*# LINE:one_hot"):
        dynamo_relational.compile(OneHotOfArgmax(classes=None), torch.randn(5, 3, dtype=torch.float64),
                                  inductor=False)


def test_error_in_user_code_names_the_line():
    class Bad(nn.Module):
        def forward(self, x):
            return torch.ones(5, 3) @ x   # BAD SHAPES

    with pytest.raises(FrontendError, match=r"RuntimeError while tracing .*test_frontend.py:\d+ in forward: "
                                            r"return torch.ones\(5, 3\) @ x   # BAD SHAPES"):
        dynamo_relational.compile(Bad(), torch.randn(4, 2), inductor=False)


def test_code_that_needs_real_tensors_is_a_clear_error_naming_the_line():
    class Mapped(nn.Module):
        def forward(self, x):
            return torch.func.vmap(torch.tanh)(x)   # VMAP

    with pytest.raises(FrontendError, match=r"ValueError while tracing .*test_frontend.py:\d+ in forward: .*# VMAP"):
        dynamo_relational.compile(Mapped(), torch.randn(4, 2), inductor=False)


def test_a_read_of_requires_grad_is_a_clear_error_naming_the_line():
    """The tracer computes values without gradients, so it cannot answer ``requires_grad``."""
    class Checks(nn.Module):
        def forward(self, x):
            return x * 2 if x.requires_grad else x   # READS

    with pytest.raises(FrontendError, match=r"reads requires_grad at .*test_frontend.py:\d+ in forward: .*# READS"):
        dynamo_relational.compile(Checks(), torch.randn(4, 2), inductor=False)


def test_random_op_with_its_own_generator_is_a_clear_error_naming_the_line():
    class Noisy(nn.Module):
        def __init__(self):
            super().__init__()
            self.generator = torch.Generator().manual_seed(0)

        def forward(self, x):
            return x + torch.randn(x.shape, generator=self.generator)   # OWN GENERATOR

    with pytest.raises(FrontendError, match=r"random op `randn` with an explicit torch.Generator at "
                                            r".*test_frontend.py:\d+ in forward: .*# OWN GENERATOR"):
        dynamo_relational.compile(Noisy(), torch.randn(4, 2), inductor=False)


def test_assigning_a_traced_tensor_to_the_model_is_a_clear_error_that_changes_nothing():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls = self.calls + 1   # REASSIGNED
            return x * self.calls

    model, x = Counting(), torch.randn(4, 2)
    buffer, setattr_before = model.calls, nn.Module.__setattr__
    with pytest.raises(FrontendError, match=r"Counting.calls is assigned a traced tensor at "
                                            r".*test_frontend.py:\d+ in forward: .*# REASSIGNED(.|\n)*in place"):
        dynamo_relational.compile(model, x, inductor=False)
    assert model.calls is buffer and nn.Module.__setattr__ is setattr_before   # (the patch is undone)
    torch.testing.assert_close(model(x), x)   # the model still runs, from its own state


@pytest.mark.parametrize("inductor", [False, True])
def test_augmented_assignment_to_a_buffer_updates_it_on_every_call_as_in_eager(inductor):
    """``self.calls += 1`` on a buffer writes it in place (the assignment stores the same tensor again), in
    the model and in its submodules; ``self.calls = self.calls + 1`` stays an error (above)."""
    class Cell(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)
            self.register_buffer("seen", torch.zeros(3, dtype=torch.float64))

        def forward(self, h):
            self.seen += h.detach().abs()
            return torch.tanh(self.lin(h))

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.cell = Cell()
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            self.calls += 1
            h = [self.cell(x[v]) for v in range(x.shape[0])]
            return torch.stack([h[v] + h[(v + 1) % len(h)] for v in range(len(h))]) * self.calls

    torch.manual_seed(0)
    model, x = Counting(), torch.randn(4, 3, dtype=torch.float64)
    reference = copy.deepcopy(model)
    compiled = dynamo_relational.compile(model, x, inductor=inductor)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), reference(x), **TOLERANCE[torch.float64])
        torch.testing.assert_close(model.calls, reference.calls)
        torch.testing.assert_close(model.cell.seen, reference.cell.seen, **TOLERANCE[torch.float64])
    compiled(x).sum().backward()
    reference(x).sum().backward()
    torch.testing.assert_close(model.cell.lin.weight.grad, reference.cell.lin.weight.grad, **TOLERANCE[torch.float64])


def test_calls_that_do_not_match_the_example_inputs_are_errors():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2)
    compiled = dynamo_relational.compile(ScalarGCN(batch, 7), batch.x, inductor=False)
    n = batch.num_nodes
    with pytest.raises(FrontendError, match=rf"argument 'x': the graph was compiled for shape \({n}, 7\), "
                                            rf"torch.float32, on cpu, got shape \({n + 1}, 7\)"):
        compiled(torch.randn(n + 1, 7))
    with pytest.raises(FrontendError, match=r"argument 'x'.*got shape .* torch.float64"):
        compiled(batch.x.double())
    with pytest.raises(FrontendError, match=r"takes 1 tensor input\(s\) \(x\), got 2"):
        compiled(batch.x, batch.x)
    with pytest.raises(FrontendError, match="argument 'x' must be a tensor"):
        compiled(batch.x.tolist())
    with pytest.raises(FrontendError, match="only tensors are supported"):
        dynamo_relational.compile(ScalarGCN(batch, 7), (batch.x.tolist(),))
    with pytest.raises(OptionsError, match="unknown option 'inductr'"):
        dynamo_relational.compile(ScalarGCN(batch, 7), batch.x, inductr=False)


def test_a_sparse_example_input_is_a_clear_error_naming_it():
    class SparseProduct(nn.Module):
        def forward(self, x, adj):
            return torch.spmm(adj, x)

    with pytest.raises(FrontendError, match="example input 'adj' is a torch.sparse_coo tensor; compile takes dense"):
        dynamo_relational.compile(SparseProduct(), (torch.randn(3, 2), torch.eye(3).to_sparse()))


def test_train_and_eval_modes_are_traced_separately():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return [self.lin(row) * (2.0 if self.training else 1.0) for row in x][-1]

    model, x = Scaled(), torch.randn(2, 3)
    compiled = dynamo_relational.compile(model, x, inductor=False)
    torch.testing.assert_close(compiled(x), model(x))
    model.eval()
    torch.testing.assert_close(compiled(x), model(x))
    model.train()
    torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("change", ["parameter", "load_state_dict_assign", "buffer", "submodule"])
def test_replaced_parameters_buffers_and_modules_are_traced_again(change):
    """The graph reads the parameter and buffer objects it was traced with: after one is replaced, the next
    call traces again (and the gradients reach the new parameters)."""
    class Shifted(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)
            self.register_buffer("shift", torch.zeros(3, dtype=torch.float64))

        def forward(self, x):
            return torch.stack([torch.tanh(self.lin(x[v])) + self.shift for v in range(x.shape[0])])

    torch.manual_seed(0)
    model, x = Shifted(), torch.randn(4, 3, dtype=torch.float64)
    compiled = dynamo_relational.compile(model, x, inductor=False)
    compiled(x)
    if change == "parameter":
        model.lin.weight = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
    elif change == "load_state_dict_assign":
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()}, assign=True)
    elif change == "buffer":
        model.shift = torch.ones(3, dtype=torch.float64)
    else:
        model.lin = nn.Linear(3, 3, dtype=torch.float64)
    got, want = compiled(x), model(x)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    assert len(compiled._traced) == 1   # the graph of the replaced objects is dropped, not kept alive
    got_grads = torch.autograd.grad(got.sum(), list(model.parameters()))
    want_grads = torch.autograd.grad(want.sum(), list(model.parameters()))
    torch.testing.assert_close(got_grads, want_grads, **TOLERANCE[torch.float64])


@pytest.mark.parametrize("change", ["in_place", "attribute", "list_item", "scalar"])
def test_changed_attributes_are_traced_again(change):
    """Plain attributes (a dense adjacency ``self.adj``, one tensor per relation in a list, a temperature) are
    read as Python data: values computed from them alone (the degrees) are frozen into the graph. After one is
    replaced or changed in place, the next call traces again instead of computing with the old values."""
    class Propagate(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)
            self.adj = torch.rand(4, 4, dtype=torch.float64)
            self.scales = [torch.rand(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64)]
            self.temperature = 1.0

        def forward(self, x):
            degree = self.adj.sum(1) * self.temperature
            h = [torch.tanh(self.lin(x[v])) * self.scales[v % 2] for v in range(x.shape[0])]
            return torch.stack([sum(self.adj[v, u] * h[u] for u in range(len(h))) / degree[v] for v in range(len(h))])

    torch.manual_seed(0)
    model, x = Propagate(), torch.randn(4, 3, dtype=torch.float64)
    compiled = dynamo_relational.compile(model, x, inductor=False)
    torch.testing.assert_close(compiled(x), model(x), **TOLERANCE[torch.float64])
    if change == "in_place":
        model.adj[0].mul_(2.0)
    elif change == "attribute":
        model.adj = torch.rand(4, 4, dtype=torch.float64)
    elif change == "list_item":
        model.scales[1] = torch.rand(3, dtype=torch.float64)
    else:
        model.temperature = 2.0
    torch.testing.assert_close(compiled(x), model(x), **TOLERANCE[torch.float64])
    assert len(compiled._traced) == 1
    traced = compiled._current()
    compiled(x)
    assert compiled._current() is traced   # unchanged since: the next call reuses the graph


def test_a_list_aliasing_parameters_does_not_trace_again_after_optimizer_steps():
    """Parameters are read live by the graph; a plain list holding them (``self.weights = [lin.weight, ...]``)
    is not Python data to freeze, so the version bump of each optimizer step must not trace again."""
    class Aliased(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3, dtype=torch.float64)
            self.weights = [self.lin.weight, self.lin.bias]

        def forward(self, x):
            weight, bias = self.weights
            return torch.stack([torch.tanh(weight @ x[v] + bias).sum() for v in range(x.shape[0])])

    torch.manual_seed(0)
    model, x = Aliased(), torch.randn(4, 3, dtype=torch.float64)
    reference = copy.deepcopy(model)
    compiled = dynamo_relational.compile(model, x, inductor=False)
    traced = compiled._current()
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for _ in range(3):
        for m, optimizer in zip((compiled, reference), optimizers):
            optimizer.zero_grad()
            m(x).square().sum().backward()
            optimizer.step()
    torch.testing.assert_close(model.lin.weight, reference.lin.weight, **TOLERANCE[torch.float64])
    torch.testing.assert_close(compiled(x), reference(x), **TOLERANCE[torch.float64])
    assert compiled._current() is traced   # the graph traced once is still the one in use


@pytest.mark.parametrize("style", ["replaced", "in_place"])
def test_forward_changing_a_tensor_attribute_is_a_clear_error(style):
    """A change that tracing would make once, not on every call, is refused; a replaced tensor is put back."""
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = torch.zeros(())

        def forward(self, x):
            if style == "replaced":
                self.calls = self.calls + 1
            else:
                self.calls += 1
            return torch.stack([row * 2 for row in x])

    model = Counting()
    before = model.calls
    with pytest.raises(FrontendError, match=r"Counting.forward changes Counting.calls \((replaced|changed in place)"):
        dynamo_relational.compile(model, torch.randn(3, 2), inductor=False)
    assert model.calls is before


@pytest.mark.parametrize("container", ["list", "dict", "list assigned in forward"])
def test_forward_keeping_a_traced_value_in_a_list_or_dict_attribute_is_a_clear_error(container):
    """The trace would keep a proxy in the model, once: refused, and the list or dict is put back (one that
    ``forward`` assigned, as older per-node code collects its outputs, is taken out)."""
    class Keeping(nn.Module):
        def __init__(self):
            super().__init__()
            self.history, self.stats = [1], {"calls": 0}

        def forward(self, x):
            h = torch.stack([row * 2 for row in x])
            if container == "list":
                self.history.append(h.detach())
            elif container == "dict":
                self.stats["mean"] = h.mean()
            else:
                self.outputs = []
                self.outputs.append(h.sum(0))
                return torch.cat(self.outputs)
            return h

    model = Keeping()
    with pytest.raises(FrontendError, match=r"Keeping.forward stores a traced value in Keeping.(history|stats|"
                                            r"outputs) \(the value computed at .*test_frontend.py:\d+ in forward: "):
        dynamo_relational.compile(model, torch.randn(3, 2), inductor=False)
    assert model.history == [1] and model.stats == {"calls": 0} and not hasattr(model, "outputs")


class _TreeNode:
    def __init__(self, index: int, children: list):
        self.index, self.children, self.state = index, children, None


def test_forward_storing_a_traced_value_on_a_tree_node_is_a_clear_error():
    """``node.state = h`` on the plain objects of a tree: the trace would leave them holding its values; refused,
    naming the attribute, and every node put back."""
    class Recursive(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)
            self.root = _TreeNode(0, [_TreeNode(1, []), _TreeNode(2, [_TreeNode(3, [])])])

        def visit(self, node, x):
            for child in node.children:
                self.visit(child, x)
            node.state = torch.tanh(self.lin(x[node.index]) + sum(c.state for c in node.children))

        def forward(self, x):
            self.visit(self.root, x)
            return self.root.state

    model = Recursive()
    with pytest.raises(FrontendError, match=r"stores a traced value in Recursive\.root(\.children\[\d\])*\.state "
                                            r"\(the value computed at .*test_frontend.py:\d+ in visit: node.state ="):
        dynamo_relational.compile(model, torch.randn(4, 2), inductor=False)
    nodes = [model.root]
    while nodes:
        node = nodes.pop()
        assert node.state is None
        nodes += node.children


def test_training_through_inductor_matches_eager():
    """20 Adam steps over model.parameters(); the first step's gradients equal eager's exactly."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    y = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    eager = ScalarGCN(batch, 7).double()
    trained = ScalarGCN(batch, 7).double()
    trained.load_state_dict(eager.state_dict())
    compiled = dynamo_relational.compile(trained, batch.x, strict=True)
    with torch.no_grad():   # inference reuses the training graph or compiles its own variant, once
        torch.testing.assert_close(compiled(batch.x), eager(batch.x), **TOLERANCE[torch.float64])
        inductor_seconds = compiled.report.pass_timings["inductor"]
        compiled(batch.x)
    assert compiled.report.pass_timings["inductor"] == inductor_seconds
    static = dynamo_relational.compile(trained, batch.x, strict=True, reuse_compiled=False)
    inductor_seconds = static.report.pass_timings["inductor"]
    with torch.no_grad():   # compile_fx's training graph also serves inference: no second compilation
        torch.testing.assert_close(static(batch.x), eager(batch.x), **TOLERANCE[torch.float64])
    assert static.report.pass_timings["inductor"] == inductor_seconds

    losses, first_grads = {}, {}
    for name, model, fn in (("eager", eager, eager), ("compiled", trained, compiled)):
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        losses[name] = []
        for step in range(20):
            optimizer.zero_grad()
            loss = nn.functional.binary_cross_entropy(fn(batch.x), y)
            loss.backward()
            if step == 0:
                first_grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()}
            optimizer.step()
            losses[name].append(loss.item())
    assert all(g.abs().sum() > 0 for g in first_grads["compiled"].values())
    torch.testing.assert_close(first_grads["compiled"], first_grads["eager"], **TOLERANCE[torch.float64])
    torch.testing.assert_close(losses["compiled"], losses["eager"], **TOLERANCE[torch.float64])
    assert losses["eager"][-1] < losses["eager"][0]


@pytest.mark.slow
def test_inference_compile_then_training_compiles_a_training_graph():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2)
    model = ScalarGCN(batch, 7)
    with torch.no_grad():
        compiled = dynamo_relational.compile(model, batch.x)
    inference_seconds = compiled.report.pass_timings["inductor"]
    out = compiled(batch.x)
    assert out.requires_grad and compiled.report.pass_timings["inductor"] > inference_seconds
    out.sum().backward()
    expected = torch.autograd.grad(model(batch.x).sum(), model.readout.weight)[0]
    torch.testing.assert_close(model.readout.weight.grad, expected, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_calls_without_gradients_after_training_return_plain_tensors(mode):
    """A call under ``no_grad`` or ``inference_mode`` reuses the training graph's code: its results must not
    require gradients (``.numpy()`` works), and inference mode must not break it."""
    torch.manual_seed(0)
    model, x = Recurrent(), torch.randn(12, 3, dtype=torch.float64)
    # a training graph (the parameters need gradients), run as Inductor's code (not as ATen calls)
    compiled = dynamo_relational.compile(model, x, autotune=False)
    with getattr(torch, mode)():
        out, want = compiled(x), model(x)
    assert not out.requires_grad and out.grad_fn is None
    torch.testing.assert_close(torch.from_numpy(out.numpy()), want, **TOLERANCE[torch.float64])


def test_compiled_in_inference_mode_then_trained():
    """Compiling inside ``torch.inference_mode()`` makes no inference tensors that a later training call
    would have to save for its backward."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model = ScalarGCN(batch, 7).double()
    with torch.inference_mode():
        compiled = dynamo_relational.compile(model, batch.x)
        torch.testing.assert_close(compiled(batch.x), model(batch.x), **TOLERANCE[torch.float64])
    got = torch.autograd.grad(compiled(batch.x).sum(), list(model.parameters()))
    want = torch.autograd.grad(model(batch.x).sum(), list(model.parameters()))
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])


@pytest.mark.slow
def test_full_mutagenesis_gcn_compiles_and_matches_eager():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis")
    model = ScalarGCN(batch, 7)
    compiled = dynamo_relational.compile(model, batch.x)
    report = compiled.report
    assert report.nodes_before > 40_000 and report.nodes_after <= 60
    with torch.no_grad():
        torch.testing.assert_close(compiled(batch.x), model(batch.x), **TOLERANCE[torch.float32])


class RowWrites(nn.Module):
    """Rows written into a tensor made in forward from Python values, in the ways user code writes them."""

    def __init__(self, style: str):
        super().__init__()
        self.style = style
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        n, nbrs = x.shape[0], [[(v + 1) % x.shape[0], (v + 3) % x.shape[0]] for v in range(x.shape[0])]
        out = torch.empty(n, 4, dtype=torch.float64) if self.style == "empty" else torch.zeros(n, 4, dtype=x.dtype)
        for v in range(n):
            if self.style in ("setitem", "empty"):
                out[v] = torch.tanh(sum(self.lin(x[u]) for u in nbrs[v]))
            elif self.style == "accumulate":
                for u in nbrs[v]:
                    out[v] += self.lin(x[u])
            else:   # a write into a view
                out[v].copy_(self.lin(x[v]))
                out.select(0, v).mul_(2)
        return torch.relu(out)


@pytest.mark.parametrize("style", ["setitem", "empty", "accumulate", "view"])
def test_rows_written_into_a_tensor_made_in_forward_match_eager_on_every_call(style):
    """fx runs ``torch.zeros(n, d)`` while tracing and keeps the tensor as a constant: a write of traced rows
    into it (``out[v] = h``) was recorded, but later reads of ``out`` ran on the unwritten constant, and every
    call shared it. The trace now records the factory when traced values are written into its tensor."""
    torch.manual_seed(0)
    model, x = RowWrites(style), torch.randn(10, 4, dtype=torch.float64)
    compiled = assert_fast_compile_matches_eager(model, x, inductor=False)
    first = compiled(x)
    kept = first.detach().clone()
    for _ in range(2):
        torch.testing.assert_close(compiled(x), model(x), **TOLERANCE[torch.float64])
    torch.testing.assert_close(first, kept, rtol=0, atol=0)   # a new tensor on every call, as in eager


def test_writing_traced_values_into_a_plain_tensor_attribute_is_refused():
    class Attribute(nn.Module):
        def __init__(self):
            super().__init__()
            self.memory = torch.zeros(10, 4, dtype=torch.float64)   # neither parameter nor buffer

        def forward(self, x):
            for v in range(x.shape[0]):
                self.memory[v] = x[v] * 2
            return self.memory.sum(0)

    with pytest.raises(FrontendError, match=r"written into a tensor the trace does not see at .*test_frontend.py:\d+"):
        dynamo_relational.compile(Attribute(), torch.randn(10, 4, dtype=torch.float64), inductor=False)


def test_in_place_accumulator_made_in_forward_is_fresh_on_every_call():
    """``acc = torch.zeros(...); acc += ...`` traces ``acc`` as a constant: it must not accumulate across calls."""
    from examples.styles import AccumulatorGCN

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=2, dtype=torch.float64)
    model = AccumulatorGCN(batch).double()
    compiled = dynamo_relational.compile(model, batch.x, inductor=False, strict=True)
    for _ in range(3):
        torch.testing.assert_close(compiled(batch.x), model(batch.x), **TOLERANCE[torch.float64])
    assert compiled.report.nodes_after < compiled.report.nodes_before / 4
