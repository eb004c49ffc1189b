"""A grouped union run on any batch of its samples, by index arithmetic.

A grouped union of samples (:mod:`dynamo_relational.union`) computes its
samples side by side. :func:`analyse` proves, node by node, that each value
is one of

* **shared**: parameters and buffers, and what is computed from them alone;
* **index**: an index tensor of the vectorizer, read only by gathers;
* **rows**: a tensor whose dim 0 holds rows, each belonging to one sample
  (the vectorizer tags each group's rows with their samples; gathers, ``cat``
  and row-wise ops carry the tags on);

and that every op keeps the rows of different samples apart: gathers read a
sample's rows for rows of the same sample (the samples are disjoint), and the
other ops compute row ``i`` from row ``i`` of their operands alone
(:func:`_row_wise`). Anything else is refused with the node, the op and its
source line; the samples then run one by one.

Restricting every rows value to the rows of some samples then computes
exactly those samples. :class:`RowPlan` holds the union's graph with its index
tensors and the sizes that count rows turned into inputs (its code is the
same for every batch), and :meth:`RowPlan.arguments` computes those inputs
for a batch (a list of union samples; one may repeat): each gather keeps the
rows of the batch's samples in batch order, its index renumbered into its
source's kept rows (:mod:`dynamo_relational.assembly` does that for all index
tensors at once).
"""
from __future__ import annotations

import collections
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Container, Sequence, cast

import numpy
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.operator_schemas import normalize_function
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from dynamo_relational.kernels.gather_reduce import unpack_csr
from dynamo_relational.passes.gather_nodes import is_added_constant
from dynamo_relational.passes.vectorize import ROW_SAMPLES, SAMPLE

from .assembly import Assembly
from .backend import use_forms
from .ops import REGISTRY, NeuronOp, tensor_info
from .ops.aggregate import aggregate
from .ops.along import GATHER_ALONG, values_or_indices
from .ops.base import TensorInfo, value_info
from .ops.cells import CELL
from .ops.elementwise import ELEMENTWISE
from .ops.facts import is_sample_constant
from .ops.losses import LOSS
from .ops.matmul import MATMUL, linear_args, product_operands
from .ops.select import ONE_HOT

_GATHER_ROWS = torch.ops.dynamo_relational.gather_rows.default
_GATHER_REDUCE = torch.ops.dynamo_relational.gather_reduce.default
_SEGMENT_REDUCE = torch.ops.dynamo_relational.segment_reduce.default
#: calls that work along the dims their ``dim`` argument names (read from the op's schema)
_ALONG = {"sum", "mean", "amax", "amin", "prod", "softmax", "log_softmax", "logsumexp", "cumsum", "cumprod",
          "norm", "linalg_vector_norm", "std", "var", "max", "min", "argmax", "argmin", "all", "any", "normalize",
          "glu"}
#: what an empty tensor's buffer name replaces in its shape, dtype and device (``torch.float32``, ``cuda:0``)
_NAME = str.maketrans(".:", "__")
#: methods and functions that keep every row as it is (no dims, or dtype only)
_KEEP = {"clone", "contiguous", "detach", "to", "float", "double", "half", "bfloat16", "type_as"}


class Refused(Exception):
    """Why a grouped union cannot be restricted to a batch of its samples."""


class Rows:
    """The rows of one rows value and how a batch restricts them.

    ``owner[i]`` is the sample of row ``i``. Restricted to a batch, the rows
    come in batch order, each sample's in union order (:meth:`listing`);
    a :class:`CatRows` keeps its parts' orders one after the other. Row ``i``
    of sample position ``b`` is then where part ``leaf_of[i]``'s rows of ``b``
    start, plus ``rank[i]``. (The arithmetic runs in numpy: a few microseconds
    less per operation than torch, on small arrays.)"""

    def __init__(self, owner: numpy.ndarray, samples: int):
        self.owner = owner
        self.rows = owner.shape[0]
        self.counts = numpy.bincount(owner, minlength=samples)
        self.order = numpy.argsort(owner, kind="stable")
        self.start = numpy.cumsum(self.counts) - self.counts
        rank = numpy.empty_like(self.order)
        rank[self.order] = numpy.arange(self.rows) - self.start[owner[self.order]]
        #: each row's rank among its sample's rows, and its part (one part: all 0)
        self.rank = rank
        self.leaf_of = numpy.zeros_like(rank)

    def same_as(self, other: "Rows") -> bool:
        return other is self or (type(other) is Rows and numpy.array_equal(other.owner, self.owner))

    def parts(self) -> list[tuple["Rows | None", int]]:
        """(rows of samples, or None for ``n`` rows of a shared value, ``n``) of each part, in order."""
        return [(self, 0)]

    def listing(self, batch: "Batch") -> tuple[numpy.ndarray, numpy.ndarray]:
        """(union row, batch position) of each restricted row, in order."""
        def compute():
            counts = self.counts[batch.samples]
            total = int(counts.sum())
            first = self.start[batch.samples] - (numpy.cumsum(counts) - counts)
            rows = self.order[numpy.repeat(first, counts) + numpy.arange(total)]
            return rows, numpy.repeat(batch.positions, counts)
        return batch.memo(self, "listing", compute)


class SharedRows(Rows):
    """The rows of a shared value joined with rows of samples (``torch.cat([weights, group])``): every batch
    keeps them all, at the same place (their owner is -1)."""

    def __init__(self, rows: int, samples: int):
        self.rows = rows
        self.owner = numpy.full(rows, -1, dtype=numpy.int64)
        self.rank = numpy.arange(rows)
        self.leaf_of = numpy.zeros_like(self.rank)
        self.counts = numpy.zeros(samples, dtype=numpy.int64)

    def same_as(self, other: Rows) -> bool:
        return other is self

    def parts(self) -> list[tuple[Rows | None, int]]:
        return [(None, self.rows)]

    def listing(self, batch: "Batch"):
        raise Refused("rows of a shared value among a sample's results")


class CatRows(Rows):
    """The rows of ``torch.cat`` of rows values (and shared values): each part's restricted rows, part after
    part."""

    def __init__(self, parts: Sequence[Rows]):
        leaves = [leaf for p in parts for leaf in (p.leaves if type(p) is CatRows else [p])]
        self.leaves: list[Rows] = leaves
        self.owner = numpy.concatenate([p.owner for p in leaves])
        self.rows = self.owner.shape[0]
        self.starts = numpy.cumsum([0] + [p.rows for p in leaves])
        self.leaf_of = numpy.repeat(numpy.arange(len(leaves)), [p.rows for p in leaves])
        self.rank = numpy.concatenate([p.rank for p in leaves])
        self.counts = numpy.sum([p.counts for p in leaves], axis=0)

    def parts(self) -> list[tuple[Rows | None, int]]:
        return [part for leaf in self.leaves for part in leaf.parts()]

    def same_as(self, other: Rows) -> bool:
        return other is self or (type(other) is CatRows and len(other.leaves) == len(self.leaves)
                                 and all(a.same_as(b) for a, b in zip(self.leaves, other.leaves)))

    def listing(self, batch: "Batch") -> tuple[numpy.ndarray, numpy.ndarray]:
        def compute():
            pieces = [p.listing(batch) for p in self.leaves]
            return (numpy.concatenate([rows + self.starts[i] for i, (rows, _) in enumerate(pieces)]),
                    numpy.concatenate([position for _, position in pieces]))
        return batch.memo(self, "listing", compute)


class Batch:
    """The union samples of one batch, in order, and what the restriction computed for it (per :class:`Rows`)."""

    def __init__(self, samples: Sequence[int]):
        self.samples = numpy.asarray(samples, dtype=numpy.int64)
        self.positions = numpy.arange(self.samples.shape[0])
        self._memo: dict = {}

    def memo(self, rows: Rows, what: str, compute: Callable) -> Any:
        key = (id(rows), what)
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = compute()
        return value


class GatherIndex:
    """One index tensor of the union, as :class:`~dynamo_relational.assembly.Assembly` restricts it.

    ``kind`` is ``"select"`` (one source row per row: ``index_select``), ``"reduce"`` (segments of source rows:
    ``gather_reduce``'s packed CSR) or ``"segments"`` (``segment_reduce``'s offsets over consecutive rows).
    A gather from a shared tensor (``source`` None) keeps its index values; one from rows renumbers them."""

    def __init__(self, kind: str, out: Rows, source: Rows | None, source_rows: int, offsets: numpy.ndarray | None,
                 index: numpy.ndarray | None, device: torch.device):
        self.kind, self.out, self.source, self.source_rows, self.device = kind, out, source, source_rows, device
        if offsets is not None:
            self.segment_start, self.segment_length = offsets[:-1], offsets[1:] - offsets[:-1]
        self.index = index
        if index is not None and source is not None:   # where each read row is among its sample's rows
            self.rank_at, self.leaf_at = source.rank[self.index], source.leaf_of[self.index]

    def same_as(self, other: "GatherIndex") -> bool:
        """Whether every batch restricts both to the same index tensor: equal entries, out rows laid out alike,
        and sources whose rows are laid out alike (the layers of a GNN reading one adjacency)."""
        def equal(a, b):
            return a is b or (a is not None and b is not None and numpy.array_equal(a, b))
        return (self.kind == other.kind and self.source_rows == other.source_rows and self.device == other.device
                and self.out.same_as(other.out) and equal(self.index, other.index)
                and (self.source is other.source or (self.source is not None and other.source is not None
                                                     and self.source.same_as(other.source)))
                and (self.kind == "select" or (equal(self.segment_start, other.segment_start)
                                               and equal(self.segment_length, other.segment_length))))


@dataclass
class RowPlan:
    """The union's graph as a function of a batch's inputs, index tensors and sizes (see the module docstring)."""
    graph: fx.GraphModule
    samples: int
    indices: list[GatherIndex]
    #: the Rows each size input counts
    sizes: list[Rows]
    #: the Rows of each output
    outputs: list[Rows]
    #: the Rows of each value with rows, by its node's position in the graph
    values: dict[int, Rows] = field(default_factory=dict)
    #: how many consecutive :attr:`indices` each index input of the graph holds (a merged gather's, joined)
    spans: list[int] | None = None

    def __post_init__(self):
        self.assembly = Assembly(self.indices, self.sizes, self.samples, self.spans)
        distinct = list({id(rows): rows for rows in self.values.values()}.values())
        slot = {id(rows): k for k, rows in enumerate(distinct)}
        self._slot_of = {position: slot[id(rows)] for position, rows in self.values.items()}
        # a value with rows of a shared part (CatRows) keeps them in every batch: never empty
        self._counts = numpy.array([numpy.ones(self.samples, dtype=numpy.int64)
                                    if any(part is None for part, _ in rows.parts()) else rows.counts
                                    for rows in distinct], dtype=numpy.int64).reshape(len(distinct), self.samples)

    @property
    def ops_per_slot(self) -> numpy.ndarray:
        """How many of the graph's ops compute values of each row set (the slots of :meth:`empty_values`)."""
        return numpy.bincount(list(self._slot_of.values()), minlength=self._counts.shape[0])

    def empty_values(self, batch: Batch) -> numpy.ndarray:
        """Which values (:meth:`without`'s slots) have no rows in ``batch``: the levels deeper than its trees'."""
        return ~self._counts[:, batch.samples].any(1)

    def empty_in_samples(self) -> numpy.ndarray:
        """[slots, samples]: which values have no rows in a batch of that sample alone (a batch leaves empty
        what it leaves empty in each of its samples)."""
        return self._counts == 0

    def without(self, empty: numpy.ndarray, forms: dict) -> fx.GraphModule:
        """The graph, its custom ops called as ``forms`` (:func:`~dynamo_relational.backend.use_forms`), for
        the batches that leave the values ``empty`` (of :meth:`empty_values`) empty: those are empty tensors made
        once, not computed, and what only they read is dropped (each of its ops, forward and backward)."""
        graph = fx.Graph()
        copies: dict[fx.Node, fx.Node] = {}
        graph.output(graph.graph_copy(self.graph.graph, copies))   # (node meta shared, not copied)
        made: dict[tuple, fx.Node] = {}
        first_op = next(n for n in graph.nodes if n.op != "placeholder")
        for position, node in enumerate(list(copies.values())):
            slot = self._slot_of.get(position)
            info = tensor_info(node)
            if slot is None or not empty[slot] or info is None or not info.shape:
                continue
            like = (info.shape[1:], info.dtype, info.device)
            if like not in made:   # (a buffer of the plan's module, which every graph made of it copies)
                name = "_relational_empty_" + "_".join(map(str, (*like[0], like[1], like[2]))).translate(_NAME)
                if not hasattr(self.graph, name):
                    self.graph.register_buffer(name, torch.empty((0, *like[0]), dtype=like[1], device=like[2]),
                                               persistent=False)
                with graph.inserting_before(first_op):
                    made[like] = graph.get_attr(name)
            node.replace_all_uses_with(made[like])
        graph.eliminate_dead_code()
        use_forms(graph, forms)
        return fx.GraphModule(self.graph, graph, class_name=self.graph.__class__.__name__)

    def arguments(self, batch: Batch) -> list[Any]:
        """The index tensors and sizes of ``batch``, in the order of the graph's inputs after the data."""
        return self.assembly.arguments(batch.samples)

    def split(self, batch: Batch, j: int, value: torch.Tensor, stacked: bool = False) -> Sequence[torch.Tensor]:
        """Output ``j`` of the batch graph cut into the rows of each batch position (each sample's in its
        own order); ``stacked``: one row per sample, each row as it is (``unbind``, one view per sample)."""
        rows = self.outputs[j]
        if type(rows) is not Rows:   # parts after parts: bring each sample's rows together
            union_rows, position = rows.listing(batch)
            order = numpy.argsort(position * max(rows.rows, 1) + union_rows, kind="stable")
            value = value[torch.from_numpy(order).to(value.device, non_blocking=True)]
        if stacked:
            return value.unbind(0)
        return torch.split(value, rows.counts[batch.samples].tolist())


def analyse(gm: fx.GraphModule, input_owners: Sequence[torch.Tensor], samples: int) -> RowPlan:
    """The :class:`RowPlan` of grouped union ``gm``, whose inputs have rows of the samples ``input_owners``;
    :class:`Refused` where a value is not provably shared or rows of samples."""
    return _Analysis(gm, samples).run(input_owners)


class _Analysis:
    def __init__(self, gm: fx.GraphModule, samples: int):
        self.gm = gm
        self.samples = samples
        self.rows: dict[fx.Node, Rows] = {}
        self.shared: set[fx.Node] = set()
        self.index_nodes: set[fx.Node] = set()
        #: (gather, its index tensor, how a batch restricts it); one index tensor may serve several gathers
        self.indices: list[tuple[fx.Node, fx.Node, GatherIndex]] = []
        self.sizes: list[tuple[fx.Node, tuple[int, ...], Rows]] = []   # (node, path to it in args, rows it counts)
        self._interned: dict[bytes, Rows] = {}
        self._shared_rows: dict[fx.Node, SharedRows] = {}
        #: joined rows -> their gather in plain order (:meth:`_relayout`)
        self._relayouts: dict[fx.Node, fx.Node] = {}
        #: ``torch.cat`` of index tensors (a merged gather's: ``passes/merge_gathers.py``) -> those tensors
        self._joined_indices: dict[fx.Node, list[fx.Node]] = {}
        #: constants of the grouping that elementwise ops read as data, a row per member (:meth:`_per_row_constant`)
        self._tables: set[fx.Node] = set()
        #: ``torch.split`` of a merged gather's rows -> the rows of each part
        self._split_parts: dict[fx.Node, list[Rows]] = {}
        #: a join of samples' own constants -> the owner of each of its rows (:meth:`_constants_of_samples`)
        self._samples_constants: dict[fx.Node, numpy.ndarray] = {}
        #: such a join -> the gather through which its readers read it as rows
        self._samples_constants_read: dict[fx.Node, fx.Node] = {}

    def shared_rows(self, part: fx.Node, cat: fx.Node) -> SharedRows:
        """The rows of shared ``part`` of ``cat`` (one :class:`SharedRows` per part: its identity is its rows')."""
        info = tensor_info(part)
        if part not in self.shared or info is None or not info.shape:
            raise Refused(f"{_describe(cat)} joins rows of samples with other values")
        if part not in self._shared_rows:
            self._shared_rows[part] = SharedRows(info.shape[0], self.samples)
        return self._shared_rows[part]

    def rows_of(self, owner: torch.Tensor | numpy.ndarray) -> Rows:
        """One :class:`Rows` per distinct owner vector: what a batch computes for it is computed once."""
        owner = owner.numpy() if isinstance(owner, torch.Tensor) else owner
        key = owner.tobytes()
        rows = self._interned.get(key)
        if rows is None:
            rows = self._interned[key] = Rows(owner, self.samples)
        return rows

    def run(self, input_owners: Sequence[torch.Tensor]) -> RowPlan:
        _propagate_shapes(self.gm)
        graph = self.gm.graph
        placeholders = list(graph.find_nodes(op="placeholder"))
        for node, owner in zip(placeholders, input_owners):
            self.rows[node] = self.rows_of(owner)
        for node in graph.nodes:
            if node.op == "get_attr":
                (self.index_nodes if is_added_constant(node) else self.shared).add(node)
            elif node.op in ("call_function", "call_method"):
                self._visit(node)
        output = next(iter(graph.find_nodes(op="output")))
        outputs = []
        for leaf in output.args[0]:
            if leaf not in self.rows:
                raise Refused(f"output {leaf.name} is not made of the samples' rows")
            outputs.append(self.rows[leaf])
        return self._plan(outputs)

    # -- what each node is -------------------------------------------------
    def _visit(self, node: fx.Node) -> None:
        operands = [a for a in flat_nodes((node.args, node.kwargs))]
        if any(a in self._samples_constants for a in operands):
            if self._constants_of_samples(node):   # (a join of such joins)
                self.shared.add(node)
                return
            operands = [self._constants_as_rows(node, a) if a in self._samples_constants else a for a in operands]
        if any(a in self.index_nodes for a in operands) and not self._joined_index(node) and not self._gather(node):
            if self._element_read(node):
                return
            if not _is_elementwise(node):
                raise Refused(f"{_describe(node)} reads an index tensor of the grouping as data")
            operands = [self._per_row_constant(node, a) if a in self.index_nodes else a for a in operands]
        if node in self.rows or node in self._joined_indices or self._split(node):
            return   # (a gather, also of a join of the samples' constants, reads it as a shared value)
        if node.target is torch.index_select and len(node.args) == 3 and node.args[2] in self._joined_indices:
            self._merged_gather(node)
            return
        with_rows = [a for a in operands if a in self.rows]
        if not with_rows:
            if any(a not in self.shared for a in operands):
                raise Refused(f"{_describe(node)} reads a value that is not shared and has no rows")
            if ROW_SAMPLES in node.meta and node.op == "call_method" and node.target == "expand":
                self._tag(node, self._tagged_rows(node), size_arg=_shape_path(node))   # a shared value per row
                return
            self.shared.add(node)
            self._constants_of_samples(node)
            return
        layouts = [self.rows[a] for a in with_rows]
        if _pairs_rows(node) and not all(r.same_as(layouts[0]) for r in layouts[1:]):
            with_rows = [self._relayout(node, a) if type(self.rows[a]) is CatRows else a for a in with_rows]
            layouts = [self.rows[a] for a in with_rows]
        rows = _row_wise(node, layouts, with_rows, self)
        self._tag(node, rows)

    def _element_read(self, node: fx.Node) -> bool:
        """Record ``base[(i_0, ..., i_m)]``, indexed by index tensors of the grouping (the vectorizer's read of
        an element of each member, ``hx[0]`` of a ``[1, d]`` state), as one gather from ``base`` with its first
        ``m + 1`` dims flattened into rows; False if ``node`` is not such a read."""
        if node.target is not operator.getitem or node.kwargs:
            return False
        base, columns = node.args
        if not (isinstance(columns, tuple) and columns and all(c in self.index_nodes for c in columns)
                and (base in self.rows or base in self.shared)):
            return False
        assert isinstance(base, fx.Node)   # (a key of self.rows or self.shared)
        info, m = _static_info(base), len(columns)
        index = [_attribute(self.gm, str(cast(fx.Node, c).target)).long().cpu().numpy() for c in columns]
        if len(info.shape) < m or any(i.ndim != 1 or i.shape != index[0].shape for i in index):
            return False
        flat_index = numpy.ravel_multi_index([i % n for i, n in zip(index, info.shape)], info.shape[:m])
        rows, per_row = int(numpy.prod(info.shape[:m])), int(numpy.prod(info.shape[1:m]))
        with self.gm.graph.inserting_before(node):
            flat = self.gm.graph.call_method("reshape", (base, (-1, *info.shape[m:])))
        flat.meta["rel_info"] = TensorInfo((rows, *info.shape[m:]), info.dtype, info.device)
        if base in self.rows:
            self.rows[flat] = self._expanded(self.rows[base], per_row)
        else:
            self.shared.add(flat)
        gathered = self._selected(node, flat, torch.from_numpy(flat_index).to(info.device),
                                  f"_relational_elements_{node.name}", _static_info(node))
        gathered.meta.update(node.meta)   # (the grouping's tags of node's rows)
        node.replace_all_uses_with(gathered)   # (node, now read by no one, goes with the dead code)
        self._gather(gathered)
        return True

    def _expanded(self, rows: Rows, n: int) -> Rows:
        """The rows of a rows value whose rows are each made ``n`` consecutive rows (its first dims flattened)."""
        if type(rows) is CatRows:
            return CatRows([self._expanded(leaf, n) for leaf in rows.leaves])
        if type(rows) is SharedRows:
            return SharedRows(rows.rows * n, self.samples)
        return self.rows_of(numpy.repeat(rows.owner, n))

    def _per_row_constant(self, node: fx.Node, table: fx.Node) -> fx.Node:
        """A constant of the grouping that elementwise ``node`` reads as data: a number per member (a node's
        ``/ len(neighbours)``, made a ``[k, 1, ...]`` column by the vectorizer) is read through a gather of the
        rows of ``node``'s samples, which a batch restricts as it restricts ``node``'s rows; a 0-d one (a
        clamp's bound beside a column) is read as it is."""
        info, out = _static_info(table), _static_info(node)
        if not info.shape:   # (the same for every row; a batch keeps it as it is)
            return table
        if len(info.shape) != len(out.shape) or info.shape[0] != out.shape[0] or any(d != 1 for d in info.shape[1:]):
            raise Refused(f"{_describe(node)} reads an index tensor of the grouping as data")
        gathered = self._selected(node, table, torch.arange(info.shape[0], device=info.device),
                                  f"_relational_rows_of_{table.target}_{node.name}", info)
        node.replace_input_with(table, gathered)   # (first: the gather's rows are its reader's)
        self._tables.add(table)
        self._gather(gathered)
        return gathered

    def _constants_of_samples(self, node: fx.Node) -> bool:
        """Note ``node`` if it joins constants of the samples' own traces along dim 0 (``torch.stack`` or
        ``torch.cat``): the vectorizer's rows of a group whose members read them (a state of zeros that each
        sample's ``forward`` made with ``torch.zeros``, rows of each sample's edge counts). Its rows belong to
        those samples; so does ``C.unsqueeze(0)`` of one such constant (the vectorizer's row of a single value).
        Whether it does."""
        if node.op == "call_method" and node.target == "unsqueeze" and node.args[1:] == (0,) and not node.kwargs \
                and is_sample_constant(node.args[0]):
            self._samples_constants[node] = numpy.array([cast(fx.Node, node.args[0]).meta[SAMPLE]], dtype=numpy.int64)
            return True
        if node.op != "call_function" or node.target not in (torch.stack, torch.cat) or len(node.args) != 1 \
                or node.kwargs:
            return False
        parts = _joined(node)
        if node.target is torch.cat and all(p in self._samples_constants or is_sample_constant(p) for p in parts):
            # (also a join of such joins: the vectorizer's rows of groups of such reads, gathered again)
            self._samples_constants[node] = numpy.concatenate([
                self._samples_constants[p] if p in self._samples_constants
                else numpy.full(_static_info(p).shape[0], p.meta[SAMPLE], dtype=numpy.int64) for p in parts])
        elif node.target is torch.stack and all(is_sample_constant(p) for p in parts):
            self._samples_constants[node] = numpy.array([p.meta[SAMPLE] for p in parts], dtype=numpy.int64)
        return node in self._samples_constants

    def _joined_constant(self, joined: fx.Node) -> torch.Tensor:
        """The value of ``joined``, a join of the samples' own constants (or of such joins, or one's row)."""
        if joined.op == "call_method":   # (C.unsqueeze(0))
            return _attribute(self.gm, cast(str, cast(fx.Node, joined.args[0]).target)).unsqueeze(0)
        return cast(Callable, joined.target)([self._joined_constant(p) if p in self._samples_constants
                                              else _attribute(self.gm, cast(str, p.target)) for p in _joined(joined)])

    def _constants_as_rows(self, node: fx.Node, joined: fx.Node) -> fx.Node:
        """Read ``joined``, a join of the samples' own constants, for ``node`` through a gather of all its rows,
        tagged with their samples: a batch keeps its samples' rows, as it does of ``node``'s other operands.
        The join is made once, here (a constant), not by every batch."""
        gathered = self._samples_constants_read.get(joined)
        if gathered is None:   # (before the first reader: the later ones come after it)
            info = _static_info(joined)
            value = self._joined_constant(joined)
            name = f"_samples_constants_{joined.name}"
            self.gm.register_buffer(name, value, persistent=False)
            with self.gm.graph.inserting_before(node):
                made = self.gm.graph.get_attr(name)
            made.meta["rel_info"] = info
            self.shared.add(made)
            gathered = self._samples_constants_read[joined] = self._selected(
                node, made, torch.arange(info.shape[0], device=info.device), f"_relational_rows_of_{name}", info)
            gathered.meta[ROW_SAMPLES] = self._samples_constants[joined].tolist()
            self._gather(gathered)
        node.replace_input_with(joined, gathered)
        return gathered

    def _selected(self, before: fx.Node, source: fx.Node, index: torch.Tensor, name: str,
                  info: TensorInfo) -> fx.Node:
        """``index_select(source, 0, index)`` (of info ``info``) inserted before ``before``, ``index`` a new index
        tensor of the grouping (buffer ``name``), which a batch restricts once :meth:`_gather` records it."""
        self.gm.register_buffer(name, index, persistent=False)
        with self.gm.graph.inserting_before(before):
            read = self.gm.graph.get_attr(name)
            selected = self.gm.graph.call_function(torch.index_select, (source, 0, read))
        selected.meta["rel_info"] = info
        self.index_nodes.add(read)
        return selected

    def _relayout(self, node: fx.Node, joined: fx.Node) -> fx.Node:
        """Read the rows of ``joined`` (a :class:`CatRows`: part after part in a batch) for ``node`` through a
        gather of all of them, whose rows a batch keeps in plain order (each sample's together), as the
        other operands of an elementwise ``node`` have theirs."""
        gathered = self._relayouts.get(joined)
        if gathered is None:   # (before the first reader: the later ones come after it)
            info = _static_info(joined)
            gathered = self._relayouts[joined] = self._selected(
                node, joined, torch.arange(info.shape[0], device=info.device), f"_relational_relayout_{joined.name}",
                info)
            self._gather(gathered)
        node.replace_input_with(joined, gathered)
        return gathered

    def _tag(self, node: fx.Node, rows: Rows, size_arg: tuple[int, ...] | None = None) -> None:
        tagged = node.meta.get(ROW_SAMPLES)
        if tagged is not None and not numpy.array_equal(numpy.asarray(tagged), rows.owner):
            raise Refused(f"{_describe(node)}: the rows' samples do not match the grouping's")
        if size_arg is not None:
            self.sizes.append((node, size_arg, rows))
        self.rows[node] = rows

    def _tagged_rows(self, node: fx.Node) -> Rows:
        tagged = node.meta.get(ROW_SAMPLES)
        if tagged is None or any(s is None for s in tagged):
            raise Refused(f"{_describe(node)}: which sample each row belongs to is not known")
        return self.rows_of(numpy.asarray(tagged, dtype=numpy.int64))

    def _gather(self, node: fx.Node) -> bool:
        """Record the gather ``node`` (reading an index tensor of the grouping); False if it is not one."""
        target, args = node.target, node.args
        if node.kwargs or node.op != "call_function":
            return False
        if target is _GATHER_ROWS and args[1] in self.index_nodes:
            source, csr = args
            kind = "rows"
        elif target is _GATHER_REDUCE and args[1] in self.index_nodes and type(args[2]) is int:
            if args[4:5] not in ((), (False,)):   # (a batch packs no transposes on the CPU)
                raise Refused(f"{_describe(node)}: a transposed gather_reduce")
            source, csr = args[0], args[1]
            kind = "reduce"
        elif target is torch.index_select and len(args) == 3 and args[1] == 0 and args[2] in self.index_nodes:
            source, csr = args[0], args[2]
            kind = "select"
        elif target is _SEGMENT_REDUCE and args[1] in self.index_nodes:
            source, csr = args[0], args[1]
            kind = "segments"
        else:
            return False
        if source not in self.rows and source not in self.shared and source not in self._tables:
            raise Refused(f"{_describe(node)} gathers from a value that is neither shared nor rows of samples")
        # (source is a key of self.rows or self.shared, csr of self.index_nodes: a get_attr node)
        assert isinstance(source, fx.Node) and isinstance(csr, fx.Node) and isinstance(csr.target, str)
        source_rows, out_rows = _static_info(source).shape[0], _static_info(node).shape[0]
        constant = _attribute(self.gm, csr.target)
        if kind in ("select", "rows"):
            offsets, index = None, (constant if kind == "select" else unpack_csr(constant, out_rows, source_rows)[1])
        elif kind == "segments":
            offsets, index = constant, None
        else:
            offsets, index = unpack_csr(constant, out_rows, source_rows)
        offsets = offsets.long().cpu().numpy() if offsets is not None else None
        index = index.long().cpu().numpy() if index is not None else None
        source_owner = self.rows[source] if source in self.rows else None
        if kind == "segments":
            assert offsets is not None   # (segment_reduce's constant is its offsets)
            if type(source_owner) is not Rows or int(offsets[0]) != 0 or int(offsets[-1]) != source_rows:
                raise Refused(f"{_describe(node)}: segments that do not cover their rows in order")
        out = self._gathered_rows(node, kind, source_owner, offsets, index)
        index_kind = "select" if kind == "rows" else kind
        self.indices.append((node, csr, GatherIndex(index_kind, out, source_owner, source_rows, offsets, index,
                                                    constant.device)))
        if kind == "reduce":
            self.sizes.append((node, (2,), out))
        self._tag(node, out)
        return True

    def _joined_index(self, node: fx.Node) -> bool:
        """Record ``node`` if it joins index tensors of the grouping (``torch.cat`` of them, which a merged gather
        reads): a batch restricts each of them as the index of its own gather."""
        joined = node.args[0] if node.target is torch.cat and len(node.args) == 1 and not node.kwargs else None
        if not isinstance(joined, (list, tuple)) or not all(a in self.index_nodes for a in joined):
            return False
        self._joined_indices[node] = [cast(fx.Node, a) for a in joined]
        return True

    def _merged_gather(self, node: fx.Node) -> None:
        """Record ``index_select(source, 0, cat(indices))`` (``passes/merge_gathers.py``): the rows of each index's
        part after the other, each index restricted as its own gather's, whose rows the split's part has."""
        source, index_node = cast(fx.Node, node.args[0]), cast(fx.Node, node.args[2])
        if source not in self.rows:
            raise Refused(f"{_describe(node)}: a merged gather of a value without rows of samples")
        if len(index_node.users) != 1:   # (its joined index becomes this gather's own input)
            raise Refused(f"{_describe(node)}: a merged gather whose index tensors other nodes read")
        source_rows = _static_info(source).shape[0]
        source_owner = self.rows[source]
        readers = {user.args[1]: user for split in node.users for user in split.users}
        parts = []
        for k, csr in enumerate(self._joined_indices[index_node]):
            constant = _attribute(self.gm, cast(str, csr.target))
            index = constant.long().cpu().numpy()
            out = self._gathered_rows(readers.get(k, node), "select", source_owner, None, index)
            parts.append(out)
            self.indices.append((index_node, csr, GatherIndex("select", out, source_owner, source_rows, None, index,
                                                              constant.device)))
        self._tag(node, CatRows(parts))

    def _split(self, node: fx.Node) -> bool:
        """Record ``torch.split`` of a merged gather's rows into its parts, and the parts; False for other
        nodes. The split's sizes are each part's rows in a batch."""
        operand = node.args[0] if node.args else None
        if node.target is torch.split and operand in self.rows and len(node.args) == 2 and not node.kwargs \
                and isinstance(node.args[1], (list, tuple)):   # (along dim 0)
            rows = self.rows[cast(fx.Node, operand)]
            if type(rows) is not CatRows or [r.rows for r in rows.leaves] != list(node.args[1]):
                raise Refused(f"{_describe(node)} splits rows other than a merged gather's parts")
            self._split_parts[node] = rows.leaves
            self.sizes += [(node, (1, k), part) for k, part in enumerate(rows.leaves)]
            return True
        if node.target is operator.getitem and operand in self._split_parts:
            self._tag(node, self._split_parts[cast(fx.Node, operand)][cast(int, node.args[1])])
            return True
        return False

    def _gathered_rows(self, node, kind, source: Rows | None, offsets, index) -> Rows:
        """The rows of a gather: the grouping's tags, else the samples of the rows it reads."""
        derived = None
        if ROW_SAMPLES not in node.meta and source is not None:   # the samples of the rows read
            if kind in ("rows", "select"):
                derived = source.owner[index]
            elif not bool((offsets[1:] == offsets[:-1]).any()):     # (an empty segment reads no sample)
                derived = source.owner[index[offsets[:-1]] if index is not None else offsets[:-1]]
        if derived is not None and bool((derived >= 0).all()):
            out = self.rows_of(derived)
        else:   # the grouping's tags (rows of shared values read for the samples' rows)
            out = self._tagged_rows(node if ROW_SAMPLES in node.meta else _tagged_reader(node))
        if source is not None:   # every row reads rows of its own sample (the samples are disjoint)
            read = source.owner[index] if index is not None else source.owner
            segment_of = numpy.arange(out.rows) if offsets is None else numpy.repeat(
                numpy.arange(out.rows), offsets[1:] - offsets[:-1])
            if not numpy.array_equal(numpy.where(read == -1, out.owner[segment_of], read), out.owner[segment_of]):
                raise Refused(f"{_describe(node)} reads rows of other samples")
        return out

    # -- the batch graph --------------------------------------------------------
    def _plan(self, outputs: list[Rows]) -> RowPlan:
        graph = self.gm.graph
        data = list(graph.find_nodes(op="placeholder"))
        last = data[-1] if data else None
        # a merged gather's index tensors are one input, their entries joined (no torch.cat of them per batch)
        spans: list[int] = []
        for k, (gather, _, _) in enumerate(self.indices):
            joined = self._joined_indices.get(gather)
            if joined is None:
                spans.append(1)
            elif k == 0 or self.indices[k - 1][0] is not gather:   # (its first part counts them all)
                spans.append(len(joined))
        index_inputs: list[fx.Node] = []
        size_inputs: list[fx.Node] = []
        for name, inputs, count in (("index", index_inputs, len(spans)), ("size", size_inputs, len(self.sizes))):
            for i in range(count):
                first = next(iter(graph.nodes))
                with graph.inserting_after(last) if last is not None else graph.inserting_before(first):
                    last = graph.placeholder(f"{name}{i}")
                inputs.append(last)
        starts = numpy.cumsum(spans) - spans
        for start, new in zip(starts, index_inputs):
            gather, csr, _ = self.indices[start]
            if gather in self._joined_indices:
                gather.replace_all_uses_with(new)
                continue
            gather.replace_input_with(csr, new)
            if gather.target is _GATHER_ROWS:   # a plain gather of the batch's index: no transpose to pack per batch
                gather.target, gather.args = torch.index_select, (gather.args[0], 0, new)
        for (node, path, _), new in zip(self.sizes, size_inputs):
            node.args = _replaced(node.args, path, new)
        graph.eliminate_dead_code()
        self.gm.recompile()
        values = {position: self.rows[node] for position, node in enumerate(graph.nodes)
                  if node in self.rows and node.op in ("call_function", "call_method")}
        return RowPlan(self.gm, self.samples, [i for _, _, i in self.indices], [r for _, _, r in self.sizes], outputs,
                       values, spans)


#: how many readers :func:`_tagged_reader` looks at, at most
_READERS_SEARCHED = 256


def _tagged_reader(node: fx.Node) -> fx.Node:
    """The first node tagged with its rows' samples among the readers of ``node`` that keep its rows, and
    their readers that do (``node`` itself if none): a gather from a shared tensor that the vectorizer
    emitted for a group, whose tagged result is made from it (reshaped, activated; a recurrent cell reads its
    state twice). Each reader's row ``i`` reads row ``i`` of ``node`` only (checked when the reader is
    visited, as are the tags of the others), so the sample of row ``i`` is the reader's."""
    rows = _static_info(node).shape[0]
    todo, seen = collections.deque([node]), {node}
    while todo and len(seen) <= _READERS_SEARCHED:
        at = todo.popleft()
        if ROW_SAMPLES in at.meta:
            return at
        for reader in at.users:
            info = tensor_info(reader)
            if reader not in seen and info is not None and info.shape and info.shape[0] == rows:
                seen.add(reader)
                todo.append(reader)
    return node


def _propagate_shapes(gm: fx.GraphModule) -> None:
    """Every node's shape, from fake tensors (the passes leave some nodes without one, or with the shape of
    the group they were read from)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    infos = [_static_info(n) for n in gm.graph.find_nodes(op="placeholder")]
    inputs = [mode.from_tensor(torch.empty(info.shape, dtype=info.dtype, device=info.device)) for info in infos]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["rel_info"] = value_info(node.meta["val"])


def _row_wise(node: fx.Node, operand_rows: list[Rows], operands: list[fx.Node], analysis: _Analysis) -> Rows:
    """The rows of ``node``, an op on rows values ``operands``; :class:`Refused` unless it computes row ``i``
    from row ``i`` of each (and shared values)."""
    first = operand_rows[0]
    target, args, kwargs = node.target, node.args, node.kwargs
    name = target if node.op == "call_method" else getattr(target, "__name__", str(target))
    info, rank = tensor_info(node), _rank(node)
    if target is operator.getitem and isinstance(args[0], fx.Node) and args[0].op == "placeholder" \
            and not isinstance(args[1], int) and not _reads_every_row(args[1]):
        raise Refused(f"{_describe(node)}: forward uses a tensor argument as a whole; only its rows (x[v], "
                      "x[v, :k]) are batched")
    if target is torch.cat and _dim(args, kwargs, 1, 0, rank) == 0:
        return CatRows([analysis.rows[a] if a in analysis.rows else analysis.shared_rows(a, node)
                        for a in _joined(node)])
    if not all(r.same_as(first) for r in operand_rows[1:]):
        raise Refused(f"{_describe(node)} combines rows of different layouts")
    if info is None or rank == 0 or info.shape[0] != first.rows:
        if node.op == "call_method" and target in ("reshape", "view"):
            return _merged_rows(node, first, analysis)
        raise Refused(f"{_describe(node)} does not keep the rows of its operand")
    if target is torch.cat or target is torch.stack:
        if any(p not in analysis.rows for p in _joined(node)) or _dim(args, kwargs, 1, 0, rank) == 0:
            raise Refused(f"{_describe(node)} joins rows of samples with other values")
        return first
    if _is_elementwise(node):
        problem = elementwise_mixing(node, analysis.rows)
        if problem is not None:
            raise Refused(f"{_describe(node)} {problem}")
        return first
    if target is aggregate:   # an n-ary sum of rows values (``h + self.lin(h)`` over a sample's rows): row by row
        if any(term not in analysis.rows for term in cast(Sequence, args[0])):
            raise Refused(f"{_describe(node)} aggregates rows of samples with a shared value")
        return first
    linear, product = linear_args(node), product_operands(node)
    if linear is not None:
        if operands != [linear.x] or rank < 2:
            raise Refused(f"{_describe(node)}: a linear map of rows needs a shared weight")
        return first
    if product is not None:
        a, b = product
        ra, rb = _rank(a), _rank(b)
        if a in analysis.rows and b in analysis.rows:
            keeps = ra == rb == rank >= 3                 # one product per row
        elif a in analysis.rows:   # rows @ W, rows @ w (W's batch dims, if any, after dim 0)
            keeps = ra == rank >= 2 and (rb <= 2 or rb < rank) or rb == 1 and ra == rank + 1 >= 2
        else:
            keeps = rb == rank >= 3 and ra < rank         # W @ each row (the row's dims after the first)
        if not keeps:
            raise Refused(f"{_describe(node)}: a product that contracts or broadcasts the rows of samples")
        return first
    if node.op == "call_function" and target is torch.einsum and args and isinstance(args[0], str):
        tensors = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        if kwargs or not _einsum_keeps_rows(args[0], tensors, analysis.rows):
            raise Refused(f"{_describe(node)}: an einsum that contracts or broadcasts the rows of samples")
        return first
    if node.op == "call_function" and target in (F.layer_norm, torch.layer_norm):
        shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
        if operands != [args[0]] or not isinstance(shape, (tuple, list)) or len(shape) >= rank:
            raise Refused(f"{_describe(node)}: a layer norm of rows needs shared weights and dims after the first")
        return first   # each row normalized over its own elements
    if node.op == "call_function" and target is F.embedding:
        if operands != [args[0]]:
            raise Refused(f"{_describe(node)}: an embedding of rows needs a shared table")
        return first   # each row's index looked up
    family = REGISTRY.family_of(node) if node.op in ("call_function", "call_method") else None
    if family is ONE_HOT:   # a vector per element
        return first
    if family is GATHER_ALONG:   # within each row, by that row's indices
        op = GATHER_ALONG.describe(node)
        if not isinstance(op, NeuronOp) or op.template == 0 or any(a not in analysis.rows for a in op.operands):
            raise Refused(f"{_describe(node)}: a gather across the rows of samples, or by a shared value's rows")
        return first
    if family in (LOSS, CELL):
        if any(not isinstance(a, fx.Node) or a not in analysis.rows for a in args[:2]):
            raise Refused(f"{_describe(node)}: rows of samples beside a shared value's rows")
        if family is CELL and any(a in analysis.rows for a in args[2:]):
            raise Refused(f"{_describe(node)}: recurrent cell weights must be shared")
        if family is LOSS and not LOSS.per_row(node):
            raise Refused(f"{_describe(node)}: a loss that reduces the rows of samples")
        return first
    if node.op == "call_function" and target is operator.getitem:
        if _reads_every_row(args[1]):
            return first
        raise Refused(f"{_describe(node)} reads single rows")
    if name in _KEEP and not flat_nodes((args[1:], kwargs)):
        return first
    if target is values_or_indices:   # max / min along a dim, or a stable sort: one part
        dim = kwargs.get("dim", -1)
        if type(dim) is int and dim % _rank(args[0]) != 0:
            return first
        raise Refused(f"{_describe(node)} works along dim 0, across the rows of samples")
    if name in _ALONG:
        if works_within_rows(node):
            return first
        raise Refused(f"{_describe(node)} works along dim 0, across the rows of samples")
    if node.op == "call_method" and target in ("unsqueeze", "squeeze", "transpose", "flatten", "permute", "movedim",
                                               "reshape", "view", "expand"):
        if _keeps_dim0(node, rank):
            if target in ("reshape", "view", "expand"):
                analysis.sizes.append((node, _shape_path(node), first))
            return first
        raise Refused(f"{_describe(node)} moves dim 0")
    if node.op == "call_method" and target == "repeat":
        repeats = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
        if len(repeats) == _rank(args[0]) and repeats[0] == 1 and not flat_nodes((repeats, kwargs)):
            return first   # each row repeated within itself
        raise Refused(f"{_describe(node)} repeats rows")
    raise Refused(f"{_describe(node)} is not known to compute each row from its own row")


def _einsum_keeps_rows(equation: str, tensors: Sequence, rows: dict) -> bool:
    """Whether ``torch.einsum(equation, *tensors)`` computes row ``i`` of its result from row ``i`` of the rows
    values among ``tensors`` alone: their first subscript is the output's first, once each, and no other
    operand has it (``"ij,aj->ai"``, a shared ``W`` applied to each row)."""
    equation = equation.replace(" ", "")
    if "..." in equation or equation.count("->") != 1:
        return False
    inputs, output = equation.split("->")
    subscripts = inputs.split(",")
    if not output or len(subscripts) != len(tensors) or output.count(output[0]) != 1:
        return False
    batch = output[0]
    for letters, tensor in zip(subscripts, tensors):
        if isinstance(tensor, fx.Node) and tensor in rows:
            if not letters or letters[0] != batch or letters.count(batch) != 1:
                return False
        elif batch in letters:
            return False
    return any(isinstance(t, fx.Node) and t in rows for t in tensors)


def _reads_every_row(index: Any) -> bool:
    """Whether ``x[index]`` reads every row of ``x`` as it is (``x[:, 2:]``): row ``i`` from row ``i``."""
    return type(index) is tuple and bool(index) and index[0] == slice(None) and not flat_nodes(index)


def elementwise_mixing(node: fx.Node, rows: Container[fx.Node]) -> str | None:
    """How elementwise ``node`` would mix the rows of samples: operands with rows (``rows``) must have its rank
    (their dim 0 is the rows) and shared ones must broadcast along the rows; None where it mixes none."""
    rank = _rank(node)
    for a in node.all_input_nodes:
        info = tensor_info(a)
        if a in rows:
            if info is None or info.rank != rank:
                return "broadcasts rows of samples"
        elif info is not None and info.rank == rank and info.shape[0] != 1:
            return "combines rows of samples with a shared value's rows"
    return None


def _is_elementwise(node: fx.Node) -> bool:
    return REGISTRY.family_of(node) is ELEMENTWISE


def _pairs_rows(node: fx.Node) -> bool:
    """Whether ``node`` computes row ``i`` from row ``i`` of each of its operands with rows (elementwise ops, a
    recurrent cell's input and state, a loss's scores and labels, a product of two batches of matrices, a
    gather's values and indices), which must then be laid out alike."""
    return REGISTRY.family_of(node) in (ELEMENTWISE, CELL, LOSS, MATMUL, GATHER_ALONG)


def _merged_rows(node: fx.Node, rows: Rows, analysis: _Analysis) -> Rows:
    """``x.reshape(k, ...)`` of rows ``x`` whose blocks of ``c`` consecutive rows belong to one sample each, a
    block per new row: the rows of the ``k`` blocks (``reshape(k, c, ...)``, which a reduction over fan-in
    ``c`` reads, or ``reshape(k, c * d)``, a row's parts joined along its one dimension)."""
    shape, before = node.args[1], _static_info(node.args[0])
    if type(rows) is not Rows or not isinstance(shape, tuple) or not shape or type(shape[0]) is not int \
            or shape[0] <= 0 or rows.rows % shape[0]:
        raise Refused(f"{_describe(node)} does not keep the rows of its operand")
    block = rows.rows // shape[0]
    per_row = 1
    for s in before.shape[1:]:
        per_row *= s
    after = 1
    for size in shape[1:]:
        assert isinstance(size, int)   # (the tracer records sizes as ints)
        after *= size
    owner = rows.owner.reshape(shape[0], block)
    if after != block * per_row or not bool((owner == owner[:, :1]).all()):
        raise Refused(f"{_describe(node)} merges rows of different samples")
    merged = analysis.rows_of(numpy.ascontiguousarray(owner[:, 0]))
    analysis.sizes.append((node, _shape_path(node), merged))
    return merged


def _shape_path(node: fx.Node) -> tuple[int, ...]:
    """Where the first size of ``x.reshape(shape)`` / ``x.reshape(*shape)`` is in the node's arguments."""
    return (1, 0) if isinstance(node.args[1], (tuple, list)) else (1,)


def works_within_rows(node: fx.Node) -> bool:
    """Whether ``node`` works along dims of its first operand that do not include dim 0 (a softmax or sum over
    each row's elements, ``argmax(1)``): row ``i`` of its result is computed from row ``i`` alone."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", None)
    if name not in _ALONG or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    dims = _dims_by_schema(node, cast(str, name), _rank(node.args[0]))
    return dims is not None and 0 not in (dims if isinstance(dims, tuple) else (dims,))


def _dims_by_schema(node: fx.Node, name: str, rank: int):
    """The ``dim`` argument of a call of ``torch.<name>`` (or the method), by the op's signature (``norm``'s
    second argument is ``p``, ``std``'s may be ``unbiased``); None where it is absent or not certain."""
    function = node.target if node.op == "call_function" else getattr(torch, name, None)
    if not callable(function):   # (None: torch has no such function)
        return None
    try:   # the types pick one overload where the arguments alone match several (sum's dim: ints or names)
        bound = normalize_function(function, tuple(node.args), dict(node.kwargs),
                                   tuple(map(_argument_type, node.args)),
                                   {k: _argument_type(v) for k, v in node.kwargs.items()},
                                   normalize_to_only_use_kwargs=True)
    except Exception:
        return None
    if bound is None or "dim" not in bound.kwargs:
        return None
    return _dim((), bound.kwargs, 0, None, rank)


def _argument_type(value: Any) -> Any:
    """The type of an argument as operator schemas name it: a node is a tensor, ``(1, 2)`` a ``tuple[int, ...]``."""
    if isinstance(value, fx.Node):
        return torch.Tensor
    if isinstance(value, (tuple, list)) and value and all(type(v) is int for v in value):
        return tuple[int, ...] if isinstance(value, tuple) else list[int]
    return type(value)


def _keeps_dim0(node: fx.Node, rank: int) -> bool:
    target, args = node.target, node.args
    if node.kwargs:
        return False
    if target in ("reshape", "view", "expand"):
        shape = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
        return bool(shape) and isinstance(shape[0], int) and shape[0] == _static_info(args[0]).shape[0]
    if target in ("unsqueeze", "squeeze"):
        if len(args) != 2 or type(args[1]) is not int:
            return False
        in_rank = _rank(args[0])
        dim = args[1] % (in_rank + 1 if target == "unsqueeze" else in_rank)
        return dim != 0
    if target == "transpose":
        in_rank = _rank(args[0])
        return all(type(d) is int and d % in_rank != 0 for d in args[1:3])
    if target == "flatten":
        return len(args) >= 2 and type(args[1]) is int and args[1] % _rank(args[0]) != 0
    if target == "permute":
        dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
        return bool(dims) and type(dims[0]) is int and dims[0] % _rank(args[0]) == 0
    if target == "movedim":
        in_rank = _rank(args[0])
        moved = [d for a in args[1:3] for d in (a if isinstance(a, (tuple, list)) else (a,))]
        return len(args) == 3 and all(type(d) is int and d % in_rank != 0 for d in moved)
    return False


def _dim(args, kwargs, position: int, default, rank: int):
    dim = kwargs.get("dim", args[position] if len(args) > position else default)
    if dim is None or rank == 0:
        return dim
    if isinstance(dim, (tuple, list)):
        return tuple(d % rank for d in dim)
    return dim % rank if type(dim) is int else None


def _static_info(node: fx.node.Argument) -> TensorInfo:
    """``tensor_info`` of a tensor: each has a static shape (the union's inputs from the trace, every other node
    from :func:`_propagate_shapes`)."""
    info = tensor_info(node)
    assert info is not None, f"{node} is not a tensor of static shape"
    return info


def _joined(node: fx.Node) -> Sequence[fx.Node]:
    """The tensors that ``torch.cat`` / ``torch.stack`` ``node`` joins."""
    return cast(Sequence[fx.Node], node.args[0])   # (a list of tensors: FX holds each as a node)


def _rank(node: Any) -> int:
    info = tensor_info(node)
    return len(info.shape) if info is not None else 0


def flat_nodes(tree: Any) -> list[fx.Node]:
    """The FX nodes in ``tree`` (arguments: tuples, lists, dicts, slices), in order."""
    found: list[fx.Node] = []
    fx.node.map_arg(tree, found.append)
    return found


def _replaced(args: tuple, path: tuple[int, ...], new: Any) -> tuple:
    head, rest = path[0], path[1:]
    value = new if not rest else type(args[head])(_replaced(tuple(args[head]), rest, new))
    return (*args[:head], value, *args[head + 1:])


def _describe(node: fx.Node) -> str:
    """The node, its op and the source line that made it (or, for a node the passes made, its first user's)."""
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
    trace = node.meta.get("stack_trace") or next((u.meta["stack_trace"] for u in node.users
                                                  if u.meta.get("stack_trace")), "")
    lines = [line.strip() for line in trace.strip().splitlines()]
    where = lines[0].removeprefix("File ") + (f" ({lines[1]})" if len(lines) > 1 else "") if lines else ""
    return f"{node.name} ({target})" + (f" at {where}" if where else "")


def _attribute(gm: fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value
