"""Many processes, one PostgreSQL store: every acknowledged row once, capacity held after
every commit with the newest tasks kept, and a writer killed mid-batch leaves all or nothing."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
import traceback
import uuid

import psycopg
import pytest

from replaystore.experience import (
    DataRow,
    Experience,
    ExpMeta,
    PostgresStorage,
    QueryBuilder,
    ReplayBuffer,
)

TASK_LEN = 10
CTX = multiprocessing.get_context("fork")


def rows_for(writer: int, start: int, n: int) -> list[DataRow]:
    return [
        DataRow(
            ExpMeta(
                f"w{writer}-t{i // TASK_LEN:05d}", "stress", f"agent_{writer}", i % TASK_LEN, 0.0
            ),
            Experience(state={"writer": writer, "i": i}, actions=[{"move": i % 4}], reward_t=i % 7),
            f"w{writer}-{i}",
        )
        for i in range(start, start + n)
    ]


def snapshot_counts(conn: psycopg.Connection, schema: str) -> tuple[int, int]:
    """(rows counted, the row counter) in one snapshot."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        counted = conn.execute(f"SELECT count(*) FROM {schema}.rows").fetchone()[0]
        counter = conn.execute(f"SELECT value FROM {schema}.stats").fetchone()[0]
    return counted, counter


def writer(url, schema, w, n_rows, batch, cap, acked, errors) -> None:
    try:
        buf = ReplayBuffer(PostgresStorage(url, cap, schema=schema, pool_size=1))
        with psycopg.connect(url, autocommit=True) as conn:
            for start in range(0, n_rows, batch):
                buf.store_batch(rows_for(w, start, batch))
                acked.put((w, start + batch))  # acknowledged: these rows are committed
                if cap is not None:
                    counted, counter = snapshot_counts(conn, schema)
                    assert counted == counter <= cap, (counted, counter, cap)
    except BaseException:
        errors.put(traceback.format_exc())
        raise


def sampler(url, schema, cap, stop, results) -> None:
    try:
        buf = ReplayBuffer(PostgresStorage(url, cap, schema=schema, pool_size=1), seed=0)
        cond = QueryBuilder().eq("exp_meta.agent_id", "agent_1").or_().gt("exp_data.reward_t", 5)
        rounds = 0
        with psycopg.connect(url, autocommit=True) as conn:
            while not stop.is_set() or rounds == 0:
                for task in buf.sample_task(query_condition=cond, batch_size=8):
                    steps = [r.exp_meta.step for r in task]
                    assert steps == sorted(steps) and len(steps) == TASK_LEN  # whole tasks
                counted, counter = snapshot_counts(conn, schema)
                assert counted == counter and (cap is None or counted <= cap), (counted, counter)
                rounds += 1
        results.put(("ok", rounds))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def run_stress(url: str, writers: int, n_rows: int, batch: int, cap: int | None) -> str:
    schema = f"stress_{uuid.uuid4().hex[:8]}"
    PostgresStorage(url, cap, schema=schema).close()  # create the tables once
    stop, results, acked, errors = CTX.Event(), CTX.Queue(), CTX.Queue(), CTX.Queue()
    samplers = [CTX.Process(target=sampler, args=(url, schema, cap, stop, results)) for _ in "ab"]
    procs = [
        CTX.Process(target=writer, args=(url, schema, w, n_rows, batch, cap, acked, errors))
        for w in range(writers)
    ]
    for p in samplers + procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    stop.set()
    outcomes = [results.get(timeout=120) for _ in samplers]
    for p in samplers:
        p.join(timeout=60)
    assert errors.empty(), errors.get()
    assert all(p.exitcode == 0 for p in procs)
    assert all(status == "ok" for status, _ in outcomes), outcomes
    last = {}
    while not acked.empty():
        w, end = acked.get()
        last[w] = max(last.get(w, 0), end)
    assert last == dict.fromkeys(range(writers), n_rows)
    return schema


def check_all_rows_once(url: str, schema: str, writers: int, n_rows: int) -> None:
    with psycopg.connect(url) as conn:
        n, distinct = conn.execute(
            f"SELECT count(*), count(DISTINCT id) FROM {schema}.rows"
        ).fetchone()
        assert (n, distinct) == (writers * n_rows, writers * n_rows)
        stored = {r[0] for r in conn.execute(f"SELECT id FROM {schema}.rows")}
    assert stored == {f"w{w}-{i}" for w in range(writers) for i in range(n_rows)}
    assert PostgresStorage(url, schema=schema).size() == writers * n_rows


def check_capacity_kept_newest(url: str, schema: str, writers: int, n_rows: int, cap: int):
    store = PostgresStorage(url, cap, schema=schema)
    rows = store.get_all()
    assert 0 < len(rows) <= cap and store.size() == len(rows)
    by_task: dict[str, int] = {}
    for r in rows:
        by_task[r.exp_meta.task_id] = by_task.get(r.exp_meta.task_id, 0) + 1
    assert set(by_task.values()) == {TASK_LEN}  # whole tasks only
    for w in range(writers):
        kept = sorted(int(t.split("-t")[1]) for t in by_task if t.startswith(f"w{w}-"))
        if kept:  # a suffix of this writer's tasks: only its oldest are gone
            assert kept == list(range(kept[0], n_rows // TASK_LEN))
    with psycopg.connect(url) as conn:  # the task table agrees with the rows
        bad = conn.execute(
            f"SELECT count(*) FROM {schema}.tasks t WHERE n_rows <> "
            f"(SELECT count(*) FROM {schema}.rows r WHERE r.task_id = t.task_id)"
        ).fetchone()[0]
    assert bad == 0
    store.close()


def test_four_writers_and_two_samplers_with_capacity(postgres_url):
    schema = run_stress(postgres_url, 4, 500, 50, cap=600)
    check_capacity_kept_newest(postgres_url, schema, 4, 500, 600)


@pytest.mark.slow
def test_eight_writers_of_5000_rows_and_two_samplers_keep_every_row_exactly_once(postgres_url):
    schema = run_stress(postgres_url, 8, 5000, 100, cap=None)
    check_all_rows_once(postgres_url, schema, 8, 5000)


@pytest.mark.slow
def test_eight_writers_with_capacity_never_exceed_it_and_keep_the_newest_tasks(postgres_url):
    schema = run_stress(postgres_url, 8, 5000, 100, cap=3000)
    check_capacity_kept_newest(postgres_url, schema, 8, 5000, 3000)


def crash_writer(url: str, schema: str) -> None:
    store = PostgresStorage(url, schema=schema, pool_size=1)
    n = 0
    while True:
        store.add_batch(
            [
                DataRow(
                    ExpMeta(f"batch{os.getpid()}-{n}", "crash", "a", i, float(i)),
                    Experience(state={"pad": "x" * 200, "i": i}),
                    f"{os.getpid()}-{n}-{i}",
                )
                for i in range(2000)
            ]
        )
        n += 1


def test_sigkill_during_store_batch_leaves_whole_batches_only(postgres_url):
    schema = f"crash_{uuid.uuid4().hex[:8]}"
    PostgresStorage(postgres_url, schema=schema).close()
    for delay in (0.3, 0.6, 0.9):
        proc = CTX.Process(target=crash_writer, args=(postgres_url, schema))
        proc.start()
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
    store = PostgresStorage(postgres_url, schema=schema)
    counts: dict[str, int] = {}
    for row in store.get_all():
        counts[row.exp_meta.task_id] = counts.get(row.exp_meta.task_id, 0) + 1
    assert counts and set(counts.values()) == {2000}
    assert store.size() == 2000 * len(counts) and len(store.task_ids()) == len(counts)
    store.add_batch(rows_for(9, 0, 10))  # still writable
    store.close()


def die_inside_second_batch(url: str, schema: str) -> None:
    store = PostgresStorage(url, schema=schema, pool_size=1)
    store.add_batch(rows_for(0, 0, 300))
    written = 0
    original = psycopg.Copy.write_row

    def write_row(self, row):
        nonlocal written
        written += 1
        if written == 150:  # halfway through the second batch's COPY
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, row)

    psycopg.Copy.write_row = write_row
    store.add_batch(rows_for(1, 0, 300))


def test_sigkill_halfway_through_a_batch_keeps_the_store_whole(postgres_url):
    schema = f"half_{uuid.uuid4().hex[:8]}"
    proc = CTX.Process(target=die_inside_second_batch, args=(postgres_url, schema))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    store = PostgresStorage(postgres_url, schema=schema)
    assert [r.id for r in store.get_all()] == [f"w0-{i}" for i in range(300)]
    assert store.size() == 300
    store.add_batch(rows_for(1, 0, 300))  # the interrupted batch can be written again
    assert store.size() == 600
    store.close()
