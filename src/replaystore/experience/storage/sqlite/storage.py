"""The SQLite storage class: :class:`SqliteStorage`, its connections, writes and reads.

What the file holds, and why, is in the package docstring
(:mod:`replaystore.experience.storage.sqlite`); the tables and the statements
that write them are in :mod:`~replaystore.experience.storage.sqlite.schema`,
conditions become SQL in :mod:`~replaystore.experience.storage.sqlite.filters`,
older files are upgraded on open by
:mod:`~replaystore.experience.storage.sqlite.migrate`, and each writing process
checkpoints the log on a thread of its own
(:mod:`~replaystore.experience.storage.sqlite.checkpointer`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from replaystore.errors import ConfigError, SchemaError, StorageError
from replaystore.experience.decoding import FieldDecoders, as_decoders
from replaystore.experience.query import Condition
from replaystore.experience.rows import (
    META_FIELDS,
    DataRow,
    ExpMeta,
    decode_experiences,
    distinct_pairs,
    encode_flat,
    id_hash,
    id_hashes,
)
from replaystore.experience.storage._fork import fork_check_lock
from replaystore.experience.storage.base import (
    Eviction,
    PicklesSettings,
    Storage,
    check_capacity,
    check_count,
    check_page,
    choose,
)
from replaystore.experience.storage.sqlite.checkpointer import Checkpointer, keep_inherited
from replaystore.experience.storage.sqlite.filters import firsts_sql, task_ids_sql, where_sql
from replaystore.experience.storage.sqlite.migrate import rebuild_keys, upgrade
from replaystore.experience.storage.sqlite.schema import (
    ASSIGNED,
    ASSIGNED_MERGED,
    BOOKED_TRIGGER,
    BOOKED_VIEW,
    CHUNK_ROWS,
    COLUMNS,
    FORMAT,
    ID_HASH_SQL,
    ID_TABLES,
    INSERT_BOOKED,
    INSERT_IDS,
    INSERT_ONE,
    INSERT_ROWS,
    KEY_INSERTS,
    KEYED,
    ROW_PARAMS,
    ROW_TRIGGER,
    ROW_VIEW,
    SCHEMA,
    SLOT,
    STATS,
    TASK_INSERTS,
)
from replaystore.formats.sqlite_experience import id_seqs_sql
from replaystore.sampling import SeedLike, as_generator

__all__ = ["SqliteStorage"]

log = logging.getLogger("replaystore.experience.sqlite")

# The recent ids are merged into ``row_ids`` once this many seqs have been handed
# out since the last merge (see "Row ids" in the package docstring).
_MERGE_ROWS = 16384
_SYNCHRONOUS = ("NORMAL", "FULL")
# Pages before a writer checkpoints on commit itself (SQLite's auto-checkpoint): only
# when the background checkpoints (see Checkpointer) have fallen behind (64 MiB).
_WAL_AUTOCHECKPOINT = 16384

_CHUNK = 500  # bound parameters per IN (...) list, well under SQLite's limit

# SQLite's primary result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
_DAMAGED_CODES = (11, 26)


# Times an I/O error while a connection sets the store up is retried with a new
# connection (20, 40, 80 ms apart) before it is reported.
_OPEN_IO_RETRIES = 3


def _is_io_error(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` is SQLite's ``SQLITE_IOERR`` (any of its extended codes)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == 10
    return "disk I/O error" in str(exc)


def _is_damage(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` reports a damaged or foreign file (not a lock, constraint or SQL error)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _DAMAGED_CODES
    text = str(exc)
    return "malformed" in text or "not a database" in text


def _damaged(path: Path, exc: sqlite3.Error) -> StorageError:
    return StorageError(
        f"SQLite store {path} is damaged ({exc}): check it with "
        f"`sqlite3 {path} 'PRAGMA integrity_check'` (or SqliteStorage.integrity_check()); "
        "restore it from a copy, or salvage its rows with the sqlite3 shell's .recover"
    )


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


class SqliteStorage(PicklesSettings, Storage):
    """Rows in one SQLite file, safe for many writer and reader processes.

    Args:
        path: the database file (created with its parent directory if missing); a relative
            path is taken from the working directory at construction (``.path`` is absolute).
        max_capacity: the most rows kept; ``None`` (default) for no limit.
        eviction: ``"task"`` (default) evicts whole oldest tasks; ``"row"`` single rows.
        timeout: seconds to wait for another process's write lock before failing.
        decoders: rebuild your types from the stored JSON on every read, e.g.
            ``{"state": Observation, "actions": ActionModel}`` (see
            :class:`~replaystore.experience.decoding.FieldDecoders`); default: rows
            come back with plain JSON values.
        synchronous: ``"NORMAL"`` (default): a commit survives a crash of the
            process, not necessarily a power loss; no fsync per commit.
            ``"FULL"``: every commit is fsynced and survives a power loss too
            (slower one-row commits). See the package docstring.

    Cost: ``add_batch`` of n rows is one transaction: multi-row inserts of the
    rows and of their id keys, one look-up per id, one insert-if-new per task
    and one per (task, agent) or (task, task name) pair, the payload JSON
    encoded once per row (about 8-10 us per row with AWorld's pydantic
    payloads on a 2-core VM, random or sequential ids alike). ``add`` is one SQL
    statement (a per-connection view whose trigger does the same inserts; for a
    task, agent and task name this connection stored a row of before, the
    row's and its id's inserts alone, guarded against another connection's
    deletes since) and one commit per call, about 40-50 us with
    ``synchronous="NORMAL"``; prefer ``add_batch`` for bulk loads.
    ``size()`` is two index lookups. A condition with ``eq``/``in_`` on ``task_id``,
    ``agent_id`` or ``task_name`` reads only the rows of the tasks that can
    match (see :meth:`query_plan`); other conditions scan the table once.

    Raises:
        StorageError: the file cannot be opened or is not a replaystore database (an I/O
            error while a connection sets the store up is retried on a new connection,
            three times, before it is reported).
        ConfigError: a bad ``max_capacity``, ``eviction``, ``decoders`` or ``synchronous``.
    """

    # Connections do not cross processes: a pickled storage reconnects on use.
    _pickled = ("path", "max_capacity", "eviction", "timeout", "decoders", "synchronous")
    _pickle_defaults: ClassVar[Mapping[str, Any]] = {"decoders": None, "synchronous": "NORMAL"}

    def __init__(
        self,
        path: str | os.PathLike[str],
        max_capacity: int | None = None,
        *,
        eviction: Eviction = "task",
        timeout: float = 60.0,
        decoders: FieldDecoders | Mapping[str, Any] | None = None,
        synchronous: str = "NORMAL",
    ) -> None:
        self.max_capacity, self.eviction = check_capacity(max_capacity, eviction)
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS:
            raise ConfigError(f"synchronous must be 'NORMAL' or 'FULL', got {synchronous!r}")
        self.synchronous = synchronous.upper()
        self.decoders: FieldDecoders | None = as_decoders(decoders)
        # Absolute: every connection (reconnections, forks, the checkpoint thread) must
        # open this file whatever the working directory is by then.
        self.path = Path(path).absolute()
        self.timeout = float(timeout)
        self._reset_local()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _create_file(self.path)
        self._connect()

    # ------------------------------------------------------------------ connection

    def _reset_local(self) -> None:
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: Checkpointer | None = None
        self._wal = False
        # One-row stores' bookings (see _book): (task_id, agent_id, task_name) of
        # rows this connection stored, whose task and keys are in the file as of
        # data_version _booked_version.
        self._booked: set[tuple[str, str | None, str | None]] = set()
        self._booked_version: int | None = None
        self._pid = os.getpid()
        self._lock = threading.RLock()

    def _guard(self) -> threading.RLock:
        """This process's thread lock; after a fork, forget the parent's lock and connection.

        The swap runs under the fork-check lock, checked again there: of several threads
        of a forked child arriving at once, one swaps and the others take its lock.
        """
        if self._pid != os.getpid():
            with fork_check_lock():
                if self._pid != os.getpid():
                    if self._conn is not None:
                        keep_inherited(self._conn)
                        self._conn = None
                    self._checkpointer = None  # the parent's, orphaned at the fork
                    self._lock = threading.RLock()
                    self._pid = os.getpid()  # last: a thread seeing it finds the new lock
        return self._lock

    def _connect(self) -> sqlite3.Connection:
        self._guard()
        if self._conn is not None:
            return self._conn
        conn = self._open_connection()
        deadline = time.monotonic() + self.timeout
        io_retries = 0
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                conn.execute(f"PRAGMA synchronous = {self.synchronous}")
                conn.execute("BEGIN IMMEDIATE")
                columns = [r[1] for r in conn.execute("PRAGMA table_info(rows)")]
                if columns and columns != ["seq", "id", *META_FIELDS, "data"]:
                    conn.execute("ROLLBACK")
                    conn.close()
                    raise StorageError(
                        f"{self.path} has a 'rows' table that is not a replaystore "
                        f"experience table (columns {columns})"
                    )
                if columns:
                    try:
                        upgrade(conn, self.path)  # no-op for a file of this version's format
                    except StorageError:  # a newer format: leave it untouched
                        conn.execute("ROLLBACK")
                        conn.close()
                        raise
                else:
                    for statement in SCHEMA.split(";"):
                        conn.execute(statement)
                    conn.execute(STATS, (FORMAT, 0, 0, 0))
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
                if _is_io_error(exc) and io_retries < _OPEN_IO_RETRIES:
                    # Seen once in CI: "disk I/O error" on the first PRAGMA of one of four
                    # processes opening the same store at once (cause not found). Nothing
                    # is written before that point, so a fresh connection may try again.
                    time.sleep(0.02 * 2**io_retries)
                    io_retries += 1
                    conn = self._open_connection()
                    continue
                raise StorageError(f"cannot initialise SQLite store {self.path}: {exc}") from exc
            except sqlite3.DatabaseError as exc:
                conn.close()
                if _is_damage(exc):
                    raise _damaged(self.path, exc) from exc
                raise StorageError(f"{self.path} is not a usable SQLite store: {exc}") from exc
        self._wal = str(mode).lower() == "wal"
        if not self._wal:
            log.warning("%s: journal_mode is %s, not WAL", self.path, mode)
        conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT}")
        for statement in (ROW_VIEW, ROW_TRIGGER, BOOKED_VIEW, BOOKED_TRIGGER):
            conn.execute(statement)
        self._booked.clear()
        self._booked_version = None
        self._conn = conn
        return conn

    def _open_connection(self) -> sqlite3.Connection:
        """A new connection to the file, with the busy timeout and the id-hash function."""
        try:
            conn = sqlite3.connect(
                self.path, timeout=self.timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open SQLite store {self.path}: {exc}") from exc
        conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
        conn.create_function(ID_HASH_SQL, 1, id_hash, deterministic=True)
        return conn

    def close(self) -> None:
        """Close this process's connection and stop its background checkpoints (both
        start again with the next call)."""
        with self._guard():
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
            if self._conn is not None:
                self._conn.close()
            self._conn = None

    def _committed(self) -> None:
        """After a commit, under the thread lock: wake the background checkpointer
        (started by this process's first commit; see :class:`Checkpointer`)."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            if not self._wal:
                return
            try:
                checkpointer = Checkpointer(self.path, self._lock)
            except RuntimeError as exc:  # no thread to be had: the commit stands regardless
                log.warning(
                    "%s: no background checkpoints (%s); writers checkpoint every %d pages",
                    self.path,
                    exc,
                    _WAL_AUTOCHECKPOINT,
                )
                self._wal = False  # not tried again until the connection is reopened
                return
            self._checkpointer = checkpointer
            weakref.finalize(self, checkpointer.stop)
        checkpointer.poke()

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent snapshot for several statements.

        A damaged file (corrupt pages) raises StorageError naming it (see _damaged).
        """
        with self._guard():
            conn = self._connect()
            try:
                conn.execute("BEGIN")
                try:
                    yield conn
                finally:
                    conn.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                if _is_damage(exc):
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise _damaged(self.path, exc) from exc
                raise

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._guard():
            conn = self._connect()
            self._booked.clear()  # this write may delete rows (see _book)
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield conn
                except BaseException:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                self._committed()
            except sqlite3.DatabaseError as exc:
                if _is_damage(exc):
                    raise _damaged(self.path, exc) from exc
                raise

    # ------------------------------------------------------------------ writing

    def add(self, data: DataRow) -> None:
        # add_batch([data]) in one statement. Unbounded, it is its own transaction:
        # the INSERT into the rows_in view runs the inserts in SQLite (see
        # ROW_TRIGGER), or, for a task, agent and task name this connection has
        # booked already, the row's and its id's inserts alone (see
        # BOOKED_TRIGGER). With a capacity the eviction joins it in one transaction.
        flat = encode_flat((data,), "data")  # [None, id, task_id, task_name, agent_id, ...]
        flat.append(id_hash(flat[SLOT["id"]]))
        p = flat[1:]
        with self._guard():
            conn = self._conn or self._connect()
            try:
                if self.max_capacity is None:
                    key = (
                        flat[SLOT["task_id"]],
                        flat[SLOT["agent_id"]],
                        flat[SLOT["task_name"]],
                    )
                    if key in self._booked and self._insert_booked(conn, flat):
                        self._committed()
                        return
                    conn.execute(INSERT_ONE, p)
                    self._committed()
                    self._book(conn, key)
                    return
                with self._write() as conn:
                    conn.execute(INSERT_ONE, p)
                    self._enforce_capacity(conn)
                return
            except sqlite3.IntegrityError:
                # The id's hash is a key of the id tables already: a stored row's id,
                # or (rarely) another id of the same hash. Nothing was stored; the
                # batch path tells the two apart (SchemaError for a stored id).
                pass
            except sqlite3.DatabaseError as exc:
                if _is_damage(exc):
                    raise _damaged(self.path, exc) from exc
                raise
            self._store(flat[:-1], "row")

    def _insert_booked(self, conn: sqlite3.Connection, flat: list[Any]) -> bool:
        """Insert a row of a booked task with its id's key alone (``flat``: its
        :func:`encode_flat` list and id hash); False (nothing stored, bookings
        forgotten) when another connection has committed since they were seen."""
        flat[0] = self._booked_version
        try:
            conn.execute(INSERT_BOOKED, flat)
        except sqlite3.IntegrityError as exc:
            if exc.sqlite_errorname != "SQLITE_CONSTRAINT_NOTNULL":
                raise
            self._booked.clear()
            return False
        return True

    def _book(self, conn: sqlite3.Connection, key: tuple[str, str | None, str | None]) -> None:
        """After a committed one-row store: remember its (task, agent, task name) as booked.

        ``tasks`` and ``task_keys`` hold them now, and go on holding them until rows
        are deleted: by this connection (every other write of this connection
        forgets the bookings, see :meth:`_write`) or by another one, which changes
        ``data_version``. The bookings are those seen at one data_version: read
        again here, a changed one means another connection committed since they
        were seen (perhaps after this store, taking its task), so they are
        forgotten, this one included.
        """
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version != self._booked_version:
            self._booked.clear()
            self._booked_version = version
            return
        self._booked.add(key)

    def add_batch(self, data_batch: Sequence[DataRow], *, _where: str | None = None) -> None:
        # The rows' records in one flat list, each after a slot for its seq: the
        # parameters of the multi-row INSERTs as they are (see _insert_rows).
        flat = encode_flat(data_batch, _where)
        if flat:
            self._store(flat, "batch")

    def _store(self, flat: list[Any], what: str) -> None:
        """Store the rows of ``flat`` (:func:`encode_flat`'s list) in one transaction.

        ``what``: ``"batch"`` or ``"row"``, for the message of a stored id.
        """
        ids = flat[SLOT["id"] :: ROW_PARAMS]
        if len(set(ids)) != len(ids):
            seen: set[str] = set()
            for row_id in ids:
                if row_id in seen:
                    raise SchemaError(
                        f"row id {row_id!r} appears twice in the batch; batch not stored"
                    )
                seen.add(row_id)
        hashes = id_hashes(ids)
        # Task bookkeeping, worked out before taking the write lock: per task the
        # offset of its first row in the batch (the reversed pairs' last writes win);
        # the distinct (field, value, task) keys of the batch, per field in order of
        # appearance.
        tids = flat[SLOT["task_id"] :: ROW_PARAMS]
        firsts = dict(zip(reversed(tids), range(len(tids) - 1, -1, -1), strict=True))
        keys = [  # flat: field, value, task id, field, ...
            item
            for field in KEYED
            for value, tid in distinct_pairs(flat[SLOT[field] :: ROW_PARAMS], tids)
            for item in (field, value, tid)
        ]
        with self._write() as conn:
            # Rows stored before this batch have seqs below ``first``.
            assigned, merged = conn.execute(ASSIGNED_MERGED).fetchone()
            first = int(assigned) + 1
            self._insert_ids(conn, first, ids, hashes, what)
            self._insert_rows(conn, first, flat)
            tasks: list[Any] = [None] * (2 * len(firsts))
            tasks[0::2] = firsts
            tasks[1::2] = [first + offset for offset in firsts.values()]
            self._insert_chunks(conn, TASK_INSERTS, tasks, 2)
            if keys:
                self._insert_chunks(conn, KEY_INSERTS, keys, 3)
            last = first + len(ids) - 1
            if last - int(merged or 0) >= _MERGE_ROWS:
                self._merge_ids(conn, last)
            if self.max_capacity is not None:
                self._enforce_capacity(conn)

    @staticmethod
    def _insert_chunks(
        conn: sqlite3.Connection, statements: dict[int, str], params: list[Any], width: int
    ) -> int:
        """Run ``statements[k]`` (k rows of ``width`` parameters each) over ``params``;
        the number of rows they inserted.

        Chunks of CHUNK_ROWS rows (or what the connection's limit on parameters
        allows), then the remainder's powers of two (1000 rows: 512, 256, 128, 64,
        32, 8).
        """
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width
        chunk = min(CHUNK_ROWS, 1 << max(limit.bit_length() - 1, 0))
        n = len(params) // width
        start = inserted = 0
        while start < n:
            k = min(chunk, 1 << ((n - start).bit_length() - 1))
            end = start + k
            inserted += conn.execute(statements[k], params[start * width : end * width]).rowcount
            start = end
        return inserted

    @classmethod
    def _insert_rows(cls, conn: sqlite3.Connection, first: int, flat: list[Any]) -> None:
        # ``flat``: encode_flat's list, whose free slots get the seqs first, first + 1, ...
        n = len(flat) // ROW_PARAMS
        flat[SLOT["seq"] :: ROW_PARAMS] = range(first, first + n)
        cls._insert_chunks(conn, INSERT_ROWS, flat, ROW_PARAMS)

    @classmethod
    def _insert_ids(
        cls, conn: sqlite3.Connection, first: int, ids: list[str], hashes: list[int], what: str
    ) -> None:
        """Key the batch's ids (seqs ``first``, ``first + 1``, ...) in the id tables.

        Raises SchemaError, before the batch's rows are written, when one of them
        is stored already. The usual case is one statement per chunk: each pair
        inserted into ``row_ids_new`` unless ``row_ids`` holds its hash (one
        search), in hash order. A hash found in either (a stored id, or another
        id of the same hash) leaves a pair out: the batch's pairs are deleted
        again (theirs are the newest seqs), and the careful path compares the
        ids themselves.
        """
        seqs = range(first, first + len(ids))
        params: list[Any] = [0] * (2 * len(ids))
        params[0::2] = hashes
        params[1::2] = seqs
        if cls._insert_chunks(conn, INSERT_IDS, params, 2) == len(ids):
            return
        # A hash of row_ids (not inserted), of row_ids_new or twice in the batch (ignored):
        # take back this batch's keys (its seqs are the newest) before the careful path.
        conn.execute("DELETE FROM row_ids_new WHERE seq >= ?", (first,))
        stored = cls._stored_ids(conn, ids, hashes)
        if stored:
            row_id = next(i for i in ids if i in stored)
            raise SchemaError(f"row id {row_id!r} is already stored; {what} not stored")
        # Distinct ids sharing a hash: the first of a hash new to row_ids_new goes
        # there, the others into row_ids, which holds a hash any number of times.
        taken = cls._recent_hashes(conn, hashes)
        recent: list[tuple[int, int]] = []
        merged: list[tuple[int, int]] = []
        for h, seq in zip(hashes, seqs, strict=True):
            (merged if h in taken else recent).append((h, seq))
            taken.add(h)
        conn.executemany("INSERT INTO row_ids_new (h, seq) VALUES (?, ?)", recent)
        conn.executemany("INSERT INTO row_ids (h, seq) VALUES (?, ?)", merged)

    @staticmethod
    def _recent_hashes(conn: sqlite3.Connection, hashes: Sequence[int]) -> set[int]:
        """Those of ``hashes`` that ``row_ids_new`` holds."""
        found: set[int] = set()
        for start in range(0, len(hashes), _CHUNK):
            part = hashes[start : start + _CHUNK]
            marks = ", ".join("?" * len(part))
            sql = f"SELECT h FROM row_ids_new WHERE h IN ({marks})"
            found.update(h for (h,) in conn.execute(sql, part))
        return found

    @staticmethod
    def _stored_ids(
        conn: sqlite3.Connection, ids: Sequence[str], hashes: Sequence[int]
    ) -> set[str]:
        """Those of ``ids`` (with their ``hashes``) that a stored row has."""
        found: set[str] = set()
        step = _CHUNK // 2  # each hash is bound twice (see id_seqs_sql)
        for start in range(0, len(hashes), step):
            part = hashes[start : start + step]
            sql = f"SELECT id FROM rows WHERE seq IN ({id_seqs_sql(len(part))})"
            found.update(i for (i,) in conn.execute(sql, [*part, *part]))
        return found & set(ids)

    @staticmethod
    def _merge_ids(conn: sqlite3.Connection, last: int) -> None:
        """Move ``row_ids_new`` into ``row_ids`` (after the batch whose last seq is ``last``)."""
        # The (h, seq) pairs are unique (a seq is one row's): nothing is ignored, and a
        # statement that cannot fail midway needs no statement journal (see INSERT_IDS).
        conn.execute("INSERT OR IGNORE INTO row_ids (h, seq) SELECT h, seq FROM row_ids_new")
        conn.execute("DELETE FROM row_ids_new")
        conn.execute("UPDATE stats SET value = ? WHERE key = 'merged'", (last,))

    @staticmethod
    def _forget_ids(conn: sqlite3.Connection, where: str, params: Sequence[Any]) -> None:
        """Before ``DELETE FROM rows WHERE {where}``: remove those rows' id keys."""
        for table in ID_TABLES:
            conn.execute(
                f"DELETE FROM {table} WHERE (h, seq) IN "
                f"(SELECT {ID_HASH_SQL}(id), seq FROM rows WHERE {where})",
                params,
            )

    @staticmethod
    def _count(conn: sqlite3.Connection) -> int:
        """Rows stored: seqs handed out minus seqs deleted (two index lookups, O(log n))."""
        sql = f"SELECT ({ASSIGNED}) - (SELECT value FROM stats WHERE key = 'dead')"
        return int(conn.execute(sql).fetchone()[0])

    @staticmethod
    def _deleting(conn: sqlite3.Connection) -> None:
        """Record the seqs handed out so far, before a delete that may take the newest row.

        The next seq is the largest of ``max(seq)`` and ``high_water``, plus one:
        seqs are never reused, so every seq up to that point is a stored row or
        one counted in ``dead``, and :meth:`_count` is exact.
        """
        conn.execute(
            "UPDATE stats SET value = max(value, coalesce((SELECT max(seq) FROM rows), 0)) "
            "WHERE key = 'high_water'"
        )

    @staticmethod
    def _deleted(conn: sqlite3.Connection, n: int) -> None:
        if n:
            conn.execute("UPDATE stats SET value = value + ? WHERE key = 'dead'", (n,))

    def _enforce_capacity(self, conn: sqlite3.Connection) -> None:
        cap = self.max_capacity
        if cap is None:
            return
        total = self._count(conn)
        if total <= cap:
            return
        self._deleting(conn)
        removed = 0
        while total - removed > cap:
            excess = total - removed - cap
            if self.eviction == "row":
                doomed = conn.execute(
                    "SELECT task_id, max(seq) FROM "
                    "(SELECT task_id, seq FROM rows ORDER BY seq LIMIT ?) GROUP BY task_id",
                    (excess,),
                ).fetchall()
                cut = max(s for _, s in doomed)
                self._forget_ids(conn, "seq <= ?", (cut,))
                removed += conn.execute("DELETE FROM rows WHERE seq <= ?", (cut,)).rowcount
                for tid, _ in doomed:
                    self._shrink_task(conn, tid)
                continue
            oldest = conn.execute("SELECT task_id FROM tasks ORDER BY first_seq LIMIT 2").fetchall()
            tid = oldest[0][0]
            if len(oldest) > 1:
                self._forget_ids(conn, "task_id = ?", (tid,))
                removed += conn.execute("DELETE FROM rows WHERE task_id = ?", (tid,)).rowcount
                conn.execute("DELETE FROM tasks WHERE task_id = ?", (tid,))
                conn.execute("DELETE FROM task_keys WHERE task_id = ?", (tid,))
            else:  # one task alone exceeds the capacity: keep its newest rows
                oldest_rows = "seq IN (SELECT seq FROM rows WHERE task_id = ? ORDER BY seq LIMIT ?)"
                self._forget_ids(conn, oldest_rows, (tid, excess))
                removed += conn.execute(
                    f"DELETE FROM rows WHERE {oldest_rows}", (tid, excess)
                ).rowcount
                self._shrink_task(conn, tid)
        self._deleted(conn, removed)

    @staticmethod
    def _shrink_task(conn: sqlite3.Connection, task_id: str) -> None:
        """Drop the task's bookkeeping if none of its rows is left, else re-derive its keys."""
        left = conn.execute("SELECT 1 FROM rows WHERE task_id = ? LIMIT 1", (task_id,)).fetchone()
        if left is None:
            conn.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,))
            conn.execute("DELETE FROM task_keys WHERE task_id = ?", (task_id,))
        else:
            # first_seq stays the task's first row ever: tasks keep their age order.
            rebuild_keys(conn, task_id)  # its agents/names may be gone

    def clear(self) -> None:
        with self._write() as conn:
            self._deleting(conn)
            self._deleted(conn, conn.execute("DELETE FROM rows").rowcount)
            for table in ("tasks", "task_keys", *ID_TABLES):
                conn.execute(f"DELETE FROM {table}")

    # ------------------------------------------------------------------ reading

    def _decode(self, records: list[tuple[Any, ...]]) -> list[DataRow]:
        payloads = decode_experiences([r[8] for r in records])
        rows = [
            DataRow(ExpMeta(*r[2:8]), exp, r[1]) for r, exp in zip(records, payloads, strict=True)
        ]
        return rows if self.decoders is None else self.decoders.decode_rows(rows)

    def query_plan(
        self, query_condition: Condition | None = None, *, tasks: bool = False
    ) -> list[str]:
        """SQLite's plan (``EXPLAIN QUERY PLAN`` detail lines) for a query by ``query_condition``.

        Args:
            query_condition: the condition, as for :meth:`get_all`.
            tasks: the plan of picking task ids (what :meth:`sample_task_ids` and
                ``sample_task`` run) instead of reading rows (:meth:`get_all`).

        Example: with an ``eq`` on ``exp_meta.agent_id`` the row plan searches
        ``task_keys`` and then ``rows`` by ``rows_task``; no line says ``SCAN rows``.
        """
        if tasks:
            sql, params = task_ids_sql(query_condition)
        else:
            where, params = where_sql(query_condition)
            sql = f"SELECT {COLUMNS} FROM rows WHERE {where} ORDER BY seq"
        with self._read() as conn:
            return [str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]

    def size(self, query_condition: Condition | None = None) -> int:
        with self._read() as conn:
            if query_condition is None:
                return self._count(conn)
            where, params = where_sql(query_condition)
            sql = f"SELECT count(*) FROM rows WHERE {where}"
            return int(conn.execute(sql, params).fetchone()[0])

    def get_paginated(
        self, page: int, page_size: int, query_condition: Condition | None = None
    ) -> list[DataRow]:
        page, page_size = check_page(page, page_size)
        where, params = where_sql(query_condition)
        with self._read() as conn:
            records = conn.execute(
                f"SELECT {COLUMNS} FROM rows WHERE {where} ORDER BY seq LIMIT ? OFFSET ?",
                [*params, page_size, (page - 1) * page_size],
            ).fetchall()
        return self._decode(records)

    def get_all(self, query_condition: Condition | None = None) -> list[DataRow]:
        where, params = where_sql(query_condition)
        with self._read() as conn:
            records = conn.execute(
                f"SELECT {COLUMNS} FROM rows WHERE {where} ORDER BY seq", params
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
                f"SELECT {COLUMNS} FROM rows WHERE task_id IN "
                f"({', '.join('?' * len(chunk))}) ORDER BY task_id, seq",  # index order: no sort
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
                f"SELECT {COLUMNS} FROM rows WHERE seq IN ({', '.join('?' * len(chunk))})",
                chunk,
            ).fetchall()
            for rec, row in zip(records, self._decode(records), strict=True):
                by_seq[rec[0]] = row
        return [by_seq[s] for s in seqs if s in by_seq]

    def task_ids(self, query_condition: Condition | None = None) -> list[str]:
        with self._read() as conn:
            return self._task_ids(conn, query_condition)

    def _task_ids(self, conn: sqlite3.Connection, cond: Condition | None) -> list[str]:
        sql, params = task_ids_sql(cond)
        return [r[0] for r in conn.execute(sql, params)]

    # The SQL of the matching tasks' first seqs (filters.firsts_sql), or None.
    _firsts_sql = staticmethod(firsts_sql)

    def _pick_task_ids(
        self, conn: sqlite3.Connection, k: int, cond: Condition | None, rng: SeedLike
    ) -> list[str]:
        """``k`` matching task ids (fewer if fewer match): ``choose`` over the tasks in age order.

        Where :meth:`_firsts_sql` applies, SQLite returns the matching tasks'
        ``first_seq`` values as one text (no Python object per task); only the
        picked tasks' ids are read. Same picks as reading every id in age order.
        """
        found = self._firsts_sql(cond)
        if found is None:
            ids = self._task_ids(conn, cond)
            return [ids[i] for i in choose(len(ids), k, rng)]
        sql, params = found
        text = conn.execute(f"SELECT group_concat(first_seq) FROM ({sql})", params).fetchone()[0]
        firsts = np.sort(np.fromstring(text, dtype=np.int64, sep=",")) if text else np.empty(0)
        picked = firsts[choose(len(firsts), k, rng)].tolist()
        by_first: dict[int, str] = {}
        for start in range(0, len(picked), _CHUNK):
            chunk = picked[start : start + _CHUNK]
            marks = ", ".join("?" * len(chunk))
            by_first.update(
                conn.execute(
                    f"SELECT first_seq, task_id FROM tasks WHERE first_seq IN ({marks})", chunk
                )
            )
        return [by_first[s] for s in picked]

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
        where, params = where_sql(query_condition)
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
        """``PRAGMA integrity_check`` of the file: ``"ok"`` when it is sound.

        Otherwise SQLite's first finding, or the error that stopped the check on a
        badly damaged file (this never raises for damage: it is the diagnosis).
        """
        with self._guard():
            conn = self._connect()
            try:
                return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
            except sqlite3.DatabaseError as exc:
                if not _is_damage(exc):
                    raise
                return f"damaged: {exc}"
