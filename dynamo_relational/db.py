"""Read a relational model's structure out of a SQL database: safely, with clear errors, in bounded memory.

A relational model is *grounded* by queries: which atoms exist, which bonds join
them, which molecule each atom belongs to. This module is the part of that
which does not depend on the schema:

* :func:`open_database` opens a SQLite file (the default: a path) or any
  SQLAlchemy URL (``postgresql+psycopg://user@host/db``). It opens **read-only**
  unless ``write=True``: SQLite through ``mode=ro``, PostgreSQL through
  ``default_transaction_read_only``; a file that does not exist is an error,
  never a new empty database.
* :class:`Relation` declares what a grounding reads from one table (columns,
  key, references); :meth:`Database.validate` checks a database against such
  declarations with SQL (missing table or column, empty table, NULL, duplicate
  key, a reference to a missing row) and raises :class:`DatabaseError` naming
  the table, the column and the row.
* :meth:`Database.stream` runs a query with a server-side cursor
  (``yield_per``) and yields it in chunks, with a progress bar, so the rows read
  never sit in memory all at once.

Needs the ``db`` extra: ``pip install 'dynamo-relational[db]'`` (SQLAlchemy,
psycopg, tqdm).
"""
from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import RelationalError

try:
    import sqlalchemy as sa
    from sqlalchemy.engine import URL, Engine, Row
    from tqdm.auto import tqdm
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"dynamo_relational.db needs the 'db' extra ({exc.name} is missing): "
                      "pip install 'dynamo-relational[db]'") from exc

__all__ = ["DatabaseError", "Relation", "Database", "open_database", "DEFAULT_CHUNK_SIZE"]

#: rows fetched per round trip by :meth:`Database.stream`
DEFAULT_CHUNK_SIZE = 10_000


class DatabaseError(RelationalError):
    """The database cannot be opened, or does not hold what the grounding reads.

    The message names the database, and the table, column and row at fault."""


@dataclass(frozen=True)
class Relation:
    """What a grounding reads from one table.

    ``columns`` must exist and hold no NULL; ``key`` (a column, or None) must be
    unique and names rows in error messages (without a key, a row is named by
    its ``columns``); ``references`` maps a column to the ``"table.column"`` it
    must point to.
    """
    name: str
    columns: tuple[str, ...]
    key: str | None = None
    references: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        missing = [c for c in (self.key, *self.references) if c is not None and c not in self.columns]
        if missing:
            raise ValueError(f"Relation {self.name!r}: {missing} must be listed in columns")


class Database:
    """An open database (see :func:`open_database`); a context manager that disposes the engine."""

    def __init__(self, engine: Engine, url: str, writable: bool):
        self.engine, self.url, self.writable = engine, url, writable
        self._tables: dict[str, sa.Table] = {}

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.url!r}{', writable' if self.writable else ''})"

    # ---- schema -------------------------------------------------------------------------------
    def table(self, name: str) -> sa.Table:
        """The reflected table ``name``; a :class:`DatabaseError` listing the tables if there is none."""
        if name not in self._tables:
            names = sa.inspect(self.engine).get_table_names()
            if name not in names:
                raise DatabaseError(f"{self.url}: table {name!r} not found "
                                    f"(tables: {', '.join(sorted(names)) or 'none'})")
            self._tables[name] = sa.Table(name, sa.MetaData(), autoload_with=self.engine)
        return self._tables[name]

    def column(self, table: str, name: str) -> sa.Column:
        """Column ``table.name``; a :class:`DatabaseError` listing the table's columns if there is none."""
        columns = self.table(table).c
        if name not in columns:
            raise DatabaseError(f"{self.url}: column {table}.{name} not found "
                                f"(columns of {table!r}: {', '.join(columns.keys())})")
        return columns[name]

    def validate(self, relations: Sequence[Relation]) -> None:
        """Check the database against ``relations``; raise :class:`DatabaseError` at the first fault.

        In order: every table and column exists; no table is empty; keys are
        unique; no NULL in a read column; every reference finds its row. All
        checks run as SQL (``LIMIT 1`` queries), so memory does not grow with
        the tables."""
        for rel in relations:
            for name in rel.columns:
                self.column(rel.name, name)
            for name, target in rel.references.items():
                table, _, col = target.partition(".")
                self.column(table, col)
        with self.engine.connect() as conn:
            for rel in relations:
                self._check_relation(conn, rel)
            for rel in relations:
                for name, target in rel.references.items():
                    self._check_reference(conn, rel, name, *target.split("."))

    def _row_name(self, rel: Relation, row: Row) -> str:
        if rel.key is not None and row._mapping[rel.key] is not None:
            return f"row {rel.key}={row._mapping[rel.key]!r}"
        return "row (" + ", ".join(f"{c}={row._mapping[c]!r}" for c in rel.columns) + ")"

    def _check_relation(self, conn: sa.Connection, rel: Relation) -> None:
        table = self.table(rel.name)
        cols = [table.c[c] for c in rel.columns]
        if conn.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first() is None:
            raise DatabaseError(f"{self.url}: table {rel.name!r} is empty")
        if rel.key is not None:
            key = table.c[rel.key]
            dup = conn.execute(sa.select(key).where(key.is_not(None)).group_by(key)
                               .having(sa.func.count() > 1).limit(1)).first()
            if dup is not None:
                raise DatabaseError(f"{self.url}: {rel.name}.{rel.key} = {dup[0]!r} is not unique "
                                    f"(several rows of {rel.name!r} have it)")
        row = conn.execute(sa.select(*cols).where(sa.or_(*(c.is_(None) for c in cols))).limit(1)).first()
        if row is not None:
            null = next(c for c in rel.columns if row._mapping[c] is None)
            raise DatabaseError(f"{self.url}: {rel.name}.{null} is NULL in {self._row_name(rel, row)}")

    def _check_reference(self, conn: sa.Connection, rel: Relation, name: str, target: str,
                         target_col: str) -> None:
        table = self.table(rel.name)
        parent = self.table(target).alias("parent")
        ref = parent.c[target_col]
        row = conn.execute(sa.select(*(table.c[c] for c in rel.columns))
                           .select_from(table.outerjoin(parent, table.c[name] == ref))
                           .where(ref.is_(None)).limit(1)).first()
        if row is not None:
            raise DatabaseError(f"{self.url}: {rel.name}.{name} = {row._mapping[name]!r} in "
                                f"{self._row_name(rel, row)} references a missing row of {target!r} "
                                f"(no {target}.{target_col} = {row._mapping[name]!r})")

    # ---- reading ------------------------------------------------------------------------------
    def scalars(self, statement: sa.Select) -> list:
        """The first column of a (small) query's result, as a list."""
        with self.engine.connect() as conn:
            return list(conn.execute(statement).scalars())

    def count(self, statement: sa.Select) -> int:
        """Number of rows ``statement`` returns (counted by the database)."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(statement.subquery())).scalar_one()

    def stream(self, statement: sa.Select, *, chunk_size: int = DEFAULT_CHUNK_SIZE, desc: str | None = None,
               progress: bool | None = None) -> Iterator[Sequence[Row]]:
        """Yield the rows of ``statement`` in chunks of at most ``chunk_size``.

        The query runs with ``yield_per`` (a server-side cursor on PostgreSQL,
        incremental ``fetchmany`` on SQLite): only one chunk of rows is held at
        a time. ``progress`` shows a tqdm bar over the row count (None: only on
        a terminal)."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        total = self.count(statement) if progress is not False else None
        with self.engine.connect() as conn, \
                tqdm(total=total, desc=desc, unit=" rows", disable=None if progress is None else not progress) as bar:
            result = conn.execution_options(yield_per=chunk_size).execute(statement)
            for chunk in result.partitions():
                bar.update(len(chunk))
                yield chunk


def open_database(target: str | os.PathLike | URL, *, write: bool = False) -> Database:
    """Open a database: a SQLite file path, or a SQLAlchemy URL (``sqlite:///path``,
    ``postgresql+psycopg://user:pw@host:port/name``, ``...?host=/socket/dir``).

    Read-only unless ``write`` (SQLite: ``mode=ro``; PostgreSQL:
    ``default_transaction_read_only``); with ``write`` a SQLite file is created
    if needed. Connects once, so a wrong URL, a missing file or a refused
    connection is a :class:`DatabaseError` here, naming the URL (password hidden).
    """
    if isinstance(target, os.PathLike) or (isinstance(target, str) and "://" not in target):
        url = URL.create("sqlite", database=os.fspath(target))
    else:
        try:
            url = sa.make_url(target)
        except (sa.exc.ArgumentError, ValueError) as exc:
            hidden = re.sub(r"//[^/@]*@", "//***@", str(target))      # credentials stay out of messages
            raise DatabaseError(f"not a database URL or SQLite path: {hidden!r} ({exc})") from None
    shown = url.render_as_string(hide_password=True)
    try:
        if url.get_backend_name() == "sqlite":
            engine = _sqlite_engine(url, write, shown)
        else:
            connect_args = {}
            if url.get_backend_name() == "postgresql" and not write:
                connect_args["options"] = "-c default_transaction_read_only=on"
            engine = sa.create_engine(url, connect_args=connect_args)
        with engine.connect():
            pass
    except sa.exc.NoSuchModuleError as exc:
        raise DatabaseError(f"unknown database kind in URL {shown}: {exc}") from None
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise DatabaseError(f"cannot use database URL {shown}: {exc}") from None
    except sa.exc.DBAPIError as exc:
        raise DatabaseError(f"cannot connect to {shown}: {str(exc.orig).strip()}") from None
    return Database(engine, shown, write)


def _sqlite_engine(url: URL, write: bool, shown: str) -> Engine:
    """A SQLite engine on the file of ``url``; read-only (``mode=ro``) unless ``write``."""
    if not url.database or url.database == ":memory:":
        raise DatabaseError(f"{shown}: give a SQLite file, not an in-memory database (it would be empty)")
    path = Path(url.database).expanduser().resolve()
    if not write and not path.is_file():
        raise DatabaseError(f"SQLite database file not found: {path}")
    uri = path.as_uri() + ("?mode=rwc" if write else "?mode=ro")
    return sa.create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False))
