"""Relational databases as the source of a relational model (dynamo_relational.db, examples/relational_db).

Grounding of a tiny hand-made database, the errors for bad input (on SQLite,
and on a throwaway PostgreSQL server where its binaries are installed), that
the user's database is never written, chunked reading in flat memory, and the
compiled model against eager.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import tracemalloc
from pathlib import Path

import pytest
import torch

sa = pytest.importorskip("sqlalchemy", reason="needs the db extra: pip install -e '.[db]'")

from tests.helpers import assert_compiled_matches_eager  # noqa: E402
from dynamo_relational.db import DatabaseError, Relation, open_database  # noqa: E402
from examples.relational_db.grounding import ground  # noqa: E402
from examples.relational_db.loader import MutagenesisRows, write_mutagenesis  # noqa: E402
from examples.relational_db.model import MoleculeRGCN  # noqa: E402

# Two molecules: 1 = C(10) bonded to O(11) (type 2) and H(12) (type 1); 2 = N(20) - C(21) (type 7).
TINY = {
    "molecule": ("id INTEGER, label INTEGER, name TEXT", [(2, 0, "m2"), (1, 1, "m1")]),
    "atom": ("id INTEGER, molecule_id INTEGER, element TEXT",
             [(10, 1, "c"), (11, 1, "o"), (12, 1, "h"), (21, 2, "c"), (20, 2, "n")]),
    "bond": ("atom1 INTEGER, atom2 INTEGER, type INTEGER", [(10, 11, 2), (12, 10, 1), (20, 21, 7)]),
}


def create_tables(target, tables: dict) -> None:
    """Write ``{name: (column DDL, rows)}`` into database ``target`` with plain, portable SQL."""
    with open_database(target, write=True) as db, db.engine.begin() as conn:
        for name, (columns, rows) in tables.items():
            conn.exec_driver_sql(f"CREATE TABLE {name} ({columns})")
            if rows:
                params = [{f"c{i}": v for i, v in enumerate(row)} for row in rows]
                conn.execute(sa.text(f"INSERT INTO {name} VALUES ({', '.join(f':c{i}' for i in range(len(rows[0])))})"),
                             params)


def tiny_with(**changes) -> dict:
    """TINY with some tables replaced (a value of None drops the table)."""
    tables = {**TINY, **changes}
    return {name: spec for name, spec in tables.items() if spec is not None}


def ground_tiny(target, **kwargs):
    with open_database(target) as db:
        return ground(db, progress=False, **kwargs)


# ---- PostgreSQL: a throwaway server in a temporary directory, reached through a unix socket ----------

def _postgres_bindir() -> Path | None:
    for candidate in [shutil.which("pg_ctl"), *sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), reverse=True)]:
        if candidate and (Path(candidate).parent / "initdb").exists():
            return Path(candidate).resolve().parent
    return None


@pytest.fixture(scope="module")
def postgres_server():
    """URL maker for databases on a fresh PostgreSQL server (skipped when its binaries are missing).

    initdb into a temporary directory, listening only on a unix socket there;
    run as user ``postgres`` when the tests run as root (the server refuses
    root); stopped at the end of the module."""
    pytest.importorskip("psycopg", reason="needs psycopg: pip install -e '.[db]'")
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found; scripts/setup.sh installs them with apt")
    prefix = []
    root = tempfile.mkdtemp(prefix="dr-pg-")
    if os.geteuid() == 0:
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("running as root and runuser is missing: cannot start PostgreSQL as user postgres")
        prefix = [runuser, "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    data, log = os.path.join(root, "data"), os.path.join(root, "log")

    def run(*cmd):
        return subprocess.run([*prefix, *cmd], check=True, capture_output=True, text=True)
    try:
        run(str(bindir / "initdb"), "-D", data, "-U", "dr", "--auth=trust", "--no-sync", "-E", "UTF8",
            "--locale=C")
        run(str(bindir / "pg_ctl"), "-D", data, "-l", log, "-w", "-t", "60", "start",
            "-o", f"-c listen_addresses='' -k {root} -c fsync=off")
    except subprocess.CalledProcessError as exc:
        text = Path(log).read_text() if os.path.exists(log) else ""
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL: {exc.stderr}{text}")
    admin = sa.create_engine(f"postgresql+psycopg://dr@/postgres?host={root}", isolation_level="AUTOCOMMIT")
    names = iter(range(10 ** 6))

    def new_database() -> str:
        name = f"t{next(names)}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://dr@/{name}?host={root}"

    try:
        yield new_database
    finally:
        admin.dispose()
        subprocess.run([*prefix, str(bindir / "pg_ctl"), "-D", data, "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def new_database(request, tmp_path):
    """A maker of empty databases (a SQLite path, or a URL on the throwaway PostgreSQL server)."""
    if request.param == "sqlite":
        paths = (tmp_path / f"db{i}.sqlite" for i in range(10 ** 6))
        return lambda: next(paths)
    return request.getfixturevalue("postgres_server")


# ---- grounding ------------------------------------------------------------------------------------

def test_grounding_of_a_tiny_database(new_database):
    target = new_database()
    create_tables(target, TINY)
    g = ground_tiny(target)
    assert g.molecule_ids == [1, 2] and g.labels.tolist() == [1.0, 0.0]
    assert g.elements == ("c", "h", "n", "o") and g.bond_types == (1, 2, 7)
    # atoms numbered by (molecule id, atom id): 10 c, 11 o, 12 h | 20 n, 21 c
    assert g.atom_element.tolist() == [0, 3, 1, 2, 0] and g.atom_ptr.tolist() == [0, 3, 5]
    assert [list(r) for r in g.atoms_of()] == [[0, 1, 2], [3, 4]]
    # every bond in both directions, by target then source; type indices into (1, 2, 7)
    assert g.in_bonds() == [[(1, 1), (2, 0)], [(0, 1)], [(0, 0)], [(4, 2)], [(3, 2)]]


def test_parse_neuralogic_text():
    examples = ("bond(d1_1, d1_2, 0), c(d1_1), o(d1_2), b_2(0), bond(d1_2, d1_1, 0).\n"
                "bond(d2_1, d2_2, 1), n(d2_1), h(d2_2), b_1(1), bond(d2_2, d2_1, 1).\n")
    rows = MutagenesisRows.parse(examples, "1.0 predict.\n0.0 predict.\n", "test")
    assert rows.molecules == [dict(id=1, name="d1", label=1), dict(id=2, name="d2", label=0)]
    assert [(a["id"], a["molecule_id"], a["element"], a["name"]) for a in rows.atoms] == [
        (1, 1, "c", "d1_1"), (2, 1, "o", "d1_2"), (3, 2, "n", "d2_1"), (4, 2, "h", "d2_2")]
    assert rows.bonds == [dict(id=0, atom1=1, atom2=2, type=2), dict(id=1, atom1=3, atom2=4, type=1)]


def test_loader_writes_mutagenesis(tmp_path):
    pytest.importorskip("neuralogic", reason="the loader reads the data set shipped by neuralogic")
    path = tmp_path / "m.sqlite"
    assert "neuralogic" in write_mutagenesis(path)
    g = ground_tiny(path)
    assert (g.num_molecules, g.num_atoms, len(g.bond_src)) == (188, 4893, 2 * 5243)
    assert int(g.labels.sum()) == 125 and set(g.elements) == {"br", "c", "cl", "f", "h", "i", "n", "o"}
    with pytest.raises(DatabaseError, match=r"table\(s\) atom, bond, molecule exist already"):
        write_mutagenesis(path)
    write_mutagenesis(path, replace=True)
    assert ground_tiny(path).equals(g)


# ---- bad input: every error names what is wrong -------------------------------------------------------

BAD = {
    "missing table": (dict(bond=None), r"table 'bond' not found \(tables: atom, molecule\)"),
    "missing column": (dict(atom=("id INTEGER, molecule_id INTEGER, kind TEXT", [(10, 1, "c")])),
                       r"column atom\.element not found \(columns of 'atom': id, molecule_id, kind\)"),
    "empty table": (dict(bond=("atom1 INTEGER, atom2 INTEGER, type INTEGER", [])), r"table 'bond' is empty"),
    "NULL": (dict(atom=(TINY["atom"][0], [(10, 1, "c"), (11, 1, None)])), r"atom\.element is NULL in row id=11"),
    "NULL key": (dict(atom=(TINY["atom"][0], [(10, 1, "c"), (None, 1, "o")])),
                 r"atom\.id is NULL in row \(id=None, molecule_id=1, element='o'\)"),
    "NULL without key": (dict(bond=(TINY["bond"][0], [(10, 11, 2), (12, None, 1)])),
                         r"bond\.atom2 is NULL in row \(atom1=12, atom2=None, type=1\)"),
    "dangling atom": (dict(bond=(TINY["bond"][0], [(10, 11, 2), (12, 99, 1)])),
                      r"bond\.atom2 = 99 in row \(atom1=12, atom2=99, type=1\) references a missing row of "
                      r"'atom' \(no atom\.id = 99\)"),
    "dangling molecule": (dict(atom=(TINY["atom"][0], [(10, 1, "c"), (11, 7, "o")])),
                          r"atom\.molecule_id = 7 in row id=11 references a missing row of 'molecule'"),
    "duplicate id": (dict(atom=(TINY["atom"][0], [(10, 1, "c"), (10, 2, "o")])), r"atom\.id = 10 is not unique"),
    "bad label": (dict(molecule=(TINY["molecule"][0], [(1, 1, "a"), (2, 3, "b")])),
                  r"molecule\.label must be 0 or 1, got 3 in row id=2"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_names_table_column_row(new_database, case):
    changes, message = BAD[case]
    target = new_database()
    create_tables(target, tiny_with(**changes))
    with pytest.raises(DatabaseError, match=message):
        ground_tiny(target)


def test_wrong_urls(tmp_path):
    missing = tmp_path / "nothing.sqlite"
    with pytest.raises(DatabaseError, match="SQLite database file not found: .*nothing.sqlite"):
        open_database(missing)
    assert not missing.exists()                     # a read-only open never creates the file
    with pytest.raises(DatabaseError, match="unknown database kind in URL nosuch://"):
        open_database("nosuch://host/db")
    with pytest.raises(DatabaseError, match=r"not a database URL or SQLite path: 'postgresql://\*\*\*@h:x/db'"):
        open_database("postgresql://me:secret@h:x/db")
    pytest.importorskip("psycopg")
    with pytest.raises(DatabaseError, match=r"cannot connect to postgresql\+psycopg://me:\*\*\*@127\.0\.0\.1:1/db"):
        open_database("postgresql+psycopg://me:secret@127.0.0.1:1/db")


def test_relation_declaration_is_checked():
    with pytest.raises(ValueError, match=r"\['id'\] must be listed in columns"):
        Relation("atom", ("element",), key="id")


# ---- the user's database is not written -------------------------------------------------------------

def test_database_is_opened_read_only(tmp_path):
    path = tmp_path / "user.sqlite"
    create_tables(path, TINY)
    before = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
    ground_tiny(path)
    with open_database(path) as db, pytest.raises(sa.exc.OperationalError, match="readonly"):
        with db.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM bond")
    assert (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user.sqlite"]     # no journal left behind


def test_postgres_is_opened_read_only(postgres_server):
    url = postgres_server()
    create_tables(url, TINY)
    with open_database(url) as db, pytest.raises(sa.exc.InternalError, match="read-only transaction"):
        with db.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM bond")
    assert ground_tiny(url).num_atoms == 5


# ---- large databases: chunks, progress, flat memory ---------------------------------------------------

def test_chunked_grounding_matches(tmp_path, capfd):
    path = tmp_path / "tiny.sqlite"
    create_tables(path, TINY)
    whole = ground_tiny(path)
    assert ground_tiny(path, chunk_size=1).equals(whole) and ground_tiny(path, chunk_size=2).equals(whole)
    with open_database(path) as db:
        chunks = list(db.stream(sa.select(db.table("atom")), chunk_size=2, desc="atoms", progress=True))
        assert [len(c) for c in chunks] == [2, 2, 1]
        ground(db, chunk_size=2, progress=True)
    assert "bonds: 100%" in capfd.readouterr().err        # the progress bar counts the directed bonds


def _synthetic(path: Path, molecules: int, atoms_per_molecule: int = 10) -> None:
    """A chain molecule database of ``molecules * atoms_per_molecule`` atoms."""
    n = molecules * atoms_per_molecule
    create_tables(path, {
        "molecule": ("id INTEGER, label INTEGER", [(m, m % 2) for m in range(molecules)]),
        "atom": ("id INTEGER, molecule_id INTEGER, element TEXT", [(a, a // atoms_per_molecule, "ch"[a % 2])
                                                                  for a in range(n)]),
        "bond": ("atom1 INTEGER, atom2 INTEGER, type INTEGER",
                 [(a, a + 1, a % 3) for a in range(n) if (a + 1) % atoms_per_molecule]),
    })


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_streaming_memory_is_flat_in_rows(tmp_path):
    small, large = tmp_path / "small.sqlite", tmp_path / "large.sqlite"
    _synthetic(small, 500)
    _synthetic(large, 5_000)

    def drain(path):
        with open_database(path) as db:
            for _ in db.stream(sa.select(db.table("bond")), chunk_size=500, progress=False):
                pass

    drain(small)                                            # warm caches (reflection, statement compilation)
    peak_small, peak_large = _peak_bytes(lambda: drain(small)), _peak_bytes(lambda: drain(large))
    assert peak_large < 1.5 * peak_small + 200_000, (peak_small, peak_large)   # 10x the rows, ~the same memory

    graphs = []
    peak = _peak_bytes(lambda: graphs.append(ground_tiny(large, chunk_size=1_000)))
    directed = len(graphs[0].bond_src)                      # 90k; fetchall would hold ~100 B per row
    assert directed == 2 * 9 * 5_000 and peak < 48 * directed + 2_000_000, peak


# ---- the model: compiled equals eager; PostgreSQL equals SQLite ---------------------------------------

def test_compiled_model_matches_eager(tmp_path):
    path = tmp_path / "tiny.sqlite"
    create_tables(path, TINY)
    torch.manual_seed(0)
    model = MoleculeRGCN(ground_tiny(path), hidden=4, layers=2)
    report = assert_compiled_matches_eager(model)
    assert report.nodes_after < report.nodes_before


@pytest.mark.slow
def test_compiled_model_matches_eager_on_mutagenesis(tmp_path):
    pytest.importorskip("neuralogic")
    path = tmp_path / "m.sqlite"
    write_mutagenesis(path)
    torch.manual_seed(0)
    assert_compiled_matches_eager(MoleculeRGCN(ground_tiny(path), hidden=8, layers=1))


def test_postgres_grounds_like_sqlite(postgres_server, tmp_path):
    pytest.importorskip("neuralogic", reason="the loader reads the data set shipped by neuralogic")
    rows = MutagenesisRows.from_neuralogic()
    url, path = postgres_server(), tmp_path / "m.sqlite"
    write_mutagenesis(url, rows=rows)
    write_mutagenesis(path, rows=rows)
    on_postgres, on_sqlite = ground_tiny(url, chunk_size=1_000), ground_tiny(path)
    assert on_postgres.num_atoms == 4893 and on_postgres.equals(on_sqlite)
    outputs = []
    for g in (on_postgres, on_sqlite):
        torch.manual_seed(0)
        outputs.append(MoleculeRGCN(g, hidden=4, layers=1)())
    assert torch.equal(*outputs)


@pytest.mark.slow
def test_mutagenesis_example_accuracy(tmp_path):
    pytest.importorskip("neuralogic")
    from examples.relational_db.mutagenesis import main
    assert main([str(tmp_path / "m.sqlite"), "--load"]) >= 0.85
