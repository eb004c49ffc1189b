"""Choose the groups: which per-neuron nodes become one vectorized node.

Every compute node is described by the neuron-op catalog
(:mod:`dynamo_relational.ops`). Nodes with equal *signatures* may share a
vectorized node. The signature is the op's key (target, constant arguments,
operand shapes and dtypes) plus the identity of operands that are not
themselves groupable (weights, inputs): ``W1 @ h`` and ``W2 @ h`` stay apart,
each becoming one ``mm``, unless more than ``max_typed_groups`` weights share a
key, when the weights are gathered instead.

Two schedules (ASAP levels and DyNet's agenda), each with and without the
code-site hint (the user's source line as part of the signature), are
computed; the one with the fewest groups wins. Members of a group are
pairwise independent by construction of both schedules, which makes
vectorizing them legal. The result is ``ctx.groups``, in execution order.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch.fx as fx

from dynamo_relational.ops import NeuronOp, describe, tensor_info

from . import schedule
from .context import PassContext


@dataclass
class Group:
    nodes: list[fx.Node]
    #: the members' neuron ops; None for a node that can only run alone
    ops: list[NeuronOp] | None

    @property
    def family(self) -> str:
        return self.ops[0].family.name if self.ops else "alone"

    @property
    def signature(self) -> str:
        """What the members share, readably: target, output shape and dtype."""
        if not self.ops:
            return "alone"
        op = self.ops[0]
        target = op.node.target if isinstance(op.node.target, str) else getattr(op.node.target, "__name__", "?")
        return f"{target} -> {list(op.info.shape)} {str(op.info.dtype).replace('torch.', '')}"


def code_site(node: fx.Node) -> str:
    """The innermost user source line that produced ``node`` (``file:line``)."""
    trace = node.meta.get("stack_trace") or ""
    start = trace.rfind('File "')
    if start < 0:
        return ""
    end = trace.find(", in ", start)
    return trace[start + 6:end if end > 0 else None]


def _member_numel(op: NeuronOp) -> int:
    """The size that makes an op "large": its output, or for a stack/aggregation its largest
    term (``torch.stack`` of thousands of small neuron rows is the pattern to vectorize)."""
    if op.variadic:
        return max((t.numel for t in map(tensor_info, op.operands) if t is not None), default=0)
    return op.info.numel


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    opts = ctx.options
    units = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    index = {n: i for i, n in enumerate(units)}
    ops: list[NeuronOp | None] = []
    for node in units:
        op = describe(node) if not ctx.mutations else f"graph has in-place ops: {ctx.mutations[0]}"
        if isinstance(op, NeuronOp) and _member_numel(op) > opts.max_member_numel:
            op = f"{_member_numel(op)} elements per neuron > max_member_numel ({opts.max_member_numel})"
        if isinstance(op, str):
            ctx.leave_ungrouped(node, op)
            op = None
        ops.append(op)

    if ctx.mutations:  # keep the original order: moving a read across a write changes its value
        ctx.groups = [Group([n], None) for n in units]
        ctx.stats.update(units=len(units), groups=len(units), schedule="original order")
        return gm
    groupable = {units[i] for i, op in enumerate(ops) if op is not None}
    keys = [_typed_key(op, groupable) if op else None for op in ops]
    _relax_typed_keys(ops, keys, opts.max_typed_groups)
    preds = [[index[a] for a in n.all_input_nodes if a in index] for n in units]
    # Ops outside the catalog may be impure (random numbers, I/O): keep their relative order.
    previous_alone = None
    for i, op in enumerate(ops):
        if op is None:
            if previous_alone is not None:
                preds[i].append(previous_alone)
            previous_alone = i
    depth = schedule.asap_depths(preds)

    candidates = []
    hints = (True, False) if opts.code_site_hint else (False,)
    algorithms = {"asap": schedule.asap, "agenda": schedule.agenda}
    names = ["asap", "agenda"] if opts.scheduler == "auto" else [opts.scheduler]
    # No schedule has fewer groups than signatures (plus ungroupable nodes) or than the longest path:
    # once a candidate reaches that, the later ones cannot win the min below.
    floor = max(max(depth, default=-1) + 1, len(set(k for k in keys if k is not None)) + keys.count(None))
    for hint in hints:
        sigs = keys if not hint else [None if k is None else (k, code_site(units[i])) for i, k in enumerate(keys)]
        for name in names:
            groups = algorithms[name](preds, sigs, depth)
            candidates.append((len(groups), len(candidates), f"{name}{'+site' if hint else ''}", groups))
            if len(groups) <= floor:
                break
        if candidates[-1][0] <= floor:
            break
    count, _, chosen, groups = min(candidates)
    ctx.groups = [Group([units[i] for i in g], [ops[i] for i in g] if ops[g[0]] is not None else None)
                  for g in groups]
    ctx.stats.update(
        units=len(units), groups=count, schedule=chosen,
        schedules={name: c for c, _, name, _ in candidates},
        vectorizable=sum(1 for g in ctx.groups if g.ops and len(g.nodes) >= opts.min_group_size))
    if ctx.detailed:
        ctx.stats["lower_bound"] = schedule.lower_bound(preds, keys, depth)
    return gm


def _typed_key(op: NeuronOp, groupable: set) -> tuple:
    if op.variadic:
        return op.key
    return op.key + (tuple(o if (o is not None and o not in groupable) else None for o in op.operands),)


def _relax_typed_keys(ops, keys, max_typed: int) -> None:
    """Drop weight identity from keys that would otherwise split into too many groups."""
    variants: dict[tuple, set] = defaultdict(set)
    for op, key in zip(ops, keys):
        if op is not None and not op.variadic:
            variants[op.key].add(key)
    crowded = {k for k, v in variants.items() if len(v) > max_typed}
    for i, op in enumerate(ops):
        if op is not None and op.key in crowded:
            keys[i] = op.key + ("any weights",)
