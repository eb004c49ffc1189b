"""Graph passes of the relational backend: :data:`PIPELINE`, one :class:`Pass` record per pass, in order.

Each pass is one module with ``run(graph_module, ctx) -> graph_module``.
The passes up to ``vectorize`` build the vectorized graph; the optimizer
passes after them (``optional``: :data:`OPTIONAL_PASSES`) can be switched off
one by one with ``options={"disable": ("name", ...)}``, and one that fails is
skipped; ``distinct_outputs`` and ``cleanup`` always run. Each record names
the passes it needs before it, and the order is checked when this module is
imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.fx as fx

from . import (absorb_gathers, aggregation, cleanup, compose_gathers, compress_values, constant_indices, cse,
               distinct_outputs, fold_bias, fold_constants, fuse_linear, grouping, hoist_gathers, inplace,
               linear_layout, lstm_cells, merge_gathers, mode_regions, padded_gathers, pair_sums, plain_factories,
               postpone_gathers, ragged_rows, recompute_gathers, rewrite_search, row_picks, row_writes,
               segment_provider, simplify_gathers, split_views, values_indices, vectorize)
from .context import PassContext


@dataclass(frozen=True)
class Pass:
    """One step of :data:`PIPELINE`."""
    name: str
    run: Callable[[fx.GraphModule, PassContext], fx.GraphModule]
    #: what it rewrites, in one line
    does: str
    #: the passes that must run before it (what it relies on)
    needs: tuple[str, ...] = ()
    #: an optimizer pass: ``options["disable"]`` may name it, and where it fails the graph it started from is kept
    optional: bool = False
    #: legal on a union of samples for every batch of them (``dynamo_relational.batch``): what it reads of the
    #: index values holds for every batch's restriction of them (a row read at most once, a part read whole
    #: in order; not rows contiguous in the union, or merged by value, which are not so in another batch) and
    #: it keeps the samples' rows in dim 0
    on_unions: bool = False
    #: runs on unions only: a rewrite for the ATen calls a union's code is, which Inductor's code (fusing a
    #: gather into its reader) does not gain from
    unions_only: bool = False


_VECTORIZED = ("vectorize",)

#: the passes in the order the backend runs them
PIPELINE: tuple[Pass, ...] = (
    Pass("row_writes", row_writes.run, "out = zeros(n, d); out[i] = h_i; out[i] += m  ->  stack of rows"),
    Pass("constant_indices", constant_indices.run,
         "h[src], z.index_add(0, dst, m) by a sample's constant indices -> stacks of rows and of their sums"),
    Pass("inplace", inplace.run, "acc += t  ->  acc + t; find the in-place ops that remain", ("row_writes",)),
    Pass("plain_factories", plain_factories.run, "x.new_zeros(n, d), zeros_like(x) -> torch.zeros(n, d, ...)",
         ("inplace",)),
    Pass("fold_constants", fold_constants.run, "ops of a sample's factories and constants alone -> one constant",
         ("plain_factories",)),
    Pass("mode_regions", mode_regions.run,
         "no_grad blocks -> detached values; other mode switches keep the order", ("inplace",)),
    Pass("split_views", split_views.run, "h.chunk(3)[j], torch.split(h, s)[j], h.unbind(0)[j], h.narrow -> slices"),
    Pass("values_indices", values_indices.run, "torch.max(h, 0)[0], h.sort(stable=True).indices -> one op per part"),
    Pass("lstm_cells", lstm_cells.run, "torch.lstm_cell (nn.LSTMCell) -> its linears and gates"),
    Pass("row_picks", row_picks.run, "x[torch.arange(k), labels] -> x.gather(1, labels[:, None])[:, 0]"),
    Pass("ragged_rows", ragged_rows.run, "sum(f(cat([h_1, ..., h_k])), 0) -> f(h_1) + ... + f(h_k) for row-wise f",
         ("inplace", "split_views")),
    Pass("aggregation", aggregation.run, "+ trees, sum(), stack().sum(0) -> n-ary aggregate", ("inplace",)),
    Pass("cse", cse.run, "merge duplicated reads and ops", ("inplace",)),
    Pass("grouping", grouping.run, "signatures + schedule -> groups", ("aggregation", "cse"), on_unions=True),
    Pass("vectorize", vectorize.run, "one vectorized node per group", ("grouping",), on_unions=True),
    Pass("compress_values", compress_values.run, "equal rows computed once (option value_compression)",
         _VECTORIZED, optional=True),
    Pass("postpone_gathers", postpone_gathers.run, "f(x[I]) -> f(x)[I] for row-wise f", _VECTORIZED, optional=True,
         on_unions=True),
    Pass("hoist_gathers", hoist_gathers.run, "f(X[P])[I_k] -> f(X[P[I_k]]) per reader, a whole part read as it is",
         _VECTORIZED, optional=True, on_unions=True),
    Pass("compose_gathers", compose_gathers.run, "gathers of gathers read the original rows", _VECTORIZED,
         optional=True, on_unions=True),
    Pass("simplify_gathers", simplify_gathers.run, "identity / range gathers -> views", _VECTORIZED, optional=True),
    Pass("absorb_gathers", absorb_gathers.run, "f(reduce(z))[I] -> f(reduce over segments I of z)", _VECTORIZED,
         optional=True),
    Pass("fuse_linear", fuse_linear.run, "linear(linear(x)) -> one linear, also through sum/mean gathers",
         _VECTORIZED, optional=True, on_unions=True),
    Pass("rewrite_search", rewrite_search.run, "sequences of the rewrites above (and commute_linear), by cost",
         _VECTORIZED, optional=True),
    Pass("fold_bias", fold_bias.run, "add(linear(x, W), b) -> linear(x, W, b)", _VECTORIZED, optional=True,
         on_unions=True),
    Pass("pair_sums", pair_sums.run, "gather_reduce(cat([a, b])) of a row of each -> a[I] + b", _VECTORIZED,
         optional=True, on_unions=True),
    Pass("merge_gathers", merge_gathers.run, "X[I_1], ..., X[I_k] -> split(X[cat(I_1, ..., I_k)])", _VECTORIZED,
         optional=True, on_unions=True, unions_only=True),
    Pass("linear_layout", linear_layout.run, "tall, narrow linear -> (W x^T)^T where measured faster",
         ("fold_bias",), optional=True),
    Pass("padded_gathers", padded_gathers.run, "gather_reduce -> padded ATen form (option gather_reduce_form)",
         _VECTORIZED, optional=True),
    Pass("distinct_outputs", distinct_outputs.run, "outputs share memory as eager's: views of inputs, clones",
         _VECTORIZED),
    Pass("cleanup", cleanup.run, "dead code, reshape chains, lint", ("distinct_outputs",), on_unions=True),
    Pass("recompute_gathers", recompute_gathers.run, "edge-sized gathers: recompute in backward, not saved",
         ("cleanup",), optional=True),
    Pass("segment_provider", segment_provider.run, "segment_reduce calls name options.segment_provider",
         _VECTORIZED, on_unions=True),
)

#: the optimizer passes that ``options["disable"]`` may name
OPTIONAL_PASSES: tuple[str, ...] = tuple(p.name for p in PIPELINE if p.optional)


def check_order(pipeline: tuple[Pass, ...]) -> None:
    """``ValueError`` unless every pass comes after the passes it needs, and names are unique."""
    seen: set[str] = set()
    for p in pipeline:
        missing = [n for n in p.needs if n not in seen]
        if missing or p.name in seen:
            raise ValueError(f"pass {p.name} runs before {missing}, which it needs" if missing
                             else f"pass {p.name} appears twice in the pipeline")
        seen.add(p.name)


check_order(PIPELINE)

__all__ = ["PIPELINE", "OPTIONAL_PASSES", "Pass", "PassContext", "check_order"]
