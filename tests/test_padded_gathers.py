"""The padded form of gather-reductions (``kernels/padded.py``, ``passes/padded_gathers.py``, option
``gather_reduce_form``): the same numbers and gradients as ``gather_reduce`` and as eager."""
import itertools
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from dynamo_relational import OptionsError
from dynamo_relational.kernels.gather_reduce import gather_reduce, pack_csr
from dynamo_relational.kernels.padded import ell_layout, gather_reduce_padded
from dynamo_relational.kernels.segment import csr_offsets
from examples.data import graph_batch
from examples.gcn import ScalarGCN
from examples.sage import ScalarSAGE
from tests.helpers import TOLERANCE, assert_compiled_matches_eager, assert_fast_compile_matches_eager


@pytest.mark.parametrize("reduce, transpose", itertools.product(("sum", "mean", "mean_adjoint"), (False, True)))
def test_padded_form_equals_gather_reduce(reduce, transpose):
    counts = [3, 0, 2, 4, 1, 0]          # empty segments, and a widest one of 4
    csr = pack_csr(csr_offsets(counts), torch.tensor([0, 4, 2, 1, 1, 3, 0, 4, 2, 5]), 6)
    rows, columns = (6, len(counts)) if transpose else (len(counts), 6)
    generator = torch.Generator().manual_seed(0)
    source = torch.randn(columns, 2, 3, dtype=torch.float64, generator=generator, requires_grad=True)
    slots, weights = ell_layout(csr, rows, columns, transpose, reduce)
    got = gather_reduce_padded(source, slots, weights)
    want = gather_reduce(source, csr, rows, reduce, transpose)
    torch.testing.assert_close(got, want, **TOLERANCE[torch.float64])
    direction = torch.randn(want.shape, dtype=torch.float64, generator=generator)
    grad_got, = torch.autograd.grad((got * direction).sum(), source)
    grad_want, = torch.autograd.grad((want * direction).sum(), source)
    torch.testing.assert_close(grad_got, grad_want, **TOLERANCE[torch.float64])


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_padding_reads_an_infinite_or_nan_row_0_without_spreading_it(value):
    """Padding slots read row 0 with weight 0: a row 0 of inf or NaN must not make the short segments
    (which do not read it) NaN, in the forward or in the gradient of the other rows."""
    counts = [1, 3, 0, 2]
    csr = pack_csr(csr_offsets(counts), torch.tensor([2, 0, 1, 3, 1, 2]), 4)
    source = torch.randn(4, 2, dtype=torch.float64)
    source[0, 1] = value
    source.requires_grad_()
    slots, weights = ell_layout(csr, 4, 4, False, "sum")
    got = gather_reduce_padded(source, slots, weights)
    want = gather_reduce(source, csr, 4, "sum")
    torch.testing.assert_close(got, want, equal_nan=True)
    assert not got[[0, 2, 3]].isnan().any()
    grad_got, = torch.autograd.grad(got[[0, 2, 3]].sum(), source)
    grad_want, = torch.autograd.grad(want[[0, 2, 3]].sum(), source)
    torch.testing.assert_close(grad_got, grad_want)


def test_ell_layout_rejects_an_unknown_reduction():
    csr = pack_csr(csr_offsets([1]), torch.tensor([0]), 1)
    with pytest.raises(ValueError, match="reduce must be one of"):
        ell_layout(csr, 1, 1, False, "amax")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("model_class", [ScalarGCN, ScalarSAGE])   # sums; means
def test_padded_graphs_match_eager_through_inductor(model_class, dtype):
    """``autotune=False``: Inductor's code runs, never the ATen executor (``choose_executor``), so
    the padded form is lowered by Inductor."""
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", 4)
    model = model_class(batch, batch.x.shape[1], hidden=4, layers=2).to(dtype)
    compiled = assert_fast_compile_matches_eager(model, batch.x.to(dtype), gather_reduce_form="padded",
                                                 autotune=False)
    stats = compiled.report.graphs[0].stats
    assert stats["padded_gathers"] >= 2 and stats["padded_gathers_kept"] == 0
    default = assert_fast_compile_matches_eager(model, batch.x.to(dtype), autotune=False)
    assert "padded_gathers" not in default.report.graphs[0].stats   # the default form: the pass does nothing



def test_padded_graphs_of_new_groundings_reuse_the_compiled_code():
    """Slots and weights are index buffers like the packed CSR: other batches (other widths) share
    the code compiled for dynamic sizes, from the third grounding on without Inductor."""
    torch.manual_seed(0)
    first = None
    for seed in range(4):
        batch = graph_batch("mutagenesis", 3 + seed, seed=seed)
        model = ScalarSAGE(batch, batch.x.shape[1], hidden=4, layers=2).double()
        first = first or model.state_dict()
        model.load_state_dict(first)
        compiled = assert_fast_compile_matches_eager(model, batch.x.double(), gather_reduce_form="padded")
        assert compiled.report.graphs[0].stats["padded_gathers"] >= 2
    assert compiled.report.graphs[0].stats["schema_uses"] >= 3
    assert "inductor" not in compiled.report.graphs[0].timings

class StarSum(nn.Module):
    """Node 0 sums all the others' rows; every other node reads one neighbour."""

    def __init__(self, nodes: int):
        super().__init__()
        self.in_nbrs = [list(range(1, nodes))] + [[(v + 1) % nodes] for v in range(1, nodes)]
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = [self.lin(x[v]) for v in range(len(self.in_nbrs))]
        return torch.stack([torch.tanh(sum(h[u] for u in nbrs)) for nbrs in self.in_nbrs])


def test_a_wide_segment_keeps_the_csr_product():
    """Padding 40 rows to node 0's 39 entries would read 20x as many: the node keeps ``gather_reduce``."""
    torch.manual_seed(0)
    model = StarSum(40).double()
    report = assert_compiled_matches_eager(model, torch.randn(40, 3, dtype=torch.float64),
                                           gather_reduce_form="padded")
    stats = report.graphs[0].stats
    assert stats["padded_gathers_kept"] >= 1 and "gather_reduce" in report.graphs[0].after
    assert f"{stats['padded_gathers_kept']} kept the CSR product" in str(report)   # explain() says so


def test_an_unknown_form_is_an_error_naming_the_option():
    with pytest.raises(OptionsError, match="gather_reduce_form.*'csr' or 'padded'"):
        assert_compiled_matches_eager(StarSum(3), torch.randn(3, 3), gather_reduce_form="ell")


class RandomAggregation(nn.Module):
    """Each node sums (or averages) its in-neighbours' ``tanh(lin(x))`` rows; a node without
    in-neighbours keeps its own row."""

    def __init__(self, in_nbrs: list[list[int]], width: int, mean: bool):
        super().__init__()
        self.in_nbrs, self.mean, self.lin = in_nbrs, mean, nn.Linear(width, width)

    def forward(self, x):
        h = [torch.tanh(self.lin(x[v])) for v in range(len(self.in_nbrs))]
        out = []
        for v, nbrs in enumerate(self.in_nbrs):
            if not nbrs:
                out.append(h[v])
            elif self.mean:
                out.append(torch.stack([h[u] for u in nbrs]).mean(0))
            else:
                out.append(sum(h[u] for u in nbrs))
        return torch.stack(out)


aggregation_graphs = dict(
    fan_ins=st.lists(st.lists(st.integers(0, 100), max_size=5), min_size=4, max_size=24),
    width=st.integers(1, 3), mean=st.booleans(), double=st.booleans(), seed=st.integers(0, 2 ** 16))


def _check_random_aggregation(fan_ins, width, mean, double, seed):
    torch.manual_seed(seed)
    dtype = torch.float64 if double else torch.float32
    in_nbrs = [[u % len(fan_ins) for u in nbrs] for nbrs in fan_ins]
    model = RandomAggregation(in_nbrs, width, mean).to(dtype)
    assert_compiled_matches_eager(model, torch.randn(len(in_nbrs), width, dtype=dtype), inductor=False,
                                  gather_reduce_form="padded")


@settings(max_examples=int(os.environ.get("RELATIONAL_FUZZ_EXAMPLES", "8")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(**aggregation_graphs)
def test_random_aggregations_match_eager_in_the_padded_form(fan_ins, width, mean, double, seed):
    _check_random_aggregation(fan_ins, width, mean, double, seed)


@pytest.mark.fuzz
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(**aggregation_graphs)
def test_three_hundred_random_aggregations_match_eager_in_the_padded_form(fan_ins, width, mean, double, seed):
    """``./test.sh -m fuzz`` runs it."""
    _check_random_aggregation(fan_ins, width, mean, double, seed)
