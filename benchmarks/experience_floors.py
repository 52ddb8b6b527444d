"""Experience writes against a plain-driver floor measured in the same run (issue 39).

    python benchmarks/experience_floors.py [--aworld-src DIR] [--postgres-url URL] [--quick]
        [--out benchmarks/RESULTS.md]

Absolute rates do not carry from one machine to another (a 2-core machine of the same
kind filled SQLite at a third of the rate another recorded); a ratio against a floor
measured beside ours does. For SQLite and PostgreSQL, one process fills a fresh store with
``store_batch(1000)`` (100,000 rows; ``--quick``: 10,000) of the simulated episodes of
``benchmarks/experience.py`` (20 steps a task, 8 agents), with AWorld's pydantic rows
(``Observation``, ``ActionModel``: its own classes with ``--aworld-src``, else stand-in
pydantic models) and with dict payloads; the floor writes the same rows with the driver
alone (``sqlite3``, ``psycopg``): a table with our columns and the same indexes (SQLite: a
unique id index and the ``(task_id, seq)`` index; PostgreSQL: the unique id index and the
six row indexes of ``PostgresStorage``), each row's data serialized once (pydantic's
``model_dump_json``, else ``json.dumps``), one transaction per 1,000 rows
(``executemany``), the same durability settings (SQLite: WAL, ``synchronous=NORMAL``;
PostgreSQL: the server's, fsync on), and nothing else (no validation, no task index, no
capacity, no row-id hashing). Ours and the floor alternate (floor first, then ours) on
fresh files, ``--rounds`` times (default 5): one fill's ratio moved from 1.04x to 1.67x
between two runs on an idle machine, so the table gives the medians and every round's
ratio. SQLite's rounds run first, before the PostgreSQL server starts (until 2026-11-29
the two storages took turns, and the server's work after each 100k-row fill shared the
cores with the next SQLite fills).

The goals (issue 39): SQLite ``store_batch(1000)`` with AWorld's pydantic rows at least
1.5x the floor, and at least 100k rows/s where the floor allows it.
"""

from __future__ import annotations

import argparse
import gc
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_summary, markdown_table, replace_generated_block
from experience_postgres import postgres_server

from experience import fallback_peer, load_aworld, make_rows
from replaystore.experience import ReplayBuffer, SqliteStorage

BEGIN = "<!-- BEGIN GENERATED: experience_floors -->"
END = "<!-- END GENERATED: experience_floors -->"

COLUMNS = "id, task_id, task_name, agent_id, step, execute_time, pre_agent, data"


def _json(value: Any) -> str:
    dump = getattr(value, "model_dump_json", None)
    return dump() if dump is not None else json.dumps(value, separators=(",", ":"))


def floor_params(rows: list[Any]) -> list[tuple[Any, ...]]:
    """Each row's columns, its state, actions and reward serialized once."""
    out = []
    for row in rows:
        meta, data = row.exp_meta, row.exp_data
        actions = ",".join(_json(a) for a in data.actions)
        text = f'{{"state":{_json(data.state)},"actions":[{actions}],"reward_t":{data.reward_t}}}'
        out.append(
            (
                row.id,
                meta.task_id,
                meta.task_name,
                meta.agent_id,
                meta.step,
                meta.execute_time,
                meta.pre_agent,
                text,
            )
        )
    return out


def sqlite_floor(path: Path, rows: list[Any]) -> float:
    """Rows/s of the plain sqlite3 fill (serialization included)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(
        "CREATE TABLE rows (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, task_id TEXT "
        "NOT NULL, task_name TEXT, agent_id TEXT, step INTEGER NOT NULL, execute_time REAL "
        "NOT NULL, pre_agent TEXT, data TEXT NOT NULL)"
    )
    conn.execute("CREATE INDEX rows_task ON rows (task_id, seq)")
    insert = f"INSERT INTO rows ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    start = time.perf_counter()
    for i in range(0, len(rows), 1000):
        params = floor_params(rows[i : i + 1000])
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(insert, params)
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    assert conn.execute("SELECT count(*) FROM rows").fetchone()[0] == len(rows)
    conn.close()
    return len(rows) / elapsed


def postgres_floor(url: str, schema: str, rows: list[Any]) -> float:
    """Rows/s of the plain psycopg fill (serialization included)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.rows (seq BIGSERIAL PRIMARY KEY, id TEXT NOT NULL UNIQUE, "
            "task_id TEXT NOT NULL, task_name TEXT, agent_id TEXT, step BIGINT NOT NULL, "
            "execute_time DOUBLE PRECISION NOT NULL, pre_agent TEXT, data JSONB NOT NULL)"
        )
        for name, cols in (
            ("task", "task_id, seq"),
            ("agent", "agent_id, task_id"),
            ("task_name", "task_name, task_id"),
            ("step", "step"),
            ("execute_time", "execute_time"),
            ("pre_agent", "pre_agent"),
        ):
            conn.execute(f"CREATE INDEX rows_{name} ON {schema}.rows ({cols})")
        insert = f"INSERT INTO {schema}.rows ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        start = time.perf_counter()
        for i in range(0, len(rows), 1000):
            params = floor_params(rows[i : i + 1000])
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(insert, params)
        elapsed = time.perf_counter() - start
        row = conn.execute(f"SELECT count(*) FROM {schema}.rows").fetchone()
        assert row is not None and row[0] == len(rows)
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    return len(rows) / elapsed


def ours(store: Any, rows: list[Any]) -> float:
    buffer = ReplayBuffer(store, seed=0)
    start = time.perf_counter()
    for i in range(0, len(rows), 1000):
        buffer.store_batch(rows[i : i + 1000])
    elapsed = time.perf_counter() - start
    assert store.size() == len(rows)
    return len(rows) / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aworld-src", type=Path, help="AWorld at 0aa3416d: its row classes")
    parser.add_argument("--postgres-url", help="a PostgreSQL server (default: a throwaway one)")
    parser.add_argument("--quick", action="store_true", help="10,000 rows (smoke test)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="floor-then-ours fills per storage (default 5)"
    )
    parser.add_argument("--out", type=Path, help="Markdown file whose generated part to replace")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    n = 10_000 if args.quick else 100_000
    peer = load_aworld(args.aworld_src) if args.aworld_src else fallback_peer()
    rows_of = {
        "pydantic": make_rows(n, kind="pydantic", peer=peer),
        "dict": make_rows(n, kind="dict"),
    }
    table, results = [], {}
    rounds: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # SQLite's rounds first, then PostgreSQL's, with no server started yet: a server
        # digesting a 100k-row fill (its checkpoints, WAL writer, autovacuum) shares the
        # 2 cores with the next SQLite fills when the two storages take turns.
        for round_ in range(args.rounds):
            for kind, rows in rows_of.items():
                gc.collect()
                floor = sqlite_floor(Path(tmp) / f"floor-{kind}-{round_}.sqlite", rows)
                gc.collect()
                store = SqliteStorage(Path(tmp) / f"ours-{kind}-{round_}.sqlite")
                mine = ours(store, rows)
                store.close()
                for used in Path(tmp).glob("*.sqlite*"):  # the next round's files are fresh
                    used.unlink()
                rounds.setdefault(("sqlite", kind), []).append((mine, floor))
    with postgres_server(args.postgres_url) as url:
        for _ in range(args.rounds if url is not None else 0):
            for kind, rows in rows_of.items():
                from replaystore.experience import PostgresStorage

                gc.collect()
                pg_floor = postgres_floor(url, f"floor_{kind}", rows)
                gc.collect()
                store = PostgresStorage(url, schema=f"ours_{kind}", pool_size=1)
                try:
                    pg_mine = ours(store, rows)
                finally:
                    store.drop()  # the schema and its tables; closes the store
                rounds.setdefault(("postgres", kind), []).append((pg_mine, pg_floor))
    for key, pairs in rounds.items():
        ratios = sorted(mine / floor for mine, floor in pairs)
        results[key] = (
            median([mine for mine, _ in pairs]),
            median([floor for _, floor in pairs]),
            median(ratios),
            ratios,
        )
    for (storage, kind), (mine, floor, ratio, ratios) in results.items():
        table.append(
            [
                "SQLite (WAL, synchronous=NORMAL)" if storage == "sqlite" else "PostgreSQL",
                f"{kind} payloads",
                f"{mine / 1e3:,.1f}k",
                f"{floor / 1e3:,.1f}k",
                f"{ratio:.2f}x",
                ", ".join(f"{r:.2f}" for r in ratios),
            ]
        )
    sqlite_mine, sqlite_floor_rate, sqlite_ratio, _ = results["sqlite", "pydantic"]
    goal = [
        f"SQLite store_batch(1000), pydantic rows: {sqlite_ratio:.2f}x the floor, median of "
        f"{args.rounds} rounds (goal >= 1.5x): "
        + ("**met**" if sqlite_ratio >= 1.5 else "**not met**"),
        f"and {sqlite_mine / 1e3:,.1f}k rows/s, median (goal >= 100k where the floor allows it, "
        f"floor {sqlite_floor_rate / 1e3:,.1f}k): "
        + ("**met**" if sqlite_mine >= 100e3 else "**not met**"),
    ]
    if ("postgres", "pydantic") not in results:
        goal.append("PostgreSQL: not measured (no server: give --postgres-url or install it)")
    body = "\n".join(
        [
            f"{n:,} rows, store_batch(1000), one process; {args.rounds} rounds, each a fill "
            f"of the floor then one of ours on fresh files, medians; rows: {peer.label}; "
            f"{machine_summary()}",
            "",
            markdown_table(
                [
                    "storage",
                    "rows",
                    "ours rows/s",
                    "plain driver rows/s",
                    "ours / floor",
                    "the rounds' ratios, sorted",
                ],
                table,
            ),
            "",
            *[f"- {line}" for line in goal],
        ]
    )
    print(body)
    if args.out:
        replace_generated_block(args.out, BEGIN, END, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
