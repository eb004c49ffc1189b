"""Rewrite search: explore sequences of rewrites under the cost model, not greedily.

The optimizer passes before this one each decide alone, site by site. Their
rewrites interact: moving a gather below a linear can cost more until
``compose_gathers`` folds it into the reduction below; distributing a linear
over a reduction (``commute_linear``) can enable a fusion with the linear
before it. This pass searches over such sequences, starting from the graph
the greedy passes left:

* **moves** (:data:`REWRITES`): every legal site of ``postpone_gathers``,
  ``commute_linear`` in both directions (factor or distribute a sum-product, as SPORES considers),
  ``fuse_linear`` and ``absorb_gathers`` (including what their local
  estimates reject);
* after each move, the always-profitable clean-ups run (``compose_gathers``,
  ``simplify_gathers``, ``cleanup``), so a graph is judged in its tidied form;
* **relaxed acceptance** (Jia et al., *Optimizing DNN computation with relaxed
  graph substitutions*): graphs are expanded cheapest first from a priority
  queue, and a new graph is queued when its estimated cost is below
  ``alpha`` times the best found so far, so a temporarily worse graph is
  explored when a later rewrite may pay for it (backtracking happens through
  the queue). Graphs already seen (same ops, same index constants) are skipped;
* **cost**: :func:`dynamo_relational.cost.graph_cost`, FLOPs plus bytes of the
  whole graph on its device, from a table (so the result does not depend on
  machine load);
* **bounds**: ``options.search_seconds`` of wall time and :data:`MAX_GRAPHS`
  graphs. If the time bound stops the search, the result may depend on the
  machine's speed; the report says whether it did.

Legal because every move is a rewrite its own module proves legal (each
checks its conditions on the site and leaves the graph alone otherwise), and
the clean-ups are legal everywhere. The best graph is returned only if its
estimate is lower than the starting graph's, so the pass never makes the
estimate worse. The path (each move, its site and the estimate after it) is
in ``stats["search"]`` and printed by ``explain()``.
"""
from __future__ import annotations

import copy
import hashlib
import heapq
import itertools
import time
from typing import Callable, NamedTuple

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _LazyGraphModule

from dynamo_relational import cost
from dynamo_relational.ops import tensor_info

from . import absorb_gathers, cleanup, commute_linear, compose_gathers, fuse_linear, postpone_gathers, simplify_gathers
from .context import PassContext
from .gather_nodes import is_added_constant

#: at most this many distinct graphs are costed per compilation
MAX_GRAPHS = 200


class Rewrite(NamedTuple):
    name: str
    #: the sites of a graph, each a tuple of nodes
    sites: Callable[[fx.GraphModule], list]
    #: apply at one site (nodes of the graph given); False where the rewrite turned out not to apply
    apply: Callable[..., bool]


REWRITES = (
    Rewrite("postpone_gathers", postpone_gathers.sites, postpone_gathers.apply),
    Rewrite("commute_linear", commute_linear.sites, commute_linear.apply),
    Rewrite("fuse_linear", fuse_linear.sites, fuse_linear.apply),
    Rewrite("absorb_gathers", absorb_gathers.sites, absorb_gathers.apply),
)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    started = time.perf_counter()
    deadline = started + ctx.options.search_seconds
    device = next((info.device for info in map(tensor_info, gm.graph.nodes) if info is not None), "cpu")
    signature = _Signatures()

    def estimate(graph: fx.GraphModule) -> float:
        return cost.graph_cost(graph).seconds(device) * 1e6

    start_us = best_us = estimate(gm)
    best, best_path = gm, []
    order = itertools.count()
    queue = [(best_us, next(order), gm, [])]
    seen = {signature(gm)}
    while queue and len(seen) < MAX_GRAPHS and time.perf_counter() < deadline:
        _, _, graph, path = heapq.heappop(queue)
        for rewrite in REWRITES:
            for site in rewrite.sites(graph):
                if len(seen) >= MAX_GRAPHS or time.perf_counter() >= deadline:
                    break
                candidate = _LazyGraphModule(graph, copy.deepcopy(graph.graph))   # no code until needed
                nodes = {n.name: n for n in candidate.graph.nodes}
                if not rewrite.apply(candidate, *(nodes[n.name] for n in site)):
                    continue
                _tidy(candidate, ctx)
                key = signature(candidate)
                if key in seen:
                    continue
                seen.add(key)
                candidate_us = estimate(candidate)
                step = path + [dict(rewrite=rewrite.name, at=" > ".join(n.name for n in site),
                                    estimate_us=candidate_us)]
                if candidate_us < best_us:
                    best, best_us, best_path = candidate, candidate_us, step
                if candidate_us < ctx.options.search_alpha * best_us:
                    heapq.heappush(queue, (candidate_us, next(order), candidate, step))
    ctx.stats["search"] = dict(start_us=start_us, best_us=best_us, path=best_path, graphs=len(seen),
                               seconds=time.perf_counter() - started,
                               stopped_by=("graph limit" if len(seen) >= MAX_GRAPHS else
                                           "time" if time.perf_counter() >= deadline else "exhausted"))
    return best if best is gm else fx.GraphModule(best, best.graph)


def _tidy(gm: fx.GraphModule, ctx: PassContext) -> None:
    """The clean-ups that never cost more, with their statistics kept out of the report."""
    scratch = PassContext(ctx.options)
    for tidy in (compose_gathers.run, simplify_gathers.run, cleanup.run):
        tidy(gm, scratch)


class _Signatures:
    """A key per graph: its nodes' ops and wiring, with each index constant known by its content."""

    def __init__(self):
        self._digests: dict[int, tuple[torch.Tensor, bytes]] = {}

    def _digest(self, tensor: torch.Tensor) -> bytes:
        known = self._digests.get(id(tensor))
        if known is None or known[0] is not tensor:
            data = tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()   # 0-d too
            digest = hashlib.blake2b(data, digest_size=16)
            digest.update(repr((tensor.dtype, tuple(tensor.shape))).encode())   # equal bytes, other shapes
            known = self._digests[id(tensor)] = (tensor, digest.digest())
        return known[1]

    def __call__(self, gm: fx.GraphModule) -> int:
        position, parts = {}, []
        for i, node in enumerate(gm.graph.nodes):
            position[node] = i
            if is_added_constant(node):
                value = getattr(gm, node.target)
                parts.append(("constant", tuple(value.shape), value.dtype, self._digest(value)))
            else:
                wiring = fx.node.map_arg((node.args, node.kwargs), lambda n: f"%{position[n]}")
                parts.append((node.op, str(node.target), repr(wiring)))
        return hash(tuple(parts))
