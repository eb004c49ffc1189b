"""Graph passes of the relational backend, in pipeline order.

Each pass is one module with ``run(graph_module, ctx) -> graph_module``.
"""
from . import aggregation, cleanup, cse, grouping, inplace, vectorize
from .context import PassContext

#: (name, pass) in the order the backend runs them
PIPELINE = (
    ("inplace", inplace.run),        # acc += t  ->  acc + t; find remaining mutations
    ("aggregation", aggregation.run),  # + trees, sum(), stack().sum(0) -> n-ary aggregate
    ("cse", cse.run),                # merge duplicated reads and ops
    ("grouping", grouping.run),      # signatures + schedule -> groups
    ("vectorize", vectorize.run),    # one vectorized node per group
    ("cleanup", cleanup.run),        # dead code, lint
)

__all__ = ["PIPELINE", "PassContext"]
