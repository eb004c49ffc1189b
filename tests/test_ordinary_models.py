"""Ordinary (non-relational) models through ``backend="relational"``: outputs and gradients as eager's and as
stock ``torch.compile``'s (Inductor), also where an output is an element of a tuple an op returns
(``torch.topk(h, 2).values``, ``torch.var_mean``, ``torch.cond``), and through the fast front-end
``dynamo_relational.compile`` where its contract allows the model."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import _pytree as pytree

import dynamo_relational
from benchmarks.ordinary import LSTMCellLoop
from tests.helpers import TOLERANCE

TIGHT = {torch.float64: dict(rtol=1e-8, atol=1e-10), torch.float32: TOLERANCE[torch.float32]}


class Block(nn.Module):
    """A residual block: two 3x3 convolutions with batch norm, the input added back."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(h)))


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.blocks = nn.Sequential(Block(4), Block(4))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = self.blocks(F.relu(self.stem(x)))
        return self.head(h.mean(dim=(2, 3)))


class TransformerBlock(nn.Module):
    def __init__(self, width: int = 8, heads: int = 2):
        super().__init__()
        self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class LSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 6, batch_first=True)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return out, h, c


class Linear(nn.Module):
    """A linear layer, then ``body`` on its result."""

    def __init__(self, body):
        super().__init__()
        self.linear = nn.Linear(4, 6)
        self.body = body

    def forward(self, x):
        return self.body(self.linear(x))


def _graph_break_after_topk(h):
    values = torch.topk(h, 2).values
    torch._dynamo.graph_break()
    return torch.relu(values) * 2


def _topk_values_viewed(h):
    values = torch.topk(h, 3).values
    return values.t(), values.reshape(-1)   # two views of one tensor that the graph does not return


def _cond(h):
    return torch.cond(h.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (h,))


BODIES = {
    "topk_values": lambda h: torch.topk(h, 2).values,
    "topk_values_and_indices": lambda h: tuple(torch.topk(h, 2)),
    "topk_values_viewed": _topk_values_viewed,
    "var_mean": lambda h: torch.var_mean(h, dim=1),
    "var_mean_summed": lambda h: sum(torch.var_mean(h, dim=1)),
    "sort": lambda h: torch.sort(h)[0],
    "max_with_dim": lambda h: torch.max(h, dim=1).values,
    "max_with_dim_and_indices": lambda h: tuple(torch.max(h, dim=1)),
    "cond": _cond,
    "graph_break_after_topk": _graph_break_after_topk,
}

#: per case: the model (built after seeding), its inputs, their dtype
CASES = {
    "resnet": (ResNet, lambda: torch.randn(2, 3, 6, 6), torch.float32),
    "transformer_block": (TransformerBlock, lambda: torch.randn(2, 5, 8), torch.float64),
    "multihead_attention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True),   # called directly
                            lambda: (torch.randn(2, 5, 8),) * 3, torch.float64),
    "lstm": (LSTM, lambda: torch.randn(2, 5, 4), torch.float64),
    "lstm_cell_loop": (lambda: LSTMCellLoop(4, 6), lambda: torch.randn(8, 4, 4), torch.float64),
    **{name: (lambda body=body: Linear(body), lambda: torch.randn(3, 4), torch.float64)
       for name, body in BODIES.items()},
}

#: the cases the fast front-end refuses by its contract (a FrontendError), and why
NOT_FOR_FAST_FRONT_END = {
    "cond": "torch.cond branches on a tensor's value: data-dependent control flow",
    "lstm": "nn.LSTM.forward reassigns its _flat_weights attribute, a change the trace would make once",
    "var_mean": "an op's tuple returned as it is is no output it accepts (var_mean_summed reads the op's tuple)",
}


def _model_and_inputs(name: str):
    model_fn, inputs_fn, dtype = CASES[name]
    torch.manual_seed(0)
    model = model_fn().to(dtype)
    inputs = inputs_fn()
    inputs = tuple(x.to(dtype) for x in (inputs if isinstance(inputs, tuple) else (inputs,)))
    return model, inputs, dtype


def _outputs_and_gradients(fn, model: nn.Module, inputs: tuple) -> tuple[list, list]:
    """``fn``'s outputs (flattened) and the gradients of a fixed weighted sum of its floating outputs with
    respect to the model's parameters and the inputs."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]
    outputs = pytree.tree_leaves(fn(*leaves))
    floating = [o for o in outputs if o.is_floating_point()]
    generator = torch.Generator().manual_seed(1)
    loss = sum((o * torch.randn(o.shape, generator=generator, dtype=o.dtype)).sum() for o in floating)
    wrt = list(model.parameters()) + leaves
    gradients = torch.autograd.grad(loss, wrt, allow_unused=True)
    return [o.detach() for o in outputs], [torch.zeros_like(w) if g is None else g for g, w in zip(gradients, wrt)]


def _assert_same(got, want, dtype):
    torch.testing.assert_close(got, want, **TIGHT[dtype])


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_eager_and_inductor(name):
    model, inputs, dtype = _model_and_inputs(name)
    eager = _outputs_and_gradients(model, model, inputs)
    stock = _outputs_and_gradients(torch.compile(model, backend="inductor"), model, inputs)
    torch._dynamo.reset()
    ours = _outputs_and_gradients(torch.compile(model, backend="relational"), model, inputs)
    _assert_same(stock, eager, dtype)
    _assert_same(ours, eager, dtype)
    _assert_same(ours, stock, dtype)


@pytest.mark.parametrize("name", ["topk_values", "var_mean", "sort", "max_with_dim", "multihead_attention", "cond",
                                  "graph_break_after_topk"])
def test_ungrouped_matches_eager(name):
    """Without grouping, the graph goes to Inductor as Dynamo traced it."""
    model, inputs, dtype = _model_and_inputs(name)
    eager = _outputs_and_gradients(model, model, inputs)
    ours = _outputs_and_gradients(torch.compile(model, backend="relational", options={"grouping": False}),
                                  model, inputs)
    _assert_same(ours, eager, dtype)


@pytest.mark.parametrize("name", sorted(set(CASES) - set(NOT_FOR_FAST_FRONT_END)))
def test_fast_front_end_matches_eager(name):
    model, inputs, dtype = _model_and_inputs(name)
    eager = _outputs_and_gradients(model, model, inputs)
    # compiled for inputs that require gradients, as they are called (else a second variant is compiled)
    ours = _outputs_and_gradients(lambda *leaves: dynamo_relational.compile(model, leaves)(*leaves), model, inputs)
    _assert_same(ours, eager, dtype)


@pytest.mark.parametrize("front_end", ["backend", "fast"])
def test_a_graph_that_grouping_makes_no_smaller_is_compiled_as_traced(front_end):
    """The cells of a time loop cannot run together; split into their gates, they would only make more ops."""
    model, inputs, dtype = _model_and_inputs("lstm_cell_loop")
    if front_end == "backend":
        report = dynamo_relational.explain(model, *inputs).graphs[0]
    else:
        report = dynamo_relational.compile(model, inputs).report.graphs[0]
    assert report.nodes_after == report.nodes_before and report.vectorized_groups == 0, report
    assert "kept_as_traced" in report.stats
