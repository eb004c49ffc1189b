"""Helpers shared by the test modules: the checks that a compiled model equals eager (outputs and gradients,
through ``torch.compile`` by way of ``explain`` or through ``dynamo_relational.compile``), and the models,
builders and constants more than one test module runs. Test modules import them from here, never from
one another."""
from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import random
from typing import Container
from unittest import mock

import torch
from torch import nn
from torch.utils import _pytree as pytree

import dynamo_relational
from examples.data import graph_batch
from examples.gcn import ScalarGCN
from examples.gin import ScalarGIN
from examples.lrnn import ScalarLRNN
from examples.rgcn import ScalarRGCN
from examples.sage import ScalarSAGE

TOLERANCE = {torch.float64: dict(rtol=1e-9, atol=1e-12), torch.float32: dict(rtol=1e-4, atol=1e-5)}


def assert_compiled_matches_eager(model: torch.nn.Module, *inputs: torch.Tensor, tolerance: dict | None = None,
                                  **options):
    """Compile with the relational backend (via explain, strict), compare with eager; return the report.
    ``tolerance`` replaces the output dtype's (for a model that itself rounds through a lower precision)."""
    torch._dynamo.reset()
    options.setdefault("strict", True)
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    report = dynamo_relational.explain(model, *leaves, **options)
    compiled_out = report.compiled(*leaves)
    eager_out = model(*leaves)
    tol = tolerance or TOLERANCE[eager_out.dtype]
    torch.testing.assert_close(compiled_out, eager_out, **tol)
    wrt = [p for p in model.parameters() if p.requires_grad] + [x for x in leaves if x.requires_grad]
    weights = torch.randn_like(eager_out)
    got = torch.autograd.grad((compiled_out * weights).sum(), wrt, allow_unused=True)
    want = torch.autograd.grad((eager_out * weights).sum(), wrt, allow_unused=True)
    for g, w in zip(got, want):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0
        else:
            torch.testing.assert_close(g, w, **tol)
    return report


def assert_as_close_to_float64_as_eager(compiled, model: torch.nn.Module, exact: torch.nn.Module, x: torch.Tensor,
                                        x64: torch.Tensor, under=contextlib.nullcontext):
    """In low precision a compiled model rounds differently from eager: compare both with ``exact``, the
    model's float64 twin, instead. The compiled outputs and gradients (run, like eager's, inside
    ``under()``) must be as close to it as eager's, or closer (the largest relative error over the
    output and each parameter's gradient)."""
    def outputs_and_gradients(fn, module, inputs):
        out = fn(inputs.clone().requires_grad_())
        return [out.double()] + [g.double() for g in torch.autograd.grad(out.float().sum(), list(module.parameters()))]

    want = outputs_and_gradients(exact, exact, x64)

    def error(fn):
        with under():
            values = outputs_and_gradients(fn, model, x)
        return max(((v - w).abs().max() / w.abs().max()).item() for v, w in zip(values, want))

    assert error(compiled) <= error(model)


def op_db_samples(opinfo, dtype: torch.dtype, first: int | None = None) -> list:
    """An op_db entry's CPU sample inputs (the ``first`` ones, made one at a time). torch's sample iterator
    looks for a unittest test case on the stack (``inspect.stack()``, which reads the source of every frame of
    pytest's deep stack: seconds per op); a pytest function is none, so the lookup is skipped, with the same
    samples and seeds."""
    from torch.testing._internal import common_utils
    with mock.patch.object(common_utils, "extract_test_fn", lambda: None):
        return list(itertools.islice(opinfo.sample_inputs("cpu", dtype), first))


@contextlib.contextmanager
def warnings_logged():
    """The messages of the warnings logged by dynamo_relational inside the block."""
    messages = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("dynamo_relational")
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)


def assert_fast_compile_matches_eager(model: nn.Module, *inputs: torch.Tensor, tolerance: dict | None = None,
                                      **options):
    """Compile with dynamo_relational.compile (strict), compare outputs and the gradients of all
    parameters and inputs with eager; return the compiled module. ``tolerance`` replaces the output
    dtype's (for a model that itself rounds through a lower precision)."""
    options.setdefault("strict", True)
    leaves = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    compiled = dynamo_relational.compile(model, leaves, **options)
    compiled_out, eager_out = compiled(*leaves), model(*leaves)
    tol = tolerance or TOLERANCE[eager_out.dtype]
    torch.testing.assert_close(compiled_out, eager_out, **tol)
    differentiable = [x for x in leaves if x.requires_grad]   # (not integer inputs: indices, token ids)
    wrt = list(model.parameters()) + differentiable
    weights = torch.randn_like(eager_out)
    got = torch.autograd.grad((compiled_out * weights).sum(), wrt, allow_unused=True)
    want = torch.autograd.grad((eager_out * weights).sum(), wrt, allow_unused=True)
    for (name, _), g, w in zip([*model.named_parameters(), *(("input", x) for x in differentiable)], got, want):
        if w is None:
            assert g is None or torch.count_nonzero(g) == 0, name
        else:
            assert g is not None, name
            torch.testing.assert_close(g, w, **tol, msg=lambda m: f"gradient of {name}: {m}")
    return compiled


def report_matching_eager(front_end: str, model: nn.Module, *inputs: torch.Tensor, **options):
    """Compile ``model`` through ``front_end`` (``"backend"``: ``torch.compile`` by way of ``explain``;
    ``"fast"``: ``dynamo_relational.compile``), check outputs and gradients against eager, and return
    the graph's report."""
    if front_end == "backend":
        return assert_compiled_matches_eager(model, *inputs, **options).graphs[0]
    return assert_fast_compile_matches_eager(model, *inputs, **options).report.graphs[0]


class Recurrent(nn.Module):
    """A recurrent cell over the rows of ``x``, cycled through: one neuron per step, each reading the last."""

    def __init__(self, steps: int = 20, width: int = 3):
        super().__init__()
        self.steps = steps
        self.cell = nn.Linear(width, width, dtype=torch.float64)

    def forward(self, x):
        h = x[0]
        for step in range(self.steps):
            h = torch.tanh(self.cell(h) + x[step % x.shape[0]])
        return h


# the example models, each built for a batch of graphs
BUILDERS = {
    "gcn": lambda b: ScalarGCN(b, b.x.shape[1]),
    "sage": lambda b: ScalarSAGE(b, b.x.shape[1]),
    "gin": lambda b: ScalarGIN(b, b.x.shape[1], layers=3),
    "rgcn": lambda b: ScalarRGCN(b, b.x.shape[1]),
    "lrnn": lambda b: ScalarLRNN(b),
}


# the rows and width of tests/test_elementwise.py's models
ELEMENTWISE_ROWS, ELEMENTWISE_WIDTH = 16, 4


class PerNeuronScalars(nn.Module):
    """A threshold, exponent, bound and fill value of its own for each neuron (Python floats)."""

    def __init__(self, dtype):
        super().__init__()
        self.lin = nn.Linear(ELEMENTWISE_WIDTH, ELEMENTWISE_WIDTH, dtype=dtype)
        # 0.1 steps: exact ties with float32 rows
        self.t = [round(0.1 * v - 0.8, 1) for v in range(ELEMENTWISE_ROWS)]

    def forward(self, x):
        out = []
        for v in range(ELEMENTWISE_ROWS):
            h, t = self.lin(x[v]), self.t[v]
            above = (h > t) & torch.le(h, t + 1) | (x[v] == t)
            out.append(torch.where(above, h, t) + h.clamp(min=t) + torch.clamp(h, -1.0, t + 1) + h.abs() ** (1 + abs(t))
                       + h.masked_fill(h < t, t) + (2.0 + t) ** h + above.to(h.dtype))
        return torch.stack(out)


# the rows of Layouts (tests/test_layout_ops.py)
LAYOUT_ROWS = 12


class Layouts(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x, planes):
        out = []
        for v in range(LAYOUT_ROWS):
            h, p = self.lin(x[v]), planes[v]   # a row of 3 and a 2 x 3 plane
            grid = h.unsqueeze(1).expand(3, 2) * h.unsqueeze(0).expand(2, -1).t()      # 3 x 2
            wide = h.expand((4, 3)) + h.expand_as(p.repeat(2, 1)) + torch.tile(h, (4, 1))   # 4 x 3
            moved = (p.flip(1) + torch.flip(p, [0, 1]) + p.roll(1) + torch.roll(p, 1, 1) + p.roll((1, 2), (0, 1))
                     + p.transpose(0, 1).t() + torch.swapaxes(p, 0, 1).T + p.permute(1, 0).permute((1, 0))
                     + p.mT.mT)   # 2 x 3
            out.append(torch.cat([grid.flatten(), wide.sum(0), moved.flatten(), h.repeat(2), h.flip(0), h.t()]))
        return torch.stack(out)


# each neuron's neighbours in Statistics (tests/test_along.py)
STATISTICS_NEIGHBORS = [[1, 2], [0], [0, 1, 3], [2], [5], [4, 0], [7, 8, 9], [6], [1], [2, 3]]


class Statistics(nn.Module):
    """PNA-style statistics of each neuron's stacked messages, in the forms std and var are called."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x, planes):
        out = []
        for v, nbrs in enumerate(STATISTICS_NEIGHBORS):
            m = torch.stack([self.lin(x[u]) for u in nbrs + [v]])   # at least two messages: std is defined
            p = planes[v]
            out.append(torch.cat([m.mean(0), m.std(0), m.std(0, unbiased=False), torch.var(m, dim=0, correction=0),
                                  torch.std(m, False).reshape(1), m.var().reshape(1), torch.std(m, 0, True),
                                  p.var(dim=(0, 1), keepdim=True).reshape(1), p.std(-1, correction=2)]))
        return torch.stack(out)


# each neuron's neighbours in Pooling (tests/test_values_indices.py):
# neuron 0 lists neuron 1 twice and neurons 2 and 5 read the same rows: their messages tie exactly
POOLING_NEIGHBORS = [[1, 1, 2], [0], [0, 3], [2, 4], [5], [0, 3], [7, 8], [6], [1], [2, 3]]


class Pooling(nn.Module):
    """Max pooling of each neuron's messages in the ways it is written, and sorted messages."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        out = []
        for v, nbrs in enumerate(POOLING_NEIGHBORS):
            m = torch.stack([torch.relu(self.lin(x[u])) for u in nbrs + [v]])   # relu: ties at zero too
            values, indices = m.min(0)
            out.append(torch.cat([torch.max(m, 0)[0], m.max(dim=0).values, values * indices,
                                  m.sort(dim=0, descending=True, stable=True).values[0],
                                  m.max(1, keepdim=True).values.sum(0),
                                  torch.sort(m, dim=-1, stable=True).indices[0].to(m.dtype)]))
        return torch.stack(out)


# value compression's model (tests/test_compress_values.py)
class FactGCN(nn.Module):
    """A scalar-granular GCN over a grounded graph whose atom features are facts in a buffer (one of
    a few atom types each), the way NeuraLogic networks carry them: many atoms read equal facts, and
    atoms with equal multisets of neighbour types compute equal values."""

    def __init__(self, features: torch.Tensor, in_nbrs: list[list[int]], hidden: int = 6,
                 features_as_input: bool = False):
        super().__init__()
        self.in_nbrs = in_nbrs
        self.features_as_input = features_as_input
        self.register_buffer("facts", features)
        self.conv1 = nn.Linear(features.shape[1], hidden)
        self.conv2 = nn.Linear(hidden, hidden)
        self.scale = nn.Parameter(torch.ones(hidden))   # equal values at the start: never merged by value

    def forward(self, x=None):
        x = self.facts if x is None else x
        h = [x[v] for v in range(x.shape[0])]
        for conv in (self.conv1, self.conv2):
            h = [torch.tanh(sum((conv.weight @ h[u] for u in nbrs), conv.bias)) for nbrs in self.in_nbrs]
        return torch.stack([self.scale * h[v] for v in range(len(h))]).sum(1)


def fact_gcn(dtype=torch.float64, types: int = 3, graphs: int = 4, **kwargs) -> FactGCN:
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=graphs, dtype=dtype)
    kinds = torch.randint(0, types, (batch.num_nodes,))
    features = torch.eye(types, dtype=dtype)[kinds]
    return FactGCN(features, batch.in_neighbors(), **kwargs).to(dtype)


def compressed_rows(compiled) -> list[str]:
    return compiled.report.graphs[0].stats.get("rows_compressed", [])


#: per-sample batches of float64 models: every sample's result and gradient as eager's
BATCH_TOLERANCE = dict(rtol=1e-8, atol=1e-10)


def traced_per_sample(kind: str, samples: int, **options) -> tuple[list[tuple], nn.Module, nn.Module]:
    """``(data, model, batched)``: float64 samples of ``examples.per_sample``'s ``kind``, its model, and the model
    batched with ``options``, every sample's structure traced by a first call (the next batch of known
    structures groups them)."""
    from examples.per_sample import MODELS, dataset

    data = dataset(kind, samples, features=4, dtype=torch.float64)
    model = MODELS[kind][0](4).double()
    batched = dynamo_relational.batch(model, **options)
    batched(data)
    return data, model, batched


def assert_batches_match_eager(batched, model: nn.Module, batch: list[tuple], through_union: bool = True,
                               constant: Container[int] = ()) -> None:
    """Each sample's result and the parameters' and float inputs' gradients (of a random weighting of all
    results) as eager's; with ``through_union``, every sample ran from the grouped union. Eager runs on a copy of
    the samples' objects, as ``batch`` runs its traces (what forward stores on them stays on the copy). The
    arguments at the ``constant`` positions are given without gradients (a dense adjacency: structure)."""
    inputs = [tuple(a.detach().clone().requires_grad_(a.is_floating_point() and j not in constant)
                    if isinstance(a, torch.Tensor) else a for j, a in enumerate(s)) for s in batch]
    unbatched = (batched.report.eager_samples, batched.report.unbatched)
    got = batched(inputs)
    if through_union:
        assert (batched.report.eager_samples, batched.report.unbatched) == unbatched, batched.report
    want = [model(*copy.deepcopy(s, {id(a): a for a in s if isinstance(a, torch.Tensor)})) for s in inputs]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **BATCH_TOLERANCE)
    got, want = ([t for t in pytree.tree_leaves(results)   # (tuples, dicts; the floating ones differentiate)
                  if isinstance(t, torch.Tensor) and t.is_floating_point()] for results in (got, want))
    weights = [torch.randn_like(w) for w in want]
    wrt = list(model.parameters()) + [a for s in inputs for a in s if isinstance(a, torch.Tensor) and a.requires_grad]
    # (a parameter or input that no result reads has a zero gradient on both sides)
    got_grads = torch.autograd.grad(sum((g * c).sum() for g, c in zip(got, weights)), wrt, allow_unused=True,
                                    materialize_grads=True)
    want_grads = torch.autograd.grad(sum((w * c).sum() for w, c in zip(want, weights)), wrt, allow_unused=True,
                                     materialize_grads=True)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, **BATCH_TOLERANCE)


def assert_shuffled_batches_match_eager(model: nn.Module, data: list[tuple], seed: int = 0,
                                        constant: Container[int] = ()):
    """``batch(model)`` over ``data`` against eager: traced first (the eager calls), then from the grouped union
    over shuffled halves and a batch that repeats a sample, never one by one (``constant``: as
    :func:`assert_batches_match_eager`'s). Returns the batched module."""
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, data, through_union=False, constant=constant)
    order = random.Random(seed).sample(range(len(data)), len(data))
    half = len(data) // 2
    for chosen in (order[:half], order[half:], order[1:-1] + order[1:2]):
        assert_batches_match_eager(batched, model, [data[i] for i in chosen], constant=constant)
    assert batched.report.unbatched == 0, batched.report.unbatched_reason
    return batched


def assert_rows_batch_as_eager(model: nn.Module, through_union: bool = True, width: int = 3):
    """``batch(model)`` over float64 samples of ``[n, width]`` rows (n = 2, 3, 2, 4) against eager: traced
    first (the eager calls), then, with ``through_union``, from the grouped union, else one by one with the
    model (its reason kept). Returns the batched module."""
    samples = [(torch.randn(n, width, dtype=torch.float64),) for n in (2, 3, 2, 4)]
    batched = dynamo_relational.batch(model, progress=False)
    assert_batches_match_eager(batched, model, samples, through_union=False)
    assert_batches_match_eager(batched, model, samples[::-1], through_union=through_union)
    assert (batched.report.unbatched == 0) == through_union, batched.report.unbatched_reason
    return batched


class ZeroStartedSums(nn.Module):
    """Each node's sum of messages started from ``torch.zeros_like(h[v])`` (some nodes get none), as per-node
    message passing is often written; ``ones_like``, ``full_like`` and ``empty_like`` beside it."""

    def __init__(self):
        super().__init__()
        self.inp, self.msg = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 4, dtype=torch.float64)

    def forward(self, x):
        h = [torch.relu(self.inp(x[v])) for v in range(len(x))]
        m = [torch.zeros_like(h[v]) for v in range(len(x))]
        for u in range(1, len(x)):
            m[u - 1] = m[u - 1] + self.msg(h[u])
        scale = [torch.ones_like(h[v]) + torch.full_like(h[v], 0.5) + torch.empty_like(h[v]).zero_()
                 for v in range(len(x))]
        return torch.stack([m[v] * scale[v] for v in range(len(x))]).sum(0)


class TypedGRUMessages(nn.Module):
    """Message passing as per-node code often writes it: each node's sum started from zeros (``x.new_zeros(d)``:
    a node without messages keeps them), a weight per edge type from a ``ModuleDict``, and a GRU cell of each
    node's sum and state, on ``[1, d]`` rows made by ``unsqueeze``."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 4, dtype=torch.float64)
        self.msg = nn.ModuleDict({t: nn.Linear(4, 4, bias=False, dtype=torch.float64) for t in ("a", "b")})
        self.gru = nn.GRUCell(4, 4, dtype=torch.float64)

    def forward(self, edges, x):
        h = [torch.relu(self.inp(x[v])) for v in range(len(x))]
        for _ in range(2):
            m = [x.new_zeros(4) for _ in range(len(x))]
            for u, v, kind in edges:
                m[v] = m[v] + self.msg[kind](h[u])
            h = [self.gru(m[v].unsqueeze(0), h[v].unsqueeze(0)).squeeze(0) for v in range(len(x))]
        return torch.stack(h).sum(0)


def typed_graphs() -> list[tuple]:
    """Six float64 graphs of 2 to 5 nodes for :class:`TypedGRUMessages`: ``(u, v, type)`` edges, ``[n, 3]`` features."""
    generator = torch.Generator().manual_seed(0)
    graphs = []
    for n in (3, 4, 2, 5, 3, 4):
        pairs = torch.randint(0, n, (n, 2), generator=generator).tolist()
        graphs.append(([(u, v, "ab"[k % 2]) for k, (u, v) in enumerate(pairs)],
                       torch.randn(n, 3, dtype=torch.float64, generator=generator)))
    return graphs


class VectorNode:
    """A tree node holding its own word vector, as per-node code often builds its trees."""

    def __init__(self, vec: torch.Tensor, children: list):
        self.vec, self.children = vec, children


def vector_tree(children: list[list[int]], x: torch.Tensor, v: int = 0) -> VectorNode:
    return VectorNode(x[v].clone().requires_grad_(), [vector_tree(children, x, c) for c in children[v]])


class VectorTreeRNN(nn.Module):
    """A recursive net over :class:`VectorNode` trees: a tensor argument per node."""

    def __init__(self):
        super().__init__()
        self.W, self.U = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 4, bias=False, dtype=torch.float64)

    def forward(self, root):
        def state(node):
            own = self.W(node.vec)
            return torch.tanh(own + sum(self.U(state(c)) for c in node.children)) if node.children else own
        return state(root)


class EveryNodesState(nn.Module):
    """A TreeRNN returning a loss and the list of every node's state: as many tensors as the tree has nodes."""

    def __init__(self):
        super().__init__()
        self.W, self.U = nn.Linear(3, 4, dtype=torch.float64), nn.Linear(4, 4, bias=False, dtype=torch.float64)

    def forward(self, children, x):
        h = [None] * len(children)
        for v in reversed(range(len(children))):
            own = self.W(x[v])
            h[v] = torch.tanh(own + sum(self.U(h[c]) for c in children[v])) if children[v] else own
        return torch.stack(h).square().mean(), h


class Comparisons(nn.Module):
    """Comparison operators on traced values as masks (``h == b``, ``h > 0``): tensor methods named ``__eq__``
    ... ``__ge__``, like attributes every Python object has."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x):
        out = []
        b = self.lin.bias * 1   # (a Parameter, a subclass, would have Python try its reflected comparison first)
        for v in range(x.shape[0]):
            h = self.lin(x[v])
            top = (h == b) | (h != -h) & (h >= b)
            out.append(torch.where(h > 0, h, 0.1 * h) * (h <= 1).to(h.dtype) + top.to(h.dtype) * (h < 2))
        return torch.stack(out)


class MasksAndRemainders(Comparisons):
    """The other tensor operators, also reflected (``True & m``, ``2 % g``): ``%``, ``//``, ``~``, ``&``, ``|``,
    ``^``."""

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            h = self.lin(x[v])
            m = h > 0
            masks = (~m).to(h.dtype) + (True & m).to(h.dtype) + (m ^ (h < 0.2)).to(h.dtype) + (False | m).to(h.dtype)
            g = h.detach()   # (floor_divide has no derivative, nor remainder for its divisor)
            steps = g // 0.3 + 3 // (g.abs() + 1) + 2 % (g.abs() + 1)
            out.append(h % 0.5 + steps + masks)
        return torch.stack(out)
