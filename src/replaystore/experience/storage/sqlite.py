"""SQLite storage: :class:`SqliteStorage`, the embedded default many processes can share.

One file holds the rows: metadata in indexed columns, the experience as JSON
text. Each process (and each fork) opens its own connection; writers take the
write lock for one short transaction per batch (``BEGIN IMMEDIATE``), readers
never block writers (WAL). Query conditions are compiled to SQL with bound
parameters (values are never written into SQL text) and payload paths are
read with ``json_extract``. Random selection is done on the filtered set of
sequence numbers with a seeded NumPy generator, so the same seed gives the same
sample on the same store.

A process killed at any instant leaves the file consistent: a batch is in it
whole or not at all (SQLite's journal), and ``PRAGMA integrity_check`` passes.
Committed batches survive a process crash; after a power loss the last few
commits may be missing (``synchronous=NORMAL``), but the file is not corrupt.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from replaystore.errors import SchemaError, StorageError
from replaystore.experience.decoding import FieldDecoders, as_decoders
from replaystore.experience.query import Condition, compile_sql
from replaystore.experience.rows import META_FIELDS, DataRow, decode_row, encode_batch
from replaystore.experience.storage.base import (
    Eviction,
    Storage,
    check_capacity,
    check_count,
    check_page,
    choose,
)
from replaystore.sampling import SeedLike, as_generator

__all__ = ["SqliteStorage"]

log = logging.getLogger("replaystore.experience.sqlite")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    task_name TEXT,
    agent_id TEXT,
    step INTEGER NOT NULL,
    execute_time REAL NOT NULL,
    pre_agent TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rows_task ON rows (task_id, seq);
CREATE INDEX IF NOT EXISTS rows_agent ON rows (agent_id, task_id);
CREATE INDEX IF NOT EXISTS rows_task_name ON rows (task_name, task_id);
CREATE INDEX IF NOT EXISTS rows_step ON rows (step);
CREATE INDEX IF NOT EXISTS rows_execute_time ON rows (execute_time);
CREATE INDEX IF NOT EXISTS rows_pre_agent ON rows (pre_agent);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    first_seq INTEGER NOT NULL,
    n_rows INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_first ON tasks (first_seq);
CREATE TABLE IF NOT EXISTS stats (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT OR IGNORE INTO stats (key, value) VALUES ('n_rows', 0);
"""

_COLUMNS = "seq, id, " + ", ".join(META_FIELDS) + ", data"
_INSERT = (
    "INSERT INTO rows (id, " + ", ".join(META_FIELDS) + ", data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_CHUNK = 500  # bound parameters per IN (...) list, well under SQLite's limit

# Connections inherited through fork(). They must never be used or closed in the
# child: closing one could checkpoint and delete the WAL under the parent's feet.
# Keeping a reference stops the garbage collector from closing them.
_INHERITED: list[sqlite3.Connection] = []


def _create_file(path: Path) -> None:
    """Create ``path`` empty (a valid empty SQLite database) with ``open()``'s mode, if missing.

    SQLite creates database files 0644 masked by the umask, whatever the umask
    allows (0644, not 0664, under umask 002); its ``-wal``/``-shm`` files copy the
    database file's mode. Creating the file first gives all three the mode any
    file we create gets: ``0o666 & ~umask``. An existing file keeps its mode.
    """
    if os.fspath(path) in ("", ":memory:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileExistsError:
        pass
    except OSError as exc:
        raise StorageError(f"cannot create SQLite store {path}: {exc}") from exc


class SqliteStorage(Storage):
    """Rows in one SQLite file, safe for many writer and reader processes.

    Args:
        path: the database file (created with its parent directory if missing).
        max_capacity: the most rows kept; ``None`` (default) for no limit.
        eviction: ``"task"`` (default) evicts whole oldest tasks; ``"row"`` single rows.
        timeout: seconds to wait for another process's write lock before failing.
        decoders: rebuild your types from the stored JSON on every read, e.g.
            ``{"state": Observation, "actions": ActionModel}`` (see
            :class:`~replaystore.experience.decoding.FieldDecoders`); default: rows
            come back with plain JSON values.

    Cost: ``add_batch`` of n rows is one transaction with n inserts (plus the
    evictions it causes); ``size()`` reads a counter; a query uses the indexes on
    the metadata columns (``task_id``, ``agent_id``, ``task_name``, ``step``,
    ``execute_time``, ``pre_agent``) and scans only for payload paths.

    Raises:
        StorageError: the file cannot be opened or is not a replaystore database.
        ConfigError: a bad ``max_capacity``, ``eviction`` or ``decoders``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_capacity: int | None = None,
        *,
        eviction: Eviction = "task",
        timeout: float = 60.0,
        decoders: FieldDecoders | Mapping[str, Any] | None = None,
    ) -> None:
        self.max_capacity, self.eviction = check_capacity(max_capacity, eviction)
        self.decoders: FieldDecoders | None = as_decoders(decoders)
        self.path = Path(path)
        self.timeout = float(timeout)
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._lock = threading.RLock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _create_file(self.path)
        self._connect()

    # ------------------------------------------------------------------ connection

    def __getstate__(self) -> dict[str, Any]:
        # Connections do not cross processes: a pickled storage reconnects on use.
        return {
            "path": self.path,
            "max_capacity": self.max_capacity,
            "eviction": self.eviction,
            "timeout": self.timeout,
            "decoders": self.decoders,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("decoders", None)
        self._conn = None
        self._pid = os.getpid()
        self._lock = threading.RLock()

    def _guard(self) -> threading.RLock:
        """This process's thread lock; after a fork, forget the parent's lock and connection."""
        if self._pid != os.getpid():
            if self._conn is not None:
                _INHERITED.append(self._conn)
                self._conn = None
            self._lock = threading.RLock()
            self._pid = os.getpid()
        return self._lock

    def _connect(self) -> sqlite3.Connection:
        self._guard()
        if self._conn is not None:
            return self._conn
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open SQLite store {self.path}: {exc}") from exc
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                conn.execute("PRAGMA synchronous = NORMAL")
                conn.execute("BEGIN IMMEDIATE")
                columns = [r[1] for r in conn.execute("PRAGMA table_info(rows)")]
                if columns and columns != ["seq", "id", *META_FIELDS, "data"]:
                    conn.execute("ROLLBACK")
                    conn.close()
                    raise StorageError(
                        f"{self.path} has a 'rows' table that is not a replaystore "
                        f"experience table (columns {columns})"
                    )
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("COMMIT")
                break
            except sqlite3.OperationalError as exc:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                busy = "locked" in str(exc) or "busy" in str(exc)
                if busy and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                conn.close()
                raise StorageError(f"cannot initialise SQLite store {self.path}: {exc}") from exc
            except sqlite3.DatabaseError as exc:
                conn.close()
                raise StorageError(f"{self.path} is not a usable SQLite store: {exc}") from exc
        if str(mode).lower() != "wal":
            log.warning("%s: journal_mode is %s, not WAL", self.path, mode)
        self._conn = conn
        return conn

    def close(self) -> None:
        """Close this process's connection (it reopens on the next call)."""
        with self._guard():
            if self._conn is not None:
                self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent snapshot for several statements."""
        with self._guard():
            conn = self._connect()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._guard():
            conn = self._connect()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # ------------------------------------------------------------------ writing

    def add(self, data: DataRow) -> None:
        self.add_batch([data], _where="data")

    def add_batch(self, data_batch: Sequence[DataRow], *, _where: str | None = None) -> None:
        encoded = encode_batch(data_batch, _where, decode=False)
        if not encoded:
            return
        params = [e.record() for e in encoded]
        with self._write() as conn:
            before = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'rows'").fetchone()
            conn.execute("SAVEPOINT batch")
            try:
                conn.executemany(_INSERT, params)
            except sqlite3.IntegrityError as exc:
                conn.execute("ROLLBACK TO batch")
                raise SchemaError(f"{self._duplicate(conn, encoded)}; batch not stored") from exc
            first = (before[0] if before else 0) + 1
            # Task bookkeeping: one row per task (first seq, count) for FIFO eviction.
            counts: dict[str, list[int]] = {}
            for offset, e in enumerate(encoded):
                entry = counts.setdefault(e.row.exp_meta.task_id, [first + offset, 0])
                entry[1] += 1
            conn.executemany(
                "INSERT INTO tasks (task_id, first_seq, n_rows) VALUES (?, ?, ?) "
                "ON CONFLICT (task_id) DO UPDATE SET n_rows = n_rows + excluded.n_rows",
                [(tid, s, n) for tid, (s, n) in counts.items()],
            )
            conn.execute("UPDATE stats SET value = value + ? WHERE key = 'n_rows'", (len(encoded),))
            self._enforce_capacity(conn)

    @staticmethod
    def _duplicate(conn: sqlite3.Connection, encoded: Sequence[Any]) -> str:
        seen: set[str] = set()
        for e in encoded:
            row_id = e.row.id
            if row_id in seen:
                return f"row id {row_id!r} appears twice in the batch"
            seen.add(row_id)
            if conn.execute("SELECT 1 FROM rows WHERE id = ?", (row_id,)).fetchone():
                return f"row id {row_id!r} is already stored"
        return "a row id is already stored"

    def _count(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT value FROM stats WHERE key = 'n_rows'").fetchone()[0])

    def _enforce_capacity(self, conn: sqlite3.Connection) -> None:
        cap = self.max_capacity
        if cap is None:
            return
        total = self._count(conn)
        removed = 0
        while total - removed > cap:
            excess = total - removed - cap
            if self.eviction == "row":
                doomed = conn.execute(
                    "SELECT task_id, count(*), max(seq) FROM "
                    "(SELECT task_id, seq FROM rows ORDER BY seq LIMIT ?) GROUP BY task_id",
                    (excess,),
                ).fetchall()
                cut = max(s for _, _, s in doomed)
                conn.execute("DELETE FROM rows WHERE seq <= ?", (cut,))
                for tid, n, _ in doomed:
                    self._shrink_task(conn, tid, n)
                removed += sum(n for _, n, _ in doomed)
                continue
            oldest = conn.execute(
                "SELECT task_id, n_rows FROM tasks ORDER BY first_seq LIMIT 2"
            ).fetchall()
            tid, n = oldest[0]
            if len(oldest) > 1:
                conn.execute("DELETE FROM rows WHERE task_id = ?", (tid,))
                conn.execute("DELETE FROM tasks WHERE task_id = ?", (tid,))
                removed += n
            else:  # one task alone exceeds the capacity: keep its newest rows
                conn.execute(
                    "DELETE FROM rows WHERE seq IN "
                    "(SELECT seq FROM rows WHERE task_id = ? ORDER BY seq LIMIT ?)",
                    (tid, excess),
                )
                self._shrink_task(conn, tid, excess)
                removed += excess
        if removed:
            conn.execute("UPDATE stats SET value = value - ? WHERE key = 'n_rows'", (removed,))

    @staticmethod
    def _shrink_task(conn: sqlite3.Connection, task_id: str, n: int) -> None:
        left = conn.execute("SELECT min(seq) FROM rows WHERE task_id = ?", (task_id,)).fetchone()[0]
        if left is None:
            conn.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))
        else:
            # first_seq stays the task's first row ever: tasks keep their age order.
            conn.execute("UPDATE tasks SET n_rows = n_rows - ? WHERE task_id = ?", (n, task_id))

    def clear(self) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM rows")
            conn.execute("DELETE FROM tasks")
            conn.execute("UPDATE stats SET value = 0 WHERE key = 'n_rows'")

    # ------------------------------------------------------------------ reading

    def _decode(self, records: list[tuple[Any, ...]]) -> list[DataRow]:
        rows = [decode_row(r[1], r[2:8], r[8]) for r in records]
        return rows if self.decoders is None else self.decoders.decode_rows(rows)

    def size(self, query_condition: Condition | None = None) -> int:
        with self._read() as conn:
            if query_condition is None:
                return self._count(conn)
            where, params = compile_sql(query_condition)
            sql = f"SELECT count(*) FROM rows WHERE {where}"
            return int(conn.execute(sql, params).fetchone()[0])

    def get_paginated(
        self, page: int, page_size: int, query_condition: Condition | None = None
    ) -> list[DataRow]:
        page, page_size = check_page(page, page_size)
        where, params = compile_sql(query_condition)
        with self._read() as conn:
            records = conn.execute(
                f"SELECT {_COLUMNS} FROM rows WHERE {where} ORDER BY seq LIMIT ? OFFSET ?",
                [*params, page_size, (page - 1) * page_size],
            ).fetchall()
        return self._decode(records)

    def get_all(self, query_condition: Condition | None = None) -> list[DataRow]:
        where, params = compile_sql(query_condition)
        with self._read() as conn:
            records = conn.execute(
                f"SELECT {_COLUMNS} FROM rows WHERE {where} ORDER BY seq", params
            ).fetchall()
        return self._decode(records)

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        return self.get_batch_by_task_ids([task_id])[task_id]

    def get_batch_by_task_ids(self, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        with self._read() as conn:
            return self._rows_of_tasks(conn, list(dict.fromkeys(task_ids)))

    def _rows_of_tasks(
        self, conn: sqlite3.Connection, task_ids: Sequence[str]
    ) -> dict[str, list[DataRow]]:
        """The rows of each task in ``task_ids`` (distinct), oldest first, in chunks."""
        out: dict[str, list[DataRow]] = {tid: [] for tid in task_ids}
        for start in range(0, len(task_ids), _CHUNK):
            chunk = list(task_ids[start : start + _CHUNK])
            records = conn.execute(
                f"SELECT {_COLUMNS} FROM rows WHERE task_id IN "
                f"({', '.join('?' * len(chunk))}) ORDER BY seq",
                chunk,
            ).fetchall()
            for row in self._decode(records):
                out[row.exp_meta.task_id].append(row)
        return out

    def _fetch_seqs(self, conn: sqlite3.Connection, seqs: Sequence[int]) -> list[DataRow]:
        by_seq: dict[int, DataRow] = {}
        for start in range(0, len(seqs), _CHUNK):
            chunk = list(seqs[start : start + _CHUNK])
            records = conn.execute(
                f"SELECT {_COLUMNS} FROM rows WHERE seq IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for rec, row in zip(records, self._decode(records), strict=True):
                by_seq[rec[0]] = row
        return [by_seq[s] for s in seqs if s in by_seq]

    def task_ids(self, query_condition: Condition | None = None) -> list[str]:
        with self._read() as conn:
            return self._task_ids(conn, query_condition)

    def _task_ids(self, conn: sqlite3.Connection, cond: Condition | None) -> list[str]:
        # Oldest task first, as every storage orders them: the same seed then picks
        # the same tasks from the same rows whichever storage holds them.
        if cond is None:
            sql, params = "SELECT task_id FROM tasks ORDER BY first_seq", []
        else:
            where, params = compile_sql(cond)
            sql = (
                "SELECT task_id FROM tasks WHERE task_id IN "
                f"(SELECT task_id FROM rows WHERE {where}) ORDER BY first_seq"
            )
        return [r[0] for r in conn.execute(sql, params)]

    def _pick_task_ids(
        self, conn: sqlite3.Connection, k: int, cond: Condition | None, rng: SeedLike
    ) -> list[str]:
        ids = self._task_ids(conn, cond)
        return [ids[i] for i in choose(len(ids), k, rng)]

    def sample_task_ids(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[str]:
        k = check_count(batch_size)
        with self._read() as conn:
            return self._pick_task_ids(conn, k, query_condition, rng)

    def sample_tasks(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> dict[str, list[DataRow]]:
        """Sample task ids and read their rows in one snapshot (no task vanishes between)."""
        k = check_count(batch_size)
        with self._read() as conn:
            return self._rows_of_tasks(conn, self._pick_task_ids(conn, k, query_condition, rng))

    def sample_rows(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[DataRow]:
        k = check_count(batch_size)
        where, params = compile_sql(query_condition)
        with self._read() as conn:
            if query_condition is None:
                picked = self._sample_all_seqs(conn, k, rng)
                if picked is not None:
                    return self._fetch_seqs(conn, picked)
            cursor = conn.execute(f"SELECT seq FROM rows WHERE {where} ORDER BY seq", params)
            seqs = np.fromiter((r[0] for r in cursor), dtype=np.int64)
            picked = seqs[choose(len(seqs), k, rng)].tolist()
            return self._fetch_seqs(conn, picked)

    def _sample_all_seqs(self, conn: sqlite3.Connection, k: int, rng: SeedLike) -> list[int] | None:
        """k distinct live seqs by rejection from [min, max] when live seqs are dense there.

        Cost O(k) index lookups instead of reading every seq; ``None`` when the
        range is sparse or k is a large part of the store (the caller reads all).
        """
        total = self._count(conn)
        # Two statements: SQLite answers a lone min() or max() from the index in O(log n).
        lo = conn.execute("SELECT min(seq) FROM rows").fetchone()[0]
        hi = conn.execute("SELECT max(seq) FROM rows").fetchone()[0]
        if lo is None or (hi - lo + 1) > 2 * total or 4 * k > total:
            return None
        gen = as_generator(rng)
        picked: dict[int, None] = {}
        while len(picked) < k:
            need = k - len(picked)
            cand = [int(c) for c in gen.integers(lo, hi + 1, size=2 * need + 8)]
            live: set[int] = set()
            for start in range(0, len(cand), _CHUNK):
                chunk = cand[start : start + _CHUNK]
                marks = ", ".join("?" * len(chunk))
                live.update(
                    r[0]
                    for r in conn.execute(f"SELECT seq FROM rows WHERE seq IN ({marks})", chunk)
                )
            for c in cand:
                if c in live and c not in picked:
                    picked[c] = None
                    if len(picked) == k:
                        break
        return list(picked)

    def integrity_check(self) -> str:
        """``PRAGMA integrity_check`` of the file: ``"ok"`` when it is sound."""
        with self._read() as conn:
            return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
