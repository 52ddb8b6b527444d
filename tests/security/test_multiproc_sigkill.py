"""Issue 16: the shared-memory multi-process storage when a writer is SIGKILLed."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from replaystore.experience import DataRow, Experience, ExpMeta
from replaystore.experience.storage.multiproc import MultiProcMemoryStorage

CTX = mp.get_context("fork")


def row(writer: int, i: int) -> DataRow:
    meta = ExpMeta(
        task_id=f"w{writer}_{i // 5}", task_name="t", agent_id="a", step=i, execute_time=float(i)
    )
    return DataRow(meta, Experience(state={"w": writer, "i": i}, actions=[i]), f"w{writer}-{i}")


def _counter():
    """The writer's count of acknowledged rows: a shared int64 without a lock. A
    synchronized ``Value`` takes a lock on every write, and a writer killed while it
    holds that lock would block the test's read forever (seen once in CI); an aligned
    8-byte store is whole either way, and the test reads it once the writer is dead (or
    polls it for a change)."""
    return CTX.Value("q", 0, lock=False)


def _writer(storage: MultiProcMemoryStorage, writer: int, acked, pause: float) -> None:
    i = 0
    while True:
        storage.add_batch([row(writer, i), row(writer, i + 1)])
        acked.value = i + 2  # every row below this was acknowledged by add_batch
        i += 2
        if pause:
            time.sleep(pause)


def _call_with_timeout(fn, timeout: float):
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        pytest.fail(f"{fn} still blocked after {timeout} s (a killed writer holds the lock?)")
    return out[0] if out else None


def _check(storage: MultiProcMemoryStorage, acked: dict[int, int]) -> None:
    rows = _call_with_timeout(storage.get_all, 10)
    ids = {r.id for r in rows}
    for writer, n in acked.items():
        missing = [i for i in range(n) if f"w{writer}-{i}" not in ids]
        assert not missing, f"writer {writer}: acknowledged rows {missing[:5]} lost"
    assert len(ids) == len(rows)
    for r in rows:  # every row is whole: its payload matches its id
        writer, i = r.id[1:].split("-")
        assert r.exp_data.state == {"w": int(writer), "i": int(i)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_writer_killed_between_adds_loses_nothing_acknowledged(tmp_path):
    rng = np.random.default_rng(16)
    with CTX.Manager() as manager:
        storage = MultiProcMemoryStorage(manager.dict(), manager.list(), manager.Lock(), None)
        acked: dict[int, int] = {}
        for writer in range(4):
            counter = _counter()
            # A pause between adds: the kill lands outside add_batch almost always.
            proc = CTX.Process(target=_writer, args=(storage, writer, counter, 0.02))
            proc.start()
            # the writer's first acknowledged add (a loaded machine starts it late), then
            # a random number of further adds before the kill
            deadline = time.monotonic() + 30
            while counter.value == 0 and time.monotonic() < deadline and proc.is_alive():
                time.sleep(0.01)
            time.sleep(float(rng.uniform(0.1, 0.3)))
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            acked[writer] = counter.value
            assert counter.value > 0
            _check(storage, acked)
        _call_with_timeout(lambda: storage.add_batch([row(9, 0)]), 10)  # still writable
        assert _call_with_timeout(lambda: storage.size(), 10) >= sum(acked.values()) + 1


def _die_holding_the_lock(storage: MultiProcMemoryStorage, trim_front: bool) -> None:
    """Take the lock as add_batch does, leave half a write behind, and die."""
    with storage._held():
        state = storage._sync()
        if trim_front:  # deleted the log's dead front, killed before recording the new base
            assert storage._dead_prefix(state) == 1
            del storage._log[:1]
        else:  # appended an entry, killed before committing it
            storage._log.append((state["next_seq"], [], []))
        os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("trim_front", [False, True])
def test_writer_killed_holding_the_lock_mid_write_is_recovered(trim_front):
    with CTX.Manager() as manager:
        # With room for two rows, the second batch evicts the first: its log entry is dead.
        capacity = 2 if trim_front else None
        shared = (manager.dict(), manager.list(), manager.Lock())
        storage = MultiProcMemoryStorage(*shared, capacity, eviction="row")
        storage.add_batch([row(0, 0), row(0, 1)])
        storage.add_batch([row(0, 2), row(0, 3)])
        proc = CTX.Process(target=_die_holding_the_lock, args=(storage, trim_front))
        proc.start()
        proc.join()
        assert proc.exitcode == -signal.SIGKILL
        started = time.monotonic()
        _call_with_timeout(lambda: storage.add_batch([row(1, 0)]), 10)
        assert time.monotonic() - started < 5  # recovered within a few lock polls
        # A fresh reader replays the repaired log: the same rows as the old reader.
        fresh = MultiProcMemoryStorage(*shared, capacity, eviction="row")
        ids = sorted(r.id for r in _call_with_timeout(fresh.get_all, 10))
        assert ids == sorted(r.id for r in storage.get_all())
        kept = ["w0-3", "w1-0"] if trim_front else ["w0-0", "w0-1", "w0-2", "w0-3", "w1-0"]
        assert ids == kept
        assert len(shared[1]) == (2 if trim_front else 3)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("capacity", [None, 50])
def test_writers_killed_at_random_moments_never_block_or_lose_acknowledged_rows(capacity):
    rng = np.random.default_rng(161)
    with CTX.Manager() as manager:
        storage = MultiProcMemoryStorage(
            manager.dict(), manager.list(), manager.Lock(), capacity, eviction="row"
        )
        for writer in range(8):
            counter = _counter()
            proc = CTX.Process(target=_writer, args=(storage, writer, counter, 0.0))
            proc.start()
            time.sleep(float(rng.uniform(0.1, 0.4)))
            os.kill(proc.pid, signal.SIGKILL)  # most likely inside add_batch, lock held
            proc.join()
            acked = counter.value
            if capacity is None:
                _check(storage, {writer: acked})
            else:
                rows = _call_with_timeout(storage.get_all, 10)
                ids = {r.id for r in rows}
                assert len(rows) <= capacity
                assert {f"w{writer}-{i}" for i in range(max(0, acked - 40), acked)} <= ids
            fresh = MultiProcMemoryStorage(storage._data, storage._log, storage._lock, capacity)
            assert sorted(r.id for r in _call_with_timeout(fresh.get_all, 10)) == sorted(
                r.id for r in storage.get_all()
            )
