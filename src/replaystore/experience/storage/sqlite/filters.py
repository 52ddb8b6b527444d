"""Query conditions as SQL over the SQLite store's tables: the ``WHERE`` of a row query,
narrowed through the store's indexes, and the SQL that picks matching tasks.

:func:`~replaystore.experience.query.compile_sql` turns a condition into a ``WHERE``
expression over ``rows`` (bound parameters; values are never written into SQL
text). :func:`where_sql` adds what lets SQLite read only the rows that can match:

* ``eq``/``in_`` on ``id``: the seqs of those ids' hashes, through the id tables
  (:func:`~replaystore.formats.sqlite_experience.id_seqs_sql`);
* ``eq``/``in_`` on ``task_id``, ``agent_id`` or ``task_name``: the tasks that
  can match, through ``tasks`` and ``task_keys``, whose rows are then read
  through the ``rows_task`` index.

:func:`task_ids_sql` and :func:`firsts_sql` select the matching tasks (oldest
first) for :meth:`~replaystore.experience.storage.sqlite.storage.SqliteStorage.task_ids`
and task sampling, from ``task_keys`` alone where that suffices. Every
condition must be validated already (the storage's callers do).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replaystore.experience.query import Condition, canonical_field, compile_sql
from replaystore.experience.rows import id_hashes
from replaystore.experience.storage.sqlite.schema import KEYED
from replaystore.formats.sqlite_experience import id_seqs_sql

__all__ = ["firsts_sql", "task_ids_sql", "where_sql"]


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
    if name not in KEYED:
        return None
    return (
        f"SELECT task_id, first_seq FROM task_keys WHERE field = ? AND value IN ({marks})",
        [name, *strings],
        True,
    )


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


def where_sql(cond: Condition | None) -> tuple[str, list[Any]]:
    """The ``WHERE`` expression over ``rows`` for ``cond``, narrowed by ``task_keys``.

    The narrowing (``task_id IN (tasks that can match)``) lets SQLite read the
    rows of those tasks through ``rows_task`` instead of scanning the table; a
    condition on ``id`` reads the rows of the ids' hashes through the id tables.
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


def task_ids_sql(cond: Condition | None) -> tuple[str, list[Any]]:
    """SQL selecting the ids of the tasks with a row matching ``cond``, oldest task first.

    Oldest first, as every storage orders them: the same seed then picks the same
    tasks from the same rows whichever storage holds them.
    """
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
    where, params = where_sql(cond)
    sql = (
        "SELECT task_id FROM tasks WHERE task_id IN "
        f"(SELECT task_id FROM rows WHERE {where}) ORDER BY first_seq"
    )
    return sql, params


def firsts_sql(cond: Condition | None) -> tuple[str, list[Any]] | None:
    """SQL giving ``first_seq`` once per task matching ``cond``, from an index alone.

    For no condition and for one ``eq``/``in_`` value on ``task_id``,
    ``agent_id`` or ``task_name``; ``None`` for anything else. A task's
    ``first_seq`` is its own (seqs are never reused), so it names the task.
    """
    if cond is None:
        return "SELECT first_seq FROM tasks", []
    one = _one_value_tasks(cond)
    return None if one is None else (f"SELECT first_seq FROM ({one[0]})", one[1])
