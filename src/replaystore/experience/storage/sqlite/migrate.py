"""On-disk format upgrades of the SQLite store, and the rebuilding of its derived tables.

:func:`upgrade` brings a file of an older format (1 or 2) to
:data:`~replaystore.experience.storage.sqlite.schema.FORMAT` when the store opens it,
in the opening write transaction (a crash leaves the old file as it was), and
refuses a file of a newer format. A file of this format whose derived tables
were dropped by hand gets them back: :func:`rebuild_keys` recomputes
``task_keys`` from the rows (eviction also uses it for the tasks it shrinks),
:func:`rebuild_ids` keys every row's id in ``row_ids``.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

from replaystore.errors import StorageError
from replaystore.experience.storage.sqlite.schema import (
    COLUMNS,
    FORMAT,
    ID_HASH_SQL,
    ID_TABLES,
    KEYED,
    SCHEMA,
    STATS,
)

__all__ = ["rebuild_ids", "rebuild_keys", "upgrade"]

log = logging.getLogger("replaystore.experience.sqlite")


def upgrade(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the existing file ``path`` to :data:`FORMAT`, inside the caller's write transaction.

    The ``rows`` table of a format 1 or 2 file is copied into one of this
    format (same seqs; no unique index on ``id``) and ``row_ids`` is built from
    it. Format 1 (or a file with no ``stats`` row ``format``) also gets its
    ``tasks`` table without ``n_rows``, ``task_keys`` built if missing, and its
    counters turned into ``high_water``/``dead``. One transaction: a crash
    leaves the old file as it was. Costs a copy of the table (seconds per
    million rows), once. A file of a newer format is refused.
    """
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    fmt = 1
    if "stats" in tables:
        found = conn.execute("SELECT value FROM stats WHERE key = 'format'").fetchone()
        fmt = int(found[0]) if found else 1
    if fmt == FORMAT:
        _restore_derived(conn, tables)
        return
    if fmt > FORMAT:
        raise StorageError(
            f"{path} is an experience store of format {fmt}, written by a newer "
            f"replaystore (this one reads format {FORMAT}); upgrade replaystore to open it"
        )
    start = time.perf_counter()
    live = _copy_tables(conn, fmt, tables)
    if "task_keys" not in tables:
        rebuild_keys(conn, None)
    rebuild_ids(conn)
    log.info(
        "%s: experience store upgraded from format %d to %d (%d rows, %.1f s)",
        path,
        fmt,
        FORMAT,
        live,
        time.perf_counter() - start,
    )


def _restore_derived(conn: sqlite3.Connection, tables: set[str]) -> None:
    """In a file of this format: rebuild ``task_keys`` and the id tables if dropped by hand."""
    missing = {"task_keys", *ID_TABLES} - tables
    if missing:  # derived data, rebuilt
        for statement in SCHEMA.split(";"):
            conn.execute(statement)
        if "task_keys" in missing:
            rebuild_keys(conn, None)
        if missing != {"task_keys"}:
            rebuild_ids(conn)


def _copy_tables(conn: sqlite3.Connection, fmt: int, tables: set[str]) -> int:
    """Copy a format ``fmt`` file's ``rows`` (and format 1's ``tasks``) into tables of
    this format, and write its ``stats``; the number of rows (``tables``: the file's)."""
    assigned = int(conn.execute("SELECT coalesce(max(seq), 0) FROM rows").fetchone()[0])
    if "sqlite_sequence" in tables:  # AUTOINCREMENT's counter: seqs of deleted rows too
        found = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'rows'").fetchone()
        assigned = max(assigned, int(found[0]) if found else 0)
    live = int(conn.execute("SELECT count(*) FROM rows").fetchone()[0])
    renamed = ["rows"] if fmt == 2 else ["rows", "tasks"]
    for index in ("rows_task", "tasks_first")[: len(renamed)]:  # names the new tables reuse
        conn.execute(f"DROP INDEX IF EXISTS {index}")
    for table in renamed:
        if table in tables:
            conn.execute(f"ALTER TABLE {table} RENAME TO {table}_format{fmt}")
    if fmt == 1:
        conn.execute("DROP TABLE IF EXISTS stats")  # its counters are recomputed above
    for statement in SCHEMA.split(";"):
        conn.execute(statement)
    conn.execute(
        f"INSERT INTO rows ({COLUMNS}) SELECT {COLUMNS} FROM rows_format{fmt} ORDER BY seq"
    )
    conn.execute(f"DROP TABLE rows_format{fmt}")
    if fmt == 1:
        if "tasks" in tables:
            conn.execute(
                "INSERT INTO tasks (task_id, first_seq) "
                "SELECT task_id, first_seq FROM tasks_format1"
            )
            conn.execute("DROP TABLE tasks_format1")
        else:
            conn.execute(
                "INSERT INTO tasks (task_id, first_seq) "
                "SELECT task_id, min(seq) FROM rows GROUP BY task_id"
            )
        conn.execute(STATS, (FORMAT, assigned, assigned - live, 0))
    else:
        conn.execute("UPDATE stats SET value = ? WHERE key = 'format'", (FORMAT,))
        conn.execute(STATS, (FORMAT, 0, 0, 0))  # adds 'merged' only
    return live


def rebuild_ids(conn: sqlite3.Connection) -> None:
    """Key every stored row's id in ``row_ids`` afresh (an upgrade, or tables dropped)."""
    for table in ID_TABLES:
        conn.execute(f"DELETE FROM {table}")
    conn.execute(
        f"INSERT INTO row_ids (h, seq) SELECT {ID_HASH_SQL}(id), seq FROM rows ORDER BY 1, 2"
    )
    conn.execute(
        "UPDATE stats SET value = coalesce((SELECT max(seq) FROM rows), 0) WHERE key = 'merged'"
    )


def rebuild_keys(conn: sqlite3.Connection, task_id: str | None) -> None:
    """Recompute ``task_keys`` for one task (``None``: every task) from its rows."""
    where, params = ("", []) if task_id is None else ("WHERE r.task_id = ?", [task_id])
    conn.execute(
        "DELETE FROM task_keys" + ("" if task_id is None else " WHERE task_id = ?"), params
    )
    for field in KEYED:
        conn.execute(
            "INSERT OR IGNORE INTO task_keys (field, value, first_seq, task_id) "
            f"SELECT DISTINCT ?, r.{field}, t.first_seq, r.task_id FROM rows AS r "
            f"JOIN tasks AS t ON t.task_id = r.task_id {where} "
            f"{'AND' if where else 'WHERE'} r.{field} IS NOT NULL",
            [field, *params],
        )
