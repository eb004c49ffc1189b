"""Graph passes of the relational backend, in pipeline order.

Each pass is one module with ``run(graph_module, ctx) -> graph_module``.
The first ten build the vectorized graph; the optimizer passes after them
(``OPTIONAL_PASSES``) can be switched off one by one with
``options={"disable": ("name", ...)}``; ``cleanup`` and ``distinct_outputs`` always run.
"""
from . import (absorb_gathers, aggregation, cleanup, compose_gathers, compress_values, cse, distinct_outputs,
               fold_bias, fuse_linear, grouping, inplace, linear_layout, lstm_cells, mode_regions, padded_gathers,
               postpone_gathers, recompute_gathers, rewrite_search, row_writes, simplify_gathers, split_views,
               values_indices, vectorize)
from .context import PassContext

#: (name, pass) in the order the backend runs them
PIPELINE = (
    ("row_writes", row_writes.run),  # out = zeros(n, d); out[i] = h_i; out[i] += m  ->  stack of rows
    ("inplace", inplace.run),        # acc += t  ->  acc + t; find remaining in-place ops
    ("mode_regions", mode_regions.run),  # no_grad blocks -> detached values; other mode switches keep the order
    ("split_views", split_views.run),  # h.chunk(3)[j], torch.split(h, s)[j], h.unbind(0)[j], h.narrow -> slices
    ("values_indices", values_indices.run),  # torch.max(h, 0)[0], h.sort(stable=True).indices -> one op per part
    ("lstm_cells", lstm_cells.run),  # torch.lstm_cell (nn.LSTMCell) -> its linears and gates
    ("aggregation", aggregation.run),  # + trees, sum(), stack().sum(0) -> n-ary aggregate
    ("cse", cse.run),                # merge duplicated reads and ops
    ("grouping", grouping.run),      # signatures + schedule -> groups
    ("vectorize", vectorize.run),    # one vectorized node per group
    ("compress_values", compress_values.run),  # equal rows computed once (option value_compression)
    ("postpone_gathers", postpone_gathers.run),  # f(x[I]) -> f(x)[I] for row-wise f
    ("compose_gathers", compose_gathers.run),    # gathers of gathers read the original rows
    ("simplify_gathers", simplify_gathers.run),  # identity / range gathers -> views
    ("absorb_gathers", absorb_gathers.run),  # f(reduce(z))[I] -> f(reduce over segments I of z)
    ("fuse_linear", fuse_linear.run),  # linear(linear(x)) -> one linear, also through sum/mean gathers
    ("rewrite_search", rewrite_search.run),  # sequences of the rewrites above (and commute_linear), by cost
    ("fold_bias", fold_bias.run),    # add(linear(x, W), b) -> linear(x, W, b)
    ("linear_layout", linear_layout.run),  # tall, narrow linear -> (W x^T)^T where measured faster
    ("padded_gathers", padded_gathers.run),  # gather_reduce -> padded ATen form (option gather_reduce_form)
    ("distinct_outputs", distinct_outputs.run),  # outputs share memory as eager's: views of inputs, clones
    ("cleanup", cleanup.run),        # dead code, reshape chains, lint
    ("recompute_gathers", recompute_gathers.run),  # edge-sized gathers: recompute in backward, not saved
)

#: the optimizer passes that ``options["disable"]`` may name
OPTIONAL_PASSES = ("compress_values", "postpone_gathers", "compose_gathers", "simplify_gathers", "absorb_gathers",
                   "fuse_linear", "rewrite_search", "fold_bias", "linear_layout", "padded_gathers", "recompute_gathers")

__all__ = ["PIPELINE", "OPTIONAL_PASSES", "PassContext"]
