"""Many processes, one store: nothing lost, nothing doubled, capacity held, no deadlock."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
import traceback

import pytest

from replaystore.experience import (
    DataRow,
    Experience,
    ExpMeta,
    MultiProcMemoryStorage,
    QueryBuilder,
    ReplayBuffer,
    SqliteStorage,
)

WRITERS = 4
TASK_LEN = 10


def rows_for(writer: int, start: int, n: int) -> list[DataRow]:
    return [
        DataRow(
            ExpMeta(
                f"w{writer}-t{i // TASK_LEN:05d}",
                "stress",
                f"agent_{writer}",
                i % TASK_LEN,
                time.time(),
            ),
            Experience(
                state={"writer": writer, "i": i}, actions=[{"move": i % 4}], reward_t=float(i % 7)
            ),
            f"w{writer}-{i}",
        )
        for i in range(start, start + n)
    ]


def sqlite_writer(path: str, writer: int, n_rows: int, batch: int, cap: int | None) -> None:
    buf = ReplayBuffer(SqliteStorage(path, max_capacity=cap))
    for start in range(0, n_rows, batch):
        buf.store_batch(rows_for(writer, start, batch))


def sqlite_sampler(path: str, stop, errors, cap: int | None) -> None:
    try:
        buf = ReplayBuffer(SqliteStorage(path, max_capacity=cap), seed=0)
        cond = (
            QueryBuilder()
            .eq("exp_meta.agent_id", "agent_1")
            .or_()
            .gt("exp_data.reward_t", 5)
            .build()
        )
        rounds = 0
        while not stop.is_set() or rounds == 0:
            for task in buf.sample_task(query_condition=cond, batch_size=8):
                steps = [r.exp_meta.step for r in task]
                assert steps == sorted(steps)
            if cap is not None:
                assert buf.storage.size() <= cap, buf.storage.size()
            rounds += 1
        errors.put(("ok", rounds))
    except BaseException:
        errors.put(("error", traceback.format_exc()))


def run_sqlite_stress(path, cap):
    SqliteStorage(path, max_capacity=cap)  # create the schema once
    ctx = multiprocessing.get_context()
    stop, results = ctx.Event(), ctx.Queue()
    sampler = ctx.Process(target=sqlite_sampler, args=(str(path), stop, results, cap))
    sampler.start()
    writers = [
        ctx.Process(target=sqlite_writer, args=(str(path), w, 5000, 100, cap))
        for w in range(WRITERS)
    ]
    for p in writers:
        p.start()
    for p in writers:
        p.join(timeout=120)
        assert p.exitcode == 0
    stop.set()
    status, detail = results.get(timeout=60)
    sampler.join(timeout=60)
    assert status == "ok", detail
    assert detail >= 1


@pytest.mark.slow
def test_sqlite_four_writers_and_a_sampler_keep_every_row_exactly_once(tmp_path):
    path = tmp_path / "stress.sqlite"
    run_sqlite_stress(path, None)
    con = sqlite3.connect(path)
    n, distinct = con.execute("SELECT count(*), count(DISTINCT id) FROM rows").fetchone()
    assert (n, distinct) == (20000, 20000)
    stored = {r[0] for r in con.execute("SELECT id FROM rows")}
    assert stored == {f"w{w}-{i}" for w in range(WRITERS) for i in range(5000)}
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()
    assert SqliteStorage(path).size() == 20000


@pytest.mark.slow
def test_sqlite_with_capacity_never_exceeds_it_and_drops_only_oldest_tasks(tmp_path):
    path = tmp_path / "capped.sqlite"
    cap = 3000
    run_sqlite_stress(path, cap)
    store = SqliteStorage(path, max_capacity=cap)
    rows = store.get_all()
    assert 0 < len(rows) <= cap
    by_task: dict[str, int] = {}
    for r in rows:
        by_task[r.exp_meta.task_id] = by_task.get(r.exp_meta.task_id, 0) + 1
    assert set(by_task.values()) == {TASK_LEN}  # whole tasks only
    for w in range(WRITERS):
        kept = sorted(int(t.split("-t")[1]) for t in by_task if t.startswith(f"w{w}-"))
        if kept:  # a suffix of this writer's tasks: only its oldest are gone
            assert kept == list(range(kept[0], 5000 // TASK_LEN))


def mp_writer(buf: ReplayBuffer, writer: int, n_rows: int, batch: int) -> None:
    if batch == 1:
        for row in rows_for(writer, 0, n_rows):
            buf.store(row)
    else:
        for start in range(0, n_rows, batch):
            buf.store_batch(rows_for(writer, start, batch))


def run_multiproc(batch: int, n_rows: int, cap: int = 10000):
    manager = multiprocessing.Manager()
    try:
        buf = ReplayBuffer(
            storage=MultiProcMemoryStorage(
                data_dict=manager.dict(),
                fifo_queue=manager.list(),
                lock=manager.Lock(),
                max_capacity=cap,
            )
        )
        procs = [
            multiprocessing.Process(target=mp_writer, args=(buf, w, n_rows, batch))
            for w in range(WRITERS)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
            assert p.exitcode == 0, "writer hung or failed"
        return {r.id for r in buf.storage.get_all()}, buf
    finally:
        manager.shutdown()


@pytest.mark.slow
def test_multiproc_four_writers_store_rows_that_survive_their_exit():
    ids, _ = run_multiproc(batch=1, n_rows=1000)
    assert ids == {f"w{w}-{i}" for w in range(WRITERS) for i in range(1000)}


def test_multiproc_store_batch_does_not_deadlock():
    ids, _ = run_multiproc(batch=50, n_rows=500)
    assert len(ids) == WRITERS * 500


def test_multiproc_capacity_holds_across_processes():
    ids, _ = run_multiproc(batch=20, n_rows=400, cap=500)
    assert len(ids) <= 500
    by_task: dict[str, int] = {}
    for i in ids:
        w, n = i.split("-")
        key = f"{w}-{int(n) // TASK_LEN}"
        by_task[key] = by_task.get(key, 0) + 1
    assert set(by_task.values()) == {TASK_LEN}


def test_multiproc_log_is_trimmed_when_rows_are_evicted():
    manager = multiprocessing.Manager()
    try:
        log = manager.list()
        store = MultiProcMemoryStorage(manager.dict(), log, manager.Lock(), max_capacity=20)
        # A second handle on the same proxies, as another process would have.
        early = MultiProcMemoryStorage(store._data, log, store._lock, max_capacity=20)
        for start in range(0, 3000, 10):
            store.add_batch(rows_for(0, start, 10))
            if start == 40:
                assert early.size() == 20  # it read the log, then falls behind
        assert store.size() == 20
        assert len(log) < 200  # 300 batches written, the dead front trimmed
        fresh = MultiProcMemoryStorage(store._data, log, store._lock, max_capacity=20)
        expected = [r.id for r in store.get_all()]
        assert expected == [f"w0-{i}" for i in range(2980, 3000)]
        assert [r.id for r in fresh.get_all()] == expected
        assert [r.id for r in early.get_all()] == expected
    finally:
        manager.shutdown()


def crash_writer(path: str, first_batch_stored=None) -> None:
    store = SqliteStorage(path)
    n = 0
    while True:
        if n == 1 and first_batch_stored is not None:
            first_batch_stored.set()
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


@pytest.mark.slow
def test_sigkill_during_store_batch_leaves_whole_batches_only(tmp_path):
    path = tmp_path / "crash.sqlite"
    SqliteStorage(path)
    for delay in (0.15, 0.4, 0.7):
        first_batch_stored = multiprocessing.Event()
        proc = multiprocessing.Process(target=crash_writer, args=(str(path), first_batch_stored))
        proc.start()
        # Killed at some point after its first batch (where exactly does not
        # matter: every outcome must leave whole batches only).
        assert first_batch_stored.wait(120), "the writer stored nothing"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
    store = SqliteStorage(path)
    assert store.integrity_check() == "ok"
    counts: dict[str, int] = {}
    for row in store.get_all():
        counts[row.exp_meta.task_id] = counts.get(row.exp_meta.task_id, 0) + 1
    assert counts and set(counts.values()) == {2000}
    assert store.size() == 2000 * len(counts)
    store.add_batch(rows_for(9, 0, 10))  # still writable


def store_through_inherited(buf: ReplayBuffer, writer: int) -> None:
    buf.store_batch(rows_for(writer, 0, 200))


def test_a_sqlite_buffer_created_in_the_parent_works_in_forked_children(tmp_path):
    buf = ReplayBuffer(SqliteStorage(tmp_path / "shared.sqlite"))
    buf.store_batch(rows_for(99, 0, 10))  # the parent's connection is open when forking
    procs = [
        multiprocessing.Process(target=store_through_inherited, args=(buf, w)) for w in range(3)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(buf) == 610
    assert buf.storage.integrity_check() == "ok"


def die_inside_second_batch(path: str) -> None:
    store = SqliteStorage(path)
    store.add_batch(rows_for(0, 0, 300))
    inserts = 0

    def trace(statement: str) -> None:
        nonlocal inserts
        if statement.startswith("INSERT INTO rows"):
            inserts += 1
            # The batch's 300 rows go in by four statements (256, 32, 8 and 4 rows):
            # killed as the second starts, with 256 rows inserted and not committed.
            if inserts == 2:
                os.kill(os.getpid(), signal.SIGKILL)

    store._connect().set_trace_callback(trace)
    store.add_batch(rows_for(1, 0, 300))


def test_sigkill_halfway_through_a_batch_keeps_the_store_whole(tmp_path):
    path = tmp_path / "halfway.sqlite"
    proc = multiprocessing.Process(target=die_inside_second_batch, args=(str(path),))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == -signal.SIGKILL
    store = SqliteStorage(path)
    assert store.integrity_check() == "ok"
    assert [r.id for r in store.get_all()] == [f"w0-{i}" for i in range(300)]
    assert store.size() == 300
    store.add_batch(rows_for(1, 0, 300))  # the interrupted batch can be written again
    assert store.size() == 600
