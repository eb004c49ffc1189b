"""Value-based compression: each vectorized node computes each of its distinct rows once.

The layer-wise form of NeuraLogic's isomorphic compression (thesis, section 5.2.6), opt-in with
``options={"value_compression": True}``: it reads the model's buffers (not its parameters or
inputs) as constants, so their values at compile time decide which rows are equal (each one read is
recorded with its version counter in ``ctx.constants_read``: a call after an in-place change traces
again, or, under ``torch.compile``, raises). Grounded
relational models carry their facts in buffers (``dynamo_relational.neuralogic``: ``facts``), and
rows that read equal facts through the same weights compute equal values.

**Finding equal rows** (:func:`value_numbers`): every element of every node gets an id, such that
equal ids mean equal values whatever the parameters and inputs are. The parameters' and inputs'
elements get distinct ids; a constant's elements get one id per distinct value (bit for bit). Ops
pass ids on exactly: data movement (views, ``cat``, ``stack``, gathers) moves them, elementwise ops
and products number the tuples of their operands' ids, sum/mean gather-reductions number the
multiset of the rows of each segment. Any other op gets fresh ids, and so does dropout in training
(every row, every call, draws its own mask). No values are sampled, so
there is nothing to verify afterwards and no merge that could be wrong: the thesis' random trials
would merge ``relu`` outputs that happen to be 0 in every trial. A sum over the same terms in
another order counts as equal: it differs only by rounding, like the reassociation of the
aggregation pass.

**The rewrite:** a node with ``r`` rows of which ``u`` are distinct (``u <= RATIO * r``) is
restricted to one representative per row class: a gather reads fewer index rows, a gather-reduction
keeps fewer segments, an elementwise op or a linear map reads its row-aligned operands at the
representatives (a constant operand becomes its selected rows). A ``gather_rows`` after it expands
the ``u`` rows back to ``r`` for its users. Gathers meeting gathers then compose
(``compose_gathers``), identity gathers vanish (``simplify_gathers``), and row-wise ops move before
gathers where that pays (``postpone_gathers``), so consecutive compressed nodes read each other
directly. Legal because the ``r`` rows are the ``u`` rows, repeated. Saves the work of ``r - u``
rows in every compressed node.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.fx as fx

from dynamo_relational.forward_constants import tensor_version
from dynamo_relational.kernels.gather_reduce import pack_csr, unit_offsets
from dynamo_relational.ops import REGISTRY, TensorInfo, tensor_info
from dynamo_relational.ops.elementwise import draws_random_numbers
from dynamo_relational.ops.facts import moves_elements
from dynamo_relational.ops.matmul import linear_args, product_operands

from .context import PassContext
from .gather_nodes import add_constant, as_gather, constant_value, rows as rows_of, set_rows_info, set_source

#: compress a node only when its distinct rows are at most this share of its rows
RATIO = 0.75

_GATHER_ROWS = torch.ops.dynamo_relational.gather_rows.default
_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default

def run(gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
    if not ctx.options.value_compression or ctx.keep_order:
        return gm
    read: list = []
    ids = value_numbers(gm, read)
    compressed = []
    for node in list(gm.graph.nodes):
        classes = _row_classes(node, ids.get(node))
        if classes is None:
            continue
        representatives, inverse = classes
        if _restrict(gm, node, representatives):
            _expand_after(gm, node, inverse)
            compressed.append(f"{node.name}: {inverse.shape[0]} -> {representatives.shape[0]} rows")
    if compressed:
        gm.graph.lint()
        gm.recompile()
        ctx.constants_read = read
    ctx.stats["rows_compressed"] = compressed
    return gm


# ----------------------------------------------------------------------------------------------
# Value numbering
# ----------------------------------------------------------------------------------------------

class _Numbering:
    """Global ids: equal keys get equal ids (``number``, ``intern``), ``fresh`` ids nobody else has."""

    def __init__(self):
        self.keys: dict = {}
        self.next = 0

    def fresh(self, shape) -> torch.Tensor:
        start, self.next = self.next, self.next + math.prod(shape)
        return torch.arange(start, self.next, dtype=torch.long).reshape(shape)

    def number(self, key) -> int:
        found = self.keys.get(key)
        if found is None:
            found = self.keys[key] = self.next
            self.next += 1
        return found

    def intern(self, tag, columns: torch.Tensor) -> torch.Tensor:
        """One id per row of ``columns`` (``[n, k]`` ids): rows equal under ``tag``, ids equal."""
        if columns.shape[0] == 0:
            return torch.empty(0, dtype=torch.long)
        first, inverse = unique_rows(columns)
        number = self.number
        return torch.tensor([number((tag, *row)) for row in columns[first].tolist()], dtype=torch.long)[inverse]


def unique_rows(columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, inverse) of the distinct rows of an ``[n, k]`` integer tensor: ``first`` the index
    of each distinct row's first occurrence, row ``i`` equal to row ``first[inverse[i]]``. Column
    by column, as 1-D ``unique`` calls (``unique(dim=0)`` sorts whole rows, many times slower):
    each column is ranked, and the ranks so far and the column's are paired into one rank."""
    rows = columns.shape[0]
    key = torch.zeros(rows, dtype=torch.long)
    if rows == 0:
        return key, key
    for j in range(columns.shape[1]):
        _, rank = torch.unique(columns[:, j], return_inverse=True)
        _, key = torch.unique(key * (int(rank.max()) + 1) + rank, return_inverse=True)
    count = int(key.max()) + 1
    first = torch.full((count,), rows, dtype=torch.long).scatter_reduce_(0, key, torch.arange(rows), "amin")
    return first, key


def value_numbers(gm: fx.GraphModule, read: list | None = None) -> dict[fx.Node, torch.Tensor]:
    """Element ids of every tensor node whose shape is known (see the module docstring); the constants
    numbered by value are appended to ``read`` as (name, tensor, version counter)."""
    read = [] if read is None else read
    numbering = _Numbering()
    parameters = {id(p) for p in gm.parameters()}
    ids: dict[fx.Node, torch.Tensor] = {}
    for node in gm.graph.nodes:
        info = tensor_info(node)
        if node.op == "output":
            continue
        if node.op == "placeholder":
            buffer = _dynamo_buffer(node)
            if buffer is not None:
                ids[node] = _constant_ids(numbering, buffer)
                read.append((node.meta["grapharg"].source.name, buffer, tensor_version(buffer)))
            elif info is not None:
                ids[node] = numbering.fresh(info.shape)
            continue
        if node.op == "get_attr":
            if node.users and all(_reads_as_index(user, node) for user in node.users):
                continue   # a gather's index: never a value of the model
            value = constant_value(gm, node)
            if value is not None:
                constant = id(value) not in parameters and not value.requires_grad
                ids[node] = _constant_ids(numbering, value) if constant else numbering.fresh(value.shape)
                if constant:
                    read.append((node.target, value, tensor_version(value)))
            continue
        try:
            found = _propagate(gm, node, ids, numbering)
        except (RuntimeError, TypeError, ValueError, IndexError, KeyError, AttributeError):
            found = None
        if info is None:   # views the vectorizer made carry no shape: their ids have the op's own
            source = node.args[0] if node.args else None
            source_info = tensor_info(source[0] if isinstance(source, (list, tuple)) and source else source)
            if isinstance(found, torch.Tensor) and moves_elements(node) and source_info is not None:
                ids[node] = found
                node.meta["rel_info"] = TensorInfo(tuple(found.shape), source_info.dtype, source_info.device)
        else:
            exact = found is not None and tuple(found.shape) == info.shape
            ids[node] = found if exact else numbering.fresh(info.shape)
    return ids


def _reads_as_index(user: fx.Node, constant: fx.Node) -> bool:
    return user.target in (_GATHER_ROWS, _GATHER_REDUCE, torch.index_select) and user.args[0] is not constant


def _dynamo_buffer(node: fx.Node) -> torch.Tensor | None:
    """The value of a module buffer that TorchDynamo passes as a graph input (its source is a
    ``_buffers`` entry; the backend is handed the real tensor), else None."""
    arg = node.meta.get("grapharg")
    source = getattr(getattr(arg, "source", None), "name", "")
    if "._buffers[" not in (source if isinstance(source, str) else ""):
        return None
    value = getattr(arg, "example", None)
    return value if isinstance(value, torch.Tensor) and not value.requires_grad else None


def _constant_ids(numbering: _Numbering, value: torch.Tensor) -> torch.Tensor:
    """Equal values (bit for bit: -0.0 is not 0.0, equal NaNs are equal) get equal ids; a dtype
    whose bits cannot be read as integers gets fresh ids."""
    flat = value.detach().reshape(-1).cpu().contiguous()
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    try:
        if flat.dtype.is_floating_point or flat.dtype.is_complex:
            size = flat.element_size()
            flat = flat.view(bits[min(size, 8)]).reshape(value.numel(), max(size // 8, 1))
        columns = flat.long().reshape(value.numel(), -1)
    except (KeyError, RuntimeError, TypeError):
        return numbering.fresh(value.shape)
    return numbering.intern(("constant", value.dtype), columns).reshape(value.shape)


def _propagate(gm, node: fx.Node, ids: dict, numbering: _Numbering) -> torch.Tensor | None:
    target = node.target

    def of(a):
        return ids.get(a) if isinstance(a, fx.Node) else None

    gather = as_gather(gm, node)
    if gather is not None:
        base = of(gather.base)
        if base is None:
            return None
        if not gather.reduces:   # (ids live on the CPU, whatever the graph's device)
            return base[gather.index.long().cpu()]
        return _reduced_ids(numbering, node.args[3], base, gather.offsets.long().cpu(), gather.index.long().cpu())
    if moves_elements(node):
        return _moved_ids(node, of)
    if linear_args(node) is not None or product_operands(node) is not None or target is torch.addmm:
        return _product_ids(node, of, numbering)
    family = REGISTRY.family_of(node)
    if family is not None and family.name == "elementwise" and not draws_random_numbers(node):
        return _elementwise_ids(node, of, numbering)
    return None   # (a dropout's equal rows, or two dropouts of one row, are not equal values)


def _moved_ids(node: fx.Node, of) -> torch.Tensor | None:
    """The same data movement applied to the operands' ids."""
    missing = []

    def substitute(a):
        if isinstance(a, fx.Node):
            found = of(a)
            if found is None:
                missing.append(a)
            return found
        return a

    args = fx.node.map_aggregate(node.args, substitute)
    kwargs = fx.node.map_aggregate(node.kwargs, substitute)
    reinterpreted = []   # view(dtype) reinterprets bytes: not a movement of elements
    fx.node.map_aggregate((args, kwargs), lambda a: reinterpreted.append(a) if isinstance(a, torch.dtype) else a)
    if missing or reinterpreted:
        return None
    if node.op == "call_method":
        return getattr(args[0], node.target)(*args[1:], **kwargs)
    return node.target(*args, **kwargs)


def _elementwise_ids(node: fx.Node, of, numbering: _Numbering) -> torch.Tensor | None:
    """Id of each output element: the op (with its constant arguments) and its operands' ids there."""
    shape = tensor_info(node).shape
    operands, constants = [], []
    for position, a in enumerate([*node.args, *node.kwargs.items()]):
        value = a[1] if isinstance(a, tuple) and position >= len(node.args) else a
        if isinstance(value, fx.Node):
            found = of(value)
            if found is None:
                return None
            operands.append(torch.broadcast_to(found, shape).reshape(-1))
            constants.append(("operand", position))
        else:
            constants.append((position, repr(a)))
    tag = ("elementwise", node.op, _target_key(node.target), tuple(constants))
    if not operands:
        return None
    return numbering.intern(tag, torch.stack(operands, 1)).reshape(shape)


def _product_ids(node: fx.Node, of, numbering: _Numbering) -> torch.Tensor | None:
    """``x @ w`` (``linear``: ``x @ w.T + b``, ``addmm``: ``c + x @ w``): element ``(i, j)`` is
    numbered by row ``i`` of ``x``, column ``j`` of ``w`` and element ``(i, j)`` of the addend.
    A batched ``matmul`` (result of rank 3 or more) is numbered row by row: by the rows of its
    row-aligned operands and the whole of the shared ones (``W @ h[i]`` for every ``i``)."""
    target, args = node.target, list(node.args)
    shape = tensor_info(node).shape
    if product_operands(node) is not None and len(shape) >= 3:
        operands = [of(a) if isinstance(a, fx.Node) else None for a in args[:2]]
        if any(o is None for o in operands) or node.kwargs:
            return None
        columns = [numbering.intern(("row",), o.reshape(shape[0], -1)) if o.dim() == len(shape) and
                   o.shape[0] == shape[0] else numbering.intern(("whole",), o.reshape(1, -1)).expand(shape[0])
                   for o in operands]
        rows = numbering.intern(("batched product", _target_key(target)), torch.stack(columns, 1))
        return _cells(numbering, rows, shape)
    linear = linear_args(node)
    if linear is not None:
        x, w, addend = linear
        x_ids, w_ids = of(x), of(w)
        w_ids = None if w_ids is None or w_ids.dim() != 2 else w_ids.t()
    elif target is torch.addmm:
        if node.kwargs:
            return None
        addend, x, w = args[:3]
        x_ids, w_ids = of(x), of(w)
    else:
        x, w = args[:2]
        x_ids, w_ids = of(x), of(w)
        addend = None
    if x_ids is None or w_ids is None or x_ids.dim() != 2 or w_ids.dim() != 2:
        return None
    rows = numbering.intern(("row",), x_ids)                 # [n]: equal rows of x, equal ids
    columns = numbering.intern(("row",), w_ids.t())          # [m]: equal columns of w, equal ids
    parts = [rows[:, None].expand(shape).reshape(-1), columns[None, :].expand(shape).reshape(-1)]
    if addend is not None:
        addend_ids = of(addend)
        if addend_ids is None:
            return None
        parts.append(torch.broadcast_to(addend_ids, shape).reshape(-1))
    tag = ("product", _target_key(target), len(parts))
    return numbering.intern(tag, torch.stack(parts, 1)).reshape(shape)


def _reduced_ids(numbering: _Numbering, reduce: str, base: torch.Tensor, offsets: torch.Tensor,
                 index: torch.Tensor) -> torch.Tensor:
    """A gather-reduction's rows: numbered by the multiset of the rows its segment reads."""
    row_ids = numbering.intern(("row",), base.reshape(base.shape[0], -1))
    read = row_ids[index].tolist()
    bounds = offsets.tolist()
    out = [numbering.number(("reduce", reduce, tuple(sorted(read[start:end]))))
           for start, end in zip(bounds, bounds[1:])]
    return _cells(numbering, torch.tensor(out, dtype=torch.long), (len(out), *base.shape[1:]))


def _cells(numbering: _Numbering, rows: torch.Tensor, shape) -> torch.Tensor:
    """Element ids of a value whose row ``i`` is a function of ``rows[i]`` alone: (row id, position)."""
    width = math.prod(shape[1:])
    cells = torch.stack([rows.repeat_interleave(width), torch.arange(width).repeat(rows.shape[0])], 1)
    return numbering.intern(("cell",), cells).reshape(shape)


def _target_key(target):
    if isinstance(target, str):
        return target
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', repr(target))}"


# ----------------------------------------------------------------------------------------------
# The rewrite
# ----------------------------------------------------------------------------------------------

def _row_classes(node: fx.Node, ids: torch.Tensor | None):
    """(representatives, inverse) of a node worth compressing, else None: representatives are the
    first row of each class, ascending; row ``i`` equals representative ``inverse[i]``."""
    if ids is None or node.op != "call_function" or ids.dim() == 0 or ids.shape[0] < 2:
        return None
    rows = ids.shape[0]
    first, inverse = unique_rows(ids.reshape(rows, -1))
    count = first.shape[0]
    if count > RATIO * rows:
        return None
    order = torch.argsort(first)
    position = torch.empty_like(order)
    position[order] = torch.arange(count)
    return first[order], position[inverse]


def _restrict(gm: fx.GraphModule, node: fx.Node, keep: torch.Tensor) -> bool:
    """Make ``node`` compute only its rows ``keep``; False (and nothing changed) where it cannot."""
    info = tensor_info(node)
    gather = as_gather(gm, node)
    if gather is not None:   # index arithmetic on the CPU; the new index goes where the old one was
        device, index = gather.index.device, gather.index.long().cpu()
        if gather.reduces:
            bounds = gather.offsets.long().cpu()
            starts, ends = bounds[:-1][keep], bounds[1:][keep]
            lengths = ends - starts
            offsets = torch.zeros(keep.shape[0] + 1, dtype=torch.long)
            torch.cumsum(lengths, 0, out=offsets[1:])
            entries = torch.repeat_interleave(starts - offsets[:-1], lengths) + torch.arange(int(offsets[-1]))
            gather = dataclasses.replace(gather, offsets=offsets.to(device))
            index = index[entries]
            node.args = (*node.args[:2], keep.shape[0], *node.args[3:])
        else:
            index = index[keep]
        set_source(gm, gather, gather.base, index.to(device))
        set_rows_info(node, node, keep.shape[0])
        return True
    aligned = _row_aligned_operands(node, info)
    if aligned is None:
        return False
    for operand in aligned:
        selected = _select_rows(gm, operand, keep, before=node)
        node.args = tuple(selected if a is operand else a for a in node.args)
        node.kwargs = {k: selected if v is operand else v for k, v in node.kwargs.items()}
    set_rows_info(node, node, keep.shape[0])
    return True


def _row_aligned_operands(node: fx.Node, info) -> list[fx.Node] | None:
    """The operands whose rows are ``node``'s rows, if ``node`` computes each row from those rows
    alone (elementwise ops, and the ``x`` of ``linear``/``mm``); None for any other op."""
    if info is None:
        return None
    product = product_operands(node)
    if product is not None and info.rank >= 3:
        operands = list(node.args[:2])
        infos = [tensor_info(a) if isinstance(a, fx.Node) else None for a in operands]
        if node.kwargs or any(i is None or i.rank > info.rank for i in infos):
            return None
        aligned = [a for a, i in zip(operands, infos) if i.rank == info.rank and i.shape[0] == info.shape[0]]
        shared = [i for a, i in zip(operands, infos) if a not in aligned]
        if not aligned or any(i.rank == info.rank and i.shape[0] != 1 for i in shared):
            return None
        return list(dict.fromkeys(aligned))
    linear = linear_args(node)
    if linear is not None or product is not None:
        if linear is not None:
            x, rest = linear.x, [linear.weight, linear.bias]
        else:
            x, rest = product[0], [product[1]]
        x_info = tensor_info(x)
        if x_info is None or x_info.rank != 2 or info.rank != 2 or x in rest:
            return None
        if any(isinstance(a, fx.Node) and (tensor_info(a) is None or _aligned(a, info)) for a in rest):
            return None   # a weight with as many rows as x (a square product) is still a weight
        return [x]
    family = REGISTRY.family_of(node)
    if family is None or family.name != "elementwise" or draws_random_numbers(node):
        return None
    operands = [a for a in [*node.args, *node.kwargs.values()] if isinstance(a, fx.Node)]
    if any(tensor_info(a) is None for a in operands):
        return None   # an operand of unknown shape might be row-aligned
    return list(dict.fromkeys(a for a in operands if _aligned(a, info)))


def _aligned(operand: fx.Node, info) -> bool:
    """``operand`` is broadcast along ``info``'s rows as row-for-row (not as one shared row)."""
    o = tensor_info(operand)
    return o is not None and o.rank == info.rank and o.shape[0] == info.shape[0]


def _select_rows(gm: fx.GraphModule, operand: fx.Node, keep: torch.Tensor, before: fx.Node) -> fx.Node:
    """A node for ``operand[keep]``: a smaller constant for a constant, else a gather."""
    info = tensor_info(operand)
    value = constant_value(gm, operand)
    if value is not None and not value.requires_grad and not isinstance(value, torch.nn.Parameter):
        selected = add_constant(gm, value[keep.to(value.device)].clone(), "values")
    else:
        with gm.graph.inserting_before(before):
            selected = _gather(gm, operand, keep.to(info.device), info.dtype.is_floating_point)
    set_rows_info(selected, operand, keep.shape[0])
    return selected


def _gather(gm: fx.GraphModule, base: fx.Node, index: torch.Tensor, floating: bool) -> fx.Node:
    """``base[index]`` as a gather node (``gather_rows`` for float rows, ``index_select`` otherwise)."""
    if floating:
        csr = add_constant(gm, pack_csr(unit_offsets(index.shape[0], index.device), index, rows_of(base)), "csr")
        return gm.graph.call_function(_GATHER_ROWS, (base, csr))
    return gm.graph.call_function(torch.index_select, (base, 0, add_constant(gm, index, "index")))


def _expand_after(gm: fx.GraphModule, node: fx.Node, inverse: torch.Tensor) -> None:
    """Users of ``node`` read its rows ``inverse`` (the ``r`` rows it had before it was restricted)."""
    info = tensor_info(node)
    users = list(node.users)
    with gm.graph.inserting_after(node):
        expanded = _gather(gm, node, inverse.to(info.device), info.dtype.is_floating_point)
    expanded.meta = {k: v for k, v in node.meta.items() if k != "rel_info"}
    set_rows_info(expanded, node, inverse.shape[0])
    for user in users:
        user.replace_input_with(node, expanded)
