"""The summary of an experience store's ``rows`` table: one pair of queries for every backend.

``replaystore stats`` and the viewer show the same figures for a SQLite file
(:func:`replaystore.formats.sqlite_experience.read_summary`) and a PostgreSQL
schema (:func:`replaystore.formats.postgres_experience.read_summary`); both
count them with :func:`summarise_rows`.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

__all__ = ["summarise_rows"]


def _iso(t: Any) -> str | None:
    if not isinstance(t, int | float) or not math.isfinite(t):
        return None
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat(timespec="seconds")


def summarise_rows(conn: Any, table: str = "rows") -> dict[str, Any]:
    """Counts and ranges of the experience table ``table``, read through ``conn.execute``.

    Args:
        conn: a ``sqlite3`` or ``psycopg`` connection (rows as tuples); run it inside
            the caller's read transaction so that both queries see one snapshot.
        table: the table, quoted as the SQL needs it (``rows``, ``"schema".rows``).

    Returns:
        ``rows``, ``tasks``, ``task_names``, ``agents`` (counts), ``steps``
        (``[min, max]``), ``execute_time`` (``[first, last]`` as ISO 8601 UTC;
        None where not a finite number) and ``per_agent`` (``agent_id``, ``rows``,
        ``tasks``; most rows first, then by id).

    Cost: two scans of the table (counts, then grouped by agent).
    """
    n_rows, n_tasks, n_names, min_step, max_step, t0, t1 = conn.execute(
        "SELECT count(*), count(DISTINCT task_id), count(DISTINCT task_name), "
        f"min(step), max(step), min(execute_time), max(execute_time) FROM {table}"
    ).fetchone()
    agents = [
        {"agent_id": a, "rows": n, "tasks": t}
        for a, n, t in conn.execute(
            f"SELECT agent_id, count(*), count(DISTINCT task_id) FROM {table} "
            "GROUP BY agent_id ORDER BY count(*) DESC, agent_id"
        )
    ]
    return {
        "rows": n_rows,
        "tasks": n_tasks,
        "task_names": n_names,
        "agents": len(agents),
        "steps": [min_step, max_step],
        "execute_time": [_iso(t0), _iso(t1)],
        "per_agent": agents,
    }
