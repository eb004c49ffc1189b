"""A batch's index tensors, assembled for all index tensors at once, equal those computed one by one from
their definition: each sample's rows kept in batch order, its reads renumbered into the restricted source."""
from __future__ import annotations

import numpy
import pytest
import torch

from dynamo_relational.assembly import Assembly
from dynamo_relational.kernels.gather_reduce import pack_csr, pack_indexed
from dynamo_relational.row_plan import CatRows, Rows, SharedRows, GatherIndex


def restricted_rows(rows: Rows, samples: list[int]) -> dict[tuple[int, int], int]:
    """(union row, batch position) -> row of the restricted value, from the definition: part after part,
    each part's rows of the batch's samples in batch order (a shared part's rows all, once)."""
    where, at = {}, 0
    leaves = rows.leaves if isinstance(rows, CatRows) else [rows]
    start = 0
    for leaf in leaves:
        if isinstance(leaf, SharedRows):
            for r in range(leaf.rows):
                for b in range(len(samples)):
                    where[start + r, b] = at + r
            at += leaf.rows
        else:
            for b, s in enumerate(samples):
                for r in numpy.flatnonzero(leaf.owner == s):
                    where[start + int(r), b] = at
                    at += 1
        start += leaf.rows
    return where


def expected(index: GatherIndex, samples: list[int]) -> torch.Tensor:
    out_rows = [(int(r), b) for b, s in enumerate(samples) for r in numpy.flatnonzero(index.out.owner == s)]
    if index.kind == "segments":
        lengths = [int(index.segment_length[r]) for r, _ in out_rows]
        return torch.tensor(numpy.concatenate([[0], numpy.cumsum(lengths, dtype=numpy.int64)]), dtype=torch.long)
    where = None if index.source is None else restricted_rows(index.source, samples)

    def read(entry: int, b: int) -> int:
        return int(index.index[entry]) if where is None else where[int(index.index[entry]), b]

    if index.kind == "select":
        return torch.tensor([read(r, b) for r, b in out_rows], dtype=torch.long)
    entries = [(e, b) for r, b in out_rows
               for e in range(index.segment_start[r], index.segment_start[r] + index.segment_length[r])]
    lengths = [int(index.segment_length[r]) for r, _ in out_rows]
    offsets = torch.tensor(numpy.concatenate([[0], numpy.cumsum(lengths, dtype=numpy.int64)]), dtype=torch.long)
    columns = index.source_rows if where is None else len(set(where.values()))
    return pack_csr(offsets, torch.tensor([read(e, b) for e, b in entries], dtype=torch.long), columns)


def random_union(rng: numpy.random.Generator, samples: int):
    """Rows values of random owners, a cat of some of them with a shared part, and index tensors of every
    kind reading them (each row reads rows of its own sample)."""
    leaves = [Rows(rng.integers(0, samples, rng.integers(0, 12)), samples) for _ in range(3)]
    shared = SharedRows(int(rng.integers(1, 4)), samples)
    cat = CatRows([leaves[0], shared, leaves[1]])
    indices = []
    for source in (leaves[0], leaves[2], cat, None):
        source_owner = numpy.full(5, -1) if source is None else source.owner
        out = Rows(rng.integers(0, samples, rng.integers(1, 10)), samples)
        readable = [numpy.flatnonzero((source_owner == s) | (source_owner == -1)) for s in out.owner]
        if all(len(r) for r in readable):
            index = numpy.array([rng.choice(r) for r in readable])
            indices.append(GatherIndex("select", out, source, len(source_owner), None, index, torch.device("cpu")))
        lengths = numpy.array([rng.integers(0, 4) if len(r) else 0 for r in readable])
        offsets = numpy.concatenate([[0], numpy.cumsum(lengths)])
        index = numpy.array([rng.choice(r) for r, k in zip(readable, lengths) for _ in range(k)], dtype=numpy.int64)
        indices.append(GatherIndex("reduce", out, source, len(source_owner), offsets, index, torch.device("cpu")))
    out = leaves[2]
    lengths = rng.integers(0, 3, out.rows)
    offsets = numpy.concatenate([[0], numpy.cumsum(lengths)])
    indices.append(GatherIndex("segments", out, leaves[1], leaves[1].rows, offsets, None, torch.device("cpu")))
    rng.shuffle(indices)
    return indices, [leaves[0], cat, shared]


def indexed(csr: torch.Tensor, rows: int) -> torch.Tensor:
    """The indexed layout of a packed CSR of ``rows`` rows."""
    offsets = csr[:rows + 1]
    return pack_indexed(offsets, csr[rows + 1:rows + 1 + int(offsets[-1])])


@pytest.mark.parametrize("transposes", [True, False])
@pytest.mark.parametrize("seed", range(20))
def test_assembled_index_tensors_equal_their_definition(seed, transposes):
    rng = numpy.random.default_rng(seed)
    samples = int(rng.integers(1, 6))
    indices, sizes = random_union(rng, samples)
    assembly = Assembly(indices, sizes, samples)
    assembly.transposes = transposes   # (packed for CUDA's kernels; the CPU's indexed forms read rows instead)
    for batch in ([0], list(range(samples)), list(rng.integers(0, samples, 7)), list(range(samples))[::-1]):
        got = assembly.arguments(numpy.array(batch, dtype=numpy.int64))
        for i, index in enumerate(indices):
            want = expected(index, batch)
            if index.kind == "reduce" and not transposes:
                want = indexed(want, sum(int((index.out.owner == s).sum()) for s in batch))
            torch.testing.assert_close(got[i].long(), want.long(), rtol=0, atol=0,
                                       msg=lambda m: f"{index.kind} index {i}, batch {batch}: {m}")
        want_sizes = [len(set(restricted_rows(rows, batch).values())) for rows in sizes]
        assert got[len(indices):] == want_sizes


@pytest.mark.parametrize("seed", range(10))
def test_consecutive_selects_assembled_as_one_input_are_their_indices_joined(seed):
    """A merged gather reads its parts' index tensors as one input: their entries one after the other."""
    rng = numpy.random.default_rng(seed)
    samples = int(rng.integers(1, 6))
    indices, sizes = random_union(rng, samples)
    indices.sort(key=lambda index: index.kind != "select")   # the selects first, then one span of all of them
    selects = sum(index.kind == "select" for index in indices)
    spans = [selects] + [1] * (len(indices) - selects) if selects else None
    assembly = Assembly(indices, sizes, samples, spans)
    for batch in ([0], list(range(samples)), list(rng.integers(0, samples, 7))):
        got = assembly.arguments(numpy.array(batch, dtype=numpy.int64))
        if selects:
            want = torch.cat([expected(index, batch) for index in indices[:selects]])
            torch.testing.assert_close(got[0].long(), want, rtol=0, atol=0)
        assert len(got) == len(indices) - max(selects - 1, 0) + len(sizes)


def test_a_span_of_index_tensors_other_than_selects_is_refused():
    rng = numpy.random.default_rng(0)
    indices, sizes = random_union(rng, 3)
    indices.sort(key=lambda index: index.kind)   # reduce, then select, then segments
    with pytest.raises(ValueError, match="selects only"):
        Assembly(indices, sizes, 3, [2] + [1] * (len(indices) - 2))


def _alike(rows: Rows | None, samples: int) -> Rows | None:
    """Another value whose rows are laid out as ``rows``' (the next layer's, over the same atoms)."""
    if rows is None or isinstance(rows, SharedRows):
        return rows
    if isinstance(rows, CatRows):
        return CatRows([_alike(leaf, samples) for leaf in rows.leaves])
    return Rows(rows.owner.copy(), samples)


@pytest.mark.parametrize("seed", range(10))
def test_an_index_tensor_that_every_batch_restricts_as_an_earlier_one_is_computed_once(seed):
    """A later layer's gather along the same adjacency (equal entries, rows laid out alike) reuses the earlier
    one's index tensor; one whose entries differ in a single read does not."""
    rng = numpy.random.default_rng(seed)
    samples = int(rng.integers(1, 6))
    indices, sizes = random_union(rng, samples)
    alike = [GatherIndex(i.kind, _alike(i.out, samples), _alike(i.source, samples), i.source_rows,
                         None if i.kind == "select" else numpy.concatenate([i.segment_start, i.segment_start[-1:]
                                                                            + i.segment_length[-1:]]),
                         i.index, i.device) for i in indices]
    changed = []
    for i in indices:
        if i.kind == "select" and i.source is None:   # (a shared source: any row may be read)
            index = i.index.copy()
            index[0] = (index[0] + 1) % i.source_rows
            changed.append(GatherIndex("select", i.out, None, i.source_rows, None, index, i.device))
    assembly = Assembly(indices + alike + changed, sizes, samples)
    assert len(assembly.copies) == len(alike)
    for batch in ([0], list(range(samples)), list(rng.integers(0, samples, 7))):
        got = assembly.arguments(numpy.array(batch, dtype=numpy.int64))
        for i in range(len(indices)):
            assert got[len(indices) + i] is got[i]
        for k, index in enumerate(changed):
            torch.testing.assert_close(got[2 * len(indices) + k].long(), expected(index, batch), rtol=0, atol=0)
