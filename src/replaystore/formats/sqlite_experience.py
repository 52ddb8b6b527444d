"""A SQLite experience store opened read-only: the connection and the summary.

:class:`~replaystore.experience.storage.sqlite.SqliteStorage` writes the file;
``replaystore stats`` and the viewer read it through :func:`open_readonly`:

* ``mode=ro``: nothing is ever written to the database file, and opening it
  creates no tables (``SqliteStorage`` would create them in any SQLite file and
  switch its journal to WAL).
* never ``immutable=1``: SQLite's documentation says an immutable database that
  changes may give wrong results or ``SQLITE_CORRUPT``, and a writer may start at
  any time. Each read sees every row committed before it, so a viewer shows new
  rows on its next page load.

A store in WAL mode (every store ``SqliteStorage`` writes) is read through
SQLite's shared-memory index: a reader creates ``<file>-wal`` and ``<file>-shm``
beside the file when no writer has (SQLite's own side files; the database file
is untouched). In a directory this user cannot write, opening such a store with
no ``-shm`` file fails with a :class:`~replaystore.errors.StorageError` saying so.

A row is found by its id through the store's id tables (:data:`ID_TABLES`, keyed
by the id's 64-bit hash, :func:`~replaystore.experience.rows.id_hash`): the SQL
of :func:`id_seqs_sql` selects the candidate rows' seqs, for the writer and the
viewer alike.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from replaystore.errors import StorageError
from replaystore.formats.experience_summary import summarise_rows

__all__ = [
    "ID_TABLES",
    "SQLITE_MAGIC",
    "SUMMARY_COLUMNS",
    "id_seqs_sql",
    "is_sqlite_file",
    "open_readonly",
    "read_summary",
]

#: The first 16 bytes of every SQLite database file.
SQLITE_MAGIC = b"SQLite format 3\x00"

#: The ``rows`` columns a summary reads (a store also has ``seq``, ``id`` and ``data``).
SUMMARY_COLUMNS = ("task_id", "task_name", "agent_id", "step", "execute_time")

#: The tables that key a format 3 store's row ids by the id's hash, ``(h, seq)``:
#: ``row_ids_new`` (the ids stored since the last merge, one seq a hash) and
#: ``row_ids`` (the rest). Older files have neither (a unique index on ``rows.id``).
ID_TABLES = ("row_ids_new", "row_ids")

_WAL_HEADER_OFFSET = 18  # file format write/read version bytes: 2 means WAL


def id_seqs_sql(count: int) -> str:
    """SQL selecting the seqs keyed under ``count`` id hashes, bound twice (one list per
    id table): a superset of the rows with those ids (hashes can collide), so whoever
    uses it compares ``rows.id`` too. The writer and the viewer's reader both use it."""
    marks = ", ".join("?" * count)
    return " UNION ALL ".join(f"SELECT seq FROM {t} WHERE h IN ({marks})" for t in ID_TABLES)


def is_sqlite_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file that starts with SQLite's magic bytes."""
    try:
        with open(path, "rb") as handle:
            return handle.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except (IsADirectoryError, FileNotFoundError):
        return False


def _is_wal(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(_WAL_HEADER_OFFSET)
        return handle.read(2) == b"\x02\x02"


def open_readonly(
    path: str | os.PathLike[str], columns: Iterable[str] = SUMMARY_COLUMNS
) -> sqlite3.Connection:
    """Connect to the experience store ``path`` read-only (``mode=ro``, never ``immutable``).

    Args:
        path: the SQLite file.
        columns: columns the ``rows`` table must have (default: those a summary reads).

    Returns:
        A connection usable from any thread (``check_same_thread=False``; guard it
        with a lock). Every statement outside a transaction sees the rows committed
        before it.

    Raises:
        StorageError: the file cannot be opened read-only (the message says why;
            a WAL store in a directory this user cannot write names that), is no
            SQLite file, or has no ``rows`` table with ``columns``.
    """
    path, columns = Path(path), tuple(columns)
    try:
        conn = sqlite3.connect(
            f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open SQLite file {path} read-only: {exc}") from None
    try:
        found = {r[1] for r in conn.execute("PRAGMA table_info(rows)")}
    except sqlite3.Error as exc:
        conn.close()
        raise _open_error(path, exc) from None
    missing = [c for c in columns if c not in found]
    if missing:
        conn.close()
        raise StorageError(
            f"{path} is a SQLite database but not a replaystore experience store (no 'rows' "
            f"table with {', '.join(columns)})"
        )
    return conn


def _open_error(path: Path, exc: sqlite3.Error) -> StorageError:
    shm = Path(f"{path}-shm")
    if isinstance(exc, sqlite3.OperationalError) and _is_wal(path) and not shm.is_file():
        return StorageError(
            f"cannot open SQLite store {path} read-only: it is in WAL mode, and a reader "
            f"needs SQLite's shared-memory file {shm.name} beside it, which cannot be "
            f"created ({exc}); make {path.parent} writable for this user, or read a copy "
            "of the file"
        )
    return StorageError(f"cannot read SQLite file {path}: {exc}")


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Rows, tasks, task names, agents, step and time ranges of the store ``path``.

    The same keys as :func:`replaystore.formats.postgres_experience.read_summary`
    (less the URL and schema): ``path``, ``size_bytes``, ``rows``, ``tasks``,
    ``task_names``, ``agents``, ``steps`` (``[min, max]``), ``execute_time``
    (``[first, last]``, ISO 8601 UTC) and ``per_agent`` (``agent_id``, ``rows``,
    ``tasks``; most rows first).

    Raises:
        StorageError: as :func:`open_readonly`, or a read fails (a damaged file).

    Cost: one read transaction: a scan of ``rows`` for the counts and one grouped
    by agent.
    """
    path = Path(path)
    conn = open_readonly(path)
    try:
        with conn:  # one snapshot for both queries
            conn.execute("BEGIN")
            counts = summarise_rows(conn)
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"cannot read SQLite file {path}: {exc}") from None
    finally:
        conn.close()
    return {"path": str(path.resolve()), "size_bytes": path.stat().st_size, **counts}
