"""The SQLite store's log is checkpointed by a thread of the writing process, not by its writers.

Before, each writer ran SQLite's auto-checkpoint inside a commit every 8192 log
pages: that commit waited for the copy into the database file and two fsyncs.
Here the writers' own auto-checkpoint is set out of reach, so the database file
can only grow, and the log only stay small, if the background thread works.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path

import pytest

from replaystore.experience import SqliteStorage
from replaystore.experience.storage.sqlite import checkpointer as checkpointer_module
from replaystore.experience.storage.sqlite import storage as storage_module
from waiting import wait_until

from .helpers import episode

FORKS = 40  # stores, each forked right after its first commit
BIG = {"text": "x" * 2000}  # a row of about 2 kB: a 100-row batch writes ~50 log pages


def _checkpointers() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name.startswith("replaystore-checkpoint") and t.is_alive()
    ]


def _write_in_a_child(store: SqliteStorage, task: str, rows: int, size: int) -> int | None:
    """Fork; the child stores ``rows`` rows of ``task`` through ``store`` and exits 0 if
    the store then holds ``size`` rows (2 if not, 1 on an error). Returns the child's
    exit code, or None when it was still running after 20 s (it is killed)."""
    pid = os.fork()
    if pid == 0:  # the child: leave without running the parent's cleanup
        code = 1
        try:
            store.add_batch(episode(task, rows))
            code = 0 if store.size() == size else 2
        finally:
            os._exit(code)
    statuses: list[int] = []

    def reaped() -> bool:
        done, status = os.waitpid(pid, os.WNOHANG)
        statuses.append(status)
        return done == pid

    if wait_until(reaped, 20):
        return os.waitstatus_to_exitcode(statuses[-1])
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


@pytest.fixture
def no_writer_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_module, "_WAL_AUTOCHECKPOINT", 1_000_000)  # never, here
    # (raising=False: the same test runs, and fails, on a version without the thread)
    monkeypatch.setattr(checkpointer_module, "_WAL_RESTART", 64, raising=False)
    monkeypatch.setattr(checkpointer_module, "_CHECKPOINT_INTERVAL", 0.0, raising=False)


def test_the_log_is_copied_and_restarted_by_the_background_thread(
    tmp_path: Path, no_writer_checkpoints: None
) -> None:
    path = tmp_path / "s.sqlite"
    store = SqliteStorage(path)
    wal = Path(f"{path}-wal")
    written = 0
    for b in range(40):
        store.add_batch(episode(f"t{b}", 100, state=BIG))
        written += 100
        time.sleep(0.005)  # a writer that also does other work between its batches
    # The rows (~8 MB) reached the database file, which only a checkpoint writes.
    assert wait_until(lambda: path.stat().st_size > 8_000_000), path.stat().st_size
    # The log was restarted along the way: it never held most of what was written.
    assert wal.stat().st_size < path.stat().st_size / 2, (wal.stat().st_size, path.stat().st_size)
    assert store.size() == written
    assert store.integrity_check() == "ok"
    reopened = SqliteStorage(path)
    assert reopened.size() == written
    assert [r.id for r in reopened.get_all()] == [r.id for r in store.get_all()]
    reopened.close()
    store.close()


def test_one_row_stores_are_checkpointed_too(tmp_path: Path, no_writer_checkpoints: None) -> None:
    path = tmp_path / "s.sqlite"
    store = SqliteStorage(path)
    for row in episode("t", 500, state=BIG):
        store.add(row)
    assert wait_until(lambda: path.stat().st_size > 1_000_000), path.stat().st_size
    assert store.size() == 500
    store.close()


def test_the_restart_holds_this_process_writers_on_the_store_lock(
    tmp_path: Path, no_writer_checkpoints: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a RESTART checkpoint runs, this process's writers wait on the store's own
    lock (woken as it ends), not in SQLite's busy handler, which sleeps 1, 2, 5, 10,
    15 ms ... between its tries: a 100k-row fill lost 50-110 ms there, in two or
    three restarts."""
    store = SqliteStorage(tmp_path / "s.sqlite")
    held: list[bool] = []
    run = checkpointer_module.Checkpointer._checkpoint

    def checkpoint(self: object, conn: object, mode: str) -> int:
        if mode == "RESTART":
            # Is the store's lock held (by this thread)? Another thread cannot take it.
            probe = threading.Thread(target=lambda: held.append(not _try_lock(store)))
            probe.start()
            probe.join()
        return run(self, conn, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(checkpointer_module.Checkpointer, "_checkpoint", checkpoint, raising=False)
    for b in range(10):
        store.add_batch(episode(f"t{b}", 100, state=BIG))
    assert wait_until(lambda: held), "no restart ran"
    assert all(held), held
    assert store.size() == 1000
    store.close()


def _try_lock(store: SqliteStorage) -> bool:
    taken = store._guard().acquire(blocking=False)
    if taken:
        store._guard().release()
    return taken


def test_close_under_the_store_lock_stops_a_thread_waiting_for_it(
    tmp_path: Path, no_writer_checkpoints: None
) -> None:
    """The thread wants the store's lock for a restart while the closing thread holds
    it (close runs under it): close returns, the thread stops."""
    before = set(_checkpointers())  # other tests' stores may still have theirs
    store = SqliteStorage(tmp_path / "s.sqlite")
    closed = threading.Event()

    def write_then_close() -> None:
        with store._guard():
            for b in range(10):  # past _WAL_RESTART pages: the thread wants the lock
                store.add_batch(episode(f"t{b}", 100, state=BIG))
            time.sleep(0.2)  # the thread polls for the lock meanwhile
            store.close()
        closed.set()

    closer = threading.Thread(target=write_then_close, daemon=True)
    closer.start()
    assert closed.wait(10), "close() waited for the checkpoint thread, which waited for it"
    assert wait_until(lambda: not set(_checkpointers()) - before)
    reopened = SqliteStorage(tmp_path / "s.sqlite")
    assert reopened.size() == 1000
    reopened.close()


def test_close_and_garbage_collection_stop_the_thread(tmp_path: Path) -> None:
    before = set(_checkpointers())
    store = SqliteStorage(tmp_path / "s.sqlite")
    assert set(_checkpointers()) == before  # no thread until the first commit
    store.add_batch(episode("a", 5))
    started = set(_checkpointers()) - before
    assert len(started) == 1
    store.close()
    assert not any(t.is_alive() for t in started)
    store.add_batch(episode("b", 5))  # a later commit starts one again
    again = set(_checkpointers()) - before
    assert len(again) == 1
    del store
    gc.collect()
    assert wait_until(lambda: not any(t.is_alive() for t in again))


def test_a_forked_child_writes_with_its_own_thread_and_the_parent_keeps_its_log(
    tmp_path: Path,
) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    path = tmp_path / "s.sqlite"
    store = SqliteStorage(path)
    store.add_batch(episode("parent", 50))  # the parent's thread and connection exist
    assert _write_in_a_child(store, "child", 50, size=100) == 0
    store.add_batch(episode("parent-again", 50))
    assert store.size() == 150
    assert store.integrity_check() == "ok"
    store.close()
    assert SqliteStorage(path).size() == 150


def test_forks_while_the_thread_is_in_sqlite_never_leave_a_child_stuck(tmp_path: Path) -> None:
    """A child forked while the parent's thread was inside SQLite (opening its
    connection, right after the first commit, or checkpointing) could hang in its
    first SQLite call: a lock of SQLite's, inherited held by no thread. A fork now
    waits until the thread is out of SQLite."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    stores = []
    for i in range(FORKS):
        store = SqliteStorage(tmp_path / f"s{i}.sqlite")
        stores.append(store)
        store.add_batch(episode(f"p{i}", 20, state=BIG))  # starts the thread: it connects now
        code = _write_in_a_child(store, f"c{i}", 5, size=25)
        assert code is not None, f"the child of fork {i} is stuck"
        assert code == 0
        assert store.size() == 25
    for store in stores:
        assert store.integrity_check() == "ok"
        store.close()


def test_a_commit_stands_when_no_thread_can_be_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit is made before the thread is started: a process out of threads gets
    a warning (writers then checkpoint themselves), not an error for a stored batch."""

    def no_thread(path: Path, writers: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(storage_module, "Checkpointer", no_thread)
    store = SqliteStorage(tmp_path / "s.sqlite")
    with caplog.at_level("WARNING", logger="replaystore.experience.sqlite"):
        store.add_batch(episode("a", 5))
        store.add(episode("b", 1)[0])
    assert store.size() == 6
    assert [r.message for r in caplog.records].count(
        f"{tmp_path / 's.sqlite'}: no background checkpoints (can't start new thread); "
        "writers checkpoint every 16384 pages"
    ) == 1
    store.close()


def test_a_relative_path_names_the_same_file_after_the_working_directory_changes(
    tmp_path, monkeypatch
):
    # The store, its reconnections and its checkpoint thread must all open the file
    # it was created with. With the path kept relative, a chdir (a docs test, a
    # notebook) sent the checkpoint thread and any later connection to another,
    # empty file in the new directory.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    store = SqliteStorage("exp.sqlite")
    store.add_batch(episode("t0", 3))
    monkeypatch.chdir(tmp_path / "b")
    store.close()  # the next call reconnects
    store.add_batch(episode("t1", 2))
    assert store.size() == 5
    assert store.path == tmp_path / "a" / "exp.sqlite"
    store.close()
    assert not (tmp_path / "b" / "exp.sqlite").exists()
    assert SqliteStorage(tmp_path / "a" / "exp.sqlite").size() == 5
