"""The runs that compiling makes (timing the executors, compiling shared code) leave no trace: state that
the graph changes (running statistics, counters, the random generators) advances once per user call, as
in eager."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dynamo_relational
from tests.helpers import TOLERANCE

NEURONS = 12   # enough members per group for the grouped graph to be vectorized (and its executor timed)


class RunningStatistics(nn.Module):
    """Per-neuron layers, then ``F.batch_norm`` over the stacked rows, updating buffers it is given."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 4, dtype=torch.float64)
        self.register_buffer("mean", torch.zeros(4, dtype=torch.float64))
        self.register_buffer("var", torch.ones(4, dtype=torch.float64))

    def forward(self, x):
        h = torch.stack([torch.relu(self.layer(x[v])) for v in range(NEURONS)])
        return F.batch_norm(h, self.mean, self.var, training=True)


class BatchNormed(nn.Module):
    """``nn.BatchNorm1d`` in training mode (which also counts its calls in a buffer, in place)."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 4, dtype=torch.float64)
        self.norm = nn.BatchNorm1d(4, dtype=torch.float64)

    def forward(self, x):
        return self.norm(torch.stack([torch.tanh(self.layer(x[v])) for v in range(NEURONS)]))


def _calls():
    """A call without gradients for the input, then two with (the first of them compiles again)."""
    x = torch.randn(NEURONS, 3, dtype=torch.float64)
    return [x, x.clone().requires_grad_(), x.clone().requires_grad_()]


def _assert_each_call_matches_eager(compiled, model, eager, calls):
    """Outputs, and the buffers after every call, equal eager's."""
    for x in calls:
        torch.testing.assert_close(compiled(x), eager(x), **TOLERANCE[torch.float64])
        _assert_buffers_equal(model, eager)


def _assert_buffers_equal(model, eager):
    for (name, got), (_, want) in zip(model.named_buffers(), eager.named_buffers()):
        torch.testing.assert_close(got, want, **TOLERANCE[torch.float64], msg=lambda m: f"buffer {name}: {m}")


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_timing_the_executors_does_not_advance_running_statistics(front_end):
    torch.manual_seed(0)
    model = RunningStatistics()
    eager = copy.deepcopy(model)
    calls = _calls()
    if front_end == "fast":
        compiled = dynamo_relational.compile(model, calls[0])
    else:
        compiled = torch.compile(model, backend="relational")
    _assert_each_call_matches_eager(compiled, model, eager, calls)
    if front_end == "fast":
        assert "executor" in compiled.report.graphs[0].stats   # the executors were timed


def test_explain_timing_the_executors_runs_the_model_once():
    torch.manual_seed(0)
    model = RunningStatistics()
    eager = copy.deepcopy(model)
    x = _calls()[0]
    report = dynamo_relational.explain(model, x)
    eager(x)
    assert "executor" in report.graphs[0].stats
    _assert_buffers_equal(model, eager)


def test_compiling_shared_code_on_a_call_does_not_advance_batch_norm():
    """The training call compiles the graph again (for inputs that need gradients), as code shared across
    groundings, by calling it once before the call itself."""
    torch.manual_seed(0)
    model = BatchNormed()
    eager = copy.deepcopy(model)
    calls = _calls()
    compiled = dynamo_relational.compile(model, calls[0])
    _assert_each_call_matches_eager(compiled, model, eager, calls)
    assert compiled.report.graphs[0].stats["schema_uses"] == 2   # the shared code was compiled


def test_compiling_leaves_the_random_generator_alone():
    class Dropped(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(3, 4, dtype=torch.float64)

        def forward(self, x):
            return torch.stack([F.dropout(torch.relu(self.layer(x[v])), 0.5) for v in range(NEURONS)])

    torch.manual_seed(0)
    model, x = Dropped(), torch.randn(NEURONS, 3, dtype=torch.float64)
    before = torch.random.get_rng_state()
    compiled = dynamo_relational.compile(model, x)
    assert "executor" in compiled.report.graphs[0].stats   # the executors were timed
    assert torch.equal(torch.random.get_rng_state(), before)
