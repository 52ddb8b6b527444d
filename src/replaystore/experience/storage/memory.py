"""In-process storage: :class:`InMemoryStorage` and :class:`RowIndex`, the structure under it.

:class:`RowIndex` keeps rows by insertion sequence number, grouped by task,
with indexes on ``task_id``, ``agent_id`` and ``task_name`` and FIFO capacity
bookkeeping; every operation is O(1) amortised per row. The multi-process
storage replays a shared log into one of these in every process.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import Any

from replaystore.errors import ConfigError, SchemaError
from replaystore.experience.query import (
    Condition,
    canonical_field,
    compile_predicate,
    validate_condition,
)
from replaystore.experience.rows import (
    COPY_KERNELS,
    ENCODE_KERNELS,
    META_FIELDS,
    META_SPEC,
    PAYLOAD_FIELDS,
    DataRow,
    Experience,
    ExpMeta,
    check_row,
    encode_batch,
    encode_row,
    experience_from_json,
    loads_json,
    new_row,
    snapshot_row,
)
from replaystore.experience.storage.base import (
    Eviction,
    Storage,
    check_capacity,
    check_count,
    check_page,
    choose,
)
from replaystore.sampling import SeedLike

__all__ = ["InMemoryStorage", "RowIndex"]

_INDEXED = ("agent_id", "task_name")  # RowIndex.insert spells these out

# A plan: candidate rows grouped by task ({task_id: seqs}) and whether every
# candidate is known to match (so the predicate need not run).
_Plan = tuple[dict[str, Iterable[int]], bool]


class RowIndex:
    """Rows keyed by sequence number, grouped by task, with FIFO capacity.

    Sequence numbers are assigned by the caller and must increase (gaps are
    allowed). Tasks are ordered by their first row; a task that is evicted and
    later receives rows again counts as a new, newest task.

    Layout (every structure grows by appending, so a fill's cost per row does not
    grow with the store): the rows sit in a list at ``seq - base`` (``None`` once
    removed; the removed front is cut off, amortised O(1) per row), the ids in a
    set, each task's sequence numbers in a deque, and the ``agent_id`` /
    ``task_name`` indexes count each task's rows per value (``{value: {task_id:
    rows}}``); a query on a task some of whose rows have another value filters
    that task's rows.
    """

    cut_at = 1024  # the removed front of the row list is cut off from this many slots

    def __init__(self, max_capacity: int | None, eviction: Eviction) -> None:
        self.max_capacity = max_capacity
        self.eviction = eviction
        self.clear()

    def clear(self) -> None:
        self._slots: list[DataRow | None] = []  # the row of seq base + i; None once removed
        self._base = 0  # the sequence number of _slots[0]
        self._head = 0  # first live slot (len(_slots) when empty)
        self._count = 0
        self.ids: set[str] = set()
        self.tasks: dict[str, deque[int]] = {}
        self.task_first: dict[str, int] = {}
        # Task eviction queue of (task_id, first seq); stale entries (task already
        # removed) are skipped when popped, so removal is O(1) amortised.
        self.task_order: deque[tuple[str, int]] = deque()
        self.index: dict[str, dict[Any, dict[str, int]]] = {f: {} for f in _INDEXED}
        # The last insert's (task_id, agent_id, task_name, task seqs, agent counts,
        # name counts): a row of the same task, agent and name (the next step of an
        # episode) only appends to these. Dropped whenever a row is removed.
        self._last: tuple[Any, ...] | None = None

    def __len__(self) -> int:
        return self._count

    def insert(self, seq: int, row: DataRow) -> None:
        """Add a validated row under sequence number ``seq``.

        Raises:
            ValueError: ``seq`` is not above every sequence number inserted since
                the index was last empty.
        """
        slots = self._slots
        if seq - self._base != len(slots):
            self._gap(seq)
            slots = self._slots
        slots.append(row)
        self._count += 1
        meta = row.exp_meta
        tid = meta.task_id
        self.ids.add(row.id)
        last = self._last
        if (
            last is not None
            and last[0] == tid
            and last[1] == meta.agent_id
            and last[2] == meta.task_name
        ):
            last[3].append(seq)
            counts = last[4]
            counts[tid] += 1
            counts = last[5]
            counts[tid] += 1
            return
        seqs = self.tasks.get(tid)
        if seqs is None:
            seqs = self.tasks[tid] = deque()
            self.task_first[tid] = seq
            if self.eviction == "task":
                self.task_order.append((tid, seq))
        seqs.append(seq)
        # The loop over _INDEXED, unrolled: this is most of the per-row upkeep.
        index = self.index
        agent_counts = index["agent_id"].get(meta.agent_id)
        if agent_counts is None:
            agent_counts = index["agent_id"][meta.agent_id] = {}
        agent_counts[tid] = agent_counts.get(tid, 0) + 1
        name_counts = index["task_name"].get(meta.task_name)
        if name_counts is None:
            name_counts = index["task_name"][meta.task_name] = {}
        name_counts[tid] = name_counts.get(tid, 0) + 1
        self._last = (tid, meta.agent_id, meta.task_name, seqs, agent_counts, name_counts)

    def _gap(self, seq: int) -> None:
        """Make ``seq`` the next slot: a fresh base when empty, else ``None`` padding."""
        end = self._base + len(self._slots)
        if self._count == 0:
            self._slots = []
            self._base = seq
            self._head = 0
        elif seq > end:
            self._slots.extend([None] * (seq - end))
        else:
            raise ValueError(f"sequence number {seq} is not above the last one ({end - 1})")

    def _row(self, seq: int) -> DataRow | None:
        pos = seq - self._base
        if pos < self._head or pos >= len(self._slots):
            return None
        return self._slots[pos]

    def __contains__(self, seq: object) -> bool:
        return isinstance(seq, int) and self._row(seq) is not None

    def rows_at(self, seqs: Iterable[int]) -> list[DataRow]:
        """The stored rows of ``seqs`` (each must be stored), in that order."""
        slots = self._slots
        base = self._base
        return [slots[s - base] for s in seqs]  # type: ignore[misc]

    def all_rows(self) -> list[DataRow]:
        """Every stored row, in insertion order."""
        live = self._slots[self._head :]
        if len(live) == self._count:
            return live  # type: ignore[return-value]
        return [r for r in live if r is not None]

    def all_seqs(self) -> list[int]:
        """Every stored row's sequence number, in insertion order."""
        head = self._head
        slots = self._slots
        start = self._base + head
        if len(slots) - head == self._count:
            return list(range(start, start + self._count))
        return [start + i for i, r in enumerate(slots[head:]) if r is not None]

    def remove(self, seq: int) -> None:
        """Remove the row ``seq`` (no-op if absent). O(1) for the oldest row of its task."""
        row = self._row(seq)
        if row is None:
            return
        slots = self._slots
        pos = seq - self._base
        slots[pos] = None
        self._count -= 1
        if pos == self._head:
            head = pos + 1
            end = len(slots)
            while head < end and slots[head] is None:
                head += 1
            if head >= self.cut_at and 2 * head >= end:  # cut the dead front: O(1) amortised
                del slots[:head]
                self._base += head
                head = 0
            self._head = head
        self._last = None
        meta = row.exp_meta
        tid = meta.task_id
        self.ids.discard(row.id)
        seqs = self.tasks[tid]
        if seqs[0] == seq:
            seqs.popleft()
        else:
            seqs.remove(seq)
        if not seqs:
            del self.tasks[tid]
            del self.task_first[tid]
        for name in _INDEXED:
            values = self.index[name]
            value = getattr(meta, name)
            counts = values[value]
            left = counts[tid] - 1
            if left:
                counts[tid] = left
            else:
                del counts[tid]
                if not counts:
                    del values[value]

    def enforce_capacity(self) -> list[int]:
        """Evict oldest rows until ``len <= max_capacity``; return the evicted seqs.

        Task mode evicts whole tasks, oldest first; when one task alone exceeds
        the capacity, its oldest rows go. Row mode evicts single oldest rows.
        """
        cap = self.max_capacity
        evicted: list[int] = []
        if cap is None:
            return evicted
        while self._count > cap:
            if self.eviction == "row":
                seq = self._base + self._head
                self.remove(seq)
                evicted.append(seq)
                continue
            tid, first = self.task_order[0]
            if self.task_first.get(tid) != first:
                self.task_order.popleft()  # stale: that task is gone already
                continue
            seqs = self.tasks[tid]
            if len(self.tasks) > 1:
                self.task_order.popleft()
                doomed = list(seqs)
            else:
                doomed = list(seqs)[: self._count - cap]
            for seq in doomed:
                self.remove(seq)
            evicted.extend(doomed)
        return evicted

    def oldest_seq(self) -> int | None:
        """Sequence number of the oldest stored row (``None`` when empty). O(1)."""
        if not self._count:
            return None
        return self._base + self._head

    def drop_below(self, seq: int) -> None:
        """Remove every row with a sequence number below ``seq`` (O(rows removed + holes))."""
        while self._count and self._base + self._head < seq:
            self.remove(self._base + self._head)

    # ------------------------------------------------------------------ queries

    def _plan(self, cond: Mapping[str, Any]) -> _Plan | None:
        if "and_" in cond:
            plans: list[_Plan] = [p for p in (self._plan(c) for c in cond["and_"]) if p is not None]
            if not plans:
                return None
            best = min(plans, key=lambda p: len(p[0]))
            return best[0], best[1] and len(cond["and_"]) == 1
        if "or_" in cond:
            found = [self._plan(c) for c in cond["or_"]]
            branches = [p for p in found if p is not None]
            if len(branches) < len(found):
                return None
            merged: dict[str, dict[int, None]] = {}
            for groups, _ in branches:
                for tid, seqs in groups.items():
                    merged.setdefault(tid, {}).update(dict.fromkeys(seqs))
            return dict(merged), all(p[1] for p in branches)
        leaf = _indexed_leaf(cond)
        if leaf is None:
            return None
        name, values = leaf
        tasks = self.tasks
        if name == "task_id":
            return {v: tasks[v] for v in values if v in tasks}, True
        out: dict[str, Iterable[int]] = {}
        slots = self._slots
        base = self._base
        for v in values:
            for tid, count in self.index[name].get(v, {}).items():
                picked: Iterable[int] = tasks[tid]
                if count != len(tasks[tid]):  # the task's rows have several values
                    picked = [
                        s
                        for s in picked
                        if getattr(slots[s - base].exp_meta, name) == v  # type: ignore[union-attr]
                    ]
                out[tid] = picked if tid not in out else chain(out[tid], picked)
        return out, True

    def match(self, cond: Condition | None) -> list[int]:
        """Sequence numbers of matching rows, in insertion order."""
        if cond is None:
            return self.all_seqs()
        pred = compile_predicate(cond)
        plan = self._plan(cond)
        slots = self._slots
        base = self._base
        if plan is None:
            head = self._head
            start = base + head
            return [start + i for i, r in enumerate(slots[head:]) if r is not None and pred(r)]
        groups, exact = plan
        seqs = sorted(chain.from_iterable(groups.values()))
        return seqs if exact else [s for s in seqs if pred(slots[s - base])]  # type: ignore[arg-type]

    def task_ids(self, cond: Condition | None) -> list[str]:
        """Distinct task ids with a matching row, ordered by the task's first row."""
        if cond is None:
            return list(self.tasks)
        validate_condition(cond)
        first = self.task_first
        found = self._tasks_of(cond)
        if found is None:
            found = dict.fromkeys(r.exp_meta.task_id for r in self.rows_at(self.match(cond)))
        return sorted(found, key=first.__getitem__)

    def _tasks_of(self, cond: Mapping[str, Any]) -> dict[str, None] | None:
        """The tasks with a row matching ``cond``, read off the indexes alone (no row or
        task deque is touched), or None when ``cond`` is not made of ``eq``/``in_`` on
        indexed fields joined by ``or_`` (a one-condition ``and_`` counts)."""
        if "and_" in cond:
            parts = cond["and_"]
            return self._tasks_of(parts[0]) if len(parts) == 1 else None
        found: dict[str, None] = {}
        if "or_" in cond:
            for part in cond["or_"]:
                tids = self._tasks_of(part)
                if tids is None:
                    return None
                found.update(tids)
            return found
        leaf = _indexed_leaf(cond)
        if leaf is None:
            return None
        name, values = leaf
        if name == "task_id":
            tasks = self.tasks
            return {v: None for v in values if v in tasks}
        for v in values:
            found.update(dict.fromkeys(self.index[name].get(v, ())))
        return found

    def task_rows(self, task_id: str) -> list[DataRow]:
        return self.rows_at(self.tasks.get(task_id, ()))


def _indexed_leaf(cond: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """``(field, distinct str values)`` of an ``eq``/``in_`` on ``task_id`` or an indexed
    field (``agent_id``, ``task_name``), or None for any other condition."""
    op = "in" if cond["op"] == "in_" else cond["op"]
    field = canonical_field(cond["field"])  # "task_id" -> "exp_meta.task_id"
    if op not in ("eq", "in") or not field.startswith("exp_meta."):
        return None
    name = field[len("exp_meta.") :]
    if name != "task_id" and name not in _INDEXED:
        return None
    values = [cond["value"]] if op == "eq" else list(cond["value"])
    return name, list(dict.fromkeys(v for v in values if isinstance(v, str)))


class _Snapshot:
    """The payload of a row as it was when stored: its JSON text, decoded on first use.

    Stands in for :class:`~replaystore.experience.rows.Experience` in the rows that
    queries see (``getattr(snapshot, "state")`` and so on). Storing a row costs
    the JSON encoding only; the decoding is paid by the first query that reads
    the payload (a query on ``exp_meta`` fields never does).
    """

    __slots__ = ("_text", "_values")

    def __init__(self, text: str) -> None:
        self._text = text
        self._values: dict[str, Any] | None = None

    def __getattr__(self, name: str) -> Any:
        if name not in PAYLOAD_FIELDS:
            raise AttributeError(name)
        values = self._values
        if values is None:
            values = self._values = loads_json(self._text)
        return values.get(name)


def _given_row(row: Any, normalised: DataRow, text: str | None) -> DataRow:
    """What reads return for a stored row: the caller's own object whenever it can be.

    A row given as a mapping, or with metadata given as a mapping, has no object
    a sampler could read ``exp_meta.step`` from; it is returned with the validated
    :class:`ExpMeta` (and the caller's own ``exp_data``); a mapping row comes back
    as the :class:`DataRow` decoded from its stored JSON ``text``.
    """
    if not isinstance(row, DataRow):
        assert text is not None  # a mapping row is never snapshotted without JSON
        return DataRow(normalised.exp_meta, experience_from_json(text), normalised.id)
    if isinstance(row.exp_meta, ExpMeta):
        return row
    return DataRow(normalised.exp_meta, row.exp_data, row.id)


def _kept_row(row: Any, where: str) -> DataRow:
    """The row a default (no-snapshot) store keeps for ``row``, after validating it.

    The caller's own row when its metadata is an :class:`ExpMeta` whose values
    already have the validated types and values (non-ASCII text, a subclass of
    :class:`DataRow`); else a :class:`DataRow` of the validated metadata, the
    row's ``exp_data`` (for a mapping, the one built from it) and its id.

    Raises:
        SchemaError: as :func:`~replaystore.experience.rows.encode_row`, for the
            id and metadata (the payload is not checked).
    """
    row_id, meta, exp = check_row(row, where)
    if isinstance(row, DataRow) and type(row.exp_meta) is ExpMeta:
        given = row.exp_meta
        if all(
            type(getattr(given, name)) is type(getattr(meta, name))
            and getattr(given, name) == getattr(meta, name)
            for name in META_FIELDS
        ):
            return row
    return DataRow(meta, exp, row_id)


def _encode(row: Any, where: str) -> tuple[DataRow, DataRow]:
    """``(snapshot, given)`` through the JSON encoding (rows :func:`snapshot_row` declines)."""
    encoded = encode_row(row, where, decode=False)
    snapshot = encoded.row
    snapshot.exp_data = _Snapshot(encoded.payload_json)  # type: ignore[assignment]
    return snapshot, _given_row(row, snapshot, encoded.payload_json)


def _listed_batch(data_batch: Any, where: str | None) -> Any:
    """``data_batch`` read once into a list (validated, then kept); a single row or
    None raises the :class:`SchemaError` of :func:`encode_batch` that names it."""
    batch: Any = data_batch
    if isinstance(batch, Iterable) and not isinstance(batch, Mapping):
        batch = list(batch)
    if batch is None or isinstance(batch, DataRow | Mapping):
        encode_batch(batch, where)
    return batch


def _check_new_ids(ids: set[str], new_ids: list[str]) -> None:
    """Raise :class:`SchemaError` naming the first of ``new_ids`` already in ``ids``
    or repeated in ``new_ids`` (one set test when there is none)."""
    if not ids.isdisjoint(new_ids) or len(set(new_ids)) < len(new_ids):
        seen: set[str] = set()
        for row_id in new_ids:
            if row_id in ids or row_id in seen:
                raise SchemaError(f"row id {row_id!r} is already stored")
            seen.add(row_id)


class InMemoryStorage(Storage):
    """Rows in this process's memory: the fastest storage, for one process.

    Args:
        max_capacity: the most rows kept (default 10000, as AWorld); ``None`` for no limit.
        eviction: ``"task"`` (default) evicts whole oldest tasks, so a sampled task
            never misses its first steps; ``"row"`` evicts single oldest rows.
        snapshot: ``False`` (default): keep the rows you store and run queries on
            them, as AWorld's store does. ``True``: also take a JSON snapshot of
            each row when it is stored and run queries on that, for code that
            changes rows after storing them (see below).

    Rows come back as the very :class:`DataRow` objects you stored (``get_all()[0]
    is row``), with your ``Observation``/``ActionModel`` objects inside, as in
    AWorld; no decoders are needed here. (A row given as a mapping, or whose
    metadata needs converting, such as a mapping or a NumPy integer ``step``,
    comes back as a :class:`DataRow` with the validated :class:`ExpMeta` and
    your ``exp_data``.)

    **Default (``snapshot=False``): what you store is what you query.** A row is
    kept as given: its id and metadata are checked (and indexed) when it is
    stored; its payload is neither copied nor encoded nor checked, so a payload
    JSON cannot represent is accepted here (the SQLite store refuses it).
    Queries read the stored objects through their JSON form: a condition on
    ``exp_data.state.url`` reads a dict's ``"url"`` and a pydantic model's or a
    dataclass's field exactly as the JSON-storing storages see it (a model or
    dataclass on the path is converted as
    :func:`~replaystore.experience.rows.to_json_value` does, when a query reads
    it), so one condition selects the same rows in every storage. A query that
    reads a value with no JSON form raises :class:`~replaystore.errors.SchemaError`
    naming the row. **Do not change a row after storing it**: a change to its
    payload shows in later queries, and a change to its ``exp_meta`` leaves the
    task/agent/name indexes (made at store time) out of step with it. If your
    code reuses or mutates row objects, use ``snapshot=True``.

    **``snapshot=True``:** every row is also validated and snapshotted as JSON
    when stored (a payload JSON cannot represent raises :class:`SchemaError`),
    and queries run on that snapshot, exactly as the SQLite and multi-process
    storages see the row: change a stored object afterwards and reads show the
    change, queries do not. A payload of plain JSON values is copied by the
    compiled ``replaystore._jsoncopy`` (about 0.5 us for a few hundred bytes);
    models and dataclasses are encoded (a pydantic model by pydantic-core's own
    serialiser, about 1 us each) and parsed the first time a query reads a
    payload field.

    Cost: ``add`` is O(1) amortised (AWorld's recounts the whole store on every
    add). Default mode: one compiled check of the id and metadata types and the
    index upkeep, well under 1 us a row whatever the payload; ``snapshot=True``
    adds the snapshot. ``size()`` is O(1); a query with ``eq``/``in_`` on
    ``exp_meta.task_id``, ``agent_id`` or ``task_name`` touches only the
    matching rows, any other query scans every row once (a condition on a field
    of a pydantic payload converts that payload for each row it reads: a few us).
    Memory: your rows and the indexes (``snapshot=True``: plus the snapshots).
    Thread-safe (one lock around every call).

    Raises:
        ConfigError: a bad ``max_capacity``, ``eviction`` or ``snapshot``.
    """

    def __init__(
        self,
        max_capacity: int | None = 10000,
        *,
        eviction: Eviction = "task",
        snapshot: bool = False,
    ) -> None:
        cap, mode = check_capacity(max_capacity, eviction)
        if not isinstance(snapshot, bool):
            raise ConfigError(f"snapshot must be True or False, got {snapshot!r}")
        self._snapshot = snapshot
        self._index = RowIndex(cap, mode)
        # snapshot=True: seq -> the row object the caller stored (the index holds
        # the snapshots); otherwise the index holds the caller's rows themselves.
        self._given: dict[int, DataRow] = {}
        self._next_seq = 0
        self._lock = threading.Lock()

    @property
    def max_capacity(self) -> int | None:
        """The most rows kept (``None``: unbounded)."""
        return self._index.max_capacity

    @property
    def eviction(self) -> Eviction:
        """``"task"`` or ``"row"``."""
        return self._index.eviction

    @property
    def snapshot(self) -> bool:
        """Whether queries run on JSON snapshots taken at store time (see the class docs)."""
        return self._snapshot

    def _rows_at(self, seqs: Iterable[int]) -> list[DataRow]:
        """The rows reads return for the stored ``seqs``, in that order."""
        if self._snapshot:
            given = self._given
            return [given[s] for s in seqs]
        return self._index.rows_at(seqs)

    def add(self, data: DataRow) -> None:
        if self._snapshot:
            self._add_snapshot(data)
            return
        # The common case (a DataRow of the exact types with exactly typed ASCII
        # metadata) is one compiled check; anything else is validated and, where
        # its metadata needs converting, rebuilt around the caller's exp_data.
        check = ENCODE_KERNELS[1]
        if check is None or not check(data, DataRow, ExpMeta, Experience, META_SPEC):
            data = _kept_row(data, "data")
        lock = self._lock
        lock.acquire()  # not `with`: half the cost, which counts at a few hundred ns a row
        try:
            index = self._index
            if data.id in index.ids:
                raise SchemaError(f"row id {data.id!r} is already stored")
            seq = self._next_seq
            index.insert(seq, data)
            self._next_seq = seq + 1
            if index.max_capacity is not None and len(index) > index.max_capacity:
                index.enforce_capacity()
        finally:
            lock.release()

    def add_batch(self, data_batch: Sequence[DataRow], *, _where: str | None = None) -> None:
        if self._snapshot:
            self._add_batch_snapshot(data_batch, _where=_where)
            return
        batch = _listed_batch(data_batch, _where)
        check = ENCODE_KERNELS[1]
        if check is None:
            ok = [False] * len(batch)
        else:
            ok = [check(row, DataRow, ExpMeta, Experience, META_SPEC) for row in batch]
        if not all(ok):
            batch = [
                row if good else _kept_row(row, _where or f"data_batch[{i}]")
                for i, (row, good) in enumerate(zip(batch, ok, strict=True))
            ]
        with self._lock:
            index = self._index
            _check_new_ids(index.ids, [row.id for row in batch])
            seq = self._next_seq
            insert = index.insert
            for row in batch:
                insert(seq, row)
                seq += 1
            self._next_seq = seq
            index.enforce_capacity()

    def _add_snapshot(self, data: DataRow) -> None:
        # add_batch([data]) without the list machinery: the common call, kept short.
        # First snapshot_row's common case inlined (a valid DataRow of the exact
        # types, plain JSON payload, compiled kernels loaded): the same compiled
        # checks and copy, one Python frame fewer per row. Anything else (and any
        # check that declines) takes snapshot_row itself, which raises its errors.
        snapshot: DataRow | None = None
        kernels = COPY_KERNELS
        if kernels and kernels[0] is not None and type(data) is DataRow:
            row_id = data.id
            meta = data.exp_meta
            exp = data.exp_data
            if (
                type(row_id) is str
                and row_id
                and row_id.isascii()
                and type(meta) is ExpMeta
                and type(exp) is Experience
            ):
                meta = kernels[4](meta, ExpMeta, META_SPEC)
                if meta is not NotImplemented:
                    snap = kernels[2](exp, Experience, PAYLOAD_FIELDS)
                    if snap is not NotImplemented:
                        untrack = kernels[3]
                        untrack(meta)
                        snapshot = new_row(meta, snap, row_id)
                        untrack(snapshot)
                        given = data
        if snapshot is None:
            snapshot = snapshot_row(data, "data")
            if snapshot is not None:  # plain JSON values, copied without encoding them
                given = data if type(data.exp_meta) is ExpMeta else _given_row(data, snapshot, None)
            else:
                snapshot, given = _encode(data, "data")
        with self._lock:
            index = self._index
            ids = index.ids
            row_id = snapshot.id
            if row_id in ids:
                raise SchemaError(f"row id {row_id!r} is already stored")
            seq = self._next_seq
            index.insert(seq, snapshot)
            self._given[seq] = given
            self._next_seq = seq + 1
            if index.max_capacity is not None and len(index) > index.max_capacity:
                for old in index.enforce_capacity():
                    del self._given[old]

    def _add_batch_snapshot(self, data_batch: Sequence[DataRow], *, _where: str | None) -> None:
        batch = _listed_batch(data_batch, _where)
        snapshots = []
        given = []
        where = _where or "data_batch"
        for i, row in enumerate(batch):
            try:
                snapshot = snapshot_row(row, where)
            except SchemaError:
                if _where is None:  # the same error again, naming the row's place
                    snapshot_row(row, f"data_batch[{i}]")
                raise
            if snapshot is not None:
                snapshots.append(snapshot)
                given.append(
                    row if type(row.exp_meta) is ExpMeta else _given_row(row, snapshot, None)
                )
            else:
                snapshot, mine = _encode(row, _where or f"data_batch[{i}]")
                snapshots.append(snapshot)
                given.append(mine)
        with self._lock:
            index = self._index
            _check_new_ids(index.ids, [snapshot.id for snapshot in snapshots])
            seq = self._next_seq
            stored = self._given
            insert = index.insert
            for snapshot, row in zip(snapshots, given, strict=True):
                insert(seq, snapshot)
                stored[seq] = row
                seq += 1
            self._next_seq = seq
            for old in index.enforce_capacity():
                del stored[old]

    def size(self, query_condition: Condition | None = None) -> int:
        with self._lock:
            if query_condition is None:
                return len(self._index)
            return len(self._index.match(query_condition))

    def get_paginated(
        self, page: int, page_size: int, query_condition: Condition | None = None
    ) -> list[DataRow]:
        page, page_size = check_page(page, page_size)
        with self._lock:
            seqs = self._index.match(query_condition)
            start = (page - 1) * page_size
            return self._rows_at(seqs[start : start + page_size])

    def get_all(self, query_condition: Condition | None = None) -> list[DataRow]:
        with self._lock:
            if query_condition is None:
                if self._snapshot:
                    return list(self._given.values())
                return self._index.all_rows()
            return self._rows_at(self._index.match(query_condition))

    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        with self._lock:
            return self._task_rows(task_id)

    def get_batch_by_task_ids(self, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        with self._lock:
            return {tid: self._task_rows(tid) for tid in task_ids}

    def _task_rows(self, task_id: str) -> list[DataRow]:
        return self._rows_at(self._index.tasks.get(task_id, ()))

    def clear(self) -> None:
        with self._lock:
            self._index.clear()
            self._given.clear()

    def task_ids(self, query_condition: Condition | None = None) -> list[str]:
        with self._lock:
            return self._index.task_ids(query_condition)

    def sample_rows(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[DataRow]:
        k = check_count(batch_size)
        with self._lock:
            seqs = self._index.match(query_condition)
            return self._rows_at([seqs[i] for i in choose(len(seqs), k, rng)])
