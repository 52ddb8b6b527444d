"""PostgreSQL storage: :class:`PostgresStorage`, one store for writers on many machines.

Rows live in a PostgreSQL schema (default ``replaystore``) of tables:

* ``rows``: one row each; the metadata as typed, indexed columns (``task_id``,
  ``agent_id``, ``step`` ...), the payload twice: ``data`` (JSONB, what queries
  read) and ``payload`` (the JSON text exactly as written, what reads return,
  so key order and ``1.0`` vs ``1`` survive; JSONB normalises both);
* ``tasks``: per task its first row's sequence number and row count (FIFO order);
* ``stats``: the row count, so ``size()`` does not scan;
* ``replaystore_version``: the layout version (:data:`SCHEMA_VERSION`).

The read side of the format (the URL's schema, the layout version, the read-only
summary, :func:`read_summary`) lives in :mod:`replaystore.formats.postgres_experience`;
this module writes.

Writers need only ``INSERT``/``UPDATE``/``DELETE`` on those tables; the first
opener creates them (idempotent, under an advisory lock, so several processes may
start at once). A store of an unknown or newer layout is refused with a clear error.

Concurrency: a batch goes in with ``COPY`` in one transaction, all or nothing
(a writer killed mid-batch leaves no trace of it). The short bookkeeping at the
end of each batch (row count, task table, eviction) runs under a
transaction-level advisory lock of the store, so concurrent writers on any
number of machines never evict twice, never lose a row, and the store is within
``max_capacity`` after every commit. The bulk work (``COPY``) runs in parallel.

Conditions compile to SQL with bound parameters only
(:func:`~replaystore.experience.query.compile_sql` with ``dialect="postgresql"``).
Sampling picks in SQL and NumPy with a seeded generator: on small candidate sets
(up to :data:`EXACT_SAMPLING_UP_TO` tasks or rows) it lists them and picks the
same items as every other storage for the same seed; on larger ones it draws
random sequence numbers and keeps those that exist and match, so the cost
follows the sample, not the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from replaystore.errors import ConfigError, SchemaError, StorageError
from replaystore.experience.decoding import FieldDecoders, as_decoders
from replaystore.experience.query import Condition, compile_sql
from replaystore.experience.rows import META_FIELDS, DataRow, decode_row, encode_batch
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
from replaystore.formats.postgres_experience import (
    DEFAULT_SCHEMA,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    check_layout_version,
    error_text,
    read_layout_version,
    read_summary,
    split_schema,
)
from replaystore.redaction import redact
from replaystore.sampling import SeedLike, as_generator

try:  # optional dependency: the "postgres" extra
    import psycopg
    from psycopg import sql
    from psycopg_pool import ConnectionPool
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

__all__ = ["EXACT_SAMPLING_UP_TO", "SCHEMA_VERSION", "PostgresStorage", "read_summary"]

log = logging.getLogger("replaystore.experience.postgres")

EXACT_SAMPLING_UP_TO = 4096
"""Sampling lists the candidates (and picks what every storage picks) up to this many."""

_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
_READ_COLUMNS = "seq, id, " + ", ".join(META_FIELDS) + ", payload"
_COPY_COLUMNS = "seq, id, " + ", ".join(META_FIELDS) + ", data, payload"
_CHUNK = 256  # oldest tasks read per step of eviction

# Pools inherited through fork(). The child must never use or close them: closing a
# connection sends a Terminate message on the socket the parent still uses.
_INHERITED: list[Any] = []

_TABLES = """
CREATE TABLE {s}.rows (
    seq BIGINT PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    task_name TEXT,
    agent_id TEXT,
    step BIGINT NOT NULL,
    execute_time DOUBLE PRECISION NOT NULL,
    pre_agent TEXT,
    data JSONB NOT NULL,
    payload TEXT NOT NULL
);
CREATE SEQUENCE {s}.rows_seq OWNED BY {s}.rows.seq;
CREATE INDEX rows_task ON {s}.rows (task_id, seq);
CREATE INDEX rows_agent ON {s}.rows (agent_id, task_id);
CREATE INDEX rows_task_name ON {s}.rows (task_name, task_id);
CREATE INDEX rows_step ON {s}.rows (step);
CREATE INDEX rows_execute_time ON {s}.rows (execute_time);
CREATE INDEX rows_pre_agent ON {s}.rows (pre_agent);
CREATE TABLE {s}.tasks (
    task_id TEXT PRIMARY KEY,
    first_seq BIGINT NOT NULL,
    n_rows BIGINT NOT NULL,
    tno BIGINT NOT NULL
);
CREATE SEQUENCE {s}.tasks_tno OWNED BY {s}.tasks.tno;
CREATE INDEX tasks_first ON {s}.tasks (first_seq);
CREATE UNIQUE INDEX tasks_by_tno ON {s}.tasks (tno);
CREATE TABLE {s}.stats (key TEXT PRIMARY KEY, value BIGINT NOT NULL);
INSERT INTO {s}.stats (key, value) VALUES ('n_rows', 0);
CREATE TABLE {s}.replaystore_version (component TEXT PRIMARY KEY, version INTEGER NOT NULL);
INSERT INTO {s}.replaystore_version (component, version) VALUES ('experience', {v});
"""


def _require_psycopg() -> None:
    if psycopg is None:
        raise ConfigError(
            "PostgresStorage needs psycopg 3 and psycopg-pool: pip install 'replaystore[postgres]'"
        )


def _lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``name`` (the same on every machine)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresStorage(PicklesSettings, Storage):
    """Rows in a PostgreSQL database, safe for many writer and reader processes on many machines.

    Args:
        conninfo: a libpq connection string or URL, e.g.
            ``"postgresql://user:pw@db.example.org:5432/runs"`` or, for a local
            server's unix socket, ``"postgresql:///runs?host=/var/run/postgresql"``.
            A ``schema=NAME`` query parameter is taken as ``schema``.
        max_capacity: the most rows kept; ``None`` (default) for no limit.
        eviction: ``"task"`` (default) evicts whole oldest tasks; ``"row"`` single rows.
        schema: the PostgreSQL schema holding the tables (default ``"replaystore"``):
            one database can hold many stores. Letters, digits and ``_``.
        pool_size: the most connections this process keeps open (a pool per process).
        timeout: seconds to wait for a connection (server down, pool exhausted).
        decoders: rebuild your types from the stored JSON on every read (see
            :class:`~replaystore.experience.decoding.FieldDecoders`).

    Cost: ``add_batch`` of n rows is one transaction: one ``COPY`` of n rows plus a
    few statements (and the evictions it causes); ``size()`` reads a counter; a
    query on metadata fields uses their indexes, a payload path scans the JSONB.
    Storage per row: the metadata, the payload as JSONB and as text, six indexes.

    Raises:
        StorageError: the server cannot be reached, or the schema holds tables
            that are not a replaystore store, or a store of another layout version.
        ConfigError: a bad ``max_capacity``, ``eviction``, ``schema`` or ``decoders``,
            or psycopg is not installed (``pip install 'replaystore[postgres]'``).
    """

    # Connections do not cross processes: a pickled storage reconnects on use.
    _pickled = (
        "conninfo",
        "schema",
        "max_capacity",
        "eviction",
        "pool_size",
        "timeout",
        "decoders",
    )

    def __init__(
        self,
        conninfo: str,
        max_capacity: int | None = None,
        *,
        eviction: Eviction = "task",
        schema: str | None = None,
        pool_size: int = 4,
        timeout: float = 30.0,
        decoders: FieldDecoders | Mapping[str, Any] | None = None,
    ) -> None:
        _require_psycopg()
        self.max_capacity, self.eviction = check_capacity(max_capacity, eviction)
        self.decoders: FieldDecoders | None = as_decoders(decoders)
        if not isinstance(conninfo, str) or not conninfo:
            raise ConfigError(f"conninfo must be a non-empty string, got {conninfo!r}")
        if conninfo.startswith(("postgresql://", "postgres://")):
            conninfo, url_schema = split_schema(conninfo)
            schema = schema or url_schema
        schema = schema or DEFAULT_SCHEMA
        if not SCHEMA_NAME.fullmatch(schema):
            raise ConfigError(
                f"schema must be letters, digits and '_' (at most 63, not starting with a "
                f"digit), got {schema!r}"
            )
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigError(f"pool_size must be an integer >= 1, got {pool_size!r}")
        self.conninfo = conninfo
        self.schema = schema
        self.pool_size = pool_size
        self.timeout = float(timeout)
        self._reset_local()
        self._create_tables()

    def _reset_local(self) -> None:
        s = sql.Identifier(self.schema).as_string(None)  # quoted, validated above
        self._s = s
        self._lock = _lock_key(f"replaystore.experience:{self.schema}")
        self._pool: ConnectionPool | None = None
        self._pid = os.getpid()
        self._thread_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"PostgresStorage({redact(self.conninfo)!r}, schema={self.schema!r}, "
            f"max_capacity={self.max_capacity!r}, eviction={self.eviction!r})"
        )

    # ------------------------------------------------------------------ connection

    def _get_pool(self) -> ConnectionPool:
        if self._pid != os.getpid():  # forked: leave the parent's connections alone
            # Checked again under the fork-check lock: of several threads of a forked
            # child arriving at once, one swaps and the others take its lock.
            with fork_check_lock():
                if self._pid != os.getpid():
                    if self._pool is not None:
                        _INHERITED.append(self._pool)
                    self._pool = None
                    self._thread_lock = threading.Lock()
                    self._pid = os.getpid()  # last: a thread seeing it finds the new lock
        with self._thread_lock:
            if self._pool is None:
                pool = ConnectionPool(
                    self.conninfo,
                    min_size=1,
                    max_size=self.pool_size,
                    timeout=self.timeout,
                    open=False,
                    name=f"replaystore-{self.schema}",
                )
                try:
                    pool.open(wait=True, timeout=self.timeout)
                except Exception as exc:
                    pool.close()
                    raise StorageError(
                        f"cannot connect to PostgreSQL at {redact(self.conninfo)}: "
                        f"{error_text(exc, self.conninfo)}"
                    ) from exc
                self._pool = pool
            return self._pool

    def close(self) -> None:
        """Close this process's connections (a new pool opens on the next call)."""
        if self._pid != os.getpid():
            return
        with self._thread_lock:
            if self._pool is not None:
                self._pool.close()
            self._pool = None

    @contextlib.contextmanager
    def _connection(self, *, read_only: bool = False) -> Iterator[Any]:
        """A pooled connection inside one transaction (committed on success)."""
        try:
            with self._get_pool().connection() as conn:
                # Reads see one consistent snapshot across their statements. Set on the idle
                # connection, these go out with the BEGIN: no extra round trip.
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ if read_only else None
                conn.read_only = read_only
                yield conn
        except psycopg.OperationalError as exc:
            raise StorageError(
                f"PostgreSQL store {self.schema}: {error_text(exc, self.conninfo)}"
            ) from exc

    def _create_tables(self) -> None:
        """Create the tables once; check the version of existing ones. Safe to race."""
        s = self._s
        try:
            conn = psycopg.connect(self.conninfo, connect_timeout=max(1, int(self.timeout)))
        except psycopg.Error as exc:
            raise StorageError(
                f"cannot connect to PostgreSQL at {redact(self.conninfo)}: "
                f"{error_text(exc, self.conninfo)}"
            ) from exc
        try:
            with conn.transaction():
                # Serialises concurrent first openers: CREATE ... IF NOT EXISTS alone races.
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("replaystore.init"),))
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                found = {
                    r[0]
                    for r in conn.execute(
                        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                        (self.schema,),
                    )
                }
                if "replaystore_version" in found:
                    self._check_version(conn)
                elif found & {"rows", "tasks", "stats"}:
                    raise StorageError(
                        f"schema {self.schema!r} has tables {sorted(found)} but no "
                        "replaystore_version table: it is not a replaystore experience store; "
                        "choose another schema (schema=...)"
                    )
                else:
                    for statement in _TABLES.format(s=s, v=SCHEMA_VERSION).split(";"):
                        if statement.strip():
                            conn.execute(statement)
                    log.info("created experience store tables in schema %s", self.schema)
        except psycopg.Error as exc:
            raise StorageError(
                f"cannot initialise PostgreSQL store {self.schema}: "
                f"{error_text(exc, self.conninfo)}"
            ) from exc
        finally:
            conn.close()

    def _check_version(self, conn: Any) -> None:
        check_layout_version(read_layout_version(conn, self._s), self.schema)

    # ------------------------------------------------------------------ writing

    def add(self, data: DataRow) -> None:
        self.add_batch([data], _where="data")

    def add_batch(self, data_batch: Sequence[DataRow], *, _where: str | None = None) -> None:
        encoded = encode_batch(data_batch, _where, decode=False)
        if not encoded:
            return
        records = [e.record() for e in encoded]
        for i, rec in enumerate(records):
            _check_no_nul(rec, _where or f"data_batch[{i}]")
        n = len(records)
        s = self._s
        with self._connection() as conn:
            seqs = [
                r[0]
                for r in conn.execute(
                    f"SELECT nextval('{s}.rows_seq') FROM generate_series(1, %s)", (n,)
                )
            ]
            seqs.sort()
            try:
                with (
                    conn.transaction(),  # a savepoint: a duplicate id leaves nothing behind
                    conn.cursor().copy(f"COPY {s}.rows ({_COPY_COLUMNS}) FROM STDIN") as copy,
                ):
                    for seq, rec in zip(seqs, records, strict=True):
                        copy.write_row((seq, *rec, rec[-1]))
            except psycopg.errors.UniqueViolation as exc:
                raise SchemaError(f"{self._duplicate(conn, records)}; batch not stored") from exc
            # Per task: first seq and row count, for FIFO eviction by task.
            counts: dict[str, list[int]] = {}
            for seq, rec in zip(seqs, records, strict=True):
                entry = counts.setdefault(rec[1], [seq, 0])
                entry[1] += 1
            # Everything below is short and serialised across all writers of this store.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock,))
            columns = (
                list(counts),
                [c[0] for c in counts.values()],
                [c[1] for c in counts.values()],
            )
            known = {
                r[0]
                for r in conn.execute(
                    f"UPDATE {s}.tasks t SET n_rows = t.n_rows + u.n, "
                    "first_seq = least(t.first_seq, u.f) "
                    "FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) u(task_id, f, n) "
                    "WHERE t.task_id = u.task_id RETURNING t.task_id",
                    columns,
                )
            }
            if len(known) < len(counts):
                # New tasks get the next task numbers: dense, so sampling draws them cheaply
                # (an INSERT ... ON CONFLICT would spend a number on every existing task too).
                new = [i for i, tid in enumerate(columns[0]) if tid not in known]
                conn.execute(
                    f"INSERT INTO {s}.tasks (task_id, first_seq, n_rows, tno) "
                    f"SELECT u.task_id, u.f, u.n, nextval('{s}.tasks_tno') "
                    "FROM unnest(%s::text[], %s::bigint[], %s::bigint[]) AS u(task_id, f, n)",
                    tuple([col[i] for i in new] for col in columns),
                )
            total = conn.execute(
                f"UPDATE {s}.stats SET value = value + %s WHERE key = 'n_rows' RETURNING value",
                (n,),
            ).fetchone()[0]
            self._enforce_capacity(conn, total)

    def _duplicate(self, conn: Any, records: Sequence[tuple[Any, ...]]) -> str:
        seen: set[str] = set()
        for rec in records:
            if rec[0] in seen:
                return f"row id {rec[0]!r} appears twice in the batch"
            seen.add(rec[0])
        stored = conn.execute(
            f"SELECT id FROM {self._s}.rows WHERE id = ANY(%s) LIMIT 3", (list(seen),)
        ).fetchall()
        if not stored:
            return "a row id is already stored (by a concurrent writer)"
        return "row id " + ", ".join(repr(r[0]) for r in stored) + " is already stored"

    def _enforce_capacity(self, conn: Any, total: int) -> None:
        """Evict oldest tasks (or rows) until ``total <= max_capacity``; caller holds the lock."""
        cap = self.max_capacity
        if cap is None or total <= cap:
            return
        s = self._s
        removed = 0
        while total - removed > cap:
            excess = total - removed - cap
            if self.eviction == "row":
                doomed = conn.execute(
                    f"SELECT task_id, count(*), max(seq) FROM "
                    f"(SELECT task_id, seq FROM {s}.rows ORDER BY seq LIMIT %s) o GROUP BY task_id",
                    (excess,),
                ).fetchall()
                cut = max(r[2] for r in doomed)
                conn.execute(f"DELETE FROM {s}.rows WHERE seq <= %s", (cut,))
                for tid, k, _ in doomed:
                    self._shrink_task(conn, tid, k)
                removed += sum(r[1] for r in doomed)
                continue
            oldest = conn.execute(
                f"SELECT task_id, n_rows FROM {s}.tasks ORDER BY first_seq, task_id LIMIT %s",
                (_CHUNK + 1,),
            ).fetchall()
            if not oldest:  # the counter says rows remain but no task does
                raise StorageError(
                    f"store {self.schema!r}: row counter ({total - removed}) and task table "
                    "disagree; the store was modified outside replaystore"
                )
            if len(oldest) == 1:  # one task alone exceeds the capacity: keep its newest rows
                tid = oldest[0][0]
                conn.execute(
                    f"DELETE FROM {s}.rows WHERE seq IN (SELECT seq FROM {s}.rows "
                    "WHERE task_id = %s ORDER BY seq LIMIT %s)",
                    (tid, excess),
                )
                self._shrink_task(conn, tid, excess)
                removed += excess
                continue
            # The newest task is never evicted whole here: it is the last one read
            # when fewer than _CHUNK + 1 came back.
            candidates = oldest[:_CHUNK] if len(oldest) > _CHUNK else oldest[:-1]
            doomed_ids: list[str] = []
            freed = 0
            for tid, k in candidates:
                doomed_ids.append(tid)
                freed += k
                if freed >= excess:
                    break
            conn.execute(f"DELETE FROM {s}.rows WHERE task_id = ANY(%s)", (doomed_ids,))
            conn.execute(f"DELETE FROM {s}.tasks WHERE task_id = ANY(%s)", (doomed_ids,))
            removed += freed
        conn.execute(f"UPDATE {s}.stats SET value = value - %s WHERE key = 'n_rows'", (removed,))

    def _shrink_task(self, conn: Any, task_id: str, n: int) -> None:
        s = self._s
        left = conn.execute(
            f"SELECT 1 FROM {s}.rows WHERE task_id = %s LIMIT 1", (task_id,)
        ).fetchone()
        if left is None:
            conn.execute(f"DELETE FROM {s}.tasks WHERE task_id = %s", (task_id,))
        else:  # first_seq stays the task's first row ever: tasks keep their age order
            conn.execute(
                f"UPDATE {s}.tasks SET n_rows = n_rows - %s WHERE task_id = %s", (n, task_id)
            )

    def clear(self) -> None:
        s = self._s
        with self._connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock,))
            removed = conn.execute(f"DELETE FROM {s}.rows").rowcount
            conn.execute(f"DELETE FROM {s}.tasks")
            conn.execute(
                f"UPDATE {s}.stats SET value = value - %s WHERE key = 'n_rows'", (removed,)
            )

    def drop(self) -> None:
        """Delete the whole store: its schema and every table in it. Irreversible."""
        with self._connection() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock,))
            conn.execute(f"DROP SCHEMA {self._s} CASCADE")
        self.close()

    # ------------------------------------------------------------------ reading

    def _decode(self, records: list[tuple[Any, ...]]) -> list[DataRow]:
        rows = [decode_row(r[1], r[2:8], r[8]) for r in records]
        return rows if self.decoders is None else self.decoders.decode_rows(rows)

    def _where(self, cond: Condition | None) -> tuple[str, list[Any]]:
        return compile_sql(cond, dialect="postgresql")

    def size(self, query_condition: Condition | None = None) -> int:
        where, params = self._where(query_condition)
        with self._connection(read_only=True) as conn:
            if query_condition is None:
                return self._count(conn)
            return int(
                conn.execute(
                    f"SELECT count(*) FROM {self._s}.rows WHERE {where}", params
                ).fetchone()[0]
            )

    def _count(self, conn: Any) -> int:
        return int(
            conn.execute(f"SELECT value FROM {self._s}.stats WHERE key = 'n_rows'").fetchone()[0]
        )

    def get_paginated(
        self, page: int, page_size: int, query_condition: Condition | None = None
    ) -> list[DataRow]:
        page, page_size = check_page(page, page_size)
        where, params = self._where(query_condition)
        with self._connection(read_only=True) as conn:
            records = conn.execute(
                f"SELECT {_READ_COLUMNS} FROM {self._s}.rows WHERE {where} "
                "ORDER BY seq LIMIT %s OFFSET %s",
                [*params, page_size, (page - 1) * page_size],
            ).fetchall()
        return self._decode(records)

    def get_all(self, query_condition: Condition | None = None) -> list[DataRow]:
        where, params = self._where(query_condition)
        with self._connection(read_only=True) as conn:
            records = conn.execute(
                f"SELECT {_READ_COLUMNS} FROM {self._s}.rows WHERE {where} ORDER BY seq", params
            ).fetchall()
        return self._decode(records)

    def iter_rows(self, batch_size: int = 10_000) -> Iterator[list[DataRow]]:
        """Every row in insertion order, ``batch_size`` rows at a time (a server-side cursor).

        For copying or exporting a store larger than memory; the rows come from one
        snapshot of the store.
        """
        batch_size = check_count(batch_size)
        with self._connection(read_only=True) as conn, conn.cursor(name="replaystore_iter") as cur:
            cur.itersize = batch_size
            cur.execute(f"SELECT {_READ_COLUMNS} FROM {self._s}.rows ORDER BY seq")
            while records := cur.fetchmany(batch_size):
                yield self._decode(records)

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        return self.get_batch_by_task_ids([task_id])[task_id]

    def get_batch_by_task_ids(self, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        with self._connection(read_only=True) as conn:
            return self._rows_of_tasks(conn, list(dict.fromkeys(task_ids)))

    def _rows_of_tasks(self, conn: Any, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        out: dict[str, list[DataRow]] = {tid: [] for tid in task_ids}
        if not task_ids:
            return out
        records = conn.execute(
            f"SELECT {_READ_COLUMNS} FROM {self._s}.rows WHERE task_id = ANY(%s) ORDER BY seq",
            (list(task_ids),),
        ).fetchall()
        for row in self._decode(records):
            out[row.exp_meta.task_id].append(row)
        return out

    def _fetch_seqs(self, conn: Any, seqs: Sequence[int]) -> list[DataRow]:
        if not seqs:
            return []
        records = conn.execute(
            f"SELECT {_READ_COLUMNS} FROM {self._s}.rows WHERE seq = ANY(%s)", (list(seqs),)
        ).fetchall()
        by_seq = {rec[0]: row for rec, row in zip(records, self._decode(records), strict=True)}
        return [by_seq[s] for s in seqs if s in by_seq]

    def task_ids(self, query_condition: Condition | None = None) -> list[str]:
        with self._connection(read_only=True) as conn:
            return self._task_ids(conn, query_condition)

    def _task_ids(self, conn: Any, cond: Condition | None) -> list[str]:
        # Oldest task first, as every storage orders them.
        s = self._s
        if cond is None:
            return [r[0] for r in conn.execute(f"SELECT task_id FROM {s}.tasks ORDER BY first_seq")]
        where, params = self._where(cond)
        return [
            r[0]
            for r in conn.execute(
                f"SELECT t.task_id FROM {s}.tasks t WHERE EXISTS (SELECT 1 FROM {s}.rows "
                f"WHERE rows.task_id = t.task_id AND {where}) ORDER BY t.first_seq",
                params,
            )
        ]

    def _pick_task_ids(self, conn: Any, k: int, cond: Condition | None, rng: SeedLike) -> list[str]:
        if k == 0:
            return []
        gen = as_generator(rng)
        picked = self._draw_task_ids(conn, k, cond, gen)
        if picked is not None:
            return picked
        ids = self._task_ids(conn, cond)
        return [ids[i] for i in choose(len(ids), k, gen)]

    def _draw_task_ids(
        self, conn: Any, k: int, cond: Condition | None, gen: np.random.Generator
    ) -> list[str] | None:
        """k distinct matching tasks drawn through their task numbers; None to list instead.

        Tasks are numbered densely as they appear; a uniform random number in
        [min, max] of the live tasks' numbers hits one task or a hole left by
        eviction (every live task equally likely); the task is kept when one of
        its rows matches. Used on stores with many tasks.
        """
        s = self._s
        # Bounded costs: "more than EXACT_SAMPLING_UP_TO tasks?" reads at most that many
        # index entries; min/max come from the index; the size is the planner's estimate.
        few, lo, hi, estimate = conn.execute(
            f"SELECT (SELECT count(*) FROM (SELECT 1 FROM {s}.tasks LIMIT %s) x), "
            f"(SELECT min(tno) FROM {s}.tasks), (SELECT max(tno) FROM {s}.tasks), "
            "(SELECT reltuples FROM pg_class WHERE oid = %s::regclass)",
            (EXACT_SAMPLING_UP_TO + 1, f"{s}.tasks"),
        ).fetchone()
        if few <= EXACT_SAMPLING_UP_TO:
            return None
        where, params = self._where(cond)
        # LATERAL ... LIMIT 1 probes each candidate task by index; a plain EXISTS would be
        # planned as a semi-join over every matching row of the store.
        query = (
            f"SELECT t.task_id FROM unnest(%s::bigint[]) WITH ORDINALITY c(tno, ord) "
            f"CROSS JOIN LATERAL (SELECT task_id FROM {s}.tasks WHERE tasks.tno = c.tno LIMIT 1) t "
            f"CROSS JOIN LATERAL (SELECT 1 FROM {s}.rows WHERE rows.task_id = t.task_id "
            f"AND {where} LIMIT 1) m ORDER BY c.ord"
        )
        live = max(int(estimate or 0), few)
        return _draw(conn, k, lo, hi, live, query, params, gen)

    def sample_task_ids(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[str]:
        k = check_count(batch_size)
        self._where(query_condition)  # a malformed condition raises even on an empty store
        with self._connection(read_only=True) as conn:
            return self._pick_task_ids(conn, k, query_condition, rng)

    def sample_tasks(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> dict[str, list[DataRow]]:
        """Sample task ids and read their rows in one snapshot (no task vanishes between)."""
        k = check_count(batch_size)
        self._where(query_condition)
        with self._connection(read_only=True) as conn:
            return self._rows_of_tasks(conn, self._pick_task_ids(conn, k, query_condition, rng))

    def sample_rows(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[DataRow]:
        k = check_count(batch_size)
        where, params = self._where(query_condition)
        if k == 0:
            return []
        gen = as_generator(rng)
        with self._connection(read_only=True) as conn:
            picked = self._draw_seqs(conn, k, where, params, gen)
            if picked is None:
                seqs = np.array(
                    [
                        r[0]
                        for r in conn.execute(
                            f"SELECT seq FROM {self._s}.rows WHERE {where} ORDER BY seq", params
                        )
                    ],
                    dtype=np.int64,
                )
                picked = seqs[choose(len(seqs), k, gen)].tolist()
            return self._fetch_seqs(conn, picked)

    def _draw_seqs(
        self, conn: Any, k: int, where: str, params: list[Any], gen: np.random.Generator
    ) -> list[int] | None:
        """k distinct matching row seqs drawn uniformly from [min, max]; None to list instead."""
        s = self._s
        total = self._count(conn)
        if total <= EXACT_SAMPLING_UP_TO:
            return None
        lo, hi = conn.execute(f"SELECT min(seq), max(seq) FROM {s}.rows").fetchone()
        if lo is None:
            return None
        query = (
            f"SELECT r.seq FROM unnest(%s::bigint[]) WITH ORDINALITY c(seq, ord) "
            f"CROSS JOIN LATERAL (SELECT seq FROM {s}.rows WHERE rows.seq = c.seq "
            f"AND {where}) r ORDER BY c.ord"
        )
        return _draw(conn, k, lo, hi, total, query, params, gen)


def _draw(
    conn: Any,
    k: int,
    lo: int,
    hi: int,
    live: int,
    query: str,
    params: list[Any],
    gen: np.random.Generator,
) -> list[Any] | None:
    """Up to k distinct keys that ``query`` returns for random candidates in [lo, hi].

    ``query`` takes the candidate array as its first parameter and returns the
    keys of the live, matching candidates in the candidates' (random) order, so
    the keys are a uniform sample without replacement of the matching items.
    Round sizes follow the hit rate seen so far; ``None`` after a few rounds
    that found too few (a condition few items meet: list them instead).
    """
    picked: dict[Any, None] = {}
    tried = hit = 0
    rate = min(live / (hi - lo + 1), 1.0) / 2  # first guess: half the live items match
    for _ in range(6):
        need = k - len(picked)
        size = int(min(2 * need / max(rate, 1e-6) + 32, 100_000))
        cand = np.unique(gen.integers(lo, hi + 1, size=size))
        gen.shuffle(cand)
        array = "{" + ",".join(map(str, cand.tolist())) + "}"  # much faster than a list param
        keys = [r[0] for r in conn.execute(query, [array, *params])]
        tried += len(cand)
        hit += len(keys)
        for key in keys:
            picked.setdefault(key, None)
            if len(picked) == k:
                return list(picked)
        rate = hit / tried if hit else rate / 8
    return None


def _check_no_nul(record: tuple[Any, ...], where: str) -> None:
    """PostgreSQL text cannot hold NUL (U+0000): refuse it here, naming the field."""
    names = ("id", *(f"exp_meta.{f}" for f in META_FIELDS))
    for name, value in zip(names, record[:-1], strict=True):
        if isinstance(value, str) and "\x00" in value:
            raise SchemaError(
                f"{where}: {name} contains a NUL character, which PostgreSQL cannot store"
            )
    if "\\u0000" in record[-1] and _NUL_ESCAPE.search(record[-1]):
        raise SchemaError(
            f"{where} (row {record[0]!r}): exp_data contains a NUL character (\\u0000), "
            "which PostgreSQL cannot store"
        )
