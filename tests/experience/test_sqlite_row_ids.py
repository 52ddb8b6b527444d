"""SQLite file format 3: row ids found through ``row_ids_new`` and ``row_ids``, by id hash.

Format 2 kept a unique index on ``rows.id``. Random ids (AWorld's ``DataRow`` gives
each row ``str(uuid.uuid4())``) land on random pages of that index, so a batch of
1,000 such rows rewrote most of its pages at every commit: twice the pages of the
same batch with sequential ids. Format 3 keys a batch's ids (by hash) in a small
table, merged into the large one every few thousand rows; these tests pin that
down and check that ids stay exactly unique, findable and deletable, with any hash
(colliding ones included), across upgrades.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import SchemaError
from replaystore.experience import DataRow, Experience, ExpMeta, InMemoryStorage, SqliteStorage
from replaystore.experience.rows import (
    _distinct_pairs_py,
    _id_hashes_py,
    distinct_pairs,
    id_hash,
    id_hashes,
)
from replaystore.experience.storage.sqlite import FORMAT
from replaystore.experience.storage.sqlite import filters as filters_module
from replaystore.experience.storage.sqlite import storage as sqlite_module


def row(row_id: str, task: str, step: int = 0) -> DataRow:
    return DataRow(ExpMeta(task, "nav", "a0", step, float(step)), Experience(state=step), row_id)


def uuid_ids(n: int, seed: int = 0) -> list[str]:
    """``str(uuid.uuid4())``-shaped ids (AWorld's default), seeded."""
    rng = random.Random(seed)
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(n)]


def _wal_frames_of_one_batch(path: Path, ids: list[str]) -> int:
    """WAL frames (pages) the 21st batch of 1,000 rows writes, checkpoints off."""
    store = SqliteStorage(path)
    store._committed = lambda: None  # type: ignore[method-assign]  # no checkpoint thread
    store._connect().execute("PRAGMA wal_autocheckpoint = 0")
    rows = [row(i, f"t{k // 20}", k % 20) for k, i in enumerate(ids)]
    for start in range(0, 20_000, 1000):
        store.add_batch(rows[start : start + 1000])
    wal = path.with_name(path.name + "-wal")
    before = wal.stat().st_size
    store.add_batch(rows[20_000:21_000])
    frames = (wal.stat().st_size - before) // (4096 + 24)
    store.close()
    return frames


def test_random_ids_write_about_the_pages_sequential_ids_write(tmp_path):
    # Ids of the same length, so that the rows take the same pages. Format 2: 1,000
    # random ids into the unique index of 20k ids dirtied most of its pages.
    in_order = [f"{i:036d}" for i in range(21_000)]
    sequential = _wal_frames_of_one_batch(tmp_path / "seq.sqlite", in_order)
    random_ids = _wal_frames_of_one_batch(tmp_path / "uuid.sqlite", uuid_ids(21_000))
    assert random_ids <= 1.25 * sequential, (random_ids, sequential)


@pytest.mark.parametrize("hashes", [id_hashes, _id_hashes_py], ids=["built", "python"])
def test_the_compiled_and_python_hashes_agree_and_are_fnv1a(hashes):
    ids = ["", "a", "w0-1", "é", "\U0001f600x", *uuid_ids(200)]
    assert hashes(ids) == [id_hash(i) for i in ids]
    assert id_hash("") == 0xCBF29CE484222325 - (1 << 64)  # FNV-1a's offset basis
    assert id_hash("a") == 0xAF63DC4C8601EC8C - (1 << 64)
    with pytest.raises(TypeError, match="item 1 is int, not str"):
        hashes(["a", 1])
    with pytest.raises(TypeError, match="list of str, not tuple"):
        hashes(("a",))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    pairs=st.lists(
        st.tuples(st.sampled_from([None, "a0", "a1", "é"]), st.sampled_from(["t0", "t1", "t2"])),
        max_size=30,
    )
)
def test_a_batchs_distinct_task_keys_are_the_same_compiled_or_not(pairs):
    # Equal strings that are distinct objects (as rows built one by one hold them).
    values = [None if v is None else "".join(v) for v, _ in pairs]
    keys = ["".join(k) for _, k in pairs]
    expected = [p for p in dict.fromkeys(pairs) if p[0] is not None]
    assert distinct_pairs(values, keys) == _distinct_pairs_py(values, keys) == expected


@pytest.mark.parametrize("pairs", [distinct_pairs, _distinct_pairs_py], ids=["built", "python"])
def test_distinct_pairs_refuses_what_it_cannot_compare(pairs):
    with pytest.raises(ValueError, match="lengths differ"):
        pairs(["a"], [])
    with pytest.raises(TypeError, match="values must be str or None, keys str"):
        pairs(["a", 1], ["t", "t"])
    with pytest.raises(TypeError, match="values must be str or None, keys str"):
        pairs([None], [None])
    with pytest.raises(TypeError):
        pairs(("a",), ["t"])


def _weak(text: str) -> int:
    return len(text) % 3  # three hashes for every id: collisions everywhere


_op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 40)),
    st.tuples(st.just("batch"), st.lists(st.integers(0, 40), min_size=1, max_size=8)),
    st.tuples(st.just("clear")),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(_op, min_size=1, max_size=14),
    capacity=st.sampled_from([None, 3, 7]),
    eviction=st.sampled_from(["task", "row"]),
    weak=st.booleans(),
)
def test_ids_stay_unique_findable_and_deletable_with_any_hash(ops, capacity, eviction, weak):
    # Against the in-memory store: the same rows stored, the same duplicates refused
    # (nothing of a refused batch stored), the same rows found by id; with the real
    # hash and with one under which most ids collide; merges every 4 seqs.
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
        mp.setattr(sqlite_module, "_MERGE_ROWS", 4)
        if weak:
            mp.setattr(sqlite_module, "id_hash", _weak)
            mp.setattr(sqlite_module, "id_hashes", lambda ids: [_weak(i) for i in ids])
            mp.setattr(filters_module, "id_hashes", lambda ids: [_weak(i) for i in ids])
        memory = InMemoryStorage(capacity, eviction=eviction)
        sqlite = SqliteStorage(Path(tmp) / "s.sqlite", capacity, eviction=eviction)
        step = 0
        for op in ops:
            if op[0] == "clear":
                memory.clear()
                sqlite.clear()
                continue
            numbers = [op[1]] if op[0] == "add" else op[1]
            rows = [row(f"r{n}", f"t{n % 5}", step + k) for k, n in enumerate(numbers)]
            step += len(rows)
            outcomes = []
            for store in (memory, sqlite):
                try:
                    store.add(rows[0]) if op[0] == "add" else store.add_batch(rows)
                    outcomes.append("stored")
                except SchemaError:
                    outcomes.append("refused")
            assert outcomes[0] == outcomes[1]
            assert [r.id for r in sqlite.get_all()] == [r.id for r in memory.get_all()]
            assert sqlite.size() == memory.size()
            wanted = [f"r{n}" for n in range(0, 41, 3)]
            for cond in (
                {"field": "id", "op": "eq", "value": "r7"},
                {"field": "id", "op": "in_", "value": wanted},
                {
                    "and_": [
                        {"field": "id", "op": "in_", "value": wanted},
                        {"field": "step", "op": "gt", "value": 2},
                    ]
                },
            ):
                assert [r.id for r in sqlite.get_all(cond)] == [r.id for r in memory.get_all(cond)]
        with sqlite._read() as conn:
            keyed = conn.execute(
                "SELECT seq FROM row_ids_new UNION ALL SELECT seq FROM row_ids ORDER BY seq"
            ).fetchall()
            stored = conn.execute("SELECT seq FROM rows ORDER BY seq").fetchall()
        assert keyed == stored  # every row keyed once; no key left by a deleted row
        sqlite.close()


def test_a_hash_shared_by_two_ids_stores_both_and_still_refuses_each_again(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_module, "id_hash", lambda text: 7)
    monkeypatch.setattr(sqlite_module, "id_hashes", lambda ids: [7] * len(ids))
    monkeypatch.setattr(filters_module, "id_hashes", lambda ids: [7] * len(ids))
    store = SqliteStorage(tmp_path / "s.sqlite")
    store.add(row("a", "t0"))
    store.add(row("b", "t0", 1))  # one-row path: the hash is taken, not the id
    store.add_batch([row("c", "t1"), row("d", "t1", 1)])  # twice in the batch, and taken
    with pytest.raises(SchemaError, match="row id 'b' is already stored; row not stored"):
        store.add(row("b", "t2"))
    with pytest.raises(SchemaError, match="row id 'd' is already stored; batch not stored"):
        store.add_batch([row("e", "t2"), row("d", "t2", 1)])
    assert [r.id for r in store.get_all()] == ["a", "b", "c", "d"]
    assert [r.id for r in store.get_all({"field": "id", "op": "eq", "value": "c"})] == ["c"]


def test_a_query_by_id_reads_the_id_tables_not_the_whole_table(tmp_path):
    store = SqliteStorage(tmp_path / "s.sqlite")
    ids = uuid_ids(50)
    store.add_batch([row(i, f"t{k % 5}", k) for k, i in enumerate(ids)])
    for cond in (
        {"field": "id", "op": "eq", "value": ids[3]},
        {"field": "id", "op": "in_", "value": ids[10:13]},
        {
            "and_": [
                {"field": "id", "op": "eq", "value": ids[3]},
                {"field": "step", "op": "gte", "value": 0},
            ]
        },
    ):
        plan = " | ".join(store.query_plan(cond))
        assert "SCAN rows" not in plan and "row_ids" in plan, plan
    assert [r.id for r in store.get_all({"field": "id", "op": "in_", "value": ids[10:13]})] == ids[
        10:13
    ]


FORMAT2_SCHEMA = """
CREATE TABLE rows (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    task_name TEXT,
    agent_id TEXT,
    step INTEGER NOT NULL,
    execute_time REAL NOT NULL,
    pre_agent TEXT,
    data TEXT NOT NULL
);
CREATE INDEX rows_task ON rows (task_id, seq);
CREATE TABLE tasks (task_id TEXT PRIMARY KEY, first_seq INTEGER NOT NULL) WITHOUT ROWID;
CREATE INDEX tasks_first ON tasks (first_seq);
CREATE TABLE task_keys (
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (field, value, first_seq, task_id)
) WITHOUT ROWID;
CREATE INDEX task_keys_task ON task_keys (task_id);
CREATE TABLE stats (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
"""


def write_format2(path: Path) -> list[tuple[int, str]]:
    """A format 2 store as that version left it: seqs 1-12 handed out, 1-3 and 12 deleted."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(FORMAT2_SCHEMA)
    kept = [(seq, f"r{seq}") for seq in range(4, 12)]
    for seq, row_id in kept:
        conn.execute(
            "INSERT INTO rows VALUES (?, ?, ?, 'nav', 'a0', ?, ?, NULL, '{\"state\":1}')",
            (seq, row_id, f"t{seq // 4}", seq, float(seq)),
        )
    conn.execute("INSERT INTO tasks SELECT task_id, min(seq) FROM rows GROUP BY task_id")
    conn.execute(
        "INSERT INTO task_keys "
        "SELECT 'agent_id', 'a0', min(seq), task_id FROM rows GROUP BY task_id"
    )
    conn.execute("INSERT INTO stats VALUES ('format', 2), ('high_water', 12), ('dead', 4)")
    conn.close()
    return kept


def test_a_format2_file_is_upgraded_keeping_rows_and_counts_and_its_ids_keyed(tmp_path, caplog):
    path = tmp_path / "format2.sqlite"
    kept = write_format2(path)
    with caplog.at_level(logging.INFO, logger="replaystore.experience.sqlite"):
        store = SqliteStorage(path)
    assert f"upgraded from format 2 to {FORMAT}" in caplog.text
    with store._read() as conn:
        assert conn.execute("SELECT seq, id FROM rows ORDER BY seq").fetchall() == kept
        assert dict(conn.execute("SELECT key, value FROM stats")) == {
            "format": FORMAT,
            "high_water": 12,
            "dead": 4,
            "merged": 11,
        }
        keyed = conn.execute("SELECT h, seq FROM row_ids ORDER BY seq").fetchall()
        unique = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE tbl_name = 'rows' AND name LIKE 'sqlite_autoindex%'"
        ).fetchone()
    assert keyed == [(id_hash(i), s) for s, i in kept]
    assert unique is None  # the copied table has no unique index on id
    assert store.size() == 8 and store.integrity_check() == "ok"
    with pytest.raises(SchemaError, match="'r5' is already stored"):
        store.add(row("r5", "t9"))
    store.add(row("r12", "t9"))  # seq 13: seqs are never reused
    assert [r.id for r in store.get_all({"field": "id", "op": "eq", "value": "r6"})] == ["r6"]
    with store._read() as conn:
        assert conn.execute("SELECT max(seq) FROM rows").fetchone()[0] == 13


def test_the_viewer_finds_a_row_by_id_through_the_id_tables_and_in_older_files(tmp_path):
    from replaystore.view.experience import SqliteReader

    store = SqliteStorage(tmp_path / "s.sqlite")
    ids = uuid_ids(300)
    store.add_batch([row(i, f"t{k % 7}", k) for k, i in enumerate(ids)])
    store.close()
    reader = SqliteReader(tmp_path / "s.sqlite")
    seen: list[str] = []
    reader._conn.set_trace_callback(seen.append)
    found = reader.row(ids[123])
    assert found is not None and found.id == ids[123] and found.exp_meta.step == 123
    assert reader.row("nope") is None
    plan = reader._conn.execute(f"EXPLAIN QUERY PLAN {seen[-1]}").fetchall()
    assert not any("SCAN rows" in str(line[3]) for line in plan), plan
    write_format2(tmp_path / "old.sqlite")  # read as it is: by its unique index on id
    old = SqliteReader(tmp_path / "old.sqlite")
    assert old.row("r7").exp_meta.step == 7  # type: ignore[union-attr]


def test_id_tables_dropped_by_hand_are_rebuilt_on_open(tmp_path):
    path = tmp_path / "s.sqlite"
    store = SqliteStorage(path)
    store.add_batch([row(f"r{i}", f"t{i % 3}", i) for i in range(10)])
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE row_ids_new")
    store = SqliteStorage(path)
    with pytest.raises(SchemaError, match="'r4' is already stored"):
        store.add(row("r4", "t9"))
    assert [r.id for r in store.get_all({"field": "id", "op": "eq", "value": "r7"})] == ["r7"]
    with store._read() as conn:
        keyed = conn.execute("SELECT h, seq FROM row_ids ORDER BY seq").fetchall()
    assert keyed == [(id_hash(f"r{i}"), i + 1) for i in range(10)]
