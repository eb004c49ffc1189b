"""Per-graph tensor code run once for the samples of a union, on their rows joined, as PyG collates graphs.

Per-graph code written with tensor ops over a sample's edge index reads rows
by it and sums rows into it::

    src, dst = ...                                   # the sample's structure: constants of its trace
    h = torch.relu(torch.zeros(n, d).index_add(0, dst, h[src] @ W.t()) + b)

The samples of a union that run the same code (a *program*: the same records
but for their shapes and their constants' values, with the same pattern of
equal row counts) run each such op once, on their rows joined, sample after
sample:

* a tensor argument is its rows of the union's input (the input itself where
  the program has every sample of the union);
* ``h[src]`` (``h.index_select(0, src)``) is one gather of the joined ``h`` by
  the samples' indices, each moved past the rows of the samples before it;
* ``z.index_add(0, dst, m)`` (or ``z.scatter_add(0, dst.view(-1, 1).expand_as(m), m)``)
  into new zeros is one segment sum of the joined ``m``, the targets moved the
  same way (onto a joined ``z``: its rows plus those sums);
* a constant with a row per row of such values (the in-degrees a mean divides
  by) is the samples' constants joined;
* a row-wise op of such values of the same rows and of shared values (weights),
  or a view or expansion within their rows, is one op on all of them.

The code after them reads each sample's rows of the joined values as a union
reads them (``union.py``): a readout ``h.mean(0)`` is the sample's row of one
segment reduction for all samples, a loss of them and of the sample's targets
is the sample's part of one loss per row. Without this, each read and sum is a
stack of per-edge and per-node nodes in every sample's trace
(``passes/constant_indices.py``), which is still what a sample gets where its
code reads the joined values some other way (``union._collates``).

Legal because the samples are disjoint: each joined value holds the samples'
rows, sample after sample, and each op computes a sample's rows from its own
rows alone. What a record collates to depends on its program alone (its ops,
and which row counts are equal, which the program's key holds), so one
sample's trace tells whether every sample of its program collates, before
any union is built.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Container, Hashable, Sequence, cast

import numpy
import torch
import torch.fx as fx

from dynamo_relational.kernels.gather_reduce import GATHER_REDUCTIONS, pack_csr, unit_offsets
from dynamo_relational.kernels.segment import csr_offsets
from dynamo_relational.passes.gather_nodes import CONSTANT_PREFIX, names_rows
from dynamo_relational.passes.postpone_gathers import row_wise_in
from dynamo_relational.passes.vectorize import ROW_SAMPLES, SAMPLE

from .nodes import new_node
from .ops import TensorInfo, tensor_info
from .ops.facts import calls, is_forward_constant_name, zeros_call
from .ops.matmul import is_product

if TYPE_CHECKING:
    from .union import SampleGraph, _Shared

_GATHER_ROWS = torch.ops.dynamo_relational.gather_rows.default
_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default
_SEGMENT_REDUCE = torch.ops.dynamo_relational.segment_reduce.default
#: the dtypes of a sample's index constants (an edge list)
_INDEX_DTYPES = (torch.int64, torch.int32)


class Slot(int):
    """In a sample's records (``union.SampleGraph``), an argument that is the value of the record at this
    position."""
    __slots__ = ()

    def __repr__(self) -> str:
        return f"%{int(self)}"


@dataclass(frozen=True)
class ProgramRows:
    """The class of a program's joined values in the union (``union._Shared.row_class``): values of one class
    hold as many rows of each of these samples, in order."""
    samples: tuple[int, ...]
    counts: tuple[int, ...]


#: a collated record: (its union value, the rows of each member of the program, in order)
Joined = tuple[fx.Node, list[int]]


def own_constant(target: Any) -> bool:
    """Whether a get_attr of ``target`` reads a sample's own constant (a tensor its ``forward`` built, or one a
    pass added), never the model's parameters and buffers."""
    return isinstance(target, str) and (is_forward_constant_name(target) or target.startswith(CONSTANT_PREFIX))


def reads_by_constants(graph: fx.Graph) -> bool:
    """Whether a sample's traced ``graph`` holds an integer constant of its own (an edge index that
    :func:`collate` may read rows by) or a matrix of its own that multiplies a value (an adjacency); cheap, for
    traces of per-node code to skip the rest."""
    for node in graph.find_nodes(op="get_attr"):
        if not own_constant(node.target):
            continue
        info, value = tensor_info(node), node.meta.get("example_value")
        if info is not None and info.dtype in _INDEX_DTYPES or isinstance(value, torch.Tensor) \
                and value.dim() == 2 and any(is_product(user.target, sparse=True) and user.args[:1] == (node,)
                                             for user in node.users):
            return True
    return False


def index_readers(records: Sequence[tuple], skipped: frozenset[int]) -> list[int]:
    """The calls among ``records`` (but the ``skipped`` ones) that read an integer constant of the sample's own:
    its reads and sums by an index, which collate or else are the sample's per-edge and per-node nodes."""
    def index(a: Any) -> bool:
        if type(a) is not Slot or records[a][0] != "get_attr" or not own_constant(records[a][1]):
            return False
        info = record_info(records[a])
        return info is not None and info.dtype in _INDEX_DTYPES
    return [i for i, (op, _, args, kwargs, _, _) in enumerate(records) if op in ("call_function", "call_method")
            and i not in skipped and any(map(index, flat_args((args, kwargs))))]


def collate(graph: fx.Graph, shared: "_Shared", members: Sequence[tuple[int, "SampleGraph"]],
            inputs: Sequence[fx.Node | None], starts: Sequence[Sequence[int]], everyone: bool,
            tried: bool = False) -> dict[int, Joined]:
    """The records of ``members`` (the union's samples of one program, in order: their numbers and traces) that
    run once on the members' rows joined, made in ``graph``: record -> :data:`Joined`. ``inputs`` are the
    union's inputs joined along dim 0 (None where stacked), ``starts[j]`` each member's first row in input ``j``;
    ``everyone``: the members are all of the union's samples, whose rows the inputs hold in order. ``tried``:
    only which records collate counts (the union's constants, the index tensors, are not made)."""
    return _Program(graph, shared, members, inputs, starts, everyone, tried).run()


class _Program:
    def __init__(self, graph: fx.Graph, shared: "_Shared", members: Sequence[tuple[int, "SampleGraph"]],
                 inputs: Sequence[fx.Node | None], starts: Sequence[Sequence[int]], everyone: bool, tried: bool):
        self.graph, self.shared, self.members, self.inputs, self.everyone = graph, shared, members, inputs, everyone
        self.starts, self.tried = starts, tried
        self.records = members[0][1].records
        self.joined: dict[int, Joined] = {}
        #: joined values made for an operand (an input's rows, constants joined): erased if no op reads them
        self.operands: dict[int, Joined] = {}
        self.shared_nodes: dict[int, fx.Node] = {}
        self.placeholders: dict[int, int] = {}

    def run(self) -> dict[int, Joined]:
        for i, (op, target, args, kwargs, _, meta) in enumerate(self.records):
            if op == "placeholder":
                self.placeholders[i] = len(self.placeholders)
            elif op == "get_attr":
                if target in self.shared.params:
                    self.shared_nodes[i] = self.shared.attribute(self.graph, self.members[0][1], self.members[0][0],
                                                                 target, meta)
            elif op == "output":
                break
            else:
                joined = self._gathered(i) or self._summed(i) or self._multiplied(i) or self._row_wise(i)
                if joined is not None:
                    self.joined[i] = joined
                else:
                    self._shared(i)
        for i, (node, _) in list(self.operands.items()):
            if not node.users and node.op != "placeholder":
                self.graph.erase_node(node)
                del self.operands[i]
        # a tensor argument that other records read too is its joined rows for them (targets beside outputs)
        read = {a for i, record in enumerate(self.records) if i not in self.joined
                for a in record_slots(record[2:4]) if a in self.placeholders}
        for x in read:
            if self.rows(x) is not None:
                self.joined[x] = self.operands[x]
        samples = tuple(s for s, _ in self.members)
        for node, counts in self.joined.values():
            if node.op != "placeholder":   # (the input's own rows keep their class)
                self.shared.row_class[node] = ProgramRows(samples, tuple(counts))
        return self.joined

    # -- what an operand is --------------------------------------------------
    def counts(self, i: int) -> list[int] | None:
        """Each member's rows of record ``i``'s value (None if it has no rows)."""
        counts = []
        for _, sample in self.members:
            info = record_info(sample.records[i])
            if info is None or not info.shape:
                return None
            counts.append(info.shape[0])
        return counts

    def rows(self, slot: Any) -> Joined | None:
        """The joined value of ``slot``: a collated record's, a tensor argument's rows, or the members' constants
        joined (made here, once)."""
        if type(slot) is not Slot:
            return None
        if slot in self.joined:
            return self.joined[slot]
        if slot in self.operands:
            return self.operands[slot]
        counts = self.counts(slot)
        op, target, args, kwargs, _, meta = self.records[slot]
        new = op == "call_function" and target in (torch.zeros, torch.ones) \
            and not record_slots((args, kwargs))
        if counts is None or not (op == "placeholder" or op == "get_attr" and own_constant(target) or new):
            return None
        info = record_info(self.records[slot])
        assert info is not None
        whole = TensorInfo((sum(counts), *info.shape[1:]), info.dtype, info.device)
        if op == "placeholder":
            source = self.inputs[self.placeholders[slot]]
            if source is None:
                return None
            if self.everyone:
                node = source
            else:   # (the members' rows of the input, in order)
                starts = self.starts[self.placeholders[slot]]
                node = self._gather(source, lambda: numpy.concatenate(
                    [numpy.arange(a, a + n) for a, n in zip(starts, counts)] + [numpy.zeros(0, numpy.int64)]),
                    sum(counts), info, meta)
        elif new:   # (a new tensor of zeros or ones with rows of the members': a row of them for each, which the
            # union's row plan restricts to a batch's rows as it restricts a gather)
            row = TensorInfo((1, *info.shape[1:]), info.dtype, info.device)
            one = new_node(self.graph, op, target, (row.shape,), dict(kwargs))
            one.meta.update(_source(meta), rel_info=row)
            node = new_node(self.graph, "call_method", "expand", (one, whole.shape), {})
            node.meta.update(_source(meta), rel_info=whole)
            node.meta[ROW_SAMPLES] = self._row_samples(counts)
        else:   # (the members' constants joined once)
            node = self._per_row_constant(lambda: torch.cat([sample.attrs[target] for _, sample in self.members]),
                                          "constants", whole, counts, meta)
        self.operands[slot] = (node, counts)
        return self.operands[slot]

    def index(self, slot: Any, rows: list[int]) -> list[numpy.ndarray] | None:
        """Each member's values of ``slot``, an integer constant of its own, as rows of a value of ``rows`` rows
        each (1-d; an ``[E, 1]`` column read as its values), or None."""
        if type(slot) is not Slot or self.records[slot][0] != "get_attr" \
                or not own_constant(self.records[slot][1]):
            return None
        values = []
        for (_, sample), n in zip(self.members, rows):
            value = sample.attrs[self.records[slot][1]]
            if not isinstance(value, torch.Tensor) or value.dtype not in _INDEX_DTYPES \
                    or value.dim() < 1 or any(d != 1 for d in value.shape[1:]):
                return None
            value = value.reshape(-1).cpu().numpy().astype(numpy.int64)
            if value.size and n == 0:
                return None
            values.append(value % n if value.size else value)
        return values

    # -- the records that collate -------------------------------------------
    def _gathered(self, i: int) -> Joined | None:
        """``x[index]``, ``x.index_select(0, index)``: one gather of the joined ``x``."""
        op, target, args, kwargs, _, meta = self.records[i]
        if op == "call_function" and target is operator.getitem and len(args) == 2 and not kwargs:
            x, index = args
        elif calls(op, target, "index_select") and len(args) == 3 and not kwargs and _along_rows(self, args[0],
                                                                                                  args[1]):
            x, _, index = args
        else:
            return None
        source = self.rows(x)
        info = record_info(self.records[i])
        if source is None or info is None:
            return None
        node, counts = source
        values = self.index(index, counts)
        if values is None:
            return None
        rows = [len(v) for v in values]
        return self._gather(node, lambda: _joined_index(values, counts), sum(rows), info, meta), rows

    def _summed(self, i: int) -> Joined | None:
        """``z.index_add(0, index, m)``, ``z.scatter_add(0, index.view(-1, 1).expand_as(m), m)`` into new zeros (or
        a constant of zeros): one segment sum of the joined ``m``, a segment per row of the members' ``z``; onto
        a joined ``z``, its rows plus those sums. ``z.scatter_reduce(0, index, m, reduce, include_self=False)``
        (and ``index_reduce``) into new zeros, as PyTorch Geometric takes the mean, maximum or minimum of
        messages: the segment's mean, maximum or minimum, a row without messages zeros."""
        op, target, args, kwargs, _, meta = self.records[i]
        reduction = _scatter_reduction(op, target, args, kwargs)
        if reduction is None:
            return None
        z, dim, index, m = args[:4]
        messages, info = self.rows(m), record_info(self.records[i])
        if messages is None or info is None or not _along_rows(self, z, dim):
            return None
        if not calls(op, target, "index_add") and not calls(op, target, "index_reduce"):
            index = _expanded_column(self.records, index, m)
        node, counts = messages
        targets = self.counts(z)
        base = None if self._zeros(z) else self.rows(z)   # (onto a value: its rows plus their sums)
        if targets is None or base is not None and (base[1] != targets or reduction != "sum") \
                or base is None and not self._zeros(z):
            return None
        values = self.index(index, targets)
        if values is None or [len(v) for v in values] != counts:
            return None
        message = record_info(self.records[m])
        if message is None or message.shape[1:] != info.shape[1:] or message.dtype != info.dtype:
            return None
        if reduction in GATHER_REDUCTIONS:
            summed = self._segment_sum(node, counts, values, targets, info, meta, reduction)
        else:
            summed = self._segment_extreme(node, values, targets, info, meta, reduction)
        if base is not None:
            summed = new_node(self.graph, "call_function", operator.add, (base[0], summed), {})
            summed.meta.update(_source(meta), rel_info=tensor_info(base[0]))
        return summed, targets

    def _segment_extreme(self, messages: fx.Node, values: list[numpy.ndarray], targets: list[int], info: TensorInfo,
                         meta: tuple, reduce: str) -> fx.Node:
        """The maximum (``reduce="amax"``) or minimum of the joined ``messages`` into rows ``values`` of each
        member's ``targets`` rows: one gather of the messages in the order of their rows, one segment reduction,
        and a row without messages zeros."""
        total = int(sum(targets))
        order, sizes = _by_target(values, targets)
        row = TensorInfo((total, *info.shape[1:]), info.dtype, info.device)
        ordered = self._gather(messages, lambda: order, len(order), info, meta)
        offsets = self._constant(lambda: csr_offsets(sizes.tolist(), info.device), "offsets")
        reduced = new_node(self.graph, "call_function", _SEGMENT_REDUCE, (ordered, offsets, reduce), {})
        reduced.meta.update(_source(meta), rel_info=row)
        reduced.meta[ROW_SAMPLES] = self._row_samples(targets)
        if sizes.all():
            return reduced
        empty = TensorInfo((total, *[1] * (len(info.shape) - 1)), torch.bool, info.device)
        mask = self._per_row_constant(lambda: torch.from_numpy(sizes == 0).view(empty.shape).to(info.device),
                                      "empty", empty, targets, meta)
        zeroed = new_node(self.graph, "call_function", torch.where, (mask, 0.0, reduced), {})
        zeroed.meta.update(_source(meta), rel_info=row)
        return zeroed

    def _multiplied(self, i: int) -> Joined | None:
        """``A @ h`` by a float constant ``A`` of each member's own (an adjacency, ``[n, c]`` for ``h`` of ``c``
        rows; dense, or sparse by ``torch.spmm``): the sum of ``A[r, c] * h[c]`` into row ``r`` over ``A``'s
        nonzeros, as over an edge index: one gather of the joined ``h``, a product by the nonzeros' values unless
        all are ones, and one segment sum (a dense ``A``'s zeros are left out, as a sparse product leaves them:
        ``0 * inf`` adds nothing where the dense product's is nan)."""
        op, target, args, kwargs, _, meta = self.records[i]
        if op not in ("call_function", "call_method") or not is_product(target, sparse=True) or len(args) != 2 \
                or kwargs:
            return None
        a, h = args
        source, info = self.rows(h), record_info(self.records[i])
        if type(a) is not Slot or self.records[a][0] != "get_attr" or not own_constant(self.records[a][1]) \
                or source is None or info is None or len(info.shape) != 2:
            return None
        node, counts = source
        matrices = [sample.attrs[self.records[a][1]] for _, sample in self.members]
        if any(not isinstance(m, torch.Tensor) or m.layout not in (torch.strided, torch.sparse_coo) or m.dim() != 2
               or m.shape[1] != n or m.dtype != info.dtype or m.requires_grad for m, n in zip(matrices, counts)):
            return None
        sparse = [(m if m.layout == torch.sparse_coo else m.to_sparse()).detach().coalesce() for m in matrices]
        found = [m.indices() for m in sparse]
        weights = [m.values() for m in sparse]
        nonzeros = [(rows.cpu().numpy(), columns.cpu().numpy()) for rows, columns in found]
        edges = [len(w) for w in weights]
        message = TensorInfo((sum(edges), info.shape[1]), info.dtype, info.device)
        product = self._gather(node, lambda: _joined_index([columns for _, columns in nonzeros], counts),
                               message.shape[0], message, meta)
        if not all(bool((w == 1).all()) for w in weights):   # (an adjacency of ones sums its rows as they are)
            weight = TensorInfo((message.shape[0], 1), info.dtype, info.device)
            weighted = self._per_row_constant(lambda: torch.cat(weights).view(-1, 1), "weights", weight, edges, meta)
            product = new_node(self.graph, "call_function", operator.mul, (product, weighted), {})
            product.meta.update(_source(meta), rel_info=message)
        targets = [m.shape[0] for m in matrices]
        return self._segment_sum(product, edges, [rows for rows, _ in nonzeros], targets, info, meta), targets

    def _segment_sum(self, messages: fx.Node, counts: list[int], values: list[numpy.ndarray], targets: list[int],
                     info: TensorInfo, meta: tuple, reduce: str = "sum") -> fx.Node:
        """The joined ``messages`` (``counts`` rows of each member) summed (``reduce="mean"``: averaged) into rows
        ``values`` of each member's ``targets`` rows (a row without messages: zeros)."""
        total = int(sum(targets))

        def segments() -> torch.Tensor:   # (each member's messages summed into its rows, in their order)
            order, sizes = _by_target(values, targets)
            return pack_csr(csr_offsets(sizes.tolist()), torch.from_numpy(order), int(sum(counts))).to(info.device)

        csr = self._constant(segments, "segments")
        summed = new_node(self.graph, "call_function", _GATHER_REDUCE, (messages, csr, total, reduce), {})
        summed.meta.update(_source(meta), rel_info=TensorInfo((total, *info.shape[1:]), info.dtype, info.device))
        summed.meta[ROW_SAMPLES] = self._row_samples(targets)
        return summed

    def _zeros(self, slot: Any) -> bool:
        """Whether ``slot`` is a new tensor of zeros (``torch.zeros(n, d)``, ``torch.zeros_like(h)``) or a constant
        of zeros of every member's own."""
        if type(slot) is not Slot:
            return False
        op, target, args, kwargs = self.records[slot][:4]
        if op == "call_function" and zeros_call(op, target):
            return set(kwargs) <= {"dtype", "device", "layout", "memory_format"} and (
                target is torch.zeros_like or not record_slots(args))
        return op == "get_attr" and own_constant(target) and all(
            isinstance(v := sample.attrs[target], torch.Tensor) and not bool(v.any()) for _, sample in self.members)

    def _row_wise(self, i: int) -> Joined | None:
        """An op that computes each row from the same rows of joined values (of the same rows) and shared values:
        one op on the joined values."""
        op, target, args, kwargs, _, meta = self.records[i]
        if op != "call_function" and not (op == "call_method" and isinstance(target, str) and not target.endswith("_")):
            return None
        counts, info = self.counts(i), record_info(self.records[i])
        slots = record_slots((args, kwargs))
        if counts is None or info is None or not any(s in self.joined or self.placeholders.get(s) is not None
                                                     for s in slots):
            return None
        values: dict[int, fx.Node] = {}
        for s in slots:
            if s in self.shared_nodes:
                continue
            joined = self.rows(s)
            if joined is None or joined[1] != counts:
                return None
            values[s] = joined[0]
        new_args, new_kwargs = fx.node.map_aggregate(
            (args, kwargs), lambda a: (values.get(a) or self.shared_nodes[a]) if type(a) is Slot else a)
        layout = _rows_layout(op, target, args, kwargs, self.records, info, sum(counts))
        if layout is not None:   # (a view or expansion that keeps each row a row: sized for the joined rows)
            new_args, new_kwargs = (values[args[0]], *layout), {}
            target = "expand" if target == "expand_as" else target
        made = new_node(self.graph, op, target, new_args, dict(new_kwargs))
        made.meta.update(_source(meta), rel_info=TensorInfo((sum(counts), *info.shape[1:]), info.dtype, info.device))
        if layout is not None:
            return made, counts
        operands = set(values.values())
        from .union import _row_wise_of_aligned   # (union builds on this module)
        first = made.args[0] if made.args else None
        if not ((len(operands) == 1 and first in operands and row_wise_in(made, first))
                or _row_wise_of_aligned(made, operands)):
            self.graph.erase_node(made)
            return None
        return made, counts

    def _shared(self, i: int) -> None:
        """Record ``i``'s node if it computes from shared values alone (``W.t()``): one for every sample, as
        :meth:`~dynamo_relational.union._Shared.key` makes it."""
        op, target, args, kwargs, _, meta = self.records[i]
        slots = record_slots((args, kwargs))
        if not slots or any(s not in self.shared_nodes for s in slots):
            return
        new_args, new_kwargs = fx.node.map_aggregate(
            (args, kwargs), lambda a: self.shared_nodes[a] if type(a) is Slot else a)
        made = new_node(self.graph, op, target, new_args, dict(new_kwargs))
        made.meta.update(meta)
        key = self.shared.key(made)
        if key is None:
            self.graph.erase_node(made)
        elif key in self.shared.computed:
            self.graph.erase_node(made)
            self.shared_nodes[i] = self.shared.computed[key]
        else:
            self.shared.computed[key] = self.shared_nodes[i] = made
            self.shared.nodes.add(made)

    # -- union nodes ---------------------------------------------------------
    def _row_samples(self, counts: Sequence[int]) -> list[int]:
        """The sample of each row of a joined value with ``counts`` rows of each member."""
        return [s for (s, _), n in zip(self.members, counts) for _ in range(n)]

    def _per_row_constant(self, make: Callable[[], torch.Tensor], hint: str, info: TensorInfo,
                          counts: Sequence[int], meta: tuple) -> fx.Node:
        """A joined constant of the union, ``make()`` (``info``: ``counts`` rows of each member), read through a
        gather of its rows tagged with their samples, which a batch restricts to its own (the constant itself
        belongs to no sample)."""
        joined = self._constant(make, hint, index=False)
        joined.meta["rel_info"] = info
        node = self._gather(joined, lambda: numpy.arange(info.shape[0]), info.shape[0], info, meta)
        node.meta[ROW_SAMPLES] = self._row_samples(counts)
        return node

    def _constant(self, make: Callable[[], torch.Tensor], hint: str, index: bool = True) -> fx.Node:
        """A get_attr of a new constant of the union, ``make()`` (not made where the program is only tried)."""
        return self.shared.constant(self.graph, f"collated_{hint}", None if self.tried else make(), index=index)

    def _gather(self, source: fx.Node, index: Callable[[], numpy.ndarray], rows: int, row: TensorInfo,
                meta: tuple) -> fx.Node:
        """``source[index()]`` (``rows`` rows like ``row``) as the grouping's gathers are: float rows with a
        deterministic backward."""
        columns = cast(TensorInfo, tensor_info(source)).shape[0]
        info = TensorInfo((rows, *row.shape[1:]), row.dtype, row.device)
        if row.dtype.is_floating_point or row.dtype.is_complex:
            csr = self._constant(
                lambda: pack_csr(unit_offsets(rows), torch.from_numpy(index()), columns).to(row.device), "rows")
            node = new_node(self.graph, "call_function", _GATHER_ROWS, (source, csr), {})
        else:
            read = self._constant(lambda: torch.from_numpy(index()).to(row.device), "index")
            node = new_node(self.graph, "call_function", torch.index_select, (source, 0, read), {})
        node.meta.update(_source(meta), rel_info=info)
        return node


def program_key(sample: "SampleGraph", collated: frozenset[int]) -> Hashable:
    """What samples of one program share: their records but for shapes, names and their constants' values, the
    records that collate, and the shapes that collation compares: which of the row counts of the collated
    records and their operands are equal (each as the first of them with as many rows; 0 as itself), and
    their other dims."""
    records = sample.records
    counted = set(collated)
    for i in collated:   # (and what holds rows among their operands, not the shared values, whose shapes never change)
        counted.update(int(a) for a in record_slots(records[i][2:4]) if _holds_rows(records[a]))
    # a matrix's columns are the rows of the value it multiplies (``A @ h``): a row count too
    matrices = {int(a) for i in collated if is_product(records[i][1], sparse=True)
                and type(a := records[i][2][0]) is Slot and records[a][0] == "get_attr" and own_constant(records[a][1])}
    return _structure(records, counted, matrices), collated


def _holds_rows(record: tuple) -> bool:
    """Whether a record that is not collated may be rows of a collated value: an argument, an own constant, a new
    tensor of zeros or ones (any other operand of a collated record is shared)."""
    op, target = record[:2]
    return op == "placeholder" or (op == "get_attr" and own_constant(target)) \
        or (op == "call_function" and (zeros_call(op, target) or target is torch.ones))


def trial_key(sample: "SampleGraph") -> Hashable:
    """What decides which records of ``sample`` collate: its records but for names and its constants' values,
    which of all their row counts are equal, their other dims, and which of its constants are zeros. Samples
    with equal keys collate the same records (and have equal :func:`program_key`)."""
    zeros = tuple(not bool(v.any()) for t, v in sample.attrs.items() if own_constant(t) and isinstance(v, torch.Tensor))
    return _structure(sample.records, None), zeros


def _structure(records: Sequence[tuple], counted: set[int] | None, matrices: Container[int] = ()) -> Hashable:
    """``records`` but for names and own constants' names, with the shapes of the ``counted`` ones (all: None),
    the ``matrices``' columns counted as rows."""
    firsts: dict[int, int] = {}

    def count(n: int) -> int:   # (each row count as the first of them with as many rows; 0 as itself)
        return -1 if n == 0 else firsts.setdefault(n, len(firsts))

    parts: list[Hashable] = []
    for i, (op, target, args, kwargs, _, meta) in enumerate(records):
        shape: Hashable = None
        if (counted is None or i in counted) and (info := record_info(records[i])) is not None:
            rows = count(info.shape[0]) if info.shape else None
            shape = (rows, (count(info.shape[1]),) if i in matrices else info.shape[1:], info.dtype, info.device)
        if op == "call_function" and target in _SIZED:
            args = ()   # (its size: its shape's, which ``shape`` holds where it counts)
        # (the arguments by their text: records by number, ``%3``; a slice is not hashable before Python 3.12)
        parts.append((op, target if op != "get_attr" or not own_constant(target) else "constant", repr(args),
                      repr(kwargs) if kwargs else "", shape))
    return tuple(parts)


#: factories whose arguments are their size alone
_SIZED = (torch.zeros, torch.ones, torch.empty)


def flat_args(tree: Any) -> list[Any]:
    """The leaves of a record's arguments (``torch.zeros((n, d))``'s sizes)."""
    leaves: list[Any] = []
    fx.node.map_aggregate(tree, leaves.append)
    return leaves


def record_slots(tree: Any) -> list[Slot]:
    """The records that a record's arguments ``tree`` read."""
    return [a for a in flat_args(tree) if type(a) is Slot]


def record_info(record: tuple) -> TensorInfo | None:
    """The shape, dtype and device of a record's value (None: not one tensor)."""
    info = dict(record[5]).get("rel_info")
    return info if isinstance(info, TensorInfo) else None


def _by_target(values: list[numpy.ndarray], targets: list[int]) -> tuple[numpy.ndarray, numpy.ndarray]:
    """For messages into rows ``values`` of each member's ``targets`` rows: the messages' order by their joined
    target row (stable), and how many each joined row gets."""
    target_rows = _joined_index(values, targets)
    return numpy.argsort(target_rows, kind="stable"), numpy.bincount(target_rows, minlength=int(sum(targets)))


def _joined_index(values: list[numpy.ndarray], rows: list[int]) -> numpy.ndarray:
    """Each member's row numbers ``values`` (of a value of ``rows`` rows each) as rows of the joined value."""
    starts = numpy.cumsum(rows) - rows
    return numpy.concatenate([v + a for v, a in zip(values, starts)] + [numpy.zeros(0, numpy.int64)])


def _source(meta: tuple) -> dict:
    """A record's metadata for a node of the union (no sample's)."""
    return {k: v for k, v in meta if k not in (SAMPLE, "rel_info")}


def _along_rows(program: _Program, x: Any, dim: Any) -> bool:
    """Whether ``dim`` names dim 0 of record ``x``'s value."""
    return type(x) is Slot and names_rows(dim, record_info(program.records[x]))


def _rows_layout(op: str, target: Any, args: tuple, kwargs: dict, records: Sequence[tuple], out: TensorInfo,
                 rows: int) -> tuple | None:
    """The arguments after the joined value (of ``rows`` rows) of a call that keeps each row of its first operand
    a row of its result, its other dims alone changed (``x.view(-1, 1)``, ``x.reshape(n, 2, 2)``,
    ``x.expand(n, d)``, ``x.expand_as(y)`` of a ``y`` of the same rows, ``x.unsqueeze(1)``), for the joined rows
    (the row count written out, which a batch replaces by its own); else None. The caller has checked that the
    result has as many rows as the operand."""
    if op != "call_method" or not args or type(args[0]) is not Slot:
        return None
    x = record_info(records[args[0]])
    if x is None or not x.shape or not out.shape or kwargs:
        return None
    if target in ("view", "reshape") and math.prod(x.shape[1:]) == math.prod(out.shape[1:]) and len(args) > 1 \
            and not record_slots(args[1:]):
        return ((rows, *out.shape[1:]),)
    if target == "expand" and len(args) > 1 and not record_slots(args[1:]):
        return ((rows, *out.shape[1:]),)
    if target == "expand_as" and len(args) == 2:
        y = record_info(records[args[1]])
        return None if y is None or y.shape != out.shape else ((rows, *out.shape[1:]),)
    if target == "unsqueeze" and len(args) == 2 and type(args[1]) is int and args[1] % len(out.shape) != 0:
        return (args[1],)
    return None


def _scatter_reduction(op: str, target: Any, args: tuple, kwargs: dict) -> str | None:
    """How a call of four or more arguments ``(z, dim, index, m)`` reduces the rows of ``m`` into ``z``: "sum"
    (``index_add``, ``scatter_add``, a scatter or index reduction's "sum"), or "mean", "amax" or "amin" of a
    scatter or index reduction that leaves ``z``'s own values out (``include_self=False``); else None."""
    if calls(op, target, "index_add") or calls(op, target, "scatter_add"):
        return "sum" if len(args) == 4 and not kwargs else None
    if not (calls(op, target, "scatter_reduce") or calls(op, target, "index_reduce")) or len(args) not in (4, 5) \
            or not set(kwargs) <= {"reduce", "include_self"}:
        return None
    reduce = args[4] if len(args) == 5 else kwargs.get("reduce")
    include_self = kwargs.get("include_self", True)
    if reduce == "sum" and include_self is True and calls(op, target, "scatter_reduce") \
            or reduce in ("mean", "amax", "amin") and include_self is False:
        return reduce
    return None


def _expanded_column(records: Sequence[tuple], index: Any, m: Any) -> Any:
    """The ``[E, 1]`` column that scatter index ``index`` repeats along the rows of ``m`` (``dst.view(-1,
    1).expand_as(m)``, recorded as an ``expand_as`` of the column), else ``index`` itself."""
    if type(index) is not Slot:
        return index
    op, target, args, kwargs = records[index][:4]
    expanded, messages = record_info(records[index]), record_info(records[m])
    if op == "call_method" and target in ("expand_as", "expand") and args and not kwargs \
            and expanded is not None and messages is not None and expanded.shape == messages.shape:
        return args[0]
    return index
