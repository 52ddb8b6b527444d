"""RowIndex (the list-with-offset layout) against a plain reference, operation by operation.

Random sequences of inserts (increasing sequence numbers, with gaps as the
multi-process store's replay makes them), removals, capacity enforcement in
both eviction modes, ``drop_below`` and ``clear``; after every step every query
the storages use must agree with the reference.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replaystore.experience import DataRow, Experience, ExpMeta, QueryBuilder
from replaystore.experience.query import compile_predicate
from replaystore.experience.storage.memory import RowIndex

TASKS = ["t0", "t1", "t2", "t3"]
AGENTS = ["a0", "a1", "a2"]
NAMES = ["n0", "n1"]


def _row(seq: int, task: str, agent: str, name: str) -> DataRow:
    meta = ExpMeta(task_id=task, task_name=name, agent_id=agent, step=seq % 7, execute_time=1.0)
    return DataRow(meta, Experience(state={"s": seq}, actions=[]), f"r{seq}")


def _conditions() -> list[Any]:
    q = QueryBuilder
    return [
        None,
        q().eq("exp_meta.agent_id", "a1").build(),
        q().in_("exp_meta.agent_id", ["a0", "a2"]).build(),
        q().eq("exp_meta.task_name", "n0").build(),
        q().eq("exp_meta.task_id", "t2").build(),
        q().in_("exp_meta.task_id", ["t0", "t3", "nope"]).build(),
        q().eq("exp_meta.agent_id", "a0").or_().eq("exp_meta.task_name", "n1").build(),
        q().eq("exp_meta.agent_id", "a2").and_().eq("exp_meta.task_name", "n0").build(),
        q().gt("exp_meta.step", 3).build(),
        q().eq("exp_meta.agent_id", "a1").and_().gt("exp_meta.step", 2).build(),
        q().eq("exp_meta.agent_id", "a0").or_().gt("exp_meta.step", 4).build(),
        q().in_("exp_meta.task_name", ["n1"]).or_().eq("exp_meta.task_id", "t1").build(),
    ]


class Reference:
    """The specification, spelled plainly: a dict of rows and each live task's first seq."""

    def __init__(self, cap: int | None, eviction: str) -> None:
        self.cap = cap
        self.eviction = eviction
        self.clear()

    def clear(self) -> None:
        self.rows: dict[int, DataRow] = {}
        self.first: dict[str, int] = {}

    def insert(self, seq: int, row: DataRow) -> None:
        self.rows[seq] = row
        self.first.setdefault(row.exp_meta.task_id, seq)

    def remove(self, seq: int) -> None:
        row = self.rows.pop(seq, None)
        if row is None:
            return
        tid = row.exp_meta.task_id
        if not any(r.exp_meta.task_id == tid for r in self.rows.values()):
            del self.first[tid]

    def task_seqs(self, tid: str) -> list[int]:
        return sorted(s for s, r in self.rows.items() if r.exp_meta.task_id == tid)

    def enforce_capacity(self) -> list[int]:
        evicted: list[int] = []
        while self.cap is not None and len(self.rows) > self.cap:
            if self.eviction == "row":
                doomed = [min(self.rows)]
            else:
                oldest = min(self.first, key=self.first.__getitem__)
                doomed = self.task_seqs(oldest)
                if len(self.first) == 1:
                    doomed = doomed[: len(self.rows) - self.cap]
            for seq in doomed:
                self.remove(seq)
            evicted.extend(doomed)
        return evicted

    def drop_below(self, seq: int) -> None:
        for s in [s for s in self.rows if s < seq]:
            self.remove(s)

    def match(self, cond: Any) -> list[int]:
        pred = (lambda r: True) if cond is None else compile_predicate(cond)
        return [s for s in sorted(self.rows) if pred(self.rows[s])]

    def task_ids(self, cond: Any) -> list[str]:
        found = {self.rows[s].exp_meta.task_id for s in self.match(cond)}
        return sorted(found, key=self.first.__getitem__)


def _check(index: RowIndex, ref: Reference) -> None:
    assert len(index) == len(ref.rows)
    assert index.ids == {r.id for r in ref.rows.values()}
    assert index.oldest_seq() == (min(ref.rows) if ref.rows else None)
    assert index.all_seqs() == sorted(ref.rows)
    assert index.all_rows() == [ref.rows[s] for s in sorted(ref.rows)]
    for cond in _conditions():
        seqs = index.match(cond)
        assert seqs == ref.match(cond), cond
        assert index.rows_at(seqs) == [ref.rows[s] for s in seqs]
        assert index.task_ids(cond) == ref.task_ids(cond), cond
    for tid in TASKS:
        assert index.task_rows(tid) == [ref.rows[s] for s in ref.task_seqs(tid)]


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("insert"),
            st.integers(1, 6),  # rows in this run
            st.integers(0, 3),  # gap before it
            st.sampled_from(TASKS),
            st.sampled_from(AGENTS),
            st.sampled_from(NAMES),
            st.booleans(),  # vary agent/name within the run
        ),
        st.tuples(st.just("remove"), st.integers(0, 200)),
        st.tuples(st.just("enforce")),
        st.tuples(st.just("drop_below"), st.integers(0, 200)),
        st.tuples(st.just("clear")),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    ops=_OPS,
    cap=st.one_of(st.none(), st.integers(1, 12)),
    eviction=st.sampled_from(["task", "row"]),
    cut_at=st.sampled_from([1, 3, 1024]),
)
def test_row_index_matches_the_reference(
    ops: list[tuple[Any, ...]], cap: Any, eviction: Any, cut_at: int
) -> None:
    index = RowIndex(cap, eviction)
    index.cut_at = cut_at  # small values cut the list's front often
    ref = Reference(cap, eviction)
    seq = 0
    for op in ops:
        if op[0] == "insert":
            _, n, gap, task, agent, name, vary = op
            seq += gap
            for i in range(n):
                a = AGENTS[(AGENTS.index(agent) + i) % 3] if vary else agent
                nm = NAMES[i % 2] if vary else name
                row = _row(seq, task, a, nm)
                index.insert(seq, row)
                ref.insert(seq, row)
                seq += 1
        elif op[0] == "remove":
            index.remove(op[1])
            ref.remove(op[1])
        elif op[0] == "enforce":
            assert index.enforce_capacity() == ref.enforce_capacity()
        elif op[0] == "drop_below":
            index.drop_below(op[1])
            ref.drop_below(op[1])
        else:
            index.clear()
            ref.clear()
        _check(index, ref)


def test_front_is_cut_off_as_rows_are_evicted() -> None:
    """A long FIFO run keeps the row list about the capacity's size, not the history's."""
    index = RowIndex(100, "row")
    for seq in range(20_000):
        index.insert(seq, _row(seq, f"t{seq // 20}", "a0", "n0"))
        index.enforce_capacity()
    assert len(index) == 100
    assert index.oldest_seq() == 19_900
    assert len(index._slots) <= 2 * 1024 + 100
    assert index.all_seqs() == list(range(19_900, 20_000))


def test_a_sequence_number_that_does_not_increase_is_refused() -> None:
    index = RowIndex(None, "task")
    index.insert(5, _row(5, "t0", "a0", "n0"))
    with pytest.raises(ValueError, match="sequence number 5 is not above the last one"):
        index.insert(5, _row(6, "t0", "a0", "n0"))
