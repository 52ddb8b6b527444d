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

Durability is a choice (``synchronous=``): with ``"NORMAL"`` (the default, in WAL
mode) committed batches survive a crash of the process, but after a power loss
or an OS crash the last few commits may be missing (the file is never corrupt);
a commit costs no fsync, which is what makes one-row ``store`` calls cheap
(tens of microseconds). ``"FULL"`` fsyncs the log on every commit, so every
commit survives a power loss too, at about 4x the cost of a one-row commit on
an SSD (batches amortise it).

Indexes: besides ``(task_id, seq)`` and the row ids (below), the table ``task_keys``
records, per task, the distinct ``agent_id`` and ``task_name`` values of its
rows (with the task's first sequence number). A condition with ``eq``/``in_``
on those fields (or on ``task_id``) first narrows the search to the tasks that
can match, through that table, then reads only their rows; sampling tasks by
such a condition reads only the table. It costs a write only when a task
meets a new agent or task name, unlike an index over every row.

Row ids: a row's id is unique in the store and found through two tables keyed
by the id's 64-bit hash (FNV-1a, :func:`~replaystore.experience.rows.id_hash`)
and the row's seq. A batch's ids go into ``row_ids_new``, which holds the ids of
the rows stored since the last merge; every :data:`_MERGE_ROWS` seqs it is
moved, in hash order, into ``row_ids``, which holds the rest. A unique index on
the id text itself put random ids (AWorld's ``DataRow`` gives each row
``str(uuid.uuid4())``) on random pages of an index of every row, and a commit
of 1,000 such rows rewrote most of its pages (a 100k-row pydantic fill ran at
55-60k rows/s against 130-140k with sequential ids); the small table's pages are
few, and the large one is rewritten once per merge. The cost: each id is
looked up in ``row_ids`` (one B-tree search) and inserted into ``row_ids_new``.
Hashes can collide: a hash found in either table sends the batch down a careful
path that compares the ids themselves; the first of two distinct ids sharing a
hash keeps ``row_ids_new``'s one slot for it, the other goes to ``row_ids``,
which holds a hash any number of times. Deleting rows deletes their keys
(through the SQL function ``replaystore_id_hash``, registered on every
connection this module opens; nothing in the schema needs it, so any SQLite can
read and check the file). A condition with ``eq``/``in_`` on ``id`` reads the
rows of those hashes' seqs, then compares the ids.

What a commit writes (file format 3, :data:`FORMAT`): a row's table page, its
``rows_task`` page and its ``row_ids_new`` page, plus the ``tasks`` and
``task_keys`` pages when the row starts a task or brings a new agent or task
name to one. No counter is
rewritten per commit: ``seq`` is not AUTOINCREMENT (a new row gets the largest
seq handed out so far plus one, read from ``max(seq)`` and ``stats.high_water``),
and ``size()`` is the number of seqs handed out minus ``stats.dead``, the two
stats rows written only when rows are deleted (eviction, :meth:`SqliteStorage.clear`).
Seqs are never reused. Files of formats 1 and 2 are upgraded on open (one
transaction, a copy of the table: see ``SqliteStorage._upgrade``); a file of a
newer format is refused with a :class:`~replaystore.errors.StorageError`.
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
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, SchemaError, StorageError
from replaystore.experience.decoding import FieldDecoders, as_decoders
from replaystore.experience.query import Condition, canonical_field, compile_sql
from replaystore.experience.rows import (
    META_FIELDS,
    RECORD_SLOTS,
    DataRow,
    ExpMeta,
    decode_experiences,
    encode_flat,
    id_hash,
    id_hashes,
)
from replaystore.experience.storage._fork import fork_check_lock
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

FORMAT = 3
"""The file format this version writes (``stats.format``); older files are migrated on open.

1: ``rows.seq`` AUTOINCREMENT, ``tasks.n_rows`` and ``stats.n_rows`` counters, all
updated by every commit. 2: none of them; ``stats`` holds ``high_water`` and
``dead``, changed only when rows are deleted (see :class:`SqliteStorage`). 3: no
unique index on ``rows.id``; the ids are found through ``row_ids_new`` and
``row_ids`` by a hash of the id (see "Row ids" in the module docstring), and
``stats.merged`` records the last merge of the one into the other.
"""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rows (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL,
    task_id TEXT NOT NULL,
    task_name TEXT,
    agent_id TEXT,
    step INTEGER NOT NULL,
    execute_time REAL NOT NULL,
    pre_agent TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rows_task ON rows (task_id, seq);
CREATE TABLE IF NOT EXISTS tasks (
    task_id TEXT PRIMARY KEY,
    first_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tasks_first ON tasks (first_seq);
CREATE TABLE IF NOT EXISTS task_keys (
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (field, value, first_seq, task_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS task_keys_task ON task_keys (task_id);
CREATE TABLE IF NOT EXISTS row_ids_new (
    h INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS row_ids (
    h INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (h, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS stats (
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID
"""
_STATS = (
    "INSERT OR IGNORE INTO stats (key, value) "
    "VALUES ('format', ?), ('high_water', ?), ('dead', ?), ('merged', ?)"
)
# The SQL function giving a row id's key in the id tables (rows.id_hash), registered
# on every connection this module opens; used where SQL must key rows it reads
# (deletes, the upgrade), never in the schema, so any SQLite reads the file.
_ID_HASH_SQL = "replaystore_id_hash"
# The tables that key the ids (see "Row ids" in the module docstring).
_ID_TABLES = ("row_ids_new", "row_ids")
# The recent ids are merged into ``row_ids`` once this many seqs have been handed
# out since the last merge (see "Row ids" in the module docstring).
_MERGE_ROWS = 16384

# Metadata fields recorded per task in ``task_keys`` (see the module docstring).
_KEYED = ("agent_id", "task_name")
_KEY_INSERT = (
    "INSERT OR IGNORE INTO task_keys (field, value, first_seq, task_id) "
    "SELECT ?, ?, first_seq, task_id FROM tasks WHERE task_id = ?"
)
_TASK_INSERT = "INSERT OR IGNORE INTO tasks (task_id, first_seq) VALUES (?, ?)"
# Sequence numbers handed out so far: every seq up to this one has been used (by a
# row stored now or deleted since), so the next row gets this plus one.
_SEQS_USED = (
    "max(coalesce((SELECT max(seq) FROM rows), 0), "
    "(SELECT value FROM stats WHERE key = 'high_water'))"
)
_ASSIGNED = "SELECT " + _SEQS_USED
_ASSIGNED_MERGED = _ASSIGNED + ", (SELECT value FROM stats WHERE key = 'merged')"
_SYNCHRONOUS = ("NORMAL", "FULL")

_COLUMNS = "seq, id, " + ", ".join(META_FIELDS) + ", data"
_ROW_PARAMS = len(_COLUMNS.split(", "))
assert _ROW_PARAMS == RECORD_SLOTS  # a row's parameters are its slots in encode_flat's list
# Each column's slot in a row's parameters (the seq's is encode_flat's free slot).
_SLOT = {name: i for i, name in enumerate(_COLUMNS.split(", "))}
_ROW_VALUES = "(" + ", ".join(["?"] * _ROW_PARAMS) + ")"
# A batch's rows go in through multi-row INSERT statements of up to this many rows
# (4,608 parameters; SQLite allows 32,766 since 3.32, builds before that 999, and
# a build may set its own: fewer rows a statement where the connection's limit is
# lower): each binds its rows and inserts them in one step, about 1 us a row less
# than executemany's reset-bind-step per row. A batch is cut into chunks whose
# sizes are powers of two, so a connection prepares (and caches) at most ten such
# statements whatever the batch sizes.
_CHUNK_ROWS = 512
_INSERT_ROWS = {
    1 << k: f"INSERT INTO rows ({_COLUMNS}) VALUES " + ", ".join([_ROW_VALUES] * (1 << k))
    for k in range(_CHUNK_ROWS.bit_length())
}
# A batch's (id hash, seq) pairs go into row_ids_new the same way, each unless its
# hash is in row_ids (one search of its primary key), sorted by hash first (by
# SQLite: inserting in key order keeps the B-tree's cursor near). Fewer rows
# inserted than given means a hash was found: see SqliteStorage._insert_ids. OR
# IGNORE (a hash of row_ids_new is skipped, not an error): a statement that cannot
# fail midway needs no statement journal, which otherwise holds a copy of each
# row_ids_new page the statement changes (0.6-0.7 us a row with uuid4 ids).
_INSERT_IDS = {
    1 << k: "INSERT OR IGNORE INTO row_ids_new (h, seq) SELECT column1, column2 FROM (VALUES "
    + ", ".join(["(?, ?)"] * (1 << k))
    + ") AS v WHERE NOT EXISTS (SELECT 1 FROM row_ids WHERE row_ids.h = v.column1) ORDER BY 1"
    for k in range(_CHUNK_ROWS.bit_length())
}
# The next row's seq, as a value in an INSERT ... VALUES (the VALUES form runs
# about 2 us faster than INSERT ... SELECT).
_NEXT_SEQ = _SEQS_USED + " + 1"
# One-row stores insert into this per-connection view; its trigger stores the row
# (seq worked out in SQL), its task and its keys, and its id's key. One statement,
# so an unbounded store commits it on its own: no BEGIN and COMMIT round trips, no
# Python between the inserts. Temporary objects: they live in this connection, not
# the file. The view's last column is the id's hash (rows.id_hash). A hash found
# in row_ids (the RAISE) or in row_ids_new (its primary key) fails the statement,
# storing nothing: SqliteStorage.add then takes the batch path, which tells a
# stored id from another id of the same hash.
_META_NEW = ", ".join("NEW." + f for f in META_FIELDS)
_ROW_VIEW = (
    "CREATE TEMP VIEW IF NOT EXISTS rows_in AS SELECT id, "
    + ", ".join(META_FIELDS)
    + ", data, 0 AS h FROM main.rows"
)
_HASH_SEEN = "SELECT RAISE(ABORT, 'row id hash in row_ids') FROM row_ids WHERE h = NEW.h LIMIT 1"
_ROW_TRIGGER = f"""
CREATE TEMP TRIGGER IF NOT EXISTS rows_in_insert INSTEAD OF INSERT ON rows_in BEGIN
    {_HASH_SEEN};
    INSERT INTO rows (seq, id, {", ".join(META_FIELDS)}, data)
        VALUES ({_NEXT_SEQ}, NEW.id, {_META_NEW}, NEW.data);
    INSERT OR IGNORE INTO tasks (task_id, first_seq) VALUES (NEW.task_id, last_insert_rowid());
    INSERT OR IGNORE INTO task_keys (field, value, first_seq, task_id)
        SELECT 'agent_id', NEW.agent_id, first_seq, task_id FROM tasks
        WHERE task_id = NEW.task_id AND NEW.agent_id IS NOT NULL
        UNION ALL
        SELECT 'task_name', NEW.task_name, first_seq, task_id FROM tasks
        WHERE task_id = NEW.task_id AND NEW.task_name IS NOT NULL;
    INSERT INTO row_ids_new (h, seq) VALUES (NEW.h, last_insert_rowid());
END
"""
_INSERT_ONE = "INSERT INTO rows_in VALUES (" + ", ".join(["?"] * (_ROW_PARAMS)) + ")"
# A one-row store whose task, agent and task name this connection has booked
# already (see SqliteStorage.add) inserts the row and its id's key alone, about
# 3 us less than the full trigger. Guarded in the statement itself: the view's
# first column is the data_version at which the booking was seen, and should
# another connection have committed since (a delete could have taken the task's
# bookkeeping), the id becomes NULL, the NOT NULL constraint refuses the row, and
# the store takes the full trigger's path.
_BOOKED_VIEW = (
    "CREATE TEMP VIEW IF NOT EXISTS rows_booked AS SELECT 0 AS version, id, "
    + ", ".join(META_FIELDS)
    + ", data, 0 AS h FROM main.rows"
)
_BOOKED_TRIGGER = f"""
CREATE TEMP TRIGGER IF NOT EXISTS rows_booked_insert INSTEAD OF INSERT ON rows_booked BEGIN
    {_HASH_SEEN};
    INSERT INTO rows (seq, id, {", ".join(META_FIELDS)}, data) VALUES ({_NEXT_SEQ},
        CASE WHEN (SELECT data_version FROM pragma_data_version) = NEW.version THEN NEW.id END,
        {_META_NEW}, NEW.data);
    INSERT INTO row_ids_new (h, seq) VALUES (NEW.h, last_insert_rowid());
END
"""
_INSERT_BOOKED = "INSERT INTO rows_booked VALUES (" + ", ".join(["?"] * (_ROW_PARAMS + 1)) + ")"
# The log (``-wal``) is checkpointed by a thread of each writing process (see
# _Checkpointer), which restarts it once it holds this many pages (32 MiB; SQLite's
# default auto-checkpoint is at 1000, 4 MiB: a checkpoint fsyncs the log and the
# file, and each writes a page that many commits touched once). The log file stays
# at its largest size afterwards (it is reused, not regrown).
_WAL_RESTART = 8192
# Pages before a writer checkpoints on commit itself (SQLite's auto-checkpoint): only
# when the background checkpoints have fallen behind (64 MiB).
_WAL_AUTOCHECKPOINT = 16384
# The background checkpointer waits at least this long between checkpoints, and
# this long at most for the write lock and for readers to leave the log before a
# restart (then it tries again after a later commit).
_CHECKPOINT_INTERVAL = 0.05
_CHECKPOINT_WAIT = 0.2

_CHUNK = 500  # bound parameters per IN (...) list, well under SQLite's limit

# Connections inherited through fork(). They must never be used or closed in the
# child: closing one could checkpoint and delete the WAL under the parent's feet.
# Keeping a reference stops the garbage collector from closing them.
_INHERITED: list[sqlite3.Connection] = []

# SQLite's primary result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
_DAMAGED_CODES = (11, 26)


class _Checkpointer:
    """Checkpoints one store's log on a thread of its own, so that writers do not wait.

    A checkpoint copies the pages committed to the log (``-wal``) into the database
    file and fsyncs both. SQLite's auto-checkpoint runs it in the committing writer,
    which waits for the copy and both fsyncs (an eighth of the time of a 100k-row
    ``add_batch`` fill with pydantic rows); here it runs beside the writers, as
    SQLite's WAL documentation suggests. After each commit the thread runs a
    PASSIVE checkpoint (it never blocks readers or writers), at most one per
    :data:`_CHECKPOINT_INTERVAL`; once the log holds :data:`_WAL_RESTART` pages, a
    RESTART checkpoint, so that the next commit writes the log from its start
    again: it copies what is left, waiting at most :data:`_CHECKPOINT_WAIT` for the
    write lock and for readers to leave the log. The store's calls in this process
    (writes and reads) wait for the restart on the store's thread lock
    (``writers``), which the thread holds through it. A checkpoint that cannot run now
    (busy, disk full) is logged at DEBUG and tried after a later commit; should the
    thread fall behind (or not start), the writers' own auto-checkpoint at
    :data:`_WAL_AUTOCHECKPOINT` pages bounds the log.

    A daemon thread with its own connection; :meth:`close` stops and joins it, and
    a process exiting mid-checkpoint leaves the file consistent (a checkpoint is
    crash-safe). A fork waits until the thread is out of SQLite (inside it, the
    thread may hold one of SQLite's process-wide locks, which the child would
    inherit held by no thread); the child does without the parent's thread and
    starts its own with its first commit.
    """

    def __init__(self, path: Path, writers: threading.RLock) -> None:
        self.path = path
        self._writers = writers
        self._wake = threading.Event()
        self._busy = threading.Lock()  # held by the thread while it is in SQLite
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"replaystore-checkpoint:{path.name}", daemon=True
        )
        _CHECKPOINTERS.add(self)
        self._thread.start()

    def poke(self) -> None:
        """A commit was made: checkpoint soon."""
        if not self._wake.is_set():  # set already: the thread has not woken since
            self._wake.set()

    def stop(self) -> None:
        """Ask the thread to stop (it then closes its connection), without waiting."""
        self._closed = True
        self._wake.set()

    def close(self) -> None:
        """Stop the thread (after the checkpoint under way, if any) and wait for it."""
        self.stop()
        self._thread.join()

    def orphan(self) -> None:
        """In a forked child: the thread is not there, and its connection must never be
        closed here (closing it could checkpoint and delete the parent's log)."""
        self._closed = True
        if self._conn is not None:
            _INHERITED.append(self._conn)

    def _hold_writers(self) -> bool:
        """Take the store's thread lock, which this process's writers take for each
        write; False (not taken) once the checkpointer is closed.

        Polled, so that :meth:`close`, called under that lock, never waits for a
        thread that waits for it.
        """
        while not self._closed:
            if self._writers.acquire(timeout=_CHECKPOINT_INTERVAL):
                return True
        return False

    def _checkpoint(self, conn: sqlite3.Connection, mode: str) -> int:
        """Run a ``mode`` checkpoint; the pages in the log (0 if it could not run now)."""
        with self._busy:  # held in SQLite: a fork waits (see _quiesce_checkpointers)
            if self._closed:
                return 0
            try:
                return int(conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()[1])
            except sqlite3.Error as exc:
                log.debug("%s: background checkpoint not done (%s)", self.path, exc)
                return 0

    def _run(self) -> None:
        conn = None
        try:
            while True:
                with self._busy:
                    if self._closed:
                        return
                    if conn is None:
                        conn = self._conn = sqlite3.connect(
                            self.path,
                            timeout=_CHECKPOINT_WAIT,
                            isolation_level=None,
                            check_same_thread=False,
                        )
                if self._checkpoint(conn, "PASSIVE") >= _WAL_RESTART and self._hold_writers():
                    # This process's writers wait on the lock while the restart copies
                    # what the passive checkpoint left and fsyncs (tens of ms), woken as
                    # it ends; waiting in SQLite's busy handler, they would sleep its
                    # steps (1, 2, 5, 10, 15 ms, ...) past it.
                    try:
                        self._checkpoint(conn, "RESTART")
                    finally:
                        self._writers.release()
                if self._closed:
                    return
                time.sleep(_CHECKPOINT_INTERVAL)
                self._wake.wait()
                self._wake.clear()
        except sqlite3.Error as exc:
            log.debug("%s: no background checkpoints (%s)", self.path, exc)
        finally:
            with self._busy:
                self._conn = None
                if conn is not None:
                    conn.close()


# Every live checkpointer of this process. At a fork each one's thread is kept out
# of SQLite (a thread inside it could hold one of SQLite's process-wide locks, which
# the child would inherit held by no one), and in the child each one is orphaned.
_CHECKPOINTERS: weakref.WeakSet[_Checkpointer] = weakref.WeakSet()
_QUIESCED: list[_Checkpointer] = []


def _quiesce_checkpointers() -> None:
    _QUIESCED[:] = list(_CHECKPOINTERS)
    for checkpointer in _QUIESCED:
        checkpointer._busy.acquire()


def _resume_checkpointers() -> None:
    for checkpointer in _QUIESCED:
        checkpointer._busy.release()
    _QUIESCED.clear()


def _orphan_checkpointers() -> None:
    for checkpointer in list(_CHECKPOINTERS):
        checkpointer.orphan()
    _CHECKPOINTERS.clear()
    _resume_checkpointers()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
    os.register_at_fork(
        before=_quiesce_checkpointers,
        after_in_parent=_resume_checkpointers,
        after_in_child=_orphan_checkpointers,
    )


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


def _task_filter(cond: Mapping[str, Any]) -> tuple[str, list[Any], bool] | None:
    """SQL selecting ``(task_id, first_seq)`` of every task that can hold a row matching ``cond``.

    Defined for ``eq``/``in_`` on ``exp_meta.task_id``, ``agent_id`` and ``task_name``,
    an ``and_`` with at least one such part and an ``or_`` of only such parts;
    ``None`` for anything else. The flag is True when the tasks selected are
    exactly those with a matching row (a single leaf, or an ``or_`` of them), so
    task sampling needs no further look at the rows; an ``and_`` of several
    parts only narrows the search. ``cond`` must be validated already.
    """
    if "and_" in cond:
        parts = cond["and_"]
        for part in parts:
            found = _task_filter(part)
            if found is not None:
                return found[0], found[1], found[2] and len(parts) == 1
        return None
    if "or_" in cond:
        found_all = []
        for part in cond["or_"]:
            found = _task_filter(part)
            if found is None:
                return None
            found_all.append(found)
        if not found_all:
            return None
        sql = " UNION ".join(f[0] for f in found_all)
        params = [v for f in found_all for v in f[1]]
        return sql, params, all(f[2] for f in found_all)
    op = cond["op"]
    field = canonical_field(cond["field"])  # "task_id" -> "exp_meta.task_id"
    if op not in ("eq", "in", "in_") or not field.startswith("exp_meta."):
        return None
    name = field[len("exp_meta.") :]
    values = [cond["value"]] if op == "eq" else list(cond["value"])
    # Only strings equal a text field (as in the in-memory evaluator).
    strings = list(dict.fromkeys(v for v in values if isinstance(v, str)))
    marks = ", ".join("?" * len(strings))
    if name == "task_id":
        return f"SELECT task_id, first_seq FROM tasks WHERE task_id IN ({marks})", strings, True
    if name not in _KEYED:
        return None
    return (
        f"SELECT task_id, first_seq FROM task_keys WHERE field = ? AND value IN ({marks})",
        [name, *strings],
        True,
    )


def id_seqs_sql(count: int) -> str:
    """SQL selecting the seqs keyed under ``count`` id hashes, bound twice (one list per
    id table): a superset of the rows with those ids (hashes can collide), so whoever
    uses it compares ``rows.id`` too. Shared with the viewer's read-only reader."""
    marks = ", ".join("?" * count)
    return " UNION ALL ".join(f"SELECT seq FROM {t} WHERE h IN ({marks})" for t in _ID_TABLES)


def _id_filter(cond: Mapping[str, Any]) -> tuple[str, list[Any]] | None:
    """SQL selecting the seqs of every row whose id can match ``cond``, through the id tables.

    Defined for ``eq``/``in_`` on ``id``, and an ``and_`` with such a part;
    ``None`` for anything else. The seqs are those of the ids' hashes, so the
    condition itself must still be applied. ``cond`` must be validated already.
    """
    if "and_" in cond:
        for part in cond["and_"]:
            found = _id_filter(part)
            if found is not None:
                return found
        return None
    if (
        "or_" in cond
        or cond["op"] not in ("eq", "in", "in_")
        or canonical_field(cond["field"]) != "id"
    ):
        return None
    values = [cond["value"]] if cond["op"] == "eq" else list(cond["value"])
    # Only strings equal an id (as in the in-memory evaluator).
    hashes = id_hashes(list(dict.fromkeys(v for v in values if isinstance(v, str))))
    return id_seqs_sql(len(hashes)), [*hashes, *hashes]


def _one_value_tasks(cond: Mapping[str, Any]) -> tuple[str, list[Any]] | None:
    """:func:`_task_filter`'s SQL when it selects each matching task exactly once.

    That is one ``eq``/``in_`` value on ``task_id``, ``agent_id`` or ``task_name``
    (one index range, no ``UNION``, no duplicates); ``None`` otherwise.
    """
    narrow = _task_filter(cond)
    if narrow is None or not narrow[2] or " UNION " in narrow[0] or len(narrow[1]) > 2:
        return None
    return narrow[0], narrow[1]


class SqliteStorage(Storage):
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
            (slower one-row commits). See the module docstring.

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
        StorageError: the file cannot be opened or is not a replaystore database.
        ConfigError: a bad ``max_capacity``, ``eviction``, ``decoders`` or ``synchronous``.
    """

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
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: _Checkpointer | None = None
        self._wal = False
        # One-row stores' bookings (see _book): (task_id, agent_id, task_name) of
        # rows this connection stored, whose task and keys are in the file as of
        # data_version _booked_version.
        self._booked: set[tuple[str, str | None, str | None]] = set()
        self._booked_version: int | None = None
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
            "synchronous": self.synchronous,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("decoders", None)
        self.__dict__.setdefault("synchronous", "NORMAL")
        self._conn = None
        self._checkpointer = None
        self._wal = False
        self._booked = set()
        self._booked_version = None
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
                        _INHERITED.append(self._conn)
                        self._conn = None
                    self._checkpointer = None  # the parent's, orphaned at the fork
                    self._lock = threading.RLock()
                    self._pid = os.getpid()  # last: a thread seeing it finds the new lock
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
        conn.create_function(_ID_HASH_SQL, 1, id_hash, deterministic=True)
        deadline = time.monotonic() + self.timeout
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
                        self._upgrade(conn)  # no-op for a file of this version's format
                    except StorageError:  # a newer format: leave it untouched
                        conn.execute("ROLLBACK")
                        conn.close()
                        raise
                else:
                    for statement in _SCHEMA.split(";"):
                        conn.execute(statement)
                    conn.execute(_STATS, (FORMAT, 0, 0, 0))
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
                if _is_damage(exc):
                    raise _damaged(self.path, exc) from exc
                raise StorageError(f"{self.path} is not a usable SQLite store: {exc}") from exc
        self._wal = str(mode).lower() == "wal"
        if not self._wal:
            log.warning("%s: journal_mode is %s, not WAL", self.path, mode)
        conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_AUTOCHECKPOINT}")
        for statement in (_ROW_VIEW, _ROW_TRIGGER, _BOOKED_VIEW, _BOOKED_TRIGGER):
            conn.execute(statement)
        self._booked.clear()
        self._booked_version = None
        self._conn = conn
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
        (started by this process's first commit; see :class:`_Checkpointer`)."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            if not self._wal:
                return
            try:
                checkpointer = _Checkpointer(self.path, self._lock)
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
        # _ROW_TRIGGER), or, for a task, agent and task name this connection has
        # booked already, the row's and its id's inserts alone (see
        # _BOOKED_TRIGGER). With a capacity the eviction joins it in one transaction.
        flat = encode_flat((data,), "data")  # [None, id, task_id, task_name, agent_id, ...]
        flat.append(id_hash(flat[_SLOT["id"]]))
        p = flat[1:]
        with self._guard():
            conn = self._conn or self._connect()
            try:
                if self.max_capacity is None:
                    key = (
                        flat[_SLOT["task_id"]],
                        flat[_SLOT["agent_id"]],
                        flat[_SLOT["task_name"]],
                    )
                    if key in self._booked and self._insert_booked(conn, flat):
                        self._committed()
                        return
                    conn.execute(_INSERT_ONE, p)
                    self._committed()
                    self._book(conn, key)
                    return
                with self._write() as conn:
                    conn.execute(_INSERT_ONE, p)
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
            conn.execute(_INSERT_BOOKED, flat)
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
        ids = flat[_SLOT["id"] :: _ROW_PARAMS]
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
        tids = flat[_SLOT["task_id"] :: _ROW_PARAMS]
        firsts = dict(zip(reversed(tids), range(len(tids) - 1, -1, -1), strict=True))
        keys = [
            (field, value, tid)
            for field in _KEYED
            for value, tid in dict.fromkeys(
                zip(flat[_SLOT[field] :: _ROW_PARAMS], tids, strict=True)
            )
            if value is not None
        ]
        with self._write() as conn:
            # Rows stored before this batch have seqs below ``first``.
            assigned, merged = conn.execute(_ASSIGNED_MERGED).fetchone()
            first = int(assigned) + 1
            self._insert_ids(conn, first, ids, hashes, what)
            self._insert_rows(conn, first, flat)
            tasks = [(tid, first + offset) for tid, offset in firsts.items()]
            if len(tasks) == 1:  # small batches: a plain execute costs less than executemany
                conn.execute(_TASK_INSERT, tasks[0])
            else:
                conn.executemany(_TASK_INSERT, tasks)
            if keys:
                conn.executemany(_KEY_INSERT, keys)
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

        Chunks of _CHUNK_ROWS rows (or what the connection's limit on parameters
        allows), then the remainder's powers of two (1000 rows: 512, 256, 128, 64,
        32, 8).
        """
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width
        chunk = min(_CHUNK_ROWS, 1 << max(limit.bit_length() - 1, 0))
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
        n = len(flat) // _ROW_PARAMS
        flat[_SLOT["seq"] :: _ROW_PARAMS] = range(first, first + n)
        cls._insert_chunks(conn, _INSERT_ROWS, flat, _ROW_PARAMS)

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
        if cls._insert_chunks(conn, _INSERT_IDS, params, 2) == len(ids):
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
        # statement that cannot fail midway needs no statement journal (see _INSERT_IDS).
        conn.execute("INSERT OR IGNORE INTO row_ids (h, seq) SELECT h, seq FROM row_ids_new")
        conn.execute("DELETE FROM row_ids_new")
        conn.execute("UPDATE stats SET value = ? WHERE key = 'merged'", (last,))

    @staticmethod
    def _rebuild_ids(conn: sqlite3.Connection) -> None:
        """Key every stored row's id in ``row_ids`` afresh (an upgrade, or tables dropped)."""
        for table in _ID_TABLES:
            conn.execute(f"DELETE FROM {table}")
        conn.execute(
            f"INSERT INTO row_ids (h, seq) SELECT {_ID_HASH_SQL}(id), seq FROM rows ORDER BY 1, 2"
        )
        conn.execute(
            "UPDATE stats SET value = coalesce((SELECT max(seq) FROM rows), 0) WHERE key = 'merged'"
        )

    @staticmethod
    def _forget_ids(conn: sqlite3.Connection, where: str, params: Sequence[Any]) -> None:
        """Before ``DELETE FROM rows WHERE {where}``: remove those rows' id keys."""
        for table in _ID_TABLES:
            conn.execute(
                f"DELETE FROM {table} WHERE (h, seq) IN "
                f"(SELECT {_ID_HASH_SQL}(id), seq FROM rows WHERE {where})",
                params,
            )

    @staticmethod
    def _rebuild_keys(conn: sqlite3.Connection, task_id: str | None) -> None:
        """Recompute ``task_keys`` for one task (``None``: every task) from its rows."""
        where, params = ("", []) if task_id is None else ("WHERE r.task_id = ?", [task_id])
        conn.execute(
            "DELETE FROM task_keys" + ("" if task_id is None else " WHERE task_id = ?"), params
        )
        for field in _KEYED:
            conn.execute(
                "INSERT OR IGNORE INTO task_keys (field, value, first_seq, task_id) "
                f"SELECT DISTINCT ?, r.{field}, t.first_seq, r.task_id FROM rows AS r "
                f"JOIN tasks AS t ON t.task_id = r.task_id {where} "
                f"{'AND' if where else 'WHERE'} r.{field} IS NOT NULL",
                [field, *params],
            )

    @staticmethod
    def _count(conn: sqlite3.Connection) -> int:
        """Rows stored: seqs handed out minus seqs deleted (two index lookups, O(log n))."""
        sql = f"SELECT ({_ASSIGNED}) - (SELECT value FROM stats WHERE key = 'dead')"
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
            SqliteStorage._rebuild_keys(conn, task_id)  # its agents/names may be gone

    def clear(self) -> None:
        with self._write() as conn:
            self._deleting(conn)
            self._deleted(conn, conn.execute("DELETE FROM rows").rowcount)
            for table in ("tasks", "task_keys", *_ID_TABLES):
                conn.execute(f"DELETE FROM {table}")

    def _upgrade(self, conn: sqlite3.Connection) -> None:
        """Bring an existing file to :data:`FORMAT`, inside the caller's write transaction.

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
            missing = {"task_keys", *_ID_TABLES} - tables
            if missing:  # dropped by hand: derived data, rebuilt
                for statement in _SCHEMA.split(";"):
                    conn.execute(statement)
                if "task_keys" in missing:
                    self._rebuild_keys(conn, None)
                if missing != {"task_keys"}:
                    self._rebuild_ids(conn)
            return
        if fmt > FORMAT:
            raise StorageError(
                f"{self.path} is an experience store of format {fmt}, written by a newer "
                f"replaystore (this one reads format {FORMAT}); upgrade replaystore to open it"
            )
        start = time.perf_counter()
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
        for statement in _SCHEMA.split(";"):
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO rows ({_COLUMNS}) SELECT {_COLUMNS} FROM rows_format{fmt} ORDER BY seq"
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
            conn.execute(_STATS, (FORMAT, assigned, assigned - live, 0))
        else:
            conn.execute("UPDATE stats SET value = ? WHERE key = 'format'", (FORMAT,))
            conn.execute(_STATS, (FORMAT, 0, 0, 0))  # adds 'merged' only
        if "task_keys" not in tables:
            self._rebuild_keys(conn, None)
        self._rebuild_ids(conn)
        log.info(
            "%s: experience store upgraded from format %d to %d (%d rows, %.1f s)",
            self.path,
            fmt,
            FORMAT,
            live,
            time.perf_counter() - start,
        )

    # ------------------------------------------------------------------ reading

    def _decode(self, records: list[tuple[Any, ...]]) -> list[DataRow]:
        payloads = decode_experiences([r[8] for r in records])
        rows = [
            DataRow(ExpMeta(*r[2:8]), exp, r[1]) for r, exp in zip(records, payloads, strict=True)
        ]
        return rows if self.decoders is None else self.decoders.decode_rows(rows)

    @staticmethod
    def _where(cond: Condition | None) -> tuple[str, list[Any]]:
        """The ``WHERE`` expression over ``rows`` for ``cond``, narrowed by ``task_keys``.

        The narrowing (``task_id IN (tasks that can match)``) lets SQLite read the
        rows of those tasks through ``rows_task`` instead of scanning the table.
        """
        where, params = compile_sql(cond)
        if cond is None:
            return where, params
        by_id = _id_filter(cond)
        if by_id is not None:
            sql, id_params = by_id
            return f"seq IN ({sql}) AND ({where})", [*id_params, *params]
        narrow = _task_filter(cond)
        if narrow is None:
            return where, params
        sql, narrow_params, _ = narrow
        return f"task_id IN (SELECT task_id FROM ({sql})) AND ({where})", [*narrow_params, *params]

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
            sql, params = self._task_ids_sql(query_condition)
        else:
            where, params = self._where(query_condition)
            sql = f"SELECT {_COLUMNS} FROM rows WHERE {where} ORDER BY seq"
        with self._read() as conn:
            return [str(r[3]) for r in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]

    def size(self, query_condition: Condition | None = None) -> int:
        with self._read() as conn:
            if query_condition is None:
                return self._count(conn)
            where, params = self._where(query_condition)
            sql = f"SELECT count(*) FROM rows WHERE {where}"
            return int(conn.execute(sql, params).fetchone()[0])

    def get_paginated(
        self, page: int, page_size: int, query_condition: Condition | None = None
    ) -> list[DataRow]:
        page, page_size = check_page(page, page_size)
        where, params = self._where(query_condition)
        with self._read() as conn:
            records = conn.execute(
                f"SELECT {_COLUMNS} FROM rows WHERE {where} ORDER BY seq LIMIT ? OFFSET ?",
                [*params, page_size, (page - 1) * page_size],
            ).fetchall()
        return self._decode(records)

    def get_all(self, query_condition: Condition | None = None) -> list[DataRow]:
        where, params = self._where(query_condition)
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
        sql, params = self._task_ids_sql(cond)
        return [r[0] for r in conn.execute(sql, params)]

    def _task_ids_sql(self, cond: Condition | None) -> tuple[str, list[Any]]:
        # Oldest task first, as every storage orders them: the same seed then picks
        # the same tasks from the same rows whichever storage holds them.
        if cond is None:
            return "SELECT task_id FROM tasks ORDER BY first_seq", []
        one = _one_value_tasks(cond)
        if one is not None:
            # task_keys' primary key (field, value, first_seq, ...) yields the tasks
            # already in age order, with no duplicates.
            return f"SELECT task_id FROM ({one[0]}) ORDER BY first_seq", one[1]
        narrow = _task_filter(cond)
        if narrow is not None and narrow[2]:
            sql, narrow_params, _ = narrow
            return (
                f"SELECT task_id FROM ({sql}) GROUP BY task_id ORDER BY min(first_seq)",
                narrow_params,
            )
        where, params = self._where(cond)
        sql = (
            "SELECT task_id FROM tasks WHERE task_id IN "
            f"(SELECT task_id FROM rows WHERE {where}) ORDER BY first_seq"
        )
        return sql, params

    @staticmethod
    def _firsts_sql(cond: Condition | None) -> tuple[str, list[Any]] | None:
        """SQL giving ``first_seq`` once per task matching ``cond``, from an index alone.

        For no condition and for one ``eq``/``in_`` value on ``task_id``,
        ``agent_id`` or ``task_name``; ``None`` for anything else. A task's
        ``first_seq`` is its own (seqs are never reused), so it names the task.
        """
        if cond is None:
            return "SELECT first_seq FROM tasks", []
        one = _one_value_tasks(cond)
        return None if one is None else (f"SELECT first_seq FROM ({one[0]})", one[1])

    def _pick_task_ids(
        self, conn: sqlite3.Connection, k: int, cond: Condition | None, rng: SeedLike
    ) -> list[str]:
        """``k`` matching task ids (fewer if fewer match): ``choose`` over the tasks in age order.

        Where :meth:`_firsts_sql` applies, SQLite returns the matching tasks'
        ``first_seq`` values as one text (no Python object per task); only the
        picked tasks' ids are read. Same picks as reading every id in age order.
        """
        firsts_sql = self._firsts_sql(cond)
        if firsts_sql is None:
            ids = self._task_ids(conn, cond)
            return [ids[i] for i in choose(len(ids), k, rng)]
        sql, params = firsts_sql
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
        where, params = self._where(query_condition)
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
