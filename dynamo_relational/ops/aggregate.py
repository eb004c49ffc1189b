"""Aggregations over a neuron's inputs, and stacks/cats of neuron values.

``aggregate(terms, reduce)`` is the n-ary node that the aggregation pass makes
from ``+`` trees, ``sum(...)`` and ``torch.stack(list).sum/mean/amax/amin(0)``.
A group of them reduces all members' terms at once: sums and means become one
fused ``gather_reduce`` (a sparse CSR product that reads the terms' rows in
place); max and min gather the terms into one ``[T, *shape]`` tensor, then
reduce it densely (``reshape(k, f, ...)``) for uniform fan-in or per CSR
segment for variable fan-in. Terms shared by every member (a bias) are added
once, broadcast.

``torch.stack`` / ``torch.cat`` of neuron values (typically the model's output
``torch.stack(out)``) become one gather plus a reshape.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.fx as fx

from dynamo_relational.kernels.gather_reduce import GATHER_REDUCTIONS

from .base import NeuronOp, OpFamily, TensorInfo, register, tensor_info

REDUCTIONS = ("sum", "mean", "amax", "amin")


def aggregate(terms: list[torch.Tensor], reduce: str) -> torch.Tensor:
    """n-ary reduction of same-shaped tensors (the eager meaning of an aggregate node): a new tensor,
    as the additions it replaces made (never its one term itself, which an output's user could write)."""
    if len(terms) == 1:
        return terms[0].clone()
    if reduce == "sum" and len(terms) == 2:
        return terms[0] + terms[1]
    return getattr(torch.stack(terms), reduce)(0)


def _terms_info(terms: Sequence[fx.node.Argument]) -> list[TensorInfo] | None:
    infos = [i for i in map(tensor_info, terms) if i is not None]
    return infos if terms and len(infos) == len(terms) else None


class Aggregate(OpFamily):
    name = "aggregate"
    fresh = True
    variadic = True

    def describe(self, node: fx.Node) -> NeuronOp | str:
        terms, reduce = node.args
        info = tensor_info(node)
        if info is None or not isinstance(terms, (list, tuple)) or not terms \
                or any(tensor_info(t) is not info for t in terms):   # infos are interned
            return "aggregation terms are not tensors of one static shape"
        return NeuronOp(node, self, (self.name, reduce, info), tuple(terms), info, (), reduce)

    def member_numel(self, op: NeuronOp) -> int:
        return op.info.numel   # every term has the output's info (describe checked)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        g, k, info, reduce = b.graph, len(members), members[0].info, members[0].template
        terms = [list(m.operands) for m in members]
        common = _common_terms(terms) if reduce == "sum" and k > 1 else []
        if common:  # e.g. a bias in every sum: add it once, broadcast, instead of gathering it k times
            terms = [[t for t in ts if t not in common] for ts in terms]
        counts = [len(ts) for ts in terms]
        flat = [t for ts in terms for t in ts]
        result = None
        if max(counts) > 1 and reduce in GATHER_REDUCTIONS and info.dtype.is_floating_point:
            # sum/mean: gather and reduce in one sparse product, no [T, ...] copy
            base, rows = b.rows_of(flat)
            result = b.gather_reduce(base, rows, counts, reduce, info.device)
        elif any(counts):
            data = b.gather(flat)
            if all(c == 1 for c in counts):
                result = data
            elif all(c == counts[0] for c in counts):
                dense = g.call_method("reshape", (data, (k, counts[0], *info.shape)))
                result = g.call_method(reduce, (dense, 1))
            else:
                result = g.call_function(torch.ops.dynamo_relational.segment_reduce.default,
                                         (data, b.csr(counts, info.device), reduce))
        for t in common:
            shared = b.value(t)
            result = shared if result is None else g.call_function(torch.add, (result, shared))
        if all(c == 0 for c in counts):  # every member is the same sum of shared terms
            result = g.call_method("expand", (g.call_method("unsqueeze", (result, 0)), (k, *info.shape)))
        return result


def _common_terms(terms: list[list[fx.Node]]) -> list[fx.Node]:
    """Terms that occur exactly once in every member's list."""
    def once(ts):
        seen, twice = set(), set()
        for t in ts:
            (twice if t in seen else seen).add(t)
        return seen - twice

    common = once(terms[0])
    for ts in terms[1:]:
        if not common:
            break
        common &= once(ts)
    return [t for t in terms[0] if t in common]


class Stack(OpFamily):
    name = "stack"
    variadic = True
    #: above this many terms of differing shapes, a per-position gather costs too much
    max_mixed_terms = 16

    def describe(self, node: fx.Node) -> NeuronOp | str:
        terms = node.args[0] if node.args else node.kwargs.get("tensors")
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        if len(node.args) > 2 or set(node.kwargs) - {"tensors", "dim"} or type(dim) is not int:
            return "stack/cat with unexpected arguments"
        info = tensor_info(node)
        if not isinstance(terms, (list, tuple)) or (infos := _terms_info(terms)) is None or info is None:
            return "stack/cat of something other than tensors of static shape"
        if len({(i.dtype, i.device) for i in infos}) > 1:
            return "stack/cat of mixed dtypes or devices"
        uniform = all(i == infos[0] for i in infos)
        if not uniform and len(infos) > self.max_mixed_terms:
            return f"cat of {len(infos)} terms of different shapes"
        rank = infos[0].rank + (node.target is torch.stack)
        if node.target is torch.cat and infos[0].rank == 0:
            return "cat of 0-d tensors"
        dim = dim % rank
        layout = ("uniform", len(infos), infos[0]) if uniform else ("mixed", tuple(infos))
        key = (self.name, node.target, dim, layout, info)
        return NeuronOp(node, self, key, tuple(terms), info, (), dim)

    def emit(self, members: Sequence[NeuronOp], b) -> fx.Node | None:
        g, k, first = b.graph, len(members), members[0]
        dim, n = first.template, len(first.operands)
        term = tensor_info(first.operands[0])
        assert term is not None   # (describe checked)
        if all(tensor_info(t) == term for t in first.operands):
            data = b.gather([t for m in members for t in m.operands])
            stacked = g.call_method("reshape", (data, (k, n, *term.shape)))
            if dim != 0:
                stacked = g.call_method("movedim", (stacked, 1, dim + 1))
            if first.node.target is torch.stack:
                return stacked
            return g.call_method("reshape", (stacked, (k, *first.info.shape)))
        columns = [b.gather([m.operands[j] for m in members]) for j in range(n)]
        return g.call_function(first.node.target, (columns, dim + 1))


AGGREGATE = register(Aggregate(), functions=[aggregate])
STACK = register(Stack(), functions=[torch.stack, torch.cat])
