"""Ragged fan-ins: a neuron's inputs joined as rows, ``torch.cat([h_1, ..., h_k], 0)``, run through row-wise
ops and reduced over the rows, become the ops on each input and an n-ary sum.

Per-node code often joins a node's k children's states into one ``[k, d]``
tensor, runs linear and elementwise ops over its rows and sums them (the
child-sum TreeLSTM: ``torch.sum(sigmoid(U(child_h) + W(x).repeat(k, 1)) *
child_c, dim=0)``). Every distinct k is then its own shape, so nodes with 1, 2
and 3 children never share a group. This pass rewrites

* ``C = cat(parts, 0)`` of parts of one shape (``[r, ...]``, r rows each) into
  its parts: ``C`` is "ragged", with k parts (of one-element vectors, a node's
  scores ``att(...)`` per neighbour: the stack of their elements);
* a row-wise op of ragged operands with k parts of r rows each (elementwise ops,
  ``F.linear`` and ``@`` by a shared matrix) into that op on each part; its
  other operands must broadcast along the rows: fewer dimensions, one row, or
  ``T.repeat(k, 1)`` / ``T.expand(k, d)`` of a one-row ``T`` (read as ``T``),
  or, for an op of one-row parts (stacked, or joined rows), have a row per part computed
  from other values (``torch.stack(h) - targets``: part ``j`` reads ``targets[j]``, read through
  layout ops within the rows and elementwise ops of one value and numbers: ``labels[:, None]``'s
  part is ``labels[j]`` reshaped, ``(labels > 1).double()``'s is ``(labels[j] > 1).double()``,
  ``F.one_hot(labels, c)``'s ``F.one_hot(labels[j], c)``; a row per part expanded along the rows,
  ``sums / counts.view(-1, 1).expand_as(sums)``, is read as that row, ``counts.view(-1, 1)[j]``);
* ``S = stack(parts, 0)`` of parts of one shape (any rank: a node's scores, one
  number per neighbour) likewise, each part one row of ``S``;
* ``sum``, ``mean`` (and, for one-row parts, ``amax`` / ``amin``) over dim 0 of
  a ragged value into ``torch.stack(parts).sum(0)`` (of the parts' sums where
  they have several rows), which the aggregation pass makes an n-ary
  aggregate, merged into the reader's sum where that is one; a ``sum`` or
  ``mean`` over all dims likewise, then over the row's own;
* ``softmax`` / ``log_softmax`` over dim 0 of a ragged value of one-row parts
  (attention over a node's neighbours) into its parts ``exp(p_j - m) / z`` /
  ``p_j - m - log(z)``, with ``m`` the parts' n-ary maximum (detached: a
  softmax does not change with the shift, nor does its gradient) and ``z`` the
  n-ary sum of ``exp(p_j - m)``: the same formula as eager's kernel;
* an op of the along family within each row (``log_softmax(scores, 1)``, ``h.norm(dim=1)``,
  ``torch.logsumexp(scores, 1)``), and a sum, mean, max or min over each row's own dims
  (``h.sum(1, keepdim=True)``), into the same on each part;
* ``torch.gather`` within each row of one-row parts by an index with a row per part
  (``logp.gather(1, labels[:, None])``: a node's label's log-probability) into each part's gather by its
  row of the index, read through the layout op as that op of ``labels[j]`` (a row read of a sample's
  argument in a union);
* ``F.cross_entropy`` / ``F.nll_loss`` of a ragged value of one-row parts (a row of scores each) and a
  label per row, reduced to a sum or mean, into each part's loss of its label ``labels[j]`` and their
  n-ary sum (for a mean, divided by the n-ary count of labels that are not ``ignore_index``: eager's
  ``sum(l_j) / count``), which the loss family groups across nodes; without reduction, the losses are a
  ragged value, part ``j`` the loss of ``labels[j]``; likewise an elementwise loss (``F.mse_loss``) of
  stacked parts and a target row per part (its mean: the sum over the parts' elements);
* ``S[j]`` of a stacked ragged value into its part ``j``;
* ``rows @ a`` by a shared vector, and the layout ops within rows: ``x.unsqueeze(d)``,
  ``x.squeeze(d)``, ``x[:, None]`` and ``cat([x, T.expand(k, ...)], d)`` (d > 0; a copy of one
  part read as that part; for one-row parts, a value with a row per part read as
  its row j, as above) likewise into the op on each part.

Only ragged values from which such a reduction or part read is reached are rewritten, and in one sample of
a union (``ctx.in_union``) those read as a whole whose rows broadcast a value the sample computes
(``states + states.mean(0)`` returned: the union's rows must each read their own sample's mean); a value
also read otherwise keeps a ``cat`` of its new parts for those readers.
Then the parts of every node, whatever its k, are ops of one shape, and a
node's reduction is a fan-in like ``sum(h[c] for c in children)``: groups follow
the depth of the structure, not its child counts.

Legal because a row-wise op computes each row of its result from the same row
of its ragged operands (and the broadcast ones), so on the rows of part j it
computes the rows of part j; a sum over rows is the sum of the parts' sums
(reassociated: equal within rounding). ``amax`` / ``amin`` over one-row parts
are the aggregate's own (gradients split among ties as eager's). Ops that draw
random numbers, write in place or are not known to be row-wise stop a ragged
value, and a graph that keeps its order (``ctx.keep_order``: in-place writes
remain, which a part read later could see) is left alone. Only floating
values are reduced this way.
"""
from __future__ import annotations

import heapq
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from dynamo_relational.nodes import meta_without_value, new_node
from dynamo_relational.ops import REGISTRY, NeuronOp, TensorInfo, tensor_info
from dynamo_relational.ops.base import node_args
from dynamo_relational.ops.along import ALONG, GATHER_ALONG
from dynamo_relational.ops.elementwise import ELEMENTWISE, draws_random_numbers
from dynamo_relational.ops.losses import LOSS, LossCall, loss_call
from dynamo_relational.ops.facts import writes
from dynamo_relational.ops.matmul import linear_args, product_operands
from dynamo_relational.ops.reduce import REDUCE, reduced
from dynamo_relational.ops.reshape import LAYOUT
from dynamo_relational.ops.select import ONE_HOT

from .context import PassContext

#: the joins whose parts become a ragged value, with the name of their dimension argument
_JOINS = {torch.cat: "dim", torch.concat: "dim", torch.concatenate: "axis"}
_SOFTMAXES = ("softmax", "log_softmax")
#: the reductions over rows that end a ragged value; amax and amin only over one-row parts
_ROW_REDUCTIONS = ("sum", "mean", "amax", "amin")


@dataclass
class _Ragged:
    """A value whose rows are ``k`` parts of one shape each, ``part`` (rows first; with ``stacked``, each part
    is one row of the value, without its first dimension)."""
    k: int
    part: TensorInfo
    stacked: bool = False
    #: a join's parts, in order
    joined: tuple = ()
    #: the join is a ``cat`` of one-element vectors (a node's scores, ``att(...)`` of each neighbour): its parts
    #: are those elements, as in a ``stack`` of them
    elements: bool = False
    #: the non-ragged operands of a row-wise op -> what each part reads for it
    reads: dict = field(default_factory=dict)
    #: for a softmax over the rows: ("softmax" or "log_softmax", its operand)
    softmax: tuple | None = None
    #: the call on each part where it is not the node's own: (op, target, args[, kwargs]) (a dimension counted
    #: without the rows' in a stacked part, a new axis as a reshape)
    call: tuple | None = None
    #: non-ragged operands of which part ``j`` reads row ``j`` (the labels of a loss per row)
    indexed: tuple = ()

    def one_row_parts(self) -> bool:
        return self.stacked or self.part.shape[0] == 1

    def same_layout(self, other: "_Ragged") -> bool:
        return self.k == other.k and self.stacked == other.stacked and (
            self.stacked or self.part.shape[:1] == other.part.shape[:1])   # (as many rows per part)


def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    ctx.stats["ragged_reductions"] = 0
    if ctx.keep_order:
        return gm
    graph = gm.graph
    joins = [n for join in (*_JOINS, torch.stack) for n in graph.find_nodes(op="call_function", target=join,
                                                                            sort=False)]
    if not joins:
        return gm   # (every ragged value starts at a join: a graph without one has none)
    # Only the joins and the readers of ragged values can be ragged or reduce one: those are visited, in the
    # graph's order (a node is pushed by an operand, which comes before it).
    position = {node: i for i, node in enumerate(graph.nodes)}
    pending = [(position[n], n) for n in joins]
    heapq.heapify(pending)
    ragged: dict[fx.Node, _Ragged] = {}
    reductions: list[tuple[fx.Node, fx.Node, str]] = []
    part_reads: list[tuple[fx.Node, fx.Node, int]] = []
    losses: list[tuple[fx.Node, LossCall]] = []
    visited: set[fx.Node] = set()
    while pending:
        node = heapq.heappop(pending)[1]
        if node in visited:
            continue
        visited.add(node)
        found = _join(node)
        if found is None:
            found = _row_wise(node, ragged) or _row_layout(node, ragged) or _row_along(node, ragged) \
                or _reduced_within_rows(node, ragged) \
                or _loss_per_row(node, ragged)
        if found is not None:
            ragged[node] = found
            for user in node.users:
                if user.op in ("call_function", "call_method"):
                    heapq.heappush(pending, (position[user], user))
            continue
        reduction = _row_reduction(node, ragged)
        if reduction is not None:
            reductions.append((node, *reduction))
        loss = _loss_over_rows(node, ragged, "mean", "sum")
        if loss is not None:
            losses.append((node, loss))
        part = _part_read(node, ragged)
        if part is not None:
            part_reads.append((node, *part))
    read = [x for _, x, _ in reductions] + [x for _, x, _ in part_reads] + [call.input for _, call in losses]
    if ctx.in_union:
        read += _read_whole_beside_own_values(ragged, set(read))
    needed = _reaching(read, ragged)
    order = sorted(needed, key=position.__getitem__)
    parts: dict[fx.Node, list] = {}
    for node in order:   # a ragged value's operands are split before it
        parts[node] = _split(graph, node, ragged[node], parts)
    # A reduction replaced here may be a part of a later join (a sum of sums): the later one reads its
    # replacement (fx updates the nodes that read it; the lists of parts here are updated by ``live``).
    replaced: dict[fx.Node, fx.Node] = {}

    def live(nodes: list) -> list:
        return [replaced.get(n, n) for n in nodes]

    for node, x, name in reductions:
        if x in parts:
            replaced[node] = _reduce_parts(graph, node, live(parts[x]), ragged[x], name)
    for node, x, j in part_reads:
        node.replace_all_uses_with(live(parts[x])[j])
        graph.erase_node(node)
    for node, call in losses:
        _loss_of_parts(graph, node, live(parts[call.input]), ragged[call.input], call)
    unread = [call.target for _, call in losses]   # (targets and indices that the parts read row by row)
    copies_erased: set[fx.Node] = set()
    for node in reversed(order):   # readers first
        if node.users and not ragged[node].joined:   # read elsewhere too: rows joined again for them
            with graph.inserting_after(node):
                join = torch.stack if ragged[node].stacked else torch.cat
                joined = new_node(graph, "call_function", join, (live(parts[node]), 0), {})
            joined.meta.update(node.meta)   # (in place: setting a node's attribute updates the graph's tables)
            node.replace_all_uses_with(joined)
        if not node.users:
            graph.erase_node(node)
        for copy, source in ragged[node].reads.items():
            if source is not None and source is not copy and copy not in copies_erased and not copy.users \
                    and copy.op in ("call_function", "call_method"):
                graph.erase_node(copy)   # a repeat / expand whose source the parts read instead
                copies_erased.add(copy)
        unread += ragged[node].indexed
    _erase_unread(graph, unread)
    ctx.stats["ragged_reductions"] = sum(1 for _, x, _ in reductions if x in parts) + sum(
        1 for x in parts if ragged[x].softmax is not None)
    return gm


def _join(node: fx.Node) -> _Ragged | None:
    """``cat(parts, 0)`` of parts of two or more dimensions or of one element each, or ``stack(parts, 0)`` of
    parts of any, that share one shape, dtype and device."""
    stacked = node.op == "call_function" and node.target is torch.stack
    try:
        dim_name = "dim" if stacked else _JOINS.get(node.target) if node.op == "call_function" else None
    except TypeError:   # unhashable target
        return None
    args = node_args(node, ("tensors", dim_name)) if dim_name else None
    parts = args.get("tensors") if args else None
    if not isinstance(parts, (list, tuple)) or not parts or not all(isinstance(p, fx.Node) for p in parts):
        return None
    part = tensor_info(parts[0])
    dim = args.get(dim_name, 0)
    if part is None or type(dim) is not int or any(tensor_info(p) is not part for p in parts):   # (interned)
        return None
    if stacked:
        return _Ragged(len(parts), part, stacked=True, joined=tuple(parts)) if dim % (part.rank + 1) == 0 else None
    if part.shape == (1,) and dim in (0, -1):   # cat of one-element vectors: the stack of their elements
        element = TensorInfo((), part.dtype, part.device)
        return _Ragged(len(parts), element, stacked=True, joined=tuple(parts), elements=True)
    if part.rank < 2 or part.shape[0] == 0 or dim % part.rank != 0:
        return None
    return _Ragged(len(parts), part, joined=tuple(parts))


def _row_wise(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> _Ragged | None:
    """The ragged value ``node`` makes, if it is a row-wise op of ragged operands of one layout (k parts
    of the same number of rows) and of operands that broadcast along the rows, or, for an op of one-row parts,
    that have a row per part computed from other values (``torch.stack(h) - targets``: part ``j`` reads
    ``targets[j]``); a gather within each row (by such indices) likewise."""
    info = tensor_info(node)
    if info is None or info.rank < 1 or writes(node):
        return None
    linear, product = linear_args(node), product_operands(node)
    broadcast: list = []
    gather = GATHER_ALONG.describe(node) if REGISTRY.family_of(node) is GATHER_ALONG else None
    if linear is not None:
        rowed, matrix = [linear.x], [a for a in (linear.weight, linear.bias) if a is not None]
    elif product is not None:
        rowed, matrix = [product[0]], [product[1]]
    elif isinstance(gather, NeuronOp) and gather.template != 0:   # within each row, by an index per row
        rowed, matrix = [a for a in gather.operands if a in ragged], []
        broadcast = [a for a in gather.operands if a not in ragged]
    elif REGISTRY.family_of(node) is ELEMENTWISE and not draws_random_numbers(node):
        operands = [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, fx.Node)]
        rowed, matrix = [a for a in operands if a in ragged], []
        broadcast = [a for a in operands if a not in ragged]
    else:
        return None
    if not rowed or any(a not in ragged for a in rowed) or any(a in ragged for a in matrix):
        return None
    # a map of each row: a matrix needs a row dimension besides the one it maps, a vector (rows @ a) one in the
    # rows it maps, which it contracts (a dimension less)
    rank = (tensor_info(matrix[0]) or info).rank if matrix else 0
    if matrix and not (rank == 2 and info.rank >= 2 or rank == 1 and product is not None and info.rank >= 1):
        return None
    contracted = 1 if rank == 1 else 0
    first = ragged[rowed[0]]
    stacked = first.stacked
    rows = 1 if stacked else first.part.shape[0]
    if any(not ragged[a].same_layout(first) or ragged[a].part.rank + stacked - contracted != info.rank
           for a in rowed) \
            or info.shape[0] != first.k * rows or (not stacked and info.rank < 2):
        return None
    reads, indexed = {}, []
    for a in broadcast:
        source = _broadcast_source(a, info, stacked) if gather is None else None   # (gather does not broadcast)
        if source is not None:
            reads[a] = source
            continue
        if first.one_row_parts():   # (a count per node expanded along its row: part j reads that count's row j)
            source = _expanded_rows(a, info)
            if source is not None:
                reads[a] = a = source
        a_info = tensor_info(a)
        if first.one_row_parts() and a_info is not None and a_info.rank == info.rank and a_info.shape[0] == first.k \
                and not any(b in ragged for b in a.all_input_nodes):
            indexed.append(a)   # a row per part from elsewhere (a target per node): part j reads a[j] (a[j:j + 1])
        else:
            return None
    call = None
    if gather is not None:   # (the same call on each part, along the part's own dim)
        assert isinstance(gather, NeuronOp)
        call = ("call_function", torch.gather, (gather.operands[0], gather.template - stacked, gather.operands[1]))
    return _row_value(info, first, reads=reads, indexed=tuple(indexed), call=call)


def _row_layout(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> _Ragged | None:
    """The ragged value ``node`` makes, if it changes the layout within the rows of a ragged value:
    ``x.unsqueeze(d)``, ``x.squeeze(d)`` of a dim of size 1 and ``x[:, None]`` (``d`` > 0; a node's scores
    ``att(K).squeeze(-1)``), ``x[:, 0]`` (constant indices within each row), or
    ``cat([x, ...], d)`` of ragged values of one layout and of copies of one part along the rows
    (``T.expand(k, ...)``: each part reads ``T``)."""
    info = tensor_info(node)
    if info is None or node.kwargs or len(node.args) != 2 or node.op not in ("call_function", "call_method"):
        return None
    target, (x, where) = node.target, node.args
    if target == "unsqueeze" or target is torch.unsqueeze:
        if x not in ragged or type(where) is not int or where % info.rank == 0:
            return None
        call = (node.op, target, (x, where % info.rank - 1))
    elif target == "squeeze" or target is torch.squeeze:
        x_info = tensor_info(x) if isinstance(x, fx.Node) else None
        if x not in ragged or type(where) is not int or x_info is None or where % x_info.rank == 0 \
                or x_info.shape[where] != 1:
            return None
        call = (node.op, target, (x, where % x_info.rank - 1))
    elif target is operator.getitem:
        if x not in ragged or type(where) is not tuple or not where or where[0] != slice(None):
            return None
        if _new_axes_only(where):   # x[:, None]: each part reshaped
            value = _row_value(info, ragged[x])
            if value is not None:
                value.call = ("call_method", "reshape", (x, value.part.shape))
            return value
        if not all(i is None or type(i) is int or type(i) is slice and all(
                b is None or type(b) is int for b in (i.start, i.stop, i.step)) for i in where[1:]):
            return None
        call = ("call_function", operator.getitem, (x, where[1:]))   # x[:, 0]: the same within each row
    elif node.op == "call_function" and target in tuple(_JOINS) and isinstance(x, (list, tuple)) \
            and type(where) is int and where % info.rank != 0:   # (a tuple: no hashing of the target)
        rowed = [a for a in x if a in ragged]
        if not rowed or not all(isinstance(a, fx.Node) for a in x):
            return None
        layout = ragged[rowed[0]]
        reads, indexed = {}, []
        for a in x:
            if a in ragged:
                continue
            copy, a_info = _broadcast_copy(a), tensor_info(a)
            if copy is not None:
                reads[a] = copy
            elif layout.one_row_parts() and a_info is not None and a_info.rank == info.rank \
                    and a_info.shape[0] == layout.k and not any(b in ragged for b in a.all_input_nodes):
                indexed.append(a)   # (a row per part: ``cat([x, sums], 1)`` of a node's features, part j reads x[j])
            else:
                return None
        part_rank = info.rank - layout.stacked
        if any(not ragged[a].same_layout(layout) for a in rowed) or any(
                (tensor_info(source) or info).rank != part_rank or not layout.one_row_parts()
                for source in reads.values()):
            return None   # (a copy's source is the part it gives every row: of the part's rank)
        return _row_value(info, layout, reads=reads, indexed=tuple(indexed),
                          call=(node.op, target, (list(x), where % info.rank - layout.stacked)))
    else:
        return None
    layout = ragged[x]
    return _row_value(info, layout, call=call if layout.stacked else None)


def _row_value(info: TensorInfo, layout: _Ragged, **fields) -> _Ragged | None:
    """The ragged value of shape ``info`` whose parts are laid out as ``layout``'s."""
    rows = 1 if layout.stacked else layout.part.shape[0]
    if info.shape[0] != layout.k * rows:
        return None
    part = info.shape[1:] if layout.stacked else (rows, *info.shape[1:])
    return _Ragged(layout.k, TensorInfo(part, info.dtype, info.device), stacked=layout.stacked, **fields)


def _row_along(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> _Ragged | None:
    """The ragged value ``node`` makes, if it is an op of the along family of a ragged value: within each row
    (``log_softmax(scores, 1)``, ``h.norm(dim=1)``: the same on each part, along its own dims), or a softmax or
    log_softmax over the rows (dim 0) of one-row parts, in their dtype."""
    if REGISTRY.family_of(node) is not ALONG:
        return None
    op, info = ALONG.describe(node), tensor_info(node)
    if not isinstance(op, NeuronOp) or info is None:
        return None
    x = op.operands[0]
    value = ragged.get(x)
    if value is None:
        return None
    name, dims, extra = op.template
    if 0 not in (dims if isinstance(dims, tuple) else (dims,)):   # (dims counted in the ragged value)
        function, kwargs = ALONG.call(op.template, -value.stacked)   # (a stacked part lacks the first)
        return _row_value(info, value, call=("call_function", function, (x,), kwargs))
    if name not in _SOFTMAXES or extra.get("dtype") is not None or not value.one_row_parts():
        return None
    return _Ragged(value.k, value.part, stacked=value.stacked, softmax=(name, x))


def _reduced_within_rows(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> _Ragged | None:
    """The ragged value ``node`` makes, if it sums, averages or takes the max or min of each row of a ragged
    value over the row's own dims (``h.sum(1, keepdim=True)``): the same on each part, over its dims."""
    if REGISTRY.family_of(node) is not REDUCE:
        return None
    r, info = reduced(node), tensor_info(node)
    if isinstance(r, str) or info is None or r.input not in ragged or 0 in r.dims or r.name not in _ROW_REDUCTIONS:
        return None
    value = ragged[r.input]
    return _row_value(info, value, call=("call_method", r.name,
                                         (r.input, tuple(d - value.stacked for d in r.dims), r.keepdim)))


def _part_read(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> tuple[fx.Node, int] | None:
    """``(x, j)`` if ``node`` is ``x[j]`` of a stacked ragged ``x``: its part ``j``."""
    if node.op != "call_function" or node.target is not operator.getitem or len(node.args) != 2:
        return None
    x, j = node.args
    value = ragged.get(x)
    if value is None or not value.stacked or type(j) is not int or not -value.k <= j < value.k:
        return None
    return x, j % value.k


def _broadcast_source(operand: fx.Node, info: TensorInfo, stacked: bool = False) -> fx.Node | None:
    """What a part reads for a non-ragged ``operand`` of a row-wise op with result ``info``: the operand
    itself where it broadcasts along the rows, the one-row tensor a ``repeat`` / ``expand`` copied along
    them, or None. A stacked part has no row dimension: only operands of fewer dimensions broadcast to it."""
    operand_info = tensor_info(operand)
    if operand_info is None:
        return None
    if operand_info.rank < info.rank:
        return operand
    if stacked:
        return None
    if operand_info.shape[0] == 1:
        return operand
    return _broadcast_copy(operand, info)


def _expanded_rows(node: fx.Node, info: TensorInfo) -> fx.Node | None:
    """``T`` if ``node`` is ``T.expand_as(x)`` or ``T.expand(...)`` to the shape ``info`` of a ``T`` of as many
    rows and dimensions (a column of counts, ``[n, 1]``, expanded to ``[n, d]``): row ``j`` of ``node`` is row
    ``j`` of ``T``, broadcast."""
    if REGISTRY.family_of(node) is not LAYOUT:
        return None
    op = LAYOUT.describe(node)
    if not isinstance(op, NeuronOp) or op.template[0] != "expand":
        return None
    source, expanded = op.operands[0], tensor_info(node)
    source_info = tensor_info(source)
    if source_info is None or expanded is None or expanded.shape != info.shape or source_info.rank != info.rank \
            or source_info.shape[0] != info.shape[0]:
        return None
    return source


def _broadcast_copy(node: fx.Node, info: TensorInfo | None = None) -> fx.Node | None:
    """``T`` if ``node`` is ``T.repeat(n, 1, ...)`` or ``T.expand(n, ...)`` of a ``T`` that has one row (or
    fewer dimensions) and the other sizes of ``node``: a copy of ``T`` along the rows, which broadcasting
    ``T`` gives every part alike."""
    if REGISTRY.family_of(node) is not LAYOUT:
        return None
    op = LAYOUT.describe(node)
    if not isinstance(op, NeuronOp) or op.template[0] not in ("repeat", "expand"):
        return None
    source, copied = op.operands[0], tensor_info(node)
    source_info = tensor_info(source)
    if source_info is None or copied is None or (info is not None and copied.rank != info.rank):
        return None
    padded = (1,) * (copied.rank - source_info.rank) + source_info.shape
    return source if padded[0] == 1 and padded[1:] == copied.shape[1:] else None


def _row_reduction(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> tuple[fx.Node, str] | None:
    """``(x, reduction)`` if ``node`` reduces a ragged floating ``x`` over its rows (dim 0) alone, or,
    summing or averaging, over all of its dims."""
    if REGISTRY.family_of(node) is not REDUCE:
        return None
    r = reduced(node)
    if isinstance(r, str) or r.input not in ragged or r.name not in _ROW_REDUCTIONS or r.dims != (0,) and not (
            r.name in ("sum", "mean") and r.dims == tuple(range(r.info.rank))):
        return None
    if r.name in ("amax", "amin") and not ragged[r.input].one_row_parts():
        return None   # ties across parts would share the gradient otherwise than eager's
    return r.input, r.name


def _loss_per_row(node: fx.Node, ragged: dict[fx.Node, _Ragged]) -> _Ragged | None:
    """The ragged value ``node`` makes, if it is a class loss of stacked rows of scores and a label per row
    without reduction (``F.cross_entropy(scores, labels, reduction="none")``): part ``j`` the loss of part
    ``j`` of the scores and ``labels[j]``."""
    call, info = _loss_over_rows(node, ragged, "none"), tensor_info(node)
    if call is None or info is None or not ragged[call.input].stacked:
        return None
    return _row_value(info, ragged[call.input], indexed=(call.target,))


def _loss_over_rows(node: fx.Node, ragged: dict[fx.Node, _Ragged], *reductions: str) -> LossCall | None:
    """The call if ``node`` is a loss reduced as one of ``reductions`` of a ragged value and a target row per
    part: a class loss (``F.cross_entropy``, ``F.nll_loss``) of one-row parts, each a row of scores, and an
    integer tensor of ``k`` labels, or an elementwise loss (``F.mse_loss``, ...) of stacked parts and a target
    of their shape (``targets[j]`` part ``j``'s)."""
    if REGISTRY.family_of(node) is not LOSS:
        return None
    call = loss_call(node)
    if isinstance(call, str) or call.reduction not in reductions or call.input not in ragged \
            or call.target in ragged:
        return None
    value, target, info = ragged[call.input], tensor_info(call.target), tensor_info(call.input)
    if target is None or info is None:
        return None
    if not call.classes:
        return call if value.stacked and target.shape == info.shape and reductions != ("none",) else None
    if not value.one_row_parts() or value.part.rank != 1 + (not value.stacked) \
            or target.shape != (value.k,) or target.dtype.is_floating_point:
        return None
    return call


def _loss_of_parts(graph: fx.Graph, node: fx.Node, parts: list, value: _Ragged, call: LossCall) -> None:
    """Replace ``node``, a loss over the rows of a ragged value, by the sum of each part's loss (of its
    target row ``targets[j]``), divided for a mean by the number of labels that count (not ``ignore_index``:
    eager's mean, ``sum(l_j) / count``), or of an elementwise loss's elements."""
    make, info = _Maker(graph, node), tensor_info(node)
    scores = TensorInfo(value.part.shape[-1:] if call.classes else value.part.shape, value.part.dtype,
                        value.part.device)
    options = {**dict(call.passed), "reduction": "sum"}
    with graph.inserting_before(node):
        labels = [_indexed_part(make, call.target, j, stacked=True) for j in range(value.k)]
        rows = parts if value.stacked else [make("call_method", "reshape", scores, p, scores.shape) for p in parts]
        terms = [make("call_function", node.target, info, row, y, kwargs=options) for row, y in zip(rows, labels)]
        total = make.aggregate("sum", terms, info)
        if call.reduction == "mean" and not call.classes:
            total = make("call_function", operator.truediv, info, total, value.k * scores.numel)
        elif call.reduction == "mean":
            flag = TensorInfo((), torch.bool, scores.device)
            ignored = dict(call.passed).get("ignore_index", -100)
            counts = [make("call_method", "to", info, make("call_function", torch.ne, flag, y, ignored), info.dtype)
                      for y in labels]
            total = make("call_function", operator.truediv, info, total, make.aggregate("sum", counts, info))
    node.replace_all_uses_with(total)
    graph.erase_node(node)


def _read_whole_beside_own_values(ragged: dict[fx.Node, _Ragged], read: set[fx.Node]) -> list[fx.Node]:
    """In one sample of a union: the ragged values read as a whole (by the results, or by an op not split
    here) whose rows broadcast a value that the sample computes (``states + states.mean(0)``) or read a row of
    one each (``torch.stack(h) - targets``). Joined with the other samples' rows, each row would read its own
    sample's value, which one op on the joined rows cannot; split into the op on each part (``h_i + m``), they
    group with the other samples' parts, and the value read as a whole is their join. (Those in ``read``, which
    reductions and part reads split anyway, are left out.)"""
    def reads_own_value(value: _Ragged) -> bool:
        return bool(value.indexed) or any(source.op != "get_attr" for pair in value.reads.items() for source in pair)
    return [node for node in ragged if node not in read and any(user not in ragged for user in node.users)
            and any(reads_own_value(ragged[value]) for value in _reaching([node], ragged))]


def _reaching(read: list[fx.Node], ragged: dict[fx.Node, _Ragged]) -> dict[fx.Node, None]:
    """The ragged values that reductions and part reads (of the values ``read``) read, directly or through
    row-wise ops and softmaxes (an ordered set)."""
    needed: dict[fx.Node, None] = {}
    pending = list(read)
    while pending:
        node = pending.pop()
        if node in needed:
            continue
        needed[node] = None
        value = ragged[node]
        if value.softmax is not None:
            pending.append(value.softmax[1])
        elif not value.joined:
            pending += [a for a in node.all_input_nodes if a in ragged]
    return needed


def _split(graph: fx.Graph, node: fx.Node, value: _Ragged, parts: dict[fx.Node, list]) -> list:
    """The parts of ragged ``node``: a join's operands, or the row-wise op on each part of its operands."""
    if value.joined and value.elements:
        make = _Maker(graph, node)
        with graph.inserting_before(node):
            return [make("call_method", "reshape", value.part, p, ()) for p in value.joined]
    if value.joined:
        return list(value.joined)
    if value.softmax is not None:
        return _softmax_parts(graph, node, value, parts[value.softmax[1]])
    make = _Maker(graph, node)
    made = []
    with graph.inserting_before(node):
        for j in range(value.k):
            def operand(a, j=j):
                if a in parts:
                    return parts[a][j]
                a = value.reads.get(a, a)
                return _indexed_part(make, a, j, value.stacked) if a in value.indexed else a
            op, target, args, *keywords = (node.op, node.target, node.args, node.kwargs) if value.call is None \
                else value.call
            args = fx.node.map_arg(args, operand)
            kwargs = fx.node.map_arg(keywords[0], operand) if keywords else {}
            made.append(make(op, target, value.part, *args, kwargs=kwargs))
    return made


def _indexed_part(make: "_Maker", a: fx.Node, j: int, stacked: bool) -> fx.Node:
    """Row ``j`` of ``a``, which has a row per part: ``a[j]`` for a stacked part, ``a[j:j + 1]`` for a one-row
    part; read through layout ops within the rows (``labels[:, None]``, ``labels.unsqueeze(1)``,
    ``labels.view(-1, 1)``) and elementwise ops of one value and numbers (``(labels > 1).double()``) as those
    ops of the value's row: in a union, a row read of a sample's argument."""
    info = tensor_info(a)
    assert info is not None   # (indexed operands and what they are computed from have static shapes)
    part = TensorInfo(info.shape[1:] if stacked else (1, *info.shape[1:]), info.dtype, info.device)
    source = _within_rows_of(a)
    if source is not None:
        return make("call_method", "reshape", part, _indexed_part(make, source, j, stacked), part.shape)
    source = _elementwise_of_one(a)
    if source is not None:
        row = _indexed_part(make, source, j, stacked)
        args, kwargs = fx.node.map_arg((a.args, a.kwargs), lambda n: row if n is source else n)
        return make(a.op, a.target, part, *args, kwargs=kwargs)
    return make("call_function", operator.getitem, part, a, j if stacked else slice(j, j + 1))


def _erase_unread(graph: fx.Graph, read: list[fx.Node]) -> None:
    """Erase the values ``read``, which the parts read row by row (:func:`_indexed_part`), and what they were
    computed from that way, as far as nothing else reads them (``labels[:, None]``: in a union, a read of the
    whole labels)."""
    erased: set[fx.Node] = set()
    for rows in read:
        while rows not in erased and not rows.users:
            source = _within_rows_of(rows) or _elementwise_of_one(rows)
            if source is None:
                break
            graph.erase_node(rows)
            erased.add(rows)
            rows = source


def _new_axes_only(index: tuple) -> bool:
    """Whether ``x[index]``, ``index`` beginning with ``:``, only gives each row new axes (``x[:, None]``)."""
    return all(i is None or i == slice(None) for i in index[1:])


def _elementwise_of_one(a: fx.Node) -> fx.Node | None:
    """The one tensor that ``a``, an elementwise op of it and numbers of its shape or ``F.one_hot`` of it (a
    vector per element), reads, else None."""
    family = REGISTRY.family_of(a)
    if family not in (ELEMENTWISE, ONE_HOT) or draws_random_numbers(a) or writes(a):
        return None
    tensors = a.all_input_nodes
    if len(tensors) != 1:
        return None
    info, source = tensor_info(a), tensor_info(tensors[0])
    if info is None or source is None:
        return None
    return tensors[0] if info.shape[:source.rank] == source.shape and (
        family is ONE_HOT or info.shape == source.shape) else None


def _within_rows_of(a: fx.Node) -> fx.Node | None:
    """The value that ``a`` lays out anew within each of its rows (``x[:, None]``, ``x.unsqueeze(d)`` with
    ``d`` > 0, ``x.view(k, ...)`` / ``x.reshape(k, ...)`` with as many rows), else None."""
    if a.op not in ("call_function", "call_method") or not a.args or not isinstance(a.args[0], fx.Node) \
            or a.kwargs:
        return None
    x, info, x_info = a.args[0], tensor_info(a), tensor_info(a.args[0])
    if info is None or x_info is None or not info.shape or not x_info.shape or info.shape[0] != x_info.shape[0]:
        return None
    target, rest = a.target, a.args[1:]
    if target is operator.getitem:
        return x if len(rest) == 1 and type(rest[0]) is tuple and rest[0] and rest[0][0] == slice(None) \
            and _new_axes_only(rest[0]) else None
    if target in ("unsqueeze", torch.unsqueeze):
        return x if len(rest) == 1 and type(rest[0]) is int and rest[0] % (x_info.rank + 1) != 0 else None
    return x if target in ("view", "reshape", torch.reshape) else None


class _Maker:
    """Nodes made in place of ``node``, with its metadata but the value's (set to each new node's ``info``)."""

    def __init__(self, graph: fx.Graph, node: fx.Node):
        self.graph, self.meta = graph, meta_without_value(node)

    def __call__(self, kind: str, target, info: TensorInfo, *args, kwargs: dict | None = None) -> fx.Node:
        made = new_node(self.graph, kind, target, args, kwargs or {})
        made.meta.update(self.meta, rel_info=info)
        return made

    def aggregate(self, reduce: str, terms: list, row: TensorInfo) -> fx.Node:
        """``stack(terms).<reduce>(0)`` of terms of info ``row``: an aggregate to the aggregation pass."""
        stacked = self("call_function", torch.stack, TensorInfo((len(terms), *row.shape), row.dtype, row.device),
                       list(terms))
        return self("call_method", reduce, row, stacked, 0)


def _reduce_parts(graph: fx.Graph, node: fx.Node, parts: list, value: _Ragged, name: str) -> fx.Node:
    """Replace ``node``, a reduction over the rows of a ragged value, by one over its ``parts``; returns that."""
    part = value.part
    row = part if value.stacked else TensorInfo((1, *part.shape[1:]), part.dtype, part.device)
    make = _Maker(graph, node)
    rows = 1 if value.stacked else part.shape[0]
    reduce = "sum" if name == "mean" and rows != 1 else name
    info = tensor_info(node)
    with graph.inserting_before(node):
        terms = parts if rows == 1 else [make("call_method", "sum", row, p, 0, True) for p in parts]
        total = make.aggregate(reduce, terms, row)
        if reduce != name:
            total = make("call_function", operator.truediv, row, total, value.k * rows)
        if reduced(node).dims != (0,):   # over every dim: then over the row's own (as many elements each)
            total = make("call_method", name, TensorInfo((), row.dtype, row.device), total)
        if tensor_info(total).shape != info.shape:   # (keepdim, or a stacked part's missing row dimension)
            total = make("call_method", "reshape", info, total, info.shape)
    node.replace_all_uses_with(total)
    graph.erase_node(node)
    return total


def _softmax_parts(graph: fx.Graph, node: fx.Node, value: _Ragged, scores: list) -> list:
    """The parts of ``node``, a softmax or log_softmax over the one-row ``scores``: ``exp(s_j - m) / z`` or
    ``s_j - m - log(z)`` (eager's formula), ``m`` the scores' detached maximum, ``z`` the sum of ``exp(s_j - m)``."""
    op, row = value.softmax[0], value.part
    make = _Maker(graph, node)
    with graph.inserting_before(node):
        top = make("call_method", "detach", row, make.aggregate("amax", scores, row))
        shifted = [make("call_function", operator.sub, row, s, top) for s in scores]
        exps = [make("call_function", torch.exp, row, s) for s in shifted]
        total = make.aggregate("sum", exps, row)
        if op == "softmax":
            return [make("call_function", operator.truediv, row, e, total) for e in exps]
        log_total = make("call_function", torch.log, row, total)
        return [make("call_function", operator.sub, row, s, log_total) for s in shifted]


def _row_info(node: fx.Node) -> TensorInfo | None:
    """What one row of ``node`` is like."""
    info = tensor_info(node)
    return None if info is None else TensorInfo(info.shape[1:], info.dtype, info.device)
