"""Choose the groups: which per-neuron nodes become one vectorized node.

Every compute node is described by the neuron-op catalog
(:mod:`dynamo_relational.ops`). Nodes with equal *signatures* may share a
vectorized node. The signature is the op's key (target, constant arguments,
operand shapes and dtypes) plus the identity of operands that are not
themselves groupable (weights, inputs): ``W1 @ h`` and ``W2 @ h`` stay apart,
each becoming one ``mm``, unless more than ``max_typed_groups`` weights share a
key, when the weights are gathered instead. Values computed from a detached
value without autograd history stay apart from the others too: a group's result
has the history where one member's has, and an op without a derivative (``//``)
on the rows of a member without it would raise in the backward, where eager's has
no autograd node.

Two schedules (ASAP levels and DyNet's agenda) and, for a union of samples
(``dynamo_relational.batch``), a third (an agenda that runs the signature with
the largest share of its remaining units ready), each with and without the
code-site hint (the user's source line as part of the signature), are
computed; the one with the fewest groups wins, one with the hint on ties. Where the hint splits no
signature, the schedules without it would be the same and are not run; where the lower bound for the
hint's finer signatures is above the best schedule without it, those with it cannot win and are not run.
Members of a group are pairwise independent by construction of both
schedules, which makes vectorizing them legal. The result is ``ctx.groups``, in execution order.

Nodes outside the catalog run alone, in their original relative order (they
may be impure), and are reported as left ungrouped; so does dropout in
training, which draws eager's random numbers in eager's order that way,
unless the ``group_dropout`` option groups it like an elementwise op. Deterministic factory
calls (``torch.zeros(8)``, ``x.new_zeros(8)``; CSE merged the equal ones) are
constants instead: they also run alone, but move freely and are not reported. So
are, in a union of samples, the values computed from parameters alone.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.fx as fx

from dynamo_relational.ops import NeuronOp, describe, tensor_info
from dynamo_relational.ops.elementwise import ELEMENTWISE, draws_random_numbers
from dynamo_relational.ops.facts import is_factory

from . import schedule
from .context import PassContext
from .vectorize import JOINED_OUTPUT, SAMPLE


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
    return op.family.member_numel(op)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    opts = ctx.options
    units = [n for n in gm.graph.nodes if n.op in _UNIT_OPS]
    index = {n: i for i, n in enumerate(units)}
    ops: list[NeuronOp | None] = []
    #: indices of deterministic factory calls (``torch.zeros(8)``): constants, not work left ungrouped
    constants = set()
    max_numel = opts.max_member_numel
    # In a union of samples (dynamo_relational.batch), a node of no sample is computed from parameters alone,
    # once for every sample (``union.py``): grouping it with others would make rows that belong to no sample.
    union = any(SAMPLE in n.meta for n in units)
    for i, node in enumerate(units):
        if union and SAMPLE not in node.meta and JOINED_OUTPUT not in node.meta:
            constants.add(i)
            ops.append(None)
            continue
        op = describe(node) if not ctx.keep_order else f"graph keeps its order: {ctx.keep_order[0]}"
        if type(op) is str and opts.group_dropout and not ctx.keep_order and draws_random_numbers(node):
            op = ELEMENTWISE.describe(node, group_dropout=True)
        if type(op) is not str:
            numel = _member_numel(op)
            if numel > max_numel:
                op = f"{numel} elements per neuron > max_member_numel ({max_numel})"
        if type(op) is str:
            if not ctx.keep_order and is_factory(node):
                constants.add(i)
            else:
                ctx.leave_ungrouped(node, op)
            op = None
        ops.append(op)

    if ctx.keep_order:  # moving a read across a write, or an op across a mode switch, changes its value
        ctx.groups = [Group([n], None) for n in units]
        ctx.stats.update(units=len(units), groups=len(units), schedule="original order")
        return gm
    # Signatures as small ints (equal keys, equal ints): the schedules hash each of them several
    # times, and a key is a deep tuple.
    keys = _signature_ids(ops, units, opts.max_typed_groups)
    keys = _split_by_detached(keys, units, gm.graph)
    if union:   # a union's outputs each gather the samples' results into one value: two grouped together would
        # be one row each of a group, a row holding every sample's results, which no batch can restrict
        fresh = max((k for k in keys if k is not None), default=-1) + 1
        for i, node in enumerate(units):
            if JOINED_OUTPUT in node.meta and keys[i] is not None:
                keys[i], fresh = fresh, fresh + 1
    position = index.get
    preds = [[i for i in map(position, n.all_input_nodes) if i is not None] for n in units]
    # Ops outside the catalog may be impure (random numbers, I/O): keep their relative order.
    # Factories are pure: they move freely.
    previous_alone = None
    for i, op in enumerate(ops):
        if op is None and i not in constants:
            if previous_alone is not None:
                preds[i].append(previous_alone)
            previous_alone = i
    depth = schedule.asap_depths(preds)

    schedules: dict[str, int] = {}
    site_keys = _with_code_sites(keys, units) if opts.code_site_hint else None
    # The site-refined keys split each signature into one or more; where they split none (as many
    # distinct values), they are the same partition and every schedule without them is the same.
    hints = (False,) if site_keys is None else (True,) if len(set(site_keys)) == len(set(keys)) else (True, False)
    algorithms = {"asap": schedule.asap, "agenda": schedule.agenda, "ready_share": schedule.ready_share}
    # ready_share's groups follow the sizes of the graph more closely than the levels do: on groundings of one
    # model of other sizes it makes groups that code compiled for dynamic sizes (schemas.py) could not serve
    # again. A union is grouped once for all its batches, which share no code: there it runs too.
    auto = ["asap", "agenda", "ready_share"] if union else ["asap", "agenda"]
    names = auto if opts.scheduler == "auto" else [opts.scheduler]
    # No schedule has fewer groups than signatures (plus ungroupable nodes) or than the longest path:
    # once a candidate reaches that, the later ones cannot win the min below.
    floor = max(max(depth, default=-1) + 1, len(set(k for k in keys if k is not None)) + keys.count(None))
    # ED-Batch's bound is tighter (asked for in detailed reports, and then known before the schedules run)
    bound = schedule.lower_bound(preds, keys, depth) if ctx.detailed else None
    floor = max(floor, bound or 0)

    def fewest(hint: bool) -> tuple[int, str, list]:
        """The schedule with the fewest groups for the keys with or without the hint, the first on ties."""
        sigs = site_keys if hint else keys
        best: tuple | None = None   # (count, label, groups): only the best is kept, each lists every unit
        for name in names:
            groups = schedule.merged(algorithms[name](preds, sigs, depth), preds, sigs)
            label = f"{name}{'+site' if hint else ''}"
            schedules[label] = len(groups)
            if best is None or len(groups) < best[0]:
                best = (len(groups), label, groups)
            if len(groups) <= floor:
                break
        assert best is not None
        return best

    if hints == (True, False):
        # The hint wins ties, so its schedules count where they can have at most the groups of the best one
        # without it: not where the refined keys' own lower bound is above that.
        best = fewest(False)
        if schedule.lower_bound(preds, site_keys, depth) <= best[0]:
            hinted = fewest(True)
            best = hinted if hinted[0] <= best[0] else best
    else:
        best = fewest(hints[0])
    count, chosen, groups = best
    ctx.groups = [Group([units[i] for i in g], [ops[i] for i in g] if ops[g[0]] is not None else None)
                  for g in groups]
    ctx.stats.update(
        units=len(units), groups=count, schedule=chosen,
        schedules=schedules,
        vectorizable=sum(1 for g in ctx.groups if g.ops and len(g.nodes) >= opts.min_group_size))
    if bound is not None:
        ctx.stats["lower_bound"] = bound
    return gm


_UNIT_OPS = frozenset(("call_function", "call_method", "call_module"))


def _signature_ids(ops: list, units: list, max_typed: int) -> list:
    """Each unit's signature as an int, None for a unit that runs alone.

    The signature is the op's key plus, for fixed-arity ops, which operands that are not
    themselves grouped (weights, inputs) it reads; where more than ``max_typed`` such variants
    share one key, the operands are left out ("any weights": the weights are gathered). A
    sample's own constant in a union is left out too: members of different samples read
    different ones, a row each. Two units get the same int exactly when these signatures are equal."""
    groupable = {units[i] for i, op in enumerate(ops) if op is not None}
    base: dict = {}      # op.key -> int
    typed: dict = {}     # (tag, base int[, operands]) -> int
    base_ids, ids = [], []
    variants: dict[int, set] = defaultdict(set)
    for op in ops:
        if op is None:
            base_ids.append(None)
            ids.append(None)
            continue
        b = base.get(op.key)
        if b is None:
            b = base[op.key] = len(base)
        base_ids.append(b)
        if op.variadic:
            ids.append(typed.setdefault(("variadic", b), len(typed)))
            continue
        weights = tuple([o if (o is not None and o not in groupable and SAMPLE not in o.meta) else None
                         for o in op.operands])
        t = typed.setdefault(("typed", b, weights), len(typed))
        ids.append(t)
        variants[b].add(t)
    crowded = {b for b, v in variants.items() if len(v) > max_typed}
    if crowded:
        for i, op in enumerate(ops):
            if op is not None and base_ids[i] in crowded:
                ids[i] = typed.setdefault(("any weights", base_ids[i]), len(typed))
    return ids


def _split_by_detached(keys: list, units: list, graph: fx.Graph) -> list:
    """``keys`` refined by whether each unit's value is computed from a detached one (``h.detach()``, or a
    value of a ``no_grad`` block, which ``mode_regions`` detaches) and has no autograd history: a group's
    result has the history where one member's has, and an op without a derivative (``//``) on the rows of a
    member without it would raise in the backward, where eager's has no autograd node."""
    if not (graph.find_nodes(op="call_method", target="detach")
            or any(graph.find_nodes(op="call_function", target=t) for t in _DETACH_FUNCTIONS)):
        return keys   # (most graphs: no value is detached)
    history: set[fx.Node] = set()
    detached: set[fx.Node] = set()
    for node in graph.nodes:
        info = tensor_info(node)
        if info is None or not (info.dtype.is_floating_point or info.dtype.is_complex):
            continue
        if node.op == "placeholder" or node.op == "get_attr":
            value = node.meta.get("example_value", node.meta.get("val"))
            if not isinstance(value, torch.Tensor) or value.requires_grad:
                history.add(node)
            continue
        if _detaches(node):
            detached.add(node)
            continue
        inputs = node.all_input_nodes
        if any(a in history for a in inputs):
            history.add(node)
        elif any(a in detached for a in inputs):
            detached.add(node)
    if not detached:
        return keys
    ids: dict = {}
    return [None if k is None else ids.setdefault((k, u in detached), len(ids)) for k, u in zip(keys, units)]


_DETACH_FUNCTIONS = (torch.detach, torch.ops.aten.detach.default)


def _detaches(node: fx.Node) -> bool:
    return node.target == "detach" if node.op == "call_method" else node.target in _DETACH_FUNCTIONS


def _with_code_sites(keys: list, units: list) -> list:
    """``keys`` refined by each unit's code site (the source-line hint), again as ints."""
    sites: dict = {}     # stack trace -> its code site (many nodes share one trace's text)
    ids: dict = {}
    out = []
    for key, node in zip(keys, units):
        if key is None:
            out.append(None)
            continue
        trace = node.meta.get("stack_trace") or ""
        site = sites.get(trace)
        if site is None:
            site = sites[trace] = code_site(node)
        out.append(ids.setdefault((key, site), len(ids)))
    return out
