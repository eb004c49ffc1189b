"""Ground molecule graphs from SQL: tables ``molecule``, ``atom``, ``bond`` -> dense index arrays.

The queries (SQLAlchemy Core, identical on SQLite and PostgreSQL):

* element and bond-type vocabularies: ``SELECT DISTINCT``;
* molecules in ``id`` order, numbered 0..M-1 by ``ROW_NUMBER()``;
* atoms joined with their molecule's number, in (molecule, atom id) order,
  numbered 0..N-1 by ``ROW_NUMBER()`` (a CTE);
* bonds joined twice with that CTE, so they arrive as pairs of atom numbers,
  in both directions (a bond carries messages both ways), sorted by target.

Every query is streamed in chunks (``Database.stream``): Python never holds
the rows of a table, only the compact int64 arrays the model is built from.
Before grounding, the tables are validated (``SCHEMA``): a missing table or
column, an empty table, a NULL, a duplicate id or a bond/atom that points to a
missing row is a ``DatabaseError`` naming it.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

import sqlalchemy as sa
import torch

from dynamo_relational.db import DEFAULT_CHUNK_SIZE, Database, DatabaseError, Relation

#: what the grounding reads (other columns and tables are ignored)
SCHEMA = (
    Relation("molecule", ("id", "label"), key="id"),
    Relation("atom", ("id", "molecule_id", "element"), key="id", references={"molecule_id": "molecule.id"}),
    Relation("bond", ("atom1", "atom2", "type"), references={"atom1": "atom.id", "atom2": "atom.id"}),
)


@dataclass
class MoleculeGraphs:
    """Molecules as graphs, numbered densely: molecule ``m`` owns atoms
    ``atom_ptr[m]:atom_ptr[m+1]``; directed bond ``e`` goes ``bond_src[e] -> bond_dst[e]``
    with type index ``bond_type[e]``, sorted by target."""
    molecule_ids: list            # database id of molecule m
    labels: torch.Tensor          # [M] float, 1 = positive
    elements: tuple               # vocabulary: element index -> value in atom.element
    bond_types: tuple             # vocabulary: bond type index -> value in bond.type
    atom_element: torch.Tensor    # [N] int64
    atom_ptr: torch.Tensor        # [M + 1] int64
    bond_src: torch.Tensor        # [2B] int64
    bond_dst: torch.Tensor        # [2B] int64
    bond_type: torch.Tensor       # [2B] int64

    @property
    def num_molecules(self) -> int:
        return len(self.molecule_ids)

    @property
    def num_atoms(self) -> int:
        return len(self.atom_element)

    def atoms_of(self) -> list[range]:
        """The atom numbers of every molecule."""
        ptr = self.atom_ptr.tolist()
        return [range(a, b) for a, b in zip(ptr, ptr[1:])]

    def in_bonds(self) -> list[list[tuple[int, int]]]:
        """For every atom, its incoming bonds as (source atom, bond type index)."""
        result: list[list[tuple[int, int]]] = [[] for _ in range(self.num_atoms)]
        for s, d, t in zip(self.bond_src.tolist(), self.bond_dst.tolist(), self.bond_type.tolist()):
            result[d].append((s, t))
        return result

    def equals(self, other: MoleculeGraphs) -> bool:
        return all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
                   for a, b in zip(vars(self).values(), vars(other).values()))


def _vocabulary(db: Database, column: sa.Column) -> tuple:
    values = db.scalars(sa.select(column).distinct())
    return tuple(sorted(values, key=lambda v: (type(v).__name__, v)))   # the same order on every backend


def ground(db: Database, *, chunk_size: int = DEFAULT_CHUNK_SIZE, progress: bool | None = None) -> MoleculeGraphs:
    """Validate ``db`` against ``SCHEMA`` and read its molecule graphs."""
    db.validate(SCHEMA)
    molecule, atom, bond = (db.table(r.name) for r in SCHEMA)
    stream = dict(chunk_size=chunk_size, progress=progress)

    molecule_ids, labels = [], array("f")
    for chunk in db.stream(sa.select(molecule.c.id, molecule.c.label).order_by(molecule.c.id),
                           desc="molecules", **stream):
        for mid, label in chunk:
            if label not in (0, 1):
                raise DatabaseError(f"{db.url}: molecule.label must be 0 or 1, got {label!r} in row id={mid!r}")
            molecule_ids.append(mid)
            labels.append(float(label))

    elements, bond_types = _vocabulary(db, atom.c.element), _vocabulary(db, bond.c.type)
    element_index = {e: i for i, e in enumerate(elements)}
    type_index = {t: i for i, t in enumerate(bond_types)}

    mol_no = sa.select(molecule.c.id, (sa.func.row_number().over(order_by=molecule.c.id) - 1).label("no")) \
        .cte("molecule_no")
    atom_no = sa.select(atom.c.id, atom.c.element, mol_no.c.no.label("molecule"),
                        (sa.func.row_number().over(order_by=(mol_no.c.no, atom.c.id)) - 1).label("no")) \
        .join_from(atom, mol_no, mol_no.c.id == atom.c.molecule_id).cte("atom_no")

    atom_element, atoms_per_molecule = array("q"), array("q", bytes(8 * len(molecule_ids)))
    for chunk in db.stream(sa.select(atom_no.c.element, atom_no.c.molecule).order_by(atom_no.c.no),
                           desc="atoms", **stream):
        for element, mol in chunk:
            atom_element.append(element_index[element])
            atoms_per_molecule[mol] += 1

    a1, a2 = atom_no.alias("a1"), atom_no.alias("a2")
    ends = bond.join(a1, a1.c.id == bond.c.atom1).join(a2, a2.c.id == bond.c.atom2)
    directed = sa.union_all(sa.select(a1.c.no.label("src"), a2.c.no.label("dst"), bond.c.type).select_from(ends),
                            sa.select(a2.c.no.label("src"), a1.c.no.label("dst"), bond.c.type).select_from(ends)
                            ).subquery("directed")
    src, dst, types = array("q"), array("q"), array("q")
    for chunk in db.stream(sa.select(directed).order_by(directed.c.dst, directed.c.src, directed.c.type),
                           desc="bonds", **stream):
        for s, d, t in chunk:
            src.append(s)
            dst.append(d)
            types.append(type_index[t])

    def as_tensor(a):
        return torch.frombuffer(a, dtype=torch.int64) if len(a) else torch.zeros(0, dtype=torch.int64)
    counts = as_tensor(atoms_per_molecule)
    return MoleculeGraphs(
        molecule_ids=molecule_ids, labels=torch.tensor(labels, dtype=torch.float32),
        elements=elements, bond_types=bond_types, atom_element=as_tensor(atom_element),
        atom_ptr=torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]),
        bond_src=as_tensor(src), bond_dst=as_tensor(dst), bond_type=as_tensor(types))
