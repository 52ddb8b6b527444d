"""SQLite experience store formats 2 and 3: counters, seqs, the upgrade of format 1 files.

(Format 3's id tables: ``test_sqlite_row_ids.py``.)

Format 1 (replaystore before format 2) kept an AUTOINCREMENT ``rows.seq`` and two
counters (``tasks.n_rows``, ``stats.n_rows``) that every commit rewrote. Format 2
has none of them: ``size()`` is seqs handed out minus ``stats.dead``. The format 1
writer below is that version's schema and statements, frozen here as the fixture.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import SchemaError, StorageError
from replaystore.experience import DataRow, Experience, ExpMeta, InMemoryStorage, SqliteStorage
from replaystore.experience.storage.base import choose
from replaystore.experience.storage.sqlite import FORMAT

FORMAT1_SCHEMA = """
CREATE TABLE rows (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
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
CREATE TABLE tasks (task_id TEXT PRIMARY KEY, first_seq INTEGER NOT NULL, n_rows INTEGER NOT NULL);
CREATE INDEX tasks_first ON tasks (first_seq);
CREATE TABLE task_keys (
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    task_id TEXT NOT NULL,
    PRIMARY KEY (field, value, first_seq, task_id)
) WITHOUT ROWID;
CREATE INDEX task_keys_task ON task_keys (task_id);
CREATE TABLE stats (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO stats (key, value) VALUES ('n_rows', 0);
"""


def row(i: int, task: str, agent: str | None = "a0") -> DataRow:
    return DataRow(ExpMeta(task, "nav", agent, i, float(i)), Experience(state={"i": i}), f"r{i}")


def write_format1(path: Path, rows: list[DataRow], evict_tasks: tuple[str, ...] = ()) -> None:
    """A format 1 store as that version wrote it: one commit per row, then task evictions."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(FORMAT1_SCHEMA)
    for r in rows:
        m = r.exp_meta
        conn.execute("BEGIN IMMEDIATE")
        seq = conn.execute(
            "INSERT INTO rows (id, task_id, task_name, agent_id, step, execute_time, pre_agent, "
            "data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (r.id, m.task_id, m.task_name, m.agent_id, m.step, m.execute_time, None, "{}"),
        ).lastrowid
        conn.execute(
            "INSERT INTO tasks (task_id, first_seq, n_rows) VALUES (?, ?, 1) "
            "ON CONFLICT (task_id) DO UPDATE SET n_rows = n_rows + 1",
            (m.task_id, seq),
        )
        for field in ("agent_id", "task_name"):
            value = getattr(m, field)
            if value is not None:
                conn.execute(
                    "INSERT OR IGNORE INTO task_keys SELECT ?, ?, first_seq, task_id "
                    "FROM tasks WHERE task_id = ?",
                    (field, value, m.task_id),
                )
        conn.execute("UPDATE stats SET value = value + 1 WHERE key = 'n_rows'")
        conn.execute("COMMIT")
    for task in evict_tasks:
        conn.execute("BEGIN IMMEDIATE")
        n = conn.execute("DELETE FROM rows WHERE task_id = ?", (task,)).rowcount
        conn.execute("DELETE FROM tasks WHERE task_id = ?", (task,))
        conn.execute("DELETE FROM task_keys WHERE task_id = ?", (task,))
        conn.execute("UPDATE stats SET value = value - ? WHERE key = 'n_rows'", (n,))
        conn.execute("COMMIT")
    conn.close()


def table_columns(path: Path, table: str) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]


def seqs_and_ids(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT seq, id FROM rows ORDER BY seq").fetchall()


def format1_file(tmp_path: Path) -> Path:
    """Tasks t0..t3 of 5 rows each, interleaved so that t1 holds the newest row; t1 and t0
    evicted: the newest seq (20) is gone, sqlite_sequence remembers it."""
    rows = [row(i, f"t{i // 5}") for i in range(15)] + [row(15 + i, "t3") for i in range(4)]
    rows.append(row(19, "t1", agent="a9"))
    path = tmp_path / "format1.sqlite"
    write_format1(path, rows, evict_tasks=("t1", "t0"))
    return path


def test_a_new_store_is_written_in_the_current_format(tmp_path):
    store = SqliteStorage(tmp_path / "new.sqlite")
    store.add(row(0, "t0"))
    with store._read() as conn:
        stats = dict(conn.execute("SELECT key, value FROM stats"))
        has_sequence = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'"
        ).fetchone()
    assert stats == {"format": FORMAT, "high_water": 0, "dead": 0, "merged": 0}
    assert has_sequence is None  # no AUTOINCREMENT: no counter row rewritten per commit
    assert table_columns(tmp_path / "new.sqlite", "tasks") == ["task_id", "first_seq"]


def test_a_format1_file_is_upgraded_on_open_keeping_rows_seqs_order_and_counts(tmp_path, caplog):
    path = format1_file(tmp_path)
    before = seqs_and_ids(path)
    assert [s for s, _ in before] == list(range(11, 20))  # t2 (11-15) and t3 (16-19) left
    assert "n_rows" in table_columns(path, "tasks")

    with caplog.at_level(logging.INFO, logger="replaystore.experience.sqlite"):
        store = SqliteStorage(path)
    assert f"upgraded from format 1 to {FORMAT}" in caplog.text
    assert seqs_and_ids(path) == before
    assert table_columns(path, "tasks") == ["task_id", "first_seq"]
    assert store.size() == 9
    assert store.task_ids() == ["t2", "t3"]
    assert store.task_ids({"field": "exp_meta.agent_id", "op": "eq", "value": "a9"}) == []
    assert store.integrity_check() == "ok"
    with store._read() as conn:
        leftover = "SELECT 1 FROM sqlite_master WHERE name LIKE '%format1'"
        assert conn.execute(leftover).fetchone() is None
        assert dict(conn.execute("SELECT key, value FROM stats")) == {
            "format": FORMAT,
            "high_water": 20,  # AUTOINCREMENT had handed out 20 seqs; 11 are gone
            "dead": 11,
            "merged": 19,  # the newest row kept (seq 19): every id up to it is in row_ids
        }

    # The next row gets seq 21, not 20 (the evicted newest row's): seqs are never reused.
    store.add(row(20, "t4"))
    assert seqs_and_ids(path)[-1] == (21, "r20")
    assert store.size() == 10
    assert store.task_ids() == ["t2", "t3", "t4"]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="replaystore.experience.sqlite"):
        assert SqliteStorage(path).size() == 10  # a second open changes nothing
    assert "upgraded" not in caplog.text


def test_a_format1_file_without_task_keys_gets_them_in_the_upgrade(tmp_path):
    path = tmp_path / "older.sqlite"
    write_format1(path, [row(i, f"t{i // 4}", agent=f"a{i // 8}") for i in range(16)])
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE task_keys")
    store = SqliteStorage(path)
    assert store.task_ids({"field": "exp_meta.agent_id", "op": "eq", "value": "a1"}) == ["t2", "t3"]
    assert store.size() == 16


def test_an_upgrade_killed_midway_leaves_the_format1_file_as_it_was(tmp_path):
    path = tmp_path / "killed.sqlite"
    write_format1(path, [row(i, f"t{i // 4}") for i in range(40)])
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE task_keys")  # so the upgrade calls rebuild_keys, late in it
    before = seqs_and_ids(path)
    # The child dies (os._exit: no cleanup, no rollback) after the rows were copied into
    # the new table and the old one dropped, inside the upgrade's transaction.
    script = textwrap.dedent(
        f"""
        import os
        from replaystore.experience.storage.sqlite import SqliteStorage, migrate
        migrate.rebuild_keys = lambda conn, task_id: os._exit(7)
        SqliteStorage({str(path)!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 7, done.stderr.decode()
    assert "n_rows" in table_columns(path, "tasks")  # still format 1, whole
    assert seqs_and_ids(path) == before
    store = SqliteStorage(path)
    assert store.size() == 40 and seqs_and_ids(path) == before
    assert store.integrity_check() == "ok"


def test_a_file_of_a_newer_format_is_refused_naming_it(tmp_path):
    path = tmp_path / "newer.sqlite"
    SqliteStorage(path).add(row(0, "t0"))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE stats SET value = ? WHERE key = 'format'", (FORMAT + 1,))
    with pytest.raises(StorageError, match=f"format {FORMAT + 1}.*newer replaystore"):
        SqliteStorage(path)
    with sqlite3.connect(path) as conn:  # refused, not touched
        assert conn.execute("SELECT count(*) FROM rows").fetchone()[0] == 1


# One operation on both stores: ("add", task, agent), ("batch", [(task, agent), ...]), ("clear",).
_task = st.sampled_from(["t0", "t1", "t2", "t3"])
_agent = st.sampled_from(["a0", "a1", None])
_op = st.one_of(
    st.tuples(st.just("add"), _task, _agent),
    st.tuples(st.just("batch"), st.lists(st.tuples(_task, _agent), min_size=1, max_size=6)),
    st.tuples(st.just("clear")),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(_op, min_size=1, max_size=14),
    capacity=st.sampled_from([None, 1, 3, 7]),
    eviction=st.sampled_from(["task", "row"]),
)
def test_size_ids_and_tasks_match_the_in_memory_store_and_seqs_are_never_reused(
    ops, capacity, eviction
):
    memory = InMemoryStorage(capacity, eviction=eviction)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.sqlite"
        sqlite = SqliteStorage(path, capacity, eviction=eviction)
        n = 0
        highest = 0  # the largest seq ever seen
        for op in ops:
            if op[0] == "clear":
                memory.clear()
                sqlite.clear()
                new_ids: set[str] = set()
            else:
                pairs = [op[1:]] if op[0] == "add" else op[1]
                rows = [row(n + k, task, agent) for k, (task, agent) in enumerate(pairs)]
                n += len(rows)
                new_ids = {r.id for r in rows}
                for store in (memory, sqlite):
                    if op[0] == "add":
                        store.add(rows[0])
                    else:
                        store.add_batch(rows)
            assert sqlite.size() == memory.size()
            assert [r.id for r in sqlite.get_all()] == [r.id for r in memory.get_all()]
            assert sqlite.task_ids() == memory.task_ids()
            for agent in ("a0", "a1"):
                cond = {"field": "exp_meta.agent_id", "op": "eq", "value": agent}
                assert sqlite.task_ids(cond) == memory.task_ids(cond)
            stored = seqs_and_ids(path)
            fresh = [s for s, i in stored if i in new_ids]
            assert all(s > highest for s in fresh), (fresh, highest)
            highest = max([highest, *fresh])
        sqlite.close()


def test_stats_and_the_viewer_read_a_format1_file_without_upgrading_it(tmp_path, capsys):
    import json

    from replaystore.cli import main

    path = format1_file(tmp_path)
    with sqlite3.connect(path) as conn:  # a checkpointed file: no side files to compare
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = path.read_bytes()
    assert main(["stats", "--json", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["rows"], summary["tasks"]) == (9, 2)

    testclient = pytest.importorskip("starlette.testclient")
    from replaystore.view import build_app

    client = testclient.TestClient(build_app("sqlite_experience_store", path))
    html = client.get("/").text
    assert "9 rows in 2 tasks" in html
    assert path.read_bytes() == before
    assert "n_rows" in table_columns(path, "tasks")


def _one_row_writer(path: str, writer: int, n: int, cap: int | None) -> None:
    store = SqliteStorage(path, cap)
    for i in range(n):
        agent = f"a{(i // 5) % 3}"
        store.add(row(writer * 100_000 + i, f"w{writer}-t{i // 5}", agent=agent))


@pytest.mark.parametrize("cap", [None, 400])
def test_one_row_stores_from_four_processes_keep_rows_tasks_keys_and_count_exact(tmp_path, cap):
    import multiprocessing

    path = tmp_path / "four.sqlite"
    SqliteStorage(path, cap).close()  # no connection of this process across the fork
    procs = [
        multiprocessing.Process(target=_one_row_writer, args=(str(path), w, 250, cap))
        for w in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    store = SqliteStorage(path, cap)
    with store._read() as conn:
        n, distinct = conn.execute("SELECT count(*), count(DISTINCT seq) FROM rows").fetchone()
        # Each task's first_seq is its first row's seq; its keys are exactly its rows' values.
        tasks = conn.execute("SELECT task_id, first_seq FROM tasks ORDER BY task_id").fetchall()
        firsts = conn.execute(
            "SELECT task_id, min(seq) FROM rows GROUP BY task_id ORDER BY task_id"
        ).fetchall()
        keys = set(conn.execute("SELECT field, value, task_id FROM task_keys"))
        values = {("agent_id", a, t) for a, t in conn.execute("SELECT agent_id, task_id FROM rows")}
        values |= {("task_name", "nav", t) for t, _ in firsts}
    assert n == distinct == (1000 if cap is None else n) and store.size() == n
    if cap is not None:
        assert cap - 5 < n <= cap  # whole 5-row tasks evicted, oldest first
    assert tasks == firsts and keys == values
    assert store.integrity_check() == "ok"


def _tables(path: Path) -> list[list[tuple]]:
    with sqlite3.connect(path) as conn:
        return [
            sorted(conn.execute(f"SELECT * FROM {table}").fetchall(), key=repr)
            for table in ("rows", "tasks", "task_keys", "row_ids_new", "row_ids", "stats")
        ]


@settings(max_examples=30, deadline=None)
@given(
    pairs=st.lists(st.tuples(_task, _agent, st.sampled_from(["nav", None])), max_size=25),
    cuts=st.lists(st.integers(0, 25), max_size=4),
)
def test_one_row_stores_write_exactly_what_batches_write(pairs, cuts):
    # The one-row path (one statement, its trigger doing the bookkeeping) against add_batch.
    rows = [
        DataRow(ExpMeta(task, name, agent, i, float(i)), Experience(state={"i": i}), f"r{i}")
        for i, (task, agent, name) in enumerate(pairs)
    ]
    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp) / "one.sqlite", Path(tmp) / "many.sqlite"
        single, batched = SqliteStorage(one), SqliteStorage(many)
        for r in rows:
            single.add(r)
        for lo, hi in itertools.pairwise(bounds):
            batched.add_batch(rows[lo:hi])
        single.close()
        batched.close()
        assert _tables(one) == _tables(many)


def _many_rows(n: int) -> list[DataRow]:
    return [row(i, f"t{i // 37}", f"a{i % 3}") for i in range(n)]


@pytest.mark.parametrize("params_limit", [None, 100])
def test_big_batches_go_in_by_chunks_exactly_as_one_row_stores(tmp_path, params_limit):
    # A batch is inserted by multi-row statements of up to 512 rows (fewer where the
    # connection allows fewer parameters: 100 allows 11 rows, so chunks of 8), its
    # remainder cut in powers of two: every cut must give the rows, seqs, tasks and
    # keys that one-row stores give.
    rows = _many_rows(2_400)
    single = SqliteStorage(tmp_path / "one.sqlite")
    batched = SqliteStorage(tmp_path / "many.sqlite")
    for r in rows:
        single.add(r)
    if params_limit is not None:
        batched.size()  # opens the connection
        batched._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, params_limit)
    for lo, hi in itertools.pairwise([0, 1, 8, 520, 1_033, 1_034, 2_400]):
        batched.add_batch(rows[lo:hi])
    single.close()
    batched.close()
    assert _tables(tmp_path / "one.sqlite") == _tables(tmp_path / "many.sqlite")


def test_a_duplicate_in_a_later_chunk_leaves_nothing_of_the_batch(tmp_path):
    store = SqliteStorage(tmp_path / "s.sqlite")
    store.add_batch(_many_rows(3))
    before = _tables(tmp_path / "s.sqlite")
    batch = _many_rows(1_000)[3:]
    # r1 is stored already; it is in the batch's fourth statement (997 rows: 512, 256,
    # 128, 64, ...), after 896 of the batch's rows were inserted
    batch[900] = row(1, "t0")
    with pytest.raises(SchemaError, match="'r1' is already stored; batch not stored"):
        store.add_batch(batch)
    assert store.size() == 3
    store.close()
    assert _tables(tmp_path / "s.sqlite") == before


@settings(max_examples=30, deadline=None)
@given(
    pairs=st.lists(st.tuples(_task, _agent, st.sampled_from(["nav", "buy", None])), max_size=30),
    capacity=st.sampled_from([None, 4, 9]),
    eviction=st.sampled_from(["task", "row"]),
    k=st.integers(0, 6),
    seed=st.integers(0, 2**16),
)
def test_task_picks_through_first_seqs_equal_picks_over_every_task_id(
    pairs, capacity, eviction, k, seed
):
    # The fast pick (first_seq values as one text, then the picked ids) against reading
    # every matching id in age order and choosing from them with the same seed.
    conditions = [
        None,
        {"field": "exp_meta.agent_id", "op": "eq", "value": "a1"},
        {"field": "exp_meta.task_name", "op": "in_", "value": ["buy"]},
        {"field": "task_id", "op": "eq", "value": "t2"},
        {"field": "exp_meta.agent_id", "op": "in_", "value": []},
    ]
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStorage(Path(tmp) / "s.sqlite", capacity, eviction=eviction)
        for i, (task, agent, name) in enumerate(pairs):
            store.add(
                DataRow(ExpMeta(task, name, agent, i, float(i)), Experience(state=i), f"r{i}")
            )
        with store._read() as conn:
            for cond in conditions:
                assert store._firsts_sql(cond) is not None
                ids = store._task_ids(conn, cond)
                slow = [ids[i] for i in choose(len(ids), k, np.random.default_rng(seed))]
                fast = store._pick_task_ids(conn, k, cond, np.random.default_rng(seed))
                assert fast == slow
        store.close()


def _statements(store: SqliteStorage) -> list[str]:
    """The SQL statements the store's connection runs from now on (in order)."""
    seen: list[str] = []
    store._connect().set_trace_callback(seen.append)
    return seen


def _bookkeeping(path: Path) -> tuple[list[tuple], set[tuple]]:
    with sqlite3.connect(path) as conn:
        tasks = conn.execute("SELECT task_id, first_seq FROM tasks ORDER BY task_id").fetchall()
        keys = set(conn.execute("SELECT field, value, first_seq, task_id FROM task_keys"))
    return tasks, keys


def test_a_booked_tasks_rows_are_inserted_alone_and_keep_the_bookkeeping_exact(tmp_path):
    # From the second row of a (task, agent, task name) on, a one-row store runs the
    # row's insert alone; what the file holds is what the trigger's path writes.
    fast, slow = SqliteStorage(tmp_path / "fast.sqlite"), SqliteStorage(tmp_path / "slow.sqlite")
    slow._book = lambda conn, key: None  # type: ignore[method-assign]  # never booked
    statements = _statements(fast)
    rows = [row(i, f"t{i // 4}", f"a{i % 2}") for i in range(16)]
    for r in rows:
        fast.add(r)
        slow.add(r)
    alone = {s for s in statements if s.startswith("INSERT INTO rows_booked")}
    # Each (task, agent)'s first row books it, and the connection's very first store
    # only reads the data_version its bookings start from: 16 - 8 - 1 rows alone.
    assert len(alone) == 7
    fast.close()
    slow.close()
    assert _tables(tmp_path / "fast.sqlite") == _tables(tmp_path / "slow.sqlite")


@pytest.mark.parametrize("how", ["clear", "evict"])
def test_a_delete_by_another_connection_sends_booked_rows_back_through_the_bookkeeping(
    tmp_path, how
):
    # Store a books task t0; another connection then deletes it (clear, or eviction
    # of the oldest task). a's next row of t0 must book the task again: inserted
    # alone, it would leave a row whose task is in neither tasks nor task_keys.
    path = tmp_path / "s.sqlite"
    a = SqliteStorage(path)
    for i in range(3):
        a.add(row(i, "t0"))
    assert ("t0", "a0", "nav") in a._booked
    b = SqliteStorage(path, max_capacity=3 if how == "evict" else None)
    if how == "clear":
        b.clear()
    else:
        b.add(row(100, "t1"))  # four rows, capacity 3: task t0 goes
    assert "t0" not in {t for t, _ in _bookkeeping(path)[0]}
    statements = _statements(a)
    a.add(row(3, "t0"))
    assert any("rows_booked" in s for s in statements)  # the guarded insert was tried
    tasks, keys = _bookkeeping(path)
    seq = {i: s for s, i in seqs_and_ids(path)}
    assert ("t0", seq["r3"]) in tasks
    assert {("agent_id", "a0", seq["r3"], "t0"), ("task_name", "nav", seq["r3"], "t0")} <= keys
    assert a.task_ids({"field": "exp_meta.agent_id", "op": "eq", "value": "a0"})[-1] == "t0"


def test_a_delete_by_the_same_connection_forgets_its_bookings(tmp_path):
    path = tmp_path / "s.sqlite"
    store = SqliteStorage(path)
    for i in range(3):
        store.add(row(i, "t0"))
    store.clear()
    assert not store._booked
    store.add(row(3, "t0"))
    assert _bookkeeping(path)[0] == [("t0", 4)]


def test_a_duplicate_id_on_the_booked_path_is_refused_and_stores_nothing(tmp_path):
    path = tmp_path / "s.sqlite"
    store = SqliteStorage(path)
    for i in range(3):
        store.add(row(i, "t0"))
    before = _tables(path)
    with pytest.raises(SchemaError, match="'r1' is already stored"):
        store.add(row(1, "t0"))
    assert _tables(path) == before
    store.add(row(3, "t0"))
    assert store.size() == 4


class _FailingFirstPragma:
    """A connection whose first ``PRAGMA journal_mode`` fails with SQLite's I/O error (as
    one of four processes opening a new store at once saw in CI), then works."""

    def __init__(self, conn: sqlite3.Connection, fail: bool) -> None:
        self._conn, self._fail = conn, fail

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if self._fail and sql.startswith("PRAGMA journal_mode"):
            self._fail = False
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


@pytest.mark.parametrize("failures", [2, 10])
def test_an_io_error_while_opening_is_retried_on_a_new_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    from replaystore.experience.storage.sqlite import storage as storage_module

    path = tmp_path / "s.sqlite"
    SqliteStorage(path).close()  # the file exists, in WAL mode
    opened: list[int] = []
    real = storage_module.SqliteStorage._open_connection

    def flaky(self: SqliteStorage) -> object:
        opened.append(1)
        return _FailingFirstPragma(real(self), fail=len(opened) <= failures)

    monkeypatch.setattr(storage_module.SqliteStorage, "_open_connection", flaky)
    retries = storage_module._OPEN_IO_RETRIES
    if failures <= retries:
        store = SqliteStorage(path)
        store.add(row(1, "t1"))
        assert store.size() == 1 and len(opened) == failures + 1
        store.close()
    else:
        with pytest.raises(StorageError, match=r"cannot initialise SQLite store .*disk I/O error"):
            SqliteStorage(path)
        assert len(opened) == retries + 1  # then it reports the error
