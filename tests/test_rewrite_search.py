"""passes/rewrite_search.py (with passes/commute_linear.py): sequences of rewrites searched under the
cost model; the compiled model equals eager wherever the search moves, and where it must not."""
import copy as copy_module

import pytest
import torch
import torch.fx as fx
from torch import nn

import dynamo_relational
from dynamo_relational.errors import OptionsError
from dynamo_relational.passes import rewrite_search
from examples.data import graph_batch
from examples.sum_product import AggregateThenTransform, TransformThenAggregate
from tests.helpers import BUILDERS, assert_fast_compile_matches_eager


def _search(compiled) -> dict:
    return compiled.report.graphs[0].stats["search"]


def _moves(compiled) -> list[str]:
    return [step["rewrite"] for step in _search(compiled)["path"]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("widths, moved_form", [((64, 4), AggregateThenTransform), ((4, 64), TransformThenAggregate)])
def test_the_linear_map_moves_to_the_narrower_side_of_the_sum(dtype, widths, moved_form):
    batch = graph_batch("mutagenesis", graphs=3, dtype=dtype)
    x = torch.randn(batch.x.shape[0], widths[0], dtype=dtype)
    best = {}
    for form in (AggregateThenTransform, TransformThenAggregate):
        torch.manual_seed(0)
        compiled = assert_fast_compile_matches_eager(form(batch, *widths).to(dtype), x, autotune=False)
        assert _moves(compiled) == (["commute_linear"] if form is moved_form else []), _search(compiled)
        best[form] = _search(compiled)["best_us"]
    # written either way, the model compiles to the graph of the same (lower) estimate
    assert best[AggregateThenTransform] == pytest.approx(best[TransformThenAggregate])


class BiasedTransformThenAggregate(nn.Module):
    """``sum(lin(x[u]))`` with a bias: the bias counts once per term, so the sum cannot be factored out."""

    def __init__(self, batch, in_features: int, out_features: int):
        super().__init__()
        self.nbrs = [[v, *nbrs] for v, nbrs in enumerate(batch.in_neighbors())]
        self.lin = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.stack([torch.tanh(sum(self.lin(x[u]) for u in nbrs)) for nbrs in self.nbrs])


def test_a_linear_with_a_bias_is_not_factored_out_of_a_sum():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    x = torch.randn(batch.x.shape[0], 4, dtype=torch.float64)
    compiled = assert_fast_compile_matches_eager(BiasedTransformThenAggregate(batch, 4, 64).double(), x,
                                                 autotune=False)
    assert "commute_linear" not in _moves(compiled)


class SharedSum(AggregateThenTransform):
    """The sum is also read directly, so the linear map cannot be distributed over it."""

    def forward(self, x):
        sums = [sum(x[u] for u in nbrs) for nbrs in self.nbrs]
        return torch.stack([torch.tanh(self.weight @ s) * s.sum() for s in sums])


def test_a_sum_with_other_readers_keeps_its_linear_map():
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    x = torch.randn(batch.x.shape[0], 64, dtype=torch.float64)
    compiled = assert_fast_compile_matches_eager(SharedSum(batch, 64, 4).double(), x, autotune=False)
    assert "commute_linear" not in _moves(compiled)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_search_never_raises_the_estimate(name):
    torch.manual_seed(0)
    batch = graph_batch("mutagenesis", graphs=3, dtype=torch.float64)
    compiled = assert_fast_compile_matches_eager(BUILDERS[name](batch).double(), batch.x, inductor=False)
    search = _search(compiled)
    assert search["best_us"] <= search["start_us"]
    if search["path"]:
        assert search["path"][-1]["estimate_us"] == search["best_us"]


def test_alpha_one_is_a_descent_and_a_larger_alpha_explores_more_graphs():
    batch = graph_batch("mutagenesis", graphs=3)
    model = BUILDERS["gin"](batch)
    graphs = []
    for alpha in (1.0, 1.05, 2.0):
        compiled = dynamo_relational.compile(model, [batch.x], inductor=False, progress=False, search_alpha=alpha,
                                             search_seconds=60.0)
        assert _search(compiled)["stopped_by"] == "exhausted"
        graphs.append(_search(compiled)["graphs"])
    assert graphs[0] < graphs[1] <= graphs[2], graphs


def test_the_time_bound_stops_the_search_and_keeps_the_graph():
    batch = graph_batch("mutagenesis", graphs=3)
    x = torch.randn(batch.x.shape[0], 64)
    compiled = dynamo_relational.compile(AggregateThenTransform(batch, 64, 4), [x], inductor=False, progress=False,
                                         search_seconds=0.0)
    search = _search(compiled)
    assert (search["graphs"], search["path"], search["stopped_by"]) == (1, [], "time")
    assert search["best_us"] == search["start_us"]


def test_disabled_search_leaves_the_written_order():
    batch = graph_batch("mutagenesis", graphs=3)
    x = torch.randn(batch.x.shape[0], 64)
    compiled = dynamo_relational.compile(AggregateThenTransform(batch, 64, 4), [x], inductor=False, progress=False,
                                         disable=("rewrite_search",))
    assert "search" not in compiled.report.graphs[0].stats


def test_explain_prints_the_path():
    batch = graph_batch("mutagenesis", graphs=2)
    text = str(dynamo_relational.explain(AggregateThenTransform(batch, 64, 4), torch.randn(batch.x.shape[0], 64),
                                         autotune=False))
    assert "rewrite search" in text and "step 1: commute_linear" in text


@pytest.mark.parametrize("option, value", [("search_alpha", 0.5), ("search_seconds", -1.0), ("search_alpha", "1")])
def test_bad_search_options_are_named(option, value):
    with pytest.raises(OptionsError, match=option):
        dynamo_relational.Options.from_mapping({option: value})


def test_graphs_are_known_by_their_wiring_and_index_contents():
    batch = graph_batch("mutagenesis", graphs=2)
    compiled = dynamo_relational.compile(AggregateThenTransform(batch, 8, 4), [torch.randn(batch.x.shape[0], 8)],
                                         inductor=False, progress=False, detailed=True)
    gm = compiled.report.graphs[0].graph_module
    signature, copy = rewrite_search._Signatures(), fx.GraphModule(gm, copy_module.deepcopy(gm.graph))
    assert signature(gm) == signature(copy)
    name = next(n.target for n in copy.graph.nodes if n.op == "get_attr" and n.target.startswith("_relational_"))
    changed = getattr(copy, name).clone()
    changed[-1] = 0 if changed[-1] != 0 else 1
    setattr(copy, name, changed)
    assert signature(gm) != signature(copy)
