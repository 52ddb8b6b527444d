"""A storage opened in the parent, used by many threads of a forked child at once.

The first call in the child finds the parent's connection (SQLite) or pool
(PostgreSQL) and replaces it with its own. When several threads of the child make
that first call together, exactly one of them must replace it: the others then use
the child's connection under the child's lock. Before the fork check ran under a
lock, two threads could both decide to reopen, each with its own new thread lock,
and then share one connection without a common lock.

To make the threads meet inside the check every time (not once in a thousand
runs), the child's ``os.getpid`` answers each thread's first call late (see
``_slow_getpid``).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from replaystore.experience import ExperienceBuffer, SqliteStorage
from replaystore.experience.storage.sqlite import storage as sqlite_module

from .helpers import episode

CTX = multiprocessing.get_context("fork")
THREADS = 8
ROUNDS = 5
STEPS = 2


def _slow_getpid() -> None:
    """Hammer thread k's first ``os.getpid()`` answers after 2k ms: thread 0 reopens at
    once, and the others reach the fork check's comparison after it did, holding the
    pid they read before it."""
    real = os.getpid
    waited: set[str] = set()

    def getpid() -> int:
        name = threading.current_thread().name
        if name.startswith("hammer-") and name not in waited:
            waited.add(name)
            time.sleep(0.002 * int(name.removeprefix("hammer-")))
        return real()

    os.getpid = getpid


def _hammer(buf: ExperienceBuffer, out: Path) -> None:
    """Run in the forked child: THREADS threads store and sample; write what happened."""
    errors: list[str] = []
    barrier = threading.Barrier(THREADS)

    def work(t: int) -> None:
        try:
            barrier.wait()
            for r in range(ROUNDS):
                buf.store_batch(episode(f"child-{t}-{r}", STEPS))
                buf.sample_task(batch_size=2, seed=r)
        except BaseException:
            errors.append(traceback.format_exc())

    threads = [threading.Thread(target=work, args=(t,), name=f"hammer-{t}") for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.write_text(json.dumps({"errors": errors, "rows": len(buf)}), encoding="utf-8")


def _run_child(target: Any, buf: ExperienceBuffer, out: Path) -> dict[str, Any]:
    child = CTX.Process(target=target, args=(buf, out))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0, f"child exit code {child.exitcode}"
    return json.loads(out.read_text(encoding="utf-8"))


def _sqlite_child(buf: ExperienceBuffer, out: Path) -> None:
    opened: list[str] = []
    real_connect = sqlite_module.sqlite3.connect

    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        # the storage's own connection (its background checkpointer opens one of its own)
        if not threading.current_thread().name.startswith("replaystore-checkpoint"):
            opened.append(str(args[0]))
        return real_connect(*args, **kwargs)

    sqlite_module.sqlite3.connect = counting_connect
    _slow_getpid()
    _hammer(buf, out)
    result = json.loads(out.read_text(encoding="utf-8"))
    out.write_text(json.dumps({**result, "opened": opened}), encoding="utf-8")


def test_threads_of_a_forked_child_reopen_a_sqlite_store_once(tmp_path: Path) -> None:
    buf = ExperienceBuffer(SqliteStorage(tmp_path / "s.sqlite"))
    buf.store_batch(episode("parent", STEPS))  # the parent's connection is open at the fork
    result = _run_child(_sqlite_child, buf, tmp_path / "out.json")
    assert result["errors"] == [], "\n".join(result["errors"])
    assert result["opened"] == [str(tmp_path / "s.sqlite")]  # one reopen, by one thread
    assert result["rows"] == STEPS * (1 + THREADS * ROUNDS)
    assert len(buf) == STEPS * (1 + THREADS * ROUNDS)  # the parent still works


def _postgres_child(buf: ExperienceBuffer, out: Path) -> None:
    from replaystore.experience.storage import postgres as pg_module

    opened: list[int] = []
    real_pool = pg_module.ConnectionPool

    def counting_pool(*args: Any, **kwargs: Any) -> Any:
        opened.append(os.getpid())
        return real_pool(*args, **kwargs)

    pg_module.ConnectionPool = counting_pool
    _slow_getpid()
    _hammer(buf, out)
    result = json.loads(out.read_text(encoding="utf-8"))
    out.write_text(json.dumps({**result, "opened": len(opened)}), encoding="utf-8")


def test_threads_of_a_forked_child_open_one_postgres_pool(make_postgres, tmp_path: Path) -> None:
    buf = ExperienceBuffer(make_postgres())
    buf.store_batch(episode("parent", STEPS))  # the parent's pool is open at the fork
    result = _run_child(_postgres_child, buf, tmp_path / "out.json")
    assert result["errors"] == [], "\n".join(result["errors"])
    assert result["opened"] == 1  # one new pool, by one thread
    assert result["rows"] == STEPS * (1 + THREADS * ROUNDS)
    assert len(buf) == STEPS * (1 + THREADS * ROUNDS)  # the parent's pool still works


def _multiproc_child(buf: ExperienceBuffer, out: Path) -> None:
    from replaystore.experience.storage import multiproc as mp_module

    made: list[int] = []
    real_rlock = mp_module.threading.RLock

    def counting_rlock() -> Any:
        made.append(threading.get_ident())
        return real_rlock()

    mp_module.threading.RLock = counting_rlock  # type: ignore[misc]
    _slow_getpid()
    _hammer(buf, out)
    result = json.loads(out.read_text(encoding="utf-8"))
    out.write_text(json.dumps({**result, "locks": len(made)}), encoding="utf-8")


def test_threads_of_a_forked_child_share_one_multiproc_thread_lock(tmp_path: Path) -> None:
    from replaystore.experience import MultiProcMemoryStorage

    with multiprocessing.Manager() as manager:
        storage = MultiProcMemoryStorage(
            manager.dict(), manager.list(), manager.Lock(), max_capacity=None
        )
        buf = ExperienceBuffer(storage)
        buf.store_batch(episode("parent", STEPS))  # the parent's thread lock exists at the fork
        result = _run_child(_multiproc_child, buf, tmp_path / "out.json")
        assert result["errors"] == [], "\n".join(result["errors"])
        assert result["locks"] == 1  # one new thread lock, made by one thread
        assert result["rows"] == STEPS * (1 + THREADS * ROUNDS)
        assert len(buf) == STEPS * (1 + THREADS * ROUNDS)
