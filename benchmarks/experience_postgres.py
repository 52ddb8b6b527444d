"""PostgreSQL experience storage beside SQLite and in-memory, in one run.

Measures, for each storage:

* rows/s in total of 8 writer processes into one store, ``store_batch(1000)``
  (PostgreSQL and SQLite; the in-memory storage is one process's);
* ``sample_task(batch_size=32)`` with an ``eq`` condition on ``exp_meta.agent_id``
  over a store of 1M rows (``--quick``: 20k), median milliseconds;
* bytes per stored row: PostgreSQL tables + indexes + TOAST
  (``pg_total_relation_size``), the SQLite file, the in-memory process's RSS growth.

Rows are the same simulated episodes as ``benchmarks/experience.py`` (20 steps a
task, 8 agents, a small JSON state), with ids ``w0-0``, ``w0-1``, ... or, with
``--ids uuid4``, random ids shaped as AWorld's ``DataRow`` makes them by default
(``str(uuid.uuid4())``, seeded). The PostgreSQL server is ``--postgres-url``
(the store goes into a fresh schema, dropped afterwards) or, without it, a
throwaway local server started from the PostgreSQL binaries with fsync on
(``tests/postgres_server.py``). Run::

    python benchmarks/experience_postgres.py            # full (about five minutes)
    python benchmarks/experience_postgres.py --quick    # smoke test (seconds)
    python benchmarks/experience_postgres.py --ids uuid4  # AWorld's default row ids
    python benchmarks/experience_postgres.py --postgres-url postgresql://me@db/bench
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from replaystore.experience import (
    DataRow,
    Experience,
    ExpMeta,
    InMemoryStorage,
    QueryBuilder,
    ReplayBuffer,
    SqliteStorage,
    Storage,
)

TASK_LEN = 20
AGENTS = 8
WRITERS = 8
BATCH = 1000


def make_rows(n: int, writer: int = 0, ids: str = "sequential") -> list[DataRow]:
    """``n`` rows of simulated episodes: 20 steps per task, 8 agents, JSON state.

    ``ids``: ``"sequential"`` (``w{writer}-{i}``) or ``"uuid4"`` (random, seeded by writer).
    """
    rng = random.Random(writer)
    return [
        DataRow(
            ExpMeta(
                task_id=f"w{writer}-task{i // TASK_LEN}",
                task_name="web_nav",
                agent_id=f"agent_{(i // TASK_LEN) % AGENTS}",
                step=i % TASK_LEN,
                execute_time=1.7e9 + i * 1e-3,
            ),
            Experience(
                state={
                    "url": f"https://example.org/page/{i % 97}",
                    "dom_len": i % 5000,
                    "text": "lorem ipsum dolor sit amet " * 3,
                },
                actions=[{"type": "click", "x": i % 640, "y": i % 480}],
                reward_t=float(i % TASK_LEN == TASK_LEN - 1),
            ),
            f"w{writer}-{i}"
            if ids == "sequential"
            else str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        )
        for i in range(n)
    ]


@contextlib.contextmanager
def postgres_server(url: str | None) -> Iterator[str | None]:
    """``url``, or a throwaway local server's URL (fsync on), or None when neither is possible."""
    if url:
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    try:
        from postgres_server import PostgresServer, find_bindir
    finally:
        sys.path.pop(0)
    bindir = find_bindir()
    if bindir is None:
        yield None
        return
    server = PostgresServer(bindir).start(durable=True)
    try:
        yield server.url
    finally:
        server.stop()


def _open(kind: str, where: str) -> Storage:
    if kind == "postgres":
        from replaystore.experience import PostgresStorage

        url, schema = where.split("|")
        return PostgresStorage(url, schema=schema, pool_size=1)
    return SqliteStorage(where)


def _writer(
    kind: str, where: str, writer: int, n: int, ready: Any, go: Any, ids: str = "sequential"
) -> None:
    rows = make_rows(n, writer, ids)
    buf = ReplayBuffer(_open(kind, where))
    ready.release()
    go.wait()
    for i in range(0, n, BATCH):
        buf.store_batch(rows[i : i + BATCH])


def parallel_store_rate(kind: str, where: str, per_writer: int, ids: str) -> float:
    """Rows/s in total of WRITERS processes storing ``per_writer`` rows each into one store."""
    store = _open(kind, where)  # creates the tables before the clock starts
    ready, go = multiprocessing.Semaphore(0), multiprocessing.Event()
    procs = [
        multiprocessing.Process(target=_writer, args=(kind, where, w, per_writer, ready, go, ids))
        for w in range(WRITERS)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    elapsed = time.perf_counter() - start
    assert store.size() == WRITERS * per_writer, (store.size(), WRITERS * per_writer)
    store.close()
    return WRITERS * per_writer / elapsed


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm caches
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fill(store: Storage, n: int, ids: str, chunk: int = 10_000) -> None:
    """Store ``n`` rows, made and stored ``chunk`` at a time (bounded memory)."""
    buf = ReplayBuffer(store)
    for start in range(0, n, chunk):
        buf.store_batch(make_rows(min(chunk, n - start), start // chunk, ids))


def pg_bytes(url: str, schema: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        return int(
            conn.execute(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'S')",
                (schema,),
            ).fetchone()[0]
        )


def run(url: str, quick: bool, ids: str = "sequential") -> None:
    per_writer = 2_500 if quick else 25_000
    n_big = 20_000 if quick else 1_000_000
    repeats = 5 if quick else 30
    tmp = tempfile.TemporaryDirectory(prefix="replaystore-bench-pg-")
    schemas: list[str] = []

    def new_schema() -> str:
        schemas.append(f"bench_{uuid.uuid4().hex[:8]}")
        return schemas[-1]

    try:
        print(f"## PostgreSQL beside SQLite and in-memory ({'quick' if quick else 'full'} run)\n")
        print(f"load average before: {os.getloadavg()[0]:.1f}\n")
        print(f"row ids: {'w0-0, w0-1, ...' if ids == 'sequential' else 'random (uuid4)'}\n")
        print(f"### {WRITERS} writer processes x {per_writer:,} rows, store_batch({BATCH})\n")
        print("| storage | rows | rows/s total | target |")
        print("|---|---:|---:|---:|")
        total = WRITERS * per_writer
        pg_rate = parallel_store_rate("postgres", f"{url}|{new_schema()}", per_writer, ids)
        print(f"| postgres | {total:,} | {pg_rate:,.0f} | >= 50,000 |")
        sq_path = str(Path(tmp.name) / "eight.sqlite")
        sq_rate = parallel_store_rate("sqlite", sq_path, per_writer, ids)
        print(f"| sqlite | {total:,} | {sq_rate:,.0f} | |")
        print("| memory | - | one process only | |")

        print(f"\n### sample_task(batch_size=32), eq on agent_id, {n_big:,} rows; bytes per row\n")
        print("| storage | fill s | median ms | target | bytes/row | counted |")
        print("|---|---:|---:|---:|---:|---|")
        cond = QueryBuilder().eq("exp_meta.agent_id", "agent_3").build()
        for kind in ("postgres", "sqlite", "memory"):
            gc.collect()
            rss0 = rss_bytes()
            if kind == "postgres":
                schema = new_schema()
                store: Storage = _open("postgres", f"{url}|{schema}")
            elif kind == "sqlite":
                store = SqliteStorage(Path(tmp.name) / "big.sqlite")
            else:
                store = InMemoryStorage(None)
            start = time.perf_counter()
            fill(store, n_big, ids)
            fill_s = time.perf_counter() - start
            buf = ReplayBuffer(store, seed=0)
            ms = median_ms(
                lambda b=buf: b.sample_task(query_condition=cond, batch_size=32), repeats
            )
            warm = None
            if kind == "postgres":
                # Right after a bulk load the first reads of each page set its hint bits
                # (writes); autovacuum catches up in steady state. Measure that state too.
                import psycopg

                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(f'VACUUM ANALYZE "{schema}".rows')
                    conn.execute(f'VACUUM ANALYZE "{schema}".tasks')
                warm = median_ms(
                    lambda b=buf: b.sample_task(query_condition=cond, batch_size=32), repeats
                )
                size, counted = pg_bytes(url, schema), "tables + indexes + TOAST"
                store.drop()  # type: ignore[attr-defined]
            elif kind == "sqlite":
                store.close()  # type: ignore[attr-defined]
                size, counted = (Path(tmp.name) / "big.sqlite").stat().st_size, "database file"
            else:
                size, counted = rss_bytes() - rss0, "process RSS growth"
            label = f"{kind}, right after the load" if warm is not None else kind
            print(
                f"| {label} | {fill_s:.1f} | {ms:.2f} | <= 10 | {size / n_big:,.0f} | {counted} |"
            )
            if warm is not None:
                print(f"| {kind}, after VACUUM ANALYZE | | {warm:.2f} | <= 10 | | store at rest |")
            del store, buf
        print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    finally:
        import psycopg

        with contextlib.suppress(psycopg.Error), psycopg.connect(url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        tmp.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("REPLAYSTORE_BENCH_POSTGRES_URL"),
        help="PostgreSQL server to use (default: start a throwaway local one)",
    )
    parser.add_argument(
        "--ids",
        choices=("sequential", "uuid4"),
        default="sequential",
        help="row ids: w0-0, w0-1, ... (default) or random, as AWorld's DataRow makes them",
    )
    args = parser.parse_args(argv)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print("skipped: pip install 'replaystore[postgres]'")
        return 1
    with postgres_server(args.postgres_url) as url:
        if url is None:
            print(
                "skipped: no --postgres-url and no PostgreSQL binaries (apt-get install postgresql)"
            )
            return 1
        run(url, args.quick, args.ids)
    return 0


if __name__ == "__main__":
    sys.exit(main())
