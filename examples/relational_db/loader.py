"""Write the Mutagenesis data set into a SQL database: tables ``molecule``, ``atom``, ``bond``.

The source is the copy of Mutagenesis (188 nitroaromatic molecules, labelled
mutagenic or not; Debnath et al. 1991) that the ``neuralogic`` package
(PyNeuraLogic, MIT licence) ships under
``neuralogic/utils/data/datasets/molecules/mutagenesis/``: ``examples.txt``
holds one molecule per line as NeuraLogic facts (``c(d59_5)``: atom ``d59_5``
is a carbon; ``bond(d59_23, d59_5, 0), b_1(0)``: bond 0 joins them and has type
1; every bond is listed in both directions), ``queries.txt`` the label of the
molecule on the same line (``1.0 predict.``). Reading these text files needs no
Java.

Tables written (SQLAlchemy Core, so the same code writes SQLite and PostgreSQL):

    molecule(id INTEGER PRIMARY KEY, name TEXT, label INTEGER)       -- label 1 = mutagenic
    atom(id INTEGER PRIMARY KEY, molecule_id -> molecule.id, element TEXT, name TEXT)
    bond(id INTEGER PRIMARY KEY, atom1 -> atom.id, atom2 -> atom.id, type INTEGER)   -- once per bond

This is the only code here that writes to a database, and only to the one it
is asked to fill.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import sqlalchemy as sa

from dynamo_relational.db import DatabaseError, open_database

METADATA = sa.MetaData()
MOLECULE = sa.Table("molecule", METADATA,
                    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                    sa.Column("name", sa.String(32), nullable=False),
                    sa.Column("label", sa.Integer, nullable=False))
ATOM = sa.Table("atom", METADATA,
                sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                sa.Column("molecule_id", sa.Integer, sa.ForeignKey("molecule.id"), nullable=False, index=True),
                sa.Column("element", sa.String(8), nullable=False),
                sa.Column("name", sa.String(32), nullable=False))
BOND = sa.Table("bond", METADATA,
                sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
                sa.Column("atom1", sa.Integer, sa.ForeignKey("atom.id"), nullable=False, index=True),
                sa.Column("atom2", sa.Integer, sa.ForeignKey("atom.id"), nullable=False, index=True),
                sa.Column("type", sa.Integer, nullable=False))

_FACT = re.compile(r"([a-z][a-z0-9_]*)\(([^)]*)\)")


@dataclass
class MutagenesisRows:
    """The data set as table rows (dicts keyed by column name) and where it came from."""
    molecules: list[dict]
    atoms: list[dict]
    bonds: list[dict]
    source: str

    @classmethod
    def from_neuralogic(cls) -> MutagenesisRows:
        """Parse the copy that the installed ``neuralogic`` package ships."""
        try:
            import neuralogic
        except ImportError:
            raise ImportError("the Mutagenesis loader reads the data set shipped with the neuralogic "
                              "package: pip install neuralogic (scripts/setup.sh installs it)") from None
        folder = Path(neuralogic.__file__).parent / "utils/data/datasets/molecules/mutagenesis"
        source = f"neuralogic {metadata.version('neuralogic')}: {folder}"
        return cls.parse((folder / "examples.txt").read_text(), (folder / "queries.txt").read_text(), source)

    @classmethod
    def parse(cls, examples: str, queries: str, source: str) -> MutagenesisRows:
        """Rows from NeuraLogic ``examples.txt`` / ``queries.txt`` text (one molecule per line)."""
        lines = [line for line in examples.splitlines() if line.strip()]
        labels = [float(line.split()[0]) for line in queries.splitlines() if line.strip()]
        if len(lines) != len(labels):
            raise ValueError(f"{source}: {len(lines)} molecules but {len(labels)} labels")
        molecules, atoms, bonds = [], [], []
        atom_id: dict[str, int] = {}
        for line_no, (line, label) in enumerate(zip(lines, labels), 1):
            bond_ends: dict[str, list[tuple[str, str]]] = {}
            bond_type: dict[str, int] = {}
            elements: dict[str, str] = {}
            for predicate, args in _FACT.findall(line):
                args = [a.strip() for a in args.split(",")]
                if predicate == "bond":
                    bond_ends.setdefault(args[2], []).append((args[0], args[1]))
                elif predicate.startswith("b_"):
                    bond_type[args[0]] = int(predicate[2:])
                else:
                    elements.setdefault(args[0], predicate)
            name = next(iter(elements)).split("_")[0]
            molecules.append(dict(id=line_no, name=name, label=int(label)))
            for atom, element in elements.items():
                atom_id[atom] = len(atom_id) + 1
                atoms.append(dict(id=atom_id[atom], molecule_id=line_no, element=element, name=atom))
            for bond, ends in bond_ends.items():      # both directions are listed: keep the first
                a1, a2 = ends[0]
                bonds.append(dict(id=int(bond), atom1=atom_id[a1], atom2=atom_id[a2], type=bond_type[bond]))
        return cls(molecules, atoms, bonds, source)


def write_mutagenesis(target, *, replace: bool = False, rows: MutagenesisRows | None = None,
                      chunk_size: int = 5_000) -> str:
    """Create and fill tables ``molecule``, ``atom`` and ``bond`` in the database ``target``
    (a SQLite path, created if missing, or a URL); return the data's provenance.

    Tables of those names that already exist are an error unless ``replace``
    (then they are dropped first)."""
    rows = rows or MutagenesisRows.from_neuralogic()
    with open_database(target, write=True) as db:
        existing = set(sa.inspect(db.engine).get_table_names()) & set(METADATA.tables)
        if existing and not replace:
            raise DatabaseError(f"{db.url}: table(s) {', '.join(sorted(existing))} exist already; "
                                "pass replace=True (--replace) to overwrite them")
        with db.engine.begin() as conn:
            METADATA.drop_all(conn, checkfirst=True)
            METADATA.create_all(conn)
            for table, data in ((MOLECULE, rows.molecules), (ATOM, rows.atoms), (BOND, rows.bonds)):
                for start in range(0, len(data), chunk_size):
                    conn.execute(table.insert(), data[start:start + chunk_size])
    return rows.source
