"""Shared-memory storage for processes on one machine: :class:`MultiProcMemoryStorage`.

AWorld's constructor is kept: ``MultiProcMemoryStorage(data_dict=manager.dict(),
fifo_queue=manager.list(), lock=manager.Lock(), max_capacity=10000)``. What
changes is how the three proxies are used, because AWorld's version recounts
the whole store on every add (quadratic), takes its non-reentrant lock twice
in ``add_batch`` (a deadlock) and keeps rows in shared-memory segments that
are unlinked when the writing process exits (rows lost under ``fork``):

* ``fifo_queue`` is an append-only **log** in the manager process: one entry
  per ``add``/``add_batch`` call, holding the new rows (plain tuples of str and
  numbers, the payload as JSON text) and the sequence numbers of the rows that
  call evicted. Entries whose rows are all evicted are trimmed from its front.
* ``data_dict`` holds the store's bookkeeping under one key (next sequence
  number, log offset, a generation that ``clear()`` renews).
* a lock entry in ``data_dict`` (below) serialises writers and log reads; it is
  taken once per call.

Every process replays the log into a local :class:`~replaystore.experience.storage.memory.RowIndex`
(reading only the entries it has not seen), so queries and sampling run
locally at in-memory speed and rows survive the processes that wrote them for
as long as the manager runs.

Cost: an add or add_batch is a constant number of round trips to the manager
(about six) plus the transfer of its rows: O(1) amortised per row. A read
first fetches the log entries written since this process last looked.
Memory: the manager holds the live rows (as JSON text) and every process that
reads or writes holds a decoded copy of them; with many processes and a large
capacity, prefer :class:`~replaystore.experience.storage.sqlite.SqliteStorage`.

A process killed (SIGKILL) at any instant loses only its unacknowledged call:

* the lock is an entry of ``data_dict`` taken with one atomic
  ``setdefault(key, (host, pid, token))``, so the store always knows who holds
  it (the ``lock`` argument, kept for AWorld's signature, is not used: a
  ``Manager().Lock()`` whose holder is killed stays locked forever and names
  no holder). Waiters poll (0.5 ms, backing off to 10 ms); every half second
  a waiter checks the holder, and a holder that is a dead process on this
  host (a zombie counts as dead) has its hold released by exactly one waiter
  (chosen through ``setdefault``), with a warning. A holder on another host
  (a remote manager) cannot be checked, and a reused pid looks alive;
* the log: each locked section first compares the log's length with the
  bookkeeping. An entry appended by a call killed before it committed (its
  bookkeeping write) is dropped; a front trimmed by a call killed before it
  recorded the new base is recorded. Cost: one more round trip per call.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from replaystore.errors import SchemaError, StorageError
from replaystore.experience.decoding import FieldDecoders, as_decoders
from replaystore.experience.query import Condition
from replaystore.experience.rows import DataRow, ExpMeta, decode_experiences, encode_batch
from replaystore.experience.storage._fork import fork_check_lock
from replaystore.experience.storage.base import (
    Eviction,
    PicklesSettings,
    Storage,
    check_capacity,
    check_count,
    check_page,
    choose,
)
from replaystore.experience.storage.memory import RowIndex
from replaystore.sampling import SeedLike

__all__ = ["MultiProcMemoryStorage"]

_STATE_KEY = "__replaystore_state__"
_LOCK_KEY = "__replaystore_lock__"  # (host, pid, token) of the holder; absent when free
_RECOVERY_KEY = "__replaystore_recovered__:"  # + token: which waiter released a dead hold
_LOCK_CHECK_S = 0.5  # how often a waiter checks whether the holder is alive
_LOCK_MAX_DELAY_S = 0.01
_HOST = socket.gethostname()

log = logging.getLogger("replaystore.experience.storage.multiproc")


def _process_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie, killed but not yet reaped, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


_COMPACT_MIN = 64  # dead log entries tolerated before trimming the log's front


class MultiProcMemoryStorage(PicklesSettings, Storage):
    """Rows shared by processes through a ``multiprocessing.Manager``.

    Args:
        data_dict: a ``Manager().dict()`` (bookkeeping).
        fifo_queue: a ``Manager().list()`` (the row log).
        lock: a ``Manager().Lock()``; accepted for AWorld's signature but not
            used: the store locks through ``data_dict`` so that a killed holder
            can be recognised and its hold released (see the module doc).
        max_capacity: the most rows kept (default 10000); ``None`` for no limit.
        eviction: ``"task"`` (default, whole oldest tasks) or ``"row"``.
        decoders: rebuild your types from the stored JSON on every read, e.g.
            ``{"state": Observation, "actions": ActionModel}`` (see
            :class:`~replaystore.experience.decoding.FieldDecoders`); default: rows
            come back with plain JSON values. Each read decodes afresh, so two
            reads give equal but distinct objects.

    Works with the ``fork`` and ``spawn`` start methods: pass the storage (or a
    ``ReplayBuffer`` holding it) to child processes. All processes must be
    built with the same ``max_capacity`` and ``eviction`` (a forked or pickled
    copy is). Decoders travel with a forked or pickled copy (under ``spawn``
    they must be picklable: module-level classes and functions).

    Raises:
        ConfigError: a bad ``max_capacity``, ``eviction`` or ``decoders``.
    """

    # The manager's proxies cross processes; the replayed index is rebuilt per process.
    _pickled = ("max_capacity", "eviction", "decoders", "_data", "_log", "_lock")
    _pickle_defaults: ClassVar[Mapping[str, Any]] = {"decoders": None}

    def __init__(
        self,
        data_dict: Any,
        fifo_queue: Any,
        lock: Any,
        max_capacity: int | None = 10000,
        *,
        eviction: Eviction = "task",
        decoders: FieldDecoders | Mapping[str, Any] | None = None,
    ) -> None:
        self.max_capacity, self.eviction = check_capacity(max_capacity, eviction)
        self.decoders: FieldDecoders | None = as_decoders(decoders)
        self._data = data_dict
        self._log = fifo_queue
        self._lock = lock
        self._reset_local()

    def _reset_local(self) -> None:
        self._index = RowIndex(self.max_capacity, self.eviction)
        self._gen: str | None = None
        self._pos = 0  # absolute log position replayed so far
        self._batches: deque[tuple[int, int]] = deque()  # (log position, first seq), live ones
        self._local = threading.RLock()
        self._pid = os.getpid()

    def _local_lock(self) -> threading.RLock:
        if self._pid != os.getpid():  # a forked child: a held thread lock would never free
            # Under the child's own fork-check lock, so that when several threads
            # make their first call together exactly one makes the new thread lock.
            with fork_check_lock():
                if self._pid != os.getpid():
                    self._local = threading.RLock()
                    self._pid = os.getpid()
        return self._local

    # ------------------------------------------------------------------ the lock

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """The store's lock, taken from a holder that was killed (see the module doc)."""
        token = (_HOST, os.getpid(), uuid.uuid4().hex)
        data = self._data
        delay = 0.0005
        check_at = time.monotonic() + _LOCK_CHECK_S
        while (holder := data.setdefault(_LOCK_KEY, token)) != token:
            if time.monotonic() >= check_at:
                self._release_if_dead(holder, token)
                check_at = time.monotonic() + _LOCK_CHECK_S
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, _LOCK_MAX_DELAY_S)
        try:
            yield
        finally:
            data.pop(_LOCK_KEY, None)

    def _release_if_dead(self, holder: Any, token: tuple[str, int, str]) -> None:
        if not (isinstance(holder, tuple) and len(holder) == 3 and holder[0] == _HOST):
            return
        if _process_alive(int(holder[1])):
            return
        # One waiter per dead hold; only it removes the entry, and only while the
        # entry is still that hold (nobody else can change it meanwhile).
        if self._data.setdefault(_RECOVERY_KEY + str(holder[2]), token) != token:
            return
        if self._data.get(_LOCK_KEY) == holder:
            self._data.pop(_LOCK_KEY, None)
            log.warning(
                "process %d died holding the multi-process store's lock; released it", holder[1]
            )

    # ------------------------------------------------------------------ log replay

    def _sync(self) -> dict[str, Any]:
        """Bring the local index up to date with the shared log; return the shared state."""
        state = self._data.get(_STATE_KEY)
        if state is None:
            state = {"gen": uuid.uuid4().hex, "base": 0, "base_seq": 0, "next_seq": 0, "end": 0}
            self._data[_STATE_KEY] = state
        physical = len(self._log)
        expected = state["end"] - state["base"]
        if physical > expected:  # appended by a call killed before it committed
            del self._log[expected:]
            log.warning("dropped %d uncommitted log entries of a dead writer", physical - expected)
        elif physical < expected:  # front trimmed by a call killed before recording it
            state["base"] += expected - physical
            state["base_seq"] = self._log[0][0] if physical else state["next_seq"]
            self._data[_STATE_KEY] = state
            log.warning("recorded a log trim left unrecorded by a killed writer")
        if state["gen"] != self._gen:
            self._index.clear()
            self._batches.clear()
            self._gen = state["gen"]
            self._pos = state["base"]
        if self._pos < state["base"]:
            # Entries we missed were trimmed: every row they held is gone.
            self._index.drop_below(state["base_seq"])
            self._pos = state["base"]
        if self._pos < state["end"]:
            for entry in self._log[self._pos - state["base"] : state["end"] - state["base"]]:
                self._apply(entry)
            self._dead_prefix(state)  # forget entries whose rows are all gone
        return state

    def _apply(self, entry: tuple[int, list[tuple[Any, ...]], list[int]]) -> None:
        first, records, evicted = entry
        index = self._index
        payloads = decode_experiences([rec[7] for rec in records])
        for offset, (rec, exp) in enumerate(zip(records, payloads, strict=True)):
            index.insert(first + offset, DataRow(ExpMeta(*rec[1:7]), exp, rec[0]))
        for seq in evicted:
            index.remove(seq)
        self._batches.append((self._pos, first))
        self._pos += 1

    def _dead_prefix(self, state: dict[str, Any]) -> int:
        """Number of log entries at the front whose rows are all evicted."""
        oldest = self._index.oldest_seq()
        if oldest is None:
            oldest = state["next_seq"]
        batches = self._batches
        while batches:
            end = batches[1][1] if len(batches) > 1 else state["next_seq"]
            if end > oldest:
                break
            batches.popleft()
        first_live = batches[0][0] if batches else self._pos
        return first_live - state["base"]

    # ------------------------------------------------------------------ writing

    def add(self, data: DataRow) -> None:
        self.add_batch([data], _where="data")

    def add_batch(self, data_batch: Sequence[DataRow], *, _where: str | None = None) -> None:
        encoded = encode_batch(data_batch, _where, decode=False)
        if not encoded:
            return
        payloads = decode_experiences([e.payload_json for e in encoded])  # one parser call
        for e, exp in zip(encoded, payloads, strict=True):
            e.row.exp_data = exp
        records = [e.record() for e in encoded]
        with self._local_lock(), self._held():
            state = self._sync()
            index = self._index
            ids = [e.row.id for e in encoded]
            if len(set(ids)) != len(ids) or any(i in index.ids for i in ids):
                dup = next(i for n, i in enumerate(ids) if i in index.ids or i in ids[:n])
                raise SchemaError(f"row id {dup!r} is already stored")
            first = state["next_seq"]
            try:
                for offset, e in enumerate(encoded):
                    index.insert(first + offset, e.row)
                evicted = index.enforce_capacity()
                self._log.append((first, records, evicted))
                self._batches.append((self._pos, first))
                self._pos += 1
                state["next_seq"] = first + len(encoded)
                state["end"] = self._pos
                self._data[_STATE_KEY] = state  # the commit point of this call
                dead = self._dead_prefix(state)
                if dead >= _COMPACT_MIN and dead >= state["end"] - state["base"] - dead:
                    # Trimmed before recorded: a kill in between is repaired by _sync.
                    del self._log[:dead]
                    state["base"] += dead
                    state["base_seq"] = self._batches[0][1] if self._batches else state["next_seq"]
                    self._data[_STATE_KEY] = state
            except BaseException as exc:
                self._gen = None  # the local index may be ahead of the log: rebuild on next use
                if isinstance(exc, Exception) and not isinstance(exc, SchemaError):
                    raise StorageError(f"multi-process store write failed: {exc}") from exc
                raise

    def clear(self) -> None:
        with self._local_lock(), self._held():
            del self._log[:]
            self._data[_STATE_KEY] = {
                "gen": uuid.uuid4().hex,
                "base": 0,
                "base_seq": 0,
                "next_seq": 0,
                "end": 0,
            }
            self._sync()

    # ------------------------------------------------------------------ reading

    def _out(self, rows: list[DataRow]) -> list[DataRow]:
        """Rows as returned to callers: decoded copies when decoders are registered."""
        return rows if self.decoders is None else self.decoders.decode_rows(rows)

    def _synced(self) -> RowIndex:
        with self._held():
            self._sync()
        return self._index

    def size(self, query_condition: Condition | None = None) -> int:
        with self._local_lock():
            index = self._synced()
            return len(index) if query_condition is None else len(index.match(query_condition))

    def get_paginated(
        self, page: int, page_size: int, query_condition: Condition | None = None
    ) -> list[DataRow]:
        page, page_size = check_page(page, page_size)
        with self._local_lock():
            index = self._synced()
            seqs = index.match(query_condition)
            start = (page - 1) * page_size
            return self._out(index.rows_at(seqs[start : start + page_size]))

    def get_all(self, query_condition: Condition | None = None) -> list[DataRow]:
        with self._local_lock():
            index = self._synced()
            return self._out(index.rows_at(index.match(query_condition)))

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        with self._local_lock():
            return self._out(self._synced().task_rows(task_id))

    def get_batch_by_task_ids(self, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        with self._local_lock():
            index = self._synced()
            return {tid: self._out(index.task_rows(tid)) for tid in task_ids}

    def task_ids(self, query_condition: Condition | None = None) -> list[str]:
        with self._local_lock():
            return self._synced().task_ids(query_condition)

    def sample_rows(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[DataRow]:
        k = check_count(batch_size)
        with self._local_lock():
            index = self._synced()
            seqs = index.match(query_condition)
            return self._out(index.rows_at([seqs[i] for i in choose(len(seqs), k, rng)]))
