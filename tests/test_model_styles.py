"""Scalar-granular models written in other people's styles compile unchanged and match eager."""
import pytest
import torch

import dynamo_relational
from dynamo_relational.frontend import FrontendError

from examples.data import graph_batch
from examples.styles import STYLES, LinearPerType
from tests.helpers import (Comparisons, MasksAndRemainders, assert_compiled_matches_eager,
                           assert_fast_compile_matches_eager, assert_rows_batch_as_eager, report_matching_eager)


@pytest.mark.parametrize("name", sorted(STYLES))
def test_style_compiles_and_matches_eager(name):
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model = STYLES[name](batch).double()
    report = assert_compiled_matches_eager(model, batch.x, inductor=False)
    assert report.nodes_after <= 60 < report.nodes_before


@pytest.mark.parametrize("name", ["linear_per_type", "weight_per_type"])
def test_a_few_weights_become_one_product_per_weight(name):
    """``W[type] @ h`` and one ``nn.Linear`` per type: one linear per type, no weight copied per edge."""
    from examples.rgcn import ScalarRGCN

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model = (LinearPerType(batch) if name == "linear_per_type" else ScalarRGCN(batch, 7, layers=1)).double()
    report = assert_compiled_matches_eager(model, batch.x, inductor=False)
    after = report.graphs[0].after
    assert "matmul" not in after and after.count("linear(") >= 3


@pytest.mark.parametrize("name", sorted(STYLES))
def test_style_groups_when_its_output_is_larger_than_max_member_numel(name):
    """At full size the output ``torch.stack`` of thousands of rows exceeds ``max_member_numel``;
    it is the stack's rows that count, so it still becomes one gather (a tiny limit recreates that here)."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    model = STYLES[name](batch).double()
    compiled = assert_fast_compile_matches_eager(model, batch.x, max_member_numel=16)
    assert compiled.report.nodes_after <= 60


class ZerosPerNeuron(torch.nn.Module):
    """``torch.zeros`` (or ``x.new_zeros``) once per neuron, many of them never accumulated into."""

    def __init__(self, method: bool = False):
        super().__init__()
        self.method = method

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            acc = x.new_zeros(x.shape[1]) if self.method else torch.zeros(x.shape[1], dtype=x.dtype)
            if v % 3 == 0:
                acc += x[v] * 2
            out.append(torch.tanh(acc))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["fast", "backend"])
@pytest.mark.parametrize("method", [False, True], ids=["torch.zeros", "new_zeros"])
def test_per_neuron_zeros_accumulators_become_one_constant(front_end, method):
    x = torch.randn(300, 4, dtype=torch.float64)
    report = report_matching_eager(front_end, ZerosPerNeuron(method), x)
    assert report.nodes_after <= 13   # the zeros: one constant (or one new_zeros call), not one per neuron


class FilledLeafStates(torch.nn.Module):
    """A recursive net whose leaves start from a state made and then filled in place, as older tree code
    writes it: ``x.new(1, d).fill_(0.)`` (``.requires_grad_()`` after it with ``leaf``, as widely copied
    TreeLSTM code writes it; Dynamo does not trace that into one graph), ``torch.empty(1, d).zero_()``,
    ``torch.empty_like(...).fill_(1.)``."""

    CHILDREN = [[1, 2], [3, 4], [5, 6], [], [], [], []] * 3

    def __init__(self, leaf: bool = False):
        super().__init__()
        self.W, self.U = torch.nn.Linear(3, 3, dtype=torch.float64), torch.nn.Linear(3, 3, dtype=torch.float64)
        self.leaf = leaf

    def forward(self, x):
        h = [None] * len(self.CHILDREN)
        for v in reversed(range(len(self.CHILDREN))):
            kids = [h[c] for c in self.CHILDREN[v] if c > v and c < v + 7]
            if kids:
                z = sum(kids)
            elif v % 3 == 0:
                z = x.detach().new(1, 3).fill_(0.)
                z = z.requires_grad_() if self.leaf else z
            elif v % 3 == 1:
                z = torch.empty(1, 3, dtype=x.dtype).zero_()
            else:
                z = torch.empty_like(x[v:v + 1]).fill_(0.5)
            h[v] = torch.tanh(self.W(x[v:v + 1]) + self.U(z))
        return torch.cat(h)


@pytest.mark.parametrize("front_end", ["fast", "backend", "fast, leaf states"])
def test_a_new_tensor_filled_in_place_groups(front_end):
    x = torch.randn(len(FilledLeafStates.CHILDREN), 3, dtype=torch.float64)
    report = report_matching_eager(front_end.split(",")[0], FilledLeafStates(leaf="leaf" in front_end), x)
    assert not report.ungrouped, report.ungrouped   # the fills no longer keep the graph in its order
    assert report.nodes_after < report.nodes_before / 2


class AugmentedAssignments(torch.nn.Module):
    """Per neuron: ``**=`` and ``@=`` on fresh temporaries, and additions written as dunder methods."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3, bias=False, dtype=torch.float64)
        self.W = torch.nn.Parameter(torch.randn(3, 3, dtype=torch.float64))
        self.bias = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            h = self.lin(x[v])
            h **= 2
            h @= self.W
            out.append(h.__add__(self.bias).__radd__(self.lin(x[v])))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["fast", "backend"])
def test_augmented_assignments_and_dunder_additions_group_and_match_eager(front_end):
    """``operator.ipow`` / ``imatmul`` on fresh values become ``pow`` / ``matmul``; nothing keeps the order."""
    report = report_matching_eager(front_end, AugmentedAssignments(), torch.randn(8, 3, dtype=torch.float64))
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 2


@pytest.mark.parametrize("model_type", [Comparisons, MasksAndRemainders])
@pytest.mark.parametrize("front_end", ["fast", "backend", "batch"])
def test_comparison_operators_on_traced_values_match_eager(front_end, model_type):
    """Recorded as fx's proxies record them (``operator.eq``, ...), so that they group in a union too."""
    model = model_type()
    if front_end == "batch":
        assert_rows_batch_as_eager(model)
    else:
        report_matching_eager(front_end, model, torch.randn(6, 3, dtype=torch.float64))


class FilledFactories(torch.nn.Module):
    """Factories filled in place whose dtype is not their fill value's: ``torch.full`` would infer int64."""

    def forward(self, x):
        return x * 2, torch.zeros(3).fill_(2), torch.arange(3).fill_(1.5), x.new(2).zero_()


@pytest.mark.parametrize("front_end", ["fast", "backend"])
def test_a_filled_factory_keeps_its_dtype(front_end):
    x = torch.randn(3)
    compiled = (dynamo_relational.compile(FilledFactories(), [x]) if front_end == "fast"
                else torch.compile(FilledFactories(), backend="relational"))
    for got, want in zip(compiled(x), FilledFactories()(x)):
        torch.testing.assert_close(got, want)   # (dtypes included)


def test_zero_accumulator_is_no_term_of_the_sum():
    """``acc = torch.zeros(...); acc += ...`` traced by the fast front-end: the zero start drops
    out of the sum (tracing ran ``+=`` on the constant's traced value, which must not count)."""
    from examples.styles import AccumulatorGCN

    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    compiled = assert_fast_compile_matches_eager(AccumulatorGCN(batch).double(), batch.x, inductor=False)
    targets = [n.target for n in compiled.graph.graph.nodes]
    assert not [t for t in targets if isinstance(t, str) and t.startswith("_tensor_constant")]
    assert torch.cat not in targets   # the sum reads the linear's rows directly


class WrittenAfterRead(torch.nn.Module):
    """A tensor made in forward, read by a traced op, then written by a call without a traced argument."""

    def forward(self, x):
        t = torch.arange(3, dtype=x.dtype)
        a = x + t
        t.add_(1)
        return a + x * t


@pytest.mark.parametrize("front_end", ["fast", "backend"])
def test_a_tensor_made_in_forward_is_read_before_and_after_a_write_without_a_traced_argument(front_end):
    report_matching_eager(front_end, WrittenAfterRead(), torch.randn(3, dtype=torch.float64))


_COUNTS = torch.zeros(3, dtype=torch.float64)


class WritesAGlobalTensor(torch.nn.Module):
    def forward(self, x):
        a = x * _COUNTS
        _COUNTS.add_(1)
        return a


def test_a_write_into_a_tensor_made_outside_forward_after_a_traced_read_is_refused():
    read_at = r"read at .*test_model_styles.py:\d+ in forward: a = x \* _COUNTS"
    with pytest.raises(FrontendError, match=r"float64 tensor of shape \(3,\), " + read_at):
        dynamo_relational.compile(WritesAGlobalTensor(), [torch.randn(3, dtype=torch.float64)])


class RowsByConstantIndex(torch.nn.Module):
    """Rows read by the 0-dim items of an index tensor made in forward (``for u in order: x[u]``)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        order = torch.arange(x.shape[0] - 1, -1, -1)
        return torch.stack([torch.tanh(self.lin(x[u])) for u in order])


def test_rows_read_by_the_items_of_an_index_tensor_group_as_rows_read_by_ints():
    # (the fast front-end reads x[u] as x[int(u)], as PyTorch's indexing does; Dynamo breaks the graph there)
    report = report_matching_eager("fast", RowsByConstantIndex().double(), torch.randn(8, 3, dtype=torch.float64))
    assert not report.ungrouped, report.ungrouped
    assert report.nodes_after < report.nodes_before / 2


class DetachedFloorDivision(torch.nn.Module):
    """``abs`` of a value and of its detached copy, then ``//`` (no derivative) of the detached one."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3, dtype=torch.float64)

    def forward(self, x):
        out = []
        for v in range(x.shape[0]):
            h = self.lin(x[v])
            out.append(h.abs() + 3 // (h.detach().abs() + 1))
        return torch.stack(out)


@pytest.mark.parametrize("front_end", ["fast", "backend"])
def test_detached_values_are_grouped_apart_from_values_with_gradients(front_end):
    """Grouped together, the abs of the detached rows would have the group's autograd history, and the floor
    division of them an autograd node, which raises 'derivative for aten::floor_divide is not implemented' in the
    backward (eager's has none)."""
    report = report_matching_eager(front_end, DetachedFloorDivision(), torch.randn(4, 3, dtype=torch.float64))
    assert not report.ungrouped, report.ungrouped
