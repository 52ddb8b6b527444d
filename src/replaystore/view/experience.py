"""Read-only access to an experience store for the viewer, and its filter form.

Two readers with one interface (:class:`ExperienceReader`):

* :class:`SqliteReader` opens the SQLite file read-only with
  :func:`~replaystore.formats.sqlite_experience.open_readonly` (``mode=ro``, never
  ``immutable``; opening it with
  :class:`~replaystore.experience.storage.sqlite.SqliteStorage` would create its
  tables and switch the journal to WAL, i.e. write), so rows a writer adds show
  on the next page load. Filters compile with the store's own SQL compiler
  (:func:`~replaystore.experience.query.compile_sql`), so a filter selects
  exactly the rows the store's queries would.
* :class:`StorageReader` wraps an opened storage (PostgreSQL, through
  :func:`~replaystore.experience.storage.urls.open_storage`) and calls only its
  reading methods.

The filter form (:func:`condition_from_form`) maps rows of (field, op, value)
onto :class:`~replaystore.experience.query.QueryBuilder`, AND-ed together.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from replaystore.errors import QueryError, StorageError
from replaystore.experience.query import OPS, Condition, QueryBuilder, compile_sql
from replaystore.experience.rows import (
    META_FIELDS,
    DataRow,
    ExpMeta,
    decode_experiences,
    id_hash,
)
from replaystore.formats.sqlite_experience import id_seqs_sql, open_readonly

__all__ = [
    "FILTER_OPS",
    "ExperienceReader",
    "SqliteReader",
    "StorageReader",
    "condition_from_form",
    "row_json",
]

#: Operators of the filter form: QueryBuilder's verbs (``in`` is ``in_``), the query's own list.
FILTER_OPS: tuple[str, ...] = OPS
_NO_VALUE = ("is_null", "is_not_null")


def _value(text: str) -> Any:
    """A form value: JSON when it parses (``3``, ``0.5``, ``true``, ``"x"``), else the text."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def condition_from_form(filters: Sequence[tuple[str, str, str]]) -> Condition | None:
    """The condition of the filter form's rows, AND-ed (None: no filter).

    Args:
        filters: ``(field, op, value)`` triples; a row with an empty field is
            ignored. ``field`` is a dotted path (``exp_meta.task_id``,
            ``exp_data.reward_t``, ``exp_data.state.url``); ``op`` one of
            :data:`FILTER_OPS`; ``value`` is parsed as JSON when it parses and
            kept as text otherwise; for ``in``/``not_in`` it is a comma-separated list.

    Raises:
        QueryError: an unknown operator, a missing value, or a field or value
            the QueryBuilder refuses (its message names it).
    """
    builder = QueryBuilder()
    used = False
    for field, op, raw in filters:
        field = field.strip()
        if not field:
            continue
        if op not in FILTER_OPS:
            raise QueryError(f"unknown filter operator {op!r}; operators: {', '.join(FILTER_OPS)}")
        if used:
            builder.and_()
        if op in _NO_VALUE:
            getattr(builder, op)(field)
        elif op in ("in", "not_in"):
            values = [_value(v.strip()) for v in raw.split(",") if v.strip()]
            if not values:
                raise QueryError(f"filter {field} {op}: give a comma-separated list of values")
            (builder.in_ if op == "in" else builder.not_in)(field, values)
        else:
            if raw == "":
                raise QueryError(f"filter {field} {op}: give a value")
            getattr(builder, op)(field, _value(raw))
        used = True
    return builder.build() if used else None


def row_json(row: DataRow) -> str:
    """The row as pretty-printed JSON (what the store holds, decoded)."""
    return json.dumps(row.to_dict(), indent=2, ensure_ascii=False, default=str, sort_keys=False)


class ExperienceReader(Protocol):
    """What the experience pages read."""

    description: str

    def size(self, cond: Condition | None = None) -> int: ...

    def rows(self, page: int, page_size: int, cond: Condition | None = None) -> list[DataRow]: ...

    def row(self, row_id: str) -> DataRow | None: ...

    def tasks(self, page: int, page_size: int) -> tuple[int, list[dict[str, Any]]]: ...


_COLUMNS = "id, " + ", ".join(META_FIELDS) + ", data"


class SqliteReader:
    """A SQLite experience store opened read-only (``mode=ro``; nothing is ever written).

    Never ``immutable``: each page reads the rows committed before it, so rows a
    writer adds while the viewer runs show on the next page load.

    Raises:
        StorageError: the file cannot be opened read-only or has no replaystore
            ``rows`` table (see :func:`~replaystore.formats.sqlite_experience.open_readonly`).

    Thread safety: one connection shared by the server's threads under a lock.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.description = f"SQLite experience store {self.path.resolve()}"
        self._conn = open_readonly(self.path, ("id", *META_FIELDS, "data"))
        self._lock = threading.Lock()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, list(params)).fetchall()
            except sqlite3.Error as exc:
                raise StorageError(f"{self.path}: {exc}") from None

    def _rows(self, records: list[tuple[Any, ...]]) -> list[DataRow]:
        payloads = decode_experiences([r[7] for r in records])
        return [DataRow(ExpMeta(*r[1:7]), e, r[0]) for r, e in zip(records, payloads, strict=True)]

    def size(self, cond: Condition | None = None) -> int:
        """Rows matching ``cond`` (one ``COUNT(*)``)."""
        where, params = compile_sql(cond)
        return int(self._query(f"SELECT COUNT(*) FROM rows WHERE {where}", params)[0][0])

    def rows(self, page: int, page_size: int, cond: Condition | None = None) -> list[DataRow]:
        """Page ``page`` (1-based) of the rows matching ``cond``, in insertion order."""
        where, params = compile_sql(cond)
        sql = f"SELECT {_COLUMNS} FROM rows WHERE {where} ORDER BY seq LIMIT ? OFFSET ?"
        return self._rows(self._query(sql, [*params, page_size, (page - 1) * page_size]))

    def row(self, row_id: str) -> DataRow | None:
        """The row with id ``row_id``, or None.

        Format 3 files find it through their id tables (by the id's hash); older
        ones through their unique index on ``id``.
        """
        if self._has_table("row_ids"):
            h = id_hash(row_id)
            found = self._query(
                f"SELECT {_COLUMNS} FROM rows WHERE seq IN ({id_seqs_sql(1)}) AND id = ?",
                [h, h, row_id],
            )
        else:
            found = self._query(f"SELECT {_COLUMNS} FROM rows WHERE id = ?", [row_id])
        return self._rows(found)[0] if found else None

    def tasks(self, page: int, page_size: int) -> tuple[int, list[dict[str, Any]]]:
        """(number of tasks, page of task summaries in order of first row).

        Cost: with the store's ``tasks`` table (every store this version writes),
        one indexed page of it plus the page's rows through the ``rows_task``
        index; a file without it costs one grouped scan of ``rows`` per page.
        """
        offset = (page - 1) * page_size
        if self._has_table("tasks"):
            total = int(self._query("SELECT COUNT(*) FROM tasks")[0][0])
            ids = [
                r[0]
                for r in self._query(
                    "SELECT task_id FROM tasks ORDER BY first_seq LIMIT ? OFFSET ?",
                    [page_size, offset],
                )
            ]
            marks = ", ".join("?" * len(ids))
            records = (
                self._query(
                    "SELECT task_id, MIN(task_name), COUNT(*), MIN(step), MAX(step), "
                    f"GROUP_CONCAT(DISTINCT agent_id) FROM rows WHERE task_id IN ({marks}) "
                    "GROUP BY task_id",
                    ids,
                )
                if ids
                else []
            )
            by_id = {r[0]: r for r in records}
            records = [by_id[i] for i in ids if i in by_id]
        else:
            total = int(self._query("SELECT COUNT(DISTINCT task_id) FROM rows")[0][0])
            records = self._query(
                "SELECT task_id, MIN(task_name), COUNT(*), MIN(step), MAX(step), "
                "GROUP_CONCAT(DISTINCT agent_id) FROM rows GROUP BY task_id ORDER BY MIN(seq) "
                "LIMIT ? OFFSET ?",
                [page_size, offset],
            )
        return total, [
            {
                "task_id": r[0],
                "task_name": r[1],
                "rows": r[2],
                "steps": (r[3], r[4]),
                "agents": r[5],
            }
            for r in records
        ]

    def _has_table(self, name: str) -> bool:
        found = self._query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [name])
        return bool(found)


class StorageReader:
    """Any opened experience storage, through its reading methods only (PostgreSQL)."""

    def __init__(self, storage: Any, description: str) -> None:
        self.storage = storage
        self.description = description

    def size(self, cond: Condition | None = None) -> int:
        return int(self.storage.size(cond))

    def rows(self, page: int, page_size: int, cond: Condition | None = None) -> list[DataRow]:
        return list(self.storage.get_paginated(page, page_size, cond))

    def row(self, row_id: str) -> DataRow | None:
        found = self.storage.get_paginated(1, 1, QueryBuilder().eq("id", row_id).build())
        return found[0] if found else None

    def tasks(self, page: int, page_size: int) -> tuple[int, list[dict[str, Any]]]:
        ids = self.storage.task_ids()
        chosen = ids[(page - 1) * page_size : page * page_size]
        by_task = self.storage.get_batch_by_task_ids(chosen) if chosen else {}
        out = []
        for task_id in chosen:
            rows = by_task.get(task_id, [])
            steps = [r.exp_meta.step for r in rows]
            out.append(
                {
                    "task_id": task_id,
                    "task_name": rows[0].exp_meta.task_name if rows else None,
                    "rows": len(rows),
                    "steps": (min(steps), max(steps)) if steps else (None, None),
                    "agents": ",".join(sorted({str(r.exp_meta.agent_id) for r in rows})),
                }
            )
        return len(ids), out
