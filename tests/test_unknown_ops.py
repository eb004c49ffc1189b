"""Ops the grouper does not know (views, dtype changes, integer, comparison and sorting ops, random
ops, custom autograd Functions), graph breaks and low-precision models: every model computes eager's
numbers and gradients (or, in bfloat16/float16, numbers at least as close to float64 as eager's),
through the Dynamo backend and the fast front-end; the known ops around the unknown ones are still
grouped, and the unknown ones are left ungrouped with a reason."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from dynamo_relational.frontend import FrontendError
from tests.helpers import (TOLERANCE, assert_as_close_to_float64_as_eager, assert_compiled_matches_eager,
                           assert_fast_compile_matches_eager)

NEIGHBORS = [[1, 2], [0, 3], [0, 1, 3], [2], [0, 4]]


class PerNeuron(nn.Module):
    """One output row per neuron: ``body(model, x, v, message)`` with ``message = sum(W @ x[u])``
    over the neuron's in-neighbours (the part the grouper knows)."""

    def __init__(self, body, width: int = 4):
        super().__init__()
        self.body = body
        self.W = nn.Parameter(torch.randn(width, width, dtype=torch.float64) / 2)

    def forward(self, x):
        return torch.stack([self.body(self, x, v, sum(self.W @ x[u] for u in nbrs))
                            for v, nbrs in enumerate(NEIGHBORS)])


# name -> (body, an op that must be named among the reasons for leaving nodes ungrouped, or None)
BODIES = {
    # views
    "view": (lambda m, x, v, h: h.view(2, 2).sum(0).repeat(2), None),
    "reshape_and_t": (lambda m, x, v, h: (h.reshape(2, 2).t() @ x[v].reshape(2, 2)).flatten(), None),
    "unsqueeze": (lambda m, x, v, h: (x[v].unsqueeze(0) @ m.W).squeeze(0) + h, None),
    "slices": (lambda m, x, v, h: torch.cat([h[1:3], x[v][:2]]), None),
    "narrow": (lambda m, x, v, h: torch.cat([h.narrow(0, 0, 2), x[v][2:]]), None),   # split_views: a slice
    "expand": (lambda m, x, v, h: x[v][0:1].expand(4) * h, None),
    "flip": (lambda m, x, v, h: h.flip(0), None),
    "chunk": (lambda m, x, v, h: torch.cat(h.chunk(2)[::-1]), None),   # Dynamo reads each piece: split_views
    "unbind": (lambda m, x, v, h: torch.stack(list(h.unbind(0))[::-1]), None),
    # mixed dtypes
    "through_float32": (lambda m, x, v, h: h.float().double(), None),
    # (factory calls such as torch.arange are constants: never reported as ungrouped)
    "promote_int64": (lambda m, x, v, h: h + torch.arange(4), None),
    "promote_float32": (lambda m, x, v, h: h * torch.ones(4, dtype=torch.float32), None),
    "python_scalars": (lambda m, x, v, h: h * 3 + v, None),
    # integer, comparison and sorting ops
    "argmax": (lambda m, x, v, h: h * h.argmax(), "along dim=None"),   # (over all dims; along one it groups)
    "where": (lambda m, x, v, h: torch.where(h > 0, h, x[v]), None),
    "bool_mask": (lambda m, x, v, h: h * (x[v] > 0), None),
    "integer_arithmetic": (lambda m, x, v, h: h * ((torch.arange(4) * v + 1) % 3 // 1), None),
    "count": (lambda m, x, v, h: h * (x[v] > 0).long().sum(), "floating"),  # an integer sum
    "clamp_round": (lambda m, x, v, h: h.clamp(-0.5, 0.5) + x[v].round(), None),
    "cummax": (lambda m, x, v, h: torch.cummax(h, 0).values, "cummax"),
    # (values and indices of max/min/stable sort: one op per part, passes/values_indices.py)
    "max_values_indices": (lambda m, x, v, h: h.max(0).values * x[v] + h.max(0).indices, None),
    "sort": (lambda m, x, v, h: h.sort().values, "sort"),   # unstable: ties in no fixed order
    "stable_sort": (lambda m, x, v, h: h.sort(stable=True).values, None),
    "topk": (lambda m, x, v, h: h.topk(2).values.repeat(2), "topk"),
    "cumsum": (lambda m, x, v, h: h.cumsum(0), None),
    "softmax": (lambda m, x, v, h: F.softmax(h, 0), None),
    "norm": (lambda m, x, v, h: h / h.norm(), None),
    "powers": (lambda m, x, v, h: h ** 2 + h.pow(3), None),
    "outer": (lambda m, x, v, h: torch.outer(h, x[v]).sum(1) + torch.outer(m.W[0], h)[1], None),
    "einsum": (lambda m, x, v, h: torch.einsum("ij,j->i", m.W, x[v]) + h, None),
}


def _model_and_input(body):
    torch.manual_seed(0)
    return PerNeuron(body), torch.randn(len(NEIGHBORS), 4, dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(BODIES))
def test_unknown_ops_through_the_backend_match_eager(name):
    body, unknown = BODIES[name]
    report = assert_compiled_matches_eager(*_model_and_input(body), inductor=False)
    (graph,) = report.graphs
    assert graph.nodes_after < graph.nodes_before   # the known ops around the unknown ones are grouped
    reasons = " ".join(graph.ungrouped)
    if unknown is None:
        assert "no vectorizer" not in reasons, reasons
    else:
        assert f" {unknown}" in reasons, reasons


@pytest.mark.parametrize("name", sorted(BODIES))
def test_unknown_ops_through_the_fast_front_end_match_eager(name):
    compiled = assert_fast_compile_matches_eager(*_model_and_input(BODIES[name][0]), inductor=False)
    assert compiled.report.nodes_after < compiled.report.nodes_before


@pytest.mark.parametrize("name", ["narrow", "through_float32", "integer_arithmetic", "sort"])
def test_unknown_ops_through_inductor_match_eager(name):
    model, x = _model_and_input(BODIES[name][0])
    # Rounded through float32, a last-bit difference of the float64 value before it (Inductor may sum
    # in another order) can move the result by one float32 step: float32's tolerance there.
    tolerance = TOLERANCE[torch.float32] if name == "through_float32" else None
    assert_compiled_matches_eager(model, x, tolerance=tolerance)
    assert_fast_compile_matches_eager(model, x, tolerance=tolerance)


def _branching(m, x, v, h):
    if h.sum() > 0:   # data-dependent control flow: a graph break under Dynamo
        return torch.relu(h)
    return torch.tanh(h)


def test_graph_breaks_on_tensor_values_match_eager():
    report = assert_compiled_matches_eager(*_model_and_input(_branching), inductor=False)
    assert len(report.graphs) > 1


class Masked(torch.autograd.Function):
    """A custom autograd Function that draws random numbers in its forward."""

    @staticmethod
    def forward(ctx, x):
        mask = (torch.rand_like(x) > 0.5).to(x.dtype)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask


RANDOM_BODIES = {
    "dropout": lambda m, x, v, h: F.dropout(h, 0.5, training=True),
    # (equal calls, two masks: CSE must not merge them)
    "two_dropouts_of_one_value": lambda m, x, v, h: F.dropout(h, 0.5, True) + F.dropout(h, 0.5, True),
    "rand_like": lambda m, x, v, h: h * torch.rand_like(x[v]),
    "randn": lambda m, x, v, h: h + torch.randn(4, dtype=torch.float64),
    "bernoulli_of_a_constant": lambda m, x, v, h: h * torch.bernoulli(torch.full((4,), 0.5, dtype=torch.float64)),
    "uniform_in_place": lambda m, x, v, h: h * torch.empty(4, dtype=torch.float64).uniform_(),
    "randint": lambda m, x, v, h: h * torch.randint(0, 3, (4,)),
    "random_in_place": lambda m, x, v, h: h * torch.empty(4, dtype=torch.float64).random_(0, 3),
    "custom_function": lambda m, x, v, h: Masked.apply(h),
    "randperm_index": lambda m, x, v, h: h[torch.randperm(4)],
    "distribution_sample": lambda m, x, v, h: h + torch.distributions.Normal(torch.tensor(0.0, dtype=torch.float64),
                                                                            1.0).sample((4,)),
}


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("name", sorted(RANDOM_BODIES))
def test_random_ops_draw_eagers_numbers_on_every_call(name, front_end):
    """Run in the traced order, the random ops draw what eager draws from the same seed, call after call
    (a draw frozen at compile time would repeat the first call's numbers)."""
    model, x = _model_and_input(RANDOM_BODIES[name])
    if front_end == "fast":
        compiled = dynamo_relational.compile(model, x, inductor=False)
    else:
        compiled = torch.compile(model, backend="relational", options={"inductor": False})
    for seed in (1, 2):
        torch.manual_seed(seed)
        got = [compiled(x), compiled(x)]
        torch.manual_seed(seed)
        want = [model(x), model(x)]
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["dropout", "randn"])
def test_fast_compile_leaves_the_random_generator_alone(name):
    """Tracing computes random values on a forked generator (and traces a model whose own code drew
    numbers again, recording its random ops), so the user's random stream is where it was."""
    model, x = _model_and_input(RANDOM_BODIES[name])
    before = torch.random.get_rng_state()
    dynamo_relational.compile(model, x, inductor=False)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_structure_sampled_with_torch_random_numbers_is_refused():
    class Shuffled(nn.Module):
        def forward(self, x):
            return torch.stack([x[i] for i in torch.randperm(x.shape[0]).tolist()])

    with pytest.raises(FrontendError, match=r"data-dependent control flow at .*test_unknown_ops.py:\d+"):
        dynamo_relational.compile(Shuffled(), torch.randn(4, 2), inductor=False)


def test_random_ops_through_inductor_draw_new_numbers_on_every_call():
    model, x = _model_and_input(RANDOM_BODIES["randn"])
    compiled = dynamo_relational.compile(model, x)
    assert not torch.equal(compiled(x), compiled(x))
    report = compiled.report.graphs[0]
    assert any("randn" in reason for reason in report.ungrouped)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_models_on_cpu_are_as_accurate_as_eager(dtype, front_end):
    """bfloat16 and float16 GCNs compile (the segment sums run in float32 on CPU) and land as close to
    the float64 model as eager does, or closer: eager rounds after every term of a sum."""
    from examples.data import graph_batch
    from examples.gcn import ScalarGCN

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", 4)
    exact = ScalarGCN(batch, batch.x.shape[1]).double()
    model = ScalarGCN(batch, batch.x.shape[1])
    model.load_state_dict(exact.state_dict())
    model, x = model.to(dtype), batch.x.to(dtype)
    if front_end == "fast":
        compiled = dynamo_relational.compile(model, x, inductor=False)
    else:
        compiled = torch.compile(model, backend="relational", options={"inductor": False})
    assert_as_close_to_float64_as_eager(compiled, model, exact, x, batch.x.double())


class Doubled(torch.autograd.Function):
    """Rounds, with a custom gradient (twice the incoming one, where round's own is zero)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2.0


@pytest.mark.parametrize("inductor", [False, True])
def test_custom_autograd_functions_keep_their_backward(inductor):
    model, x = _model_and_input(lambda m, x, v, h: Doubled.apply(h) + h)
    assert_compiled_matches_eager(model, x, inductor=inductor)
    assert_fast_compile_matches_eager(model, x, inductor=inductor)
