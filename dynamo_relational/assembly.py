"""A batch's index tensors and sizes, computed for all index tensors at once.

A grouped union's graph (:class:`dynamo_relational.row_plan.RowPlan`) takes,
after the batch's data, one index tensor per gather and the sizes that count
rows. Restricted to a batch, each index tensor is the concatenation, over the
batch's samples in order, of that sample's piece of the union's index, its
values renumbered to where the rows of the sample start in the restricted
source. Computed index tensor by index tensor, that is a dozen numpy calls
each: with hundreds of index tensors, their call overhead dominated a batch.

:class:`Assembly` lays out the pieces of every index tensor once, sample by
sample. A batch then costs a fixed number of numpy operations over all the
entries of its samples, however many index tensors the union has:

1. where each sample's rows start in every restricted value (a cumulative sum
   over the batch of a [values, samples] count matrix);
2. the batch's entries of all index tensors, taken sample after sample and
   sorted stably by index tensor, so that each index tensor lists its samples
   in batch order (``numpy.argsort`` on small integer keys is a radix sort);
3. each entry's value: where its source row's sample starts, plus its rank
   there;
4. the offsets of segment indices, and the packed CSR of ``gather_reduce``
   indices with their transposes (:func:`dynamo_relational.kernels.gather_reduce.pack_csr`'s
   layout; on the CPU, whose unions run ``gather_reduce`` as ``index_add``, each entry's row
   instead of the transposes), each family written into one buffer, copied to the device once and
   cut into views.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy
import torch

if TYPE_CHECKING:
    from .row_plan import Rows, GatherIndex

_INT32_MAX = 2 ** 31 - 1


class _Values:
    """The values a batch restricts (the sources of gathers and the values sizes count), each made of parts
    (the parts of a ``torch.cat``; one otherwise), and where a batch puts each part's rows."""

    def __init__(self, samples: int):
        self.samples = samples
        self._ids: dict[int, int] = {}
        self._leaves: dict[int, int] = {}
        self._leaf_counts: list[numpy.ndarray] = []
        self.first_part: list[int] = []
        self._part_leaf: list[int] = []
        self._part_shared: list[int] = []
        self.id_of(None)   # value 0, part 0: a shared source, whose entries are its row numbers

    def id_of(self, rows: "Rows | None") -> int:
        if id(rows) not in self._ids:
            self._ids[id(rows)] = len(self.first_part)
            self.first_part.append(len(self._part_leaf))
            for leaf, shared in ([(None, 0)] if rows is None else rows.parts()):
                self._part_leaf.append(-1 if leaf is None else self._leaf(leaf))
                self._part_shared.append(shared)
        return self._ids[id(rows)]

    def _leaf(self, leaf: "Rows") -> int:
        if id(leaf) not in self._leaves:
            self._leaves[id(leaf)] = len(self._leaf_counts)
            self._leaf_counts.append(leaf.counts)
        return self._leaves[id(leaf)]

    def freeze(self) -> None:
        leaves = len(self._leaf_counts)
        #: [leaf, sample] -> rows, and a last row of zeros: the leaf of shared parts
        self.counts = numpy.zeros((leaves + 1, self.samples), dtype=numpy.int64)
        if leaves:
            self.counts[:leaves] = numpy.stack(self._leaf_counts)
        self.part_leaf = numpy.array([leaves if p < 0 else p for p in self._part_leaf], dtype=numpy.int64)
        self.part_shared = numpy.array(self._part_shared, dtype=numpy.int64)
        bounds = self.first_part + [len(self._part_leaf)]
        self.value_first = numpy.array(bounds[:-1], dtype=numpy.int64)
        self.value_last = numpy.array(bounds[1:], dtype=numpy.int64) - 1
        self.value_of_part = numpy.repeat(numpy.arange(len(self.first_part)), numpy.diff(bounds))

    def restrict(self, samples: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
        """For the batch ``samples``: where each part starts in its value, where the rows of each
        (leaf, batch position) start in the leaf, and each value's size."""
        kept = self.counts[:, samples]
        within = kept.cumsum(1) - kept
        part_size = kept.sum(1)[self.part_leaf] + self.part_shared
        ends = part_size.cumsum()
        starts = ends - part_size
        part_start = starts - starts[self.value_first][self.value_of_part]
        return part_start, within, ends[self.value_last] - starts[self.value_first]


class _Stream:
    """Entries laid out sample by sample (each sample's sorted by key, then in union order), with the columns
    a batch reads; :meth:`take` gives a batch's entries sorted by key, then batch position, then union order."""

    def __init__(self, sample: numpy.ndarray, key: numpy.ndarray, order: numpy.ndarray, samples: int,
                 columns: dict[str, numpy.ndarray]):
        by = numpy.lexsort((order, key, sample))
        self.count = numpy.bincount(sample, minlength=samples).astype(numpy.int64)
        self.start = numpy.cumsum(self.count) - self.count
        # numpy sorts 16-bit integers by radix: the keys are index tensor numbers
        self.key = key[by].astype(numpy.int16 if key.size == 0 or key.max() < 2 ** 15 else numpy.int64)
        self.columns = {name: column[by] for name, column in columns.items()}

    def take(self, samples: numpy.ndarray) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
        """(entries, their batch positions, their keys) of the batch ``samples``, sorted by key stably."""
        counts = self.count[samples]
        total = int(counts.sum())
        entries = (self.start[samples] - (counts.cumsum() - counts)).repeat(counts) + numpy.arange(total)
        positions = numpy.arange(samples.shape[0]).repeat(counts)
        keys = self.key[entries]
        order = keys.argsort(kind="stable")
        return entries[order], positions[order], keys[order]


def _offsets(lengths: numpy.ndarray, counts: numpy.ndarray) -> numpy.ndarray:
    """Row pointers of consecutive segments lists: ``counts[k]`` lengths for list ``k``, each list's pointers
    ``[0, cumsum(its lengths)]``, all lists one after the other."""
    keys = counts.shape[0]
    key_of = numpy.arange(keys).repeat(counts)
    ends = lengths.cumsum()
    first = counts.cumsum() - counts
    base = numpy.concatenate([[0], ends])[first]
    out = numpy.zeros(lengths.shape[0] + keys, dtype=numpy.int64)
    out[numpy.arange(lengths.shape[0]) + key_of + 1] = ends - base[key_of]
    return out


def _place(buffer: numpy.ndarray, values: numpy.ndarray, lengths: numpy.ndarray, at: numpy.ndarray) -> None:
    """Write consecutive runs of ``values`` (``lengths[k]`` for run ``k``) to ``buffer[at[k]:]``."""
    starts = lengths.cumsum() - lengths
    buffer[(at - starts).repeat(lengths) + numpy.arange(values.shape[0])] = values


class Assembly:
    """Every index tensor and size of a row plan, for any batch of its samples (see the module docstring).

    ``spans`` (default: one each) counts the consecutive index tensors that each input of the plan's graph
    holds: a merged gather's selects (``passes/merge_gathers.py``) are one input, their entries joined."""

    def __init__(self, indices: Sequence["GatherIndex"], sizes: Sequence["Rows"], samples: int,
                 spans: Sequence[int] | None = None):
        self.values = values = _Values(samples)
        kinds = [index.kind for index in indices]
        spans = list(spans) if spans is not None else [1] * len(indices)
        first = numpy.cumsum(spans, dtype=numpy.int64) - spans
        if int(numpy.sum(spans)) != len(indices) or any(
                kinds[f + k] != "select" for f, span in zip(first, spans) if span > 1 for k in range(span)):
            raise ValueError("a span of several index tensors must cover selects only")
        self.inputs = len(spans)
        #: the graph input of each family member that starts one (a select, or a span of them)
        slot_of = {int(f): slot for slot, f in enumerate(first)}
        #: (input, input of an equal index tensor): an index tensor that every batch restricts as an earlier one
        #: is computed once (the layers of a GNN gather along one adjacency)
        equal = _equal_to_earlier(indices, [int(f) for f, span in zip(first, spans) if span == 1])
        self.copies = [(slot_of[i], slot_of[j]) for i, j in equal.items()]
        #: index tensors numbered family by family: selects, then CSR reductions, then segments
        self.select = [i for i, k in enumerate(kinds) if k == "select" and i not in equal]
        self.reduce = [i for i, k in enumerate(kinds) if k == "reduce" and i not in equal]
        self.segments = [i for i, k in enumerate(kinds) if k == "segments" and i not in equal]
        self.select_slots = [slot_of[i] for i in self.select if i in slot_of]
        self.select_starts = numpy.array([k for k, i in enumerate(self.select) if i in slot_of], dtype=numpy.int64)
        self.reduce_slots = [slot_of[i] for i in self.reduce]
        self.segment_slots = [slot_of[i] for i in self.segments]
        self.device = indices[0].device if indices else torch.device("cpu")
        #: pack the transposed CSR too: the CUDA kernels multiply by it in backward; the CPU's
        #: ``gather_reduce_indexed`` (``index_add``, ATen's autograd) reads each entry's row instead
        self.transposes = self.device.type != "cpu"
        self.read_keys = self.select + self.reduce       # entries that read a source row
        self.row_keys = self.reduce + self.segments      # rows whose segment lengths count
        reads, rows = [], []
        for key, i in enumerate(self.read_keys):
            reads.append(self._reads(key, indices[i]))
        for key, i in enumerate(self.row_keys):
            out, lengths = indices[i].out, indices[i].segment_length
            rows.append((out.owner, numpy.full(out.rows, key), out.rank, {"length": lengths}))
        self.sources = numpy.array([values.id_of(indices[i].source) for i in self.reduce], dtype=numpy.int64)
        self.fixed_columns = numpy.array([indices[i].source_rows for i in self.reduce], dtype=numpy.int64)
        self.sizes = [values.id_of(rows) for rows in sizes]
        values.freeze()
        self.reads = _joined(reads, samples, ("part", "rank"))
        self.rows = _joined(rows, samples, ("length",))

    def _reads(self, key: int, index: "GatherIndex") -> tuple:
        """One entry per source row that ``index`` reads: its out row's sample and rank, its part and rank."""
        out = index.out
        if index.kind == "select":
            row_of = numpy.arange(out.rows)
            entry = row_of
        else:
            lengths = index.segment_length
            row_of = numpy.repeat(numpy.arange(out.rows), lengths)
            entry = numpy.repeat(index.segment_start - (numpy.cumsum(lengths) - lengths), lengths) \
                + numpy.arange(int(lengths.sum()))
        if index.source is None:
            assert index.index is not None   # (a gather from a shared tensor has its own index)
            part, rank = numpy.zeros(entry.shape[0], dtype=numpy.int64), index.index[entry]
        else:
            part = self.values.first_part[self.values.id_of(index.source)] + index.leaf_at[entry]
            rank = index.rank_at[entry]
        # entries of one row stay in CSR order: the row's rank, then the entry number, orders them
        order = out.rank[row_of] * (int(entry.max()) + 1 if entry.size else 1) + entry
        return out.owner[row_of], numpy.full(entry.shape[0], key), order, {"part": part, "rank": rank}

    def arguments(self, samples: numpy.ndarray) -> list[Any]:
        """The index inputs (in the row plan's order) and then the sizes of the batch ``samples``."""
        values = self.values
        part_start, within, size = values.restrict(samples)
        entries, positions, keys = self.reads.take(samples)
        part = self.reads.columns["part"][entries]
        read = part_start[part] + within[values.part_leaf[part], positions] + self.reads.columns["rank"][entries]
        read_counts = numpy.bincount(keys, minlength=len(self.read_keys))
        row_entries, _, row_key = self.rows.take(samples)
        lengths = self.rows.columns["length"][row_entries]
        row_counts = numpy.bincount(row_key, minlength=len(self.row_keys))

        selects = len(self.select)
        selected = int(read_counts[:selects].sum())
        tensors: list[Any] = [None] * self.inputs
        if selects:
            span_counts = numpy.add.reduceat(read_counts[:selects], self.select_starts)
            for slot, t in zip(self.select_slots, self._cut(read[:selected], span_counts)):
                tensors[slot] = t
        reduces = len(self.reduce)
        counted = int(row_counts[:reduces].sum())
        csr = self._packed(read[selected:], read_counts[selects:], lengths[:counted], row_counts[:reduces], size)
        for slot, t in zip(self.reduce_slots, csr):
            tensors[slot] = t
        if self.segments:
            segment_counts = row_counts[reduces:]
            for slot, t in zip(self.segment_slots,
                               self._cut(_offsets(lengths[counted:], segment_counts), segment_counts + 1)):
                tensors[slot] = t
        for slot, same in self.copies:
            tensors[slot] = tensors[same]
        return tensors + size[self.sizes].tolist()

    def _packed(self, index: numpy.ndarray, nnz: numpy.ndarray, lengths: numpy.ndarray, rows: numpy.ndarray,
                size: numpy.ndarray) -> Sequence[torch.Tensor]:
        """The packed CSR ``[offsets, index, offsets_t, index_t]`` of every reduction (``pack_csr``'s layout),
        without :attr:`transposes` the indexed layout ``[offsets, index, row_of]`` (``pack_indexed``'s)."""
        if not self.reduce:
            return []
        offsets = _offsets(lengths, rows)
        key_of = numpy.arange(len(self.reduce)).repeat(rows)
        row_in_key = numpy.arange(lengths.shape[0]) - (rows.cumsum() - rows)[key_of]
        row_of = row_in_key.repeat(lengths)
        if not self.transposes:
            blocks = (rows + 1) + 2 * nnz
            buffer = numpy.empty(int(blocks.sum()), dtype=numpy.int64)
            at = blocks.cumsum() - blocks
            _place(buffer, offsets, rows + 1, at)
            _place(buffer, index, nnz, at + rows + 1)
            _place(buffer, row_of, nnz, at + rows + 1 + nnz)
            return self._cut(buffer, blocks)
        columns = numpy.where(self.sources == 0, self.fixed_columns, size[self.sources])
        column_base = columns.cumsum() - columns
        column_key = column_base.repeat(nnz) + index
        by_column = column_key.argsort(kind="stable")
        offsets_t = _offsets(numpy.bincount(column_key, minlength=int(columns.sum())), columns)
        blocks = (rows + 1) + nnz + (columns + 1) + nnz
        at = blocks.cumsum() - blocks
        buffer = numpy.empty(int(blocks.sum()), dtype=numpy.int64)
        _place(buffer, offsets, rows + 1, at)
        _place(buffer, index, nnz, at + rows + 1)
        _place(buffer, offsets_t, columns + 1, at + rows + 1 + nnz)
        _place(buffer, row_of[by_column], nnz, at + rows + 1 + nnz + columns + 1)
        if buffer.size == 0 or buffer.max() < _INT32_MAX:   # MKL's sparse product takes 32-bit indices
            buffer = buffer.astype(numpy.int32)
        return self._cut(buffer, blocks)

    def _cut(self, buffer: numpy.ndarray, lengths: numpy.ndarray) -> Sequence[torch.Tensor]:
        """``buffer`` on the union's device, cut into views of ``lengths``."""
        joined = torch.from_numpy(buffer)
        if self.device.type != "cpu":
            joined = joined.to(self.device, non_blocking=True)
        # (never written: views without autograd's view tracking, a third cheaper to make)
        return joined.unsafe_split_with_sizes(lengths.tolist())


def _equal_to_earlier(indices: Sequence["GatherIndex"], candidates: list[int]) -> dict[int, int]:
    """``{i: j}`` for each of ``candidates`` (positions in ``indices``, ascending) that every batch restricts as
    the earlier candidate ``j`` (:meth:`~dynamo_relational.row_plan.GatherIndex.same_as`)."""
    firsts: dict[tuple, list[int]] = {}
    equal = {}
    for i in candidates:
        index = indices[i]
        alike = firsts.setdefault((index.kind, index.out.rows, index.source_rows), [])
        j = next((j for j in alike if indices[j].same_as(index)), None)
        if j is None:
            alike.append(i)
        else:
            equal[i] = j
    return equal


def _joined(parts: list[tuple], samples: int, names: tuple[str, ...]) -> _Stream:
    """One :class:`_Stream` of entries given per index tensor as (sample, key, order, columns)."""
    def joined(arrays):
        return numpy.concatenate(arrays).astype(numpy.int64) if arrays else numpy.zeros(0, dtype=numpy.int64)
    return _Stream(joined([p[0] for p in parts]), joined([p[1] for p in parts]), joined([p[2] for p in parts]),
                   samples, {name: joined([p[3][name] for p in parts]) for name in names})
