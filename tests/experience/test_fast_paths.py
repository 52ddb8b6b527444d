"""The fast paths of the experience store agree with the simple paths they replace.

* the cached C JSON encoder (``_encode_payload``) vs ``json.JSONEncoder.encode``;
* the in-memory storage's lazily decoded query snapshot vs the rows decoded at store time;
* SQLite's ``task_keys`` narrowing vs the plain compiled ``WHERE``, through evictions;
* SQLite one-row commits vs batches.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.errors import ConfigError, SchemaError
from replaystore.experience import DataRow, Experience, ExpMeta, InMemoryStorage, SqliteStorage
from replaystore.experience.query import compile_predicate, compile_sql
from replaystore.experience.rows import (
    META_FIELDS,
    PAYLOAD_FIELDS,
    _dumps,
    _encode_payload,
    encode_batch,
    encode_records,
    encode_row,
    snapshot_row,
)

_counter = itertools.count()
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

TEXT = st.text(alphabet='ab_é😀\ud800"\\\n', max_size=4)
FLOAT = st.floats(allow_nan=True, allow_infinity=True)
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), FLOAT, TEXT)
ANY = st.recursive(
    LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(
            st.one_of(TEXT, st.integers(-3, 3), st.booleans(), st.none()), inner, max_size=3
        ),
        st.sets(st.integers(0, 3), max_size=2),
        st.binary(max_size=2),
    ),
    max_leaves=8,
)


def _outcome(encode, value):
    try:
        return "ok", encode(value)
    except (TypeError, ValueError) as exc:
        return "error", type(exc).__name__


@SETTINGS
@given(value=ANY)
def test_cached_c_encoder_writes_the_same_text_and_refuses_the_same_values(value):
    assert _outcome(_encode_payload, value) == _outcome(_dumps, value)


def test_cached_c_encoder_reports_a_cycle_as_an_error_not_a_crash():
    loop: list = []
    loop.append(loop)
    row = DataRow(ExpMeta("t", None, None, 0, 0.0), Experience(state=loop), "r")
    with pytest.raises(SchemaError, match=r"exp_data\.state"):
        encode_row(row)


def _same(a, b):
    """Equal values of the same types all the way down (-0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


def _containers(value):
    """The ids of every list/dict/tuple inside ``value``."""
    if isinstance(value, (list, tuple)):
        return {id(value)}.union(*(_containers(v) for v in value))
    if isinstance(value, dict):
        return {id(value)}.union(*(_containers(v) for v in value.values()))
    return set()


needs_jsoncopy = pytest.mark.skipif(
    importlib.util.find_spec("replaystore._jsoncopy") is None
    or os.environ.get("REPLAYSTORE_JSONCOPY") == "numpy",
    reason="replaystore._jsoncopy is not built (no C compiler) or REPLAYSTORE_JSONCOPY=numpy",
)


@needs_jsoncopy
@SETTINGS
@given(value=ANY)
def test_compiled_snapshot_is_the_json_round_trip_or_declines(value):
    from replaystore._jsoncopy import copy

    snap = copy(value)
    json_path = _outcome(_dumps, value)
    if snap is NotImplemented:
        return  # the JSON path decides (it stores or raises the error)
    assert json_path[0] == "ok"
    assert _same(snap, json.loads(json_path[1]))
    assert not _containers(snap) & _containers(value)  # nothing mutable shared


@needs_jsoncopy
@SETTINGS
@given(value=ANY)
def test_compiled_dumps_writes_the_same_text_or_declines(value):
    from replaystore._jsoncopy import copy, dumps

    text = dumps(value)
    if text is NotImplemented:
        assert copy(value) is NotImplemented  # one rule for both: the json path decides
        return
    assert _outcome(_dumps, value) == ("ok", text)
    assert copy(value) is not NotImplemented


@needs_jsoncopy
def test_compiled_dumps_escapes_as_json_does():
    from replaystore._jsoncopy import dumps

    text = "".join(map(chr, range(0x80))) + "é€😀\u2028"
    value = {text: [text, 1.5e300, -0.0, 2**63 - 1, -(2**63), 1e16, 0.1, True, None, ()]}
    assert dumps(value) == _dumps(value)
    assert dumps(2**63) is NotImplemented and dumps({1: 2}) is NotImplemented


@needs_jsoncopy
@SETTINGS
@given(
    state=st.one_of(ANY, st.dictionaries(TEXT, st.lists(LEAF, max_size=3), max_size=3)),
    reward=st.one_of(st.none(), FLOAT, st.lists(LEAF, max_size=2)),
)
def test_snapshot_row_equals_the_row_decoded_from_its_json(state, reward):
    row = DataRow(ExpMeta("t", "n", "a", 1, 2.0), Experience(state, [state], reward), "r")
    snap = snapshot_row(row)
    try:
        simple = encode_row(row).row
    except SchemaError:
        assert snap is None  # the fast path never stores what the JSON path refuses
        return
    if snap is None:
        return
    assert snap.id == simple.id and snap.exp_meta == simple.exp_meta
    assert snap.exp_meta is not row.exp_meta
    for name in PAYLOAD_FIELDS:
        assert _same(getattr(snap.exp_data, name), getattr(simple.exp_data, name)), name


META_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.sampled_from(["", "t1", "agent_7"]),
)


@needs_jsoncopy
@SETTINGS
@given(
    values=st.lists(META_VALUE, min_size=6, max_size=6),
    good=st.lists(st.booleans(), min_size=6, max_size=6),
    row_id=st.one_of(st.sampled_from(["r", "é", ""]), st.integers(0, 3)),
)
def test_snapshot_row_checks_metadata_as_encode_row_does(values, good, row_id):
    # Each field either a valid value of the exact type or an arbitrary one.
    fallback = ["t", None, None, 3, 1.5, None]
    fields = [
        v if not ok else fallback[i] for i, (v, ok) in enumerate(zip(values, good, strict=True))
    ]
    meta = ExpMeta.__new__(ExpMeta)
    for name, value in zip(META_FIELDS, fields, strict=True):
        setattr(meta, name, value)
    row = DataRow(meta, Experience(state={"x": 1}), row_id)
    try:
        simple = encode_row(row).row
    except SchemaError as exc:
        with pytest.raises(SchemaError) as fast:
            snapshot_row(row)
        assert str(fast.value) == str(exc)
        return
    snap = snapshot_row(row)
    assert snap is not None and snap.id == simple.id
    for name in META_FIELDS:
        assert _same(getattr(snap.exp_meta, name), getattr(simple.exp_meta, name)), name


@needs_jsoncopy
def test_compiled_copy_fields_and_untrack():
    import gc

    from replaystore._jsoncopy import copy_fields, untrack

    exp = Experience(state={"a": [1, {"b": (2,)}]}, actions=[[]], reward_t=1.0)
    snap = copy_fields(exp, Experience, PAYLOAD_FIELDS)
    assert type(snap) is Experience and snap.state == {"a": [1, {"b": [2]}]}
    assert snap.state is not exp.state and snap.actions[0] is not exp.actions[0]
    assert not gc.is_tracked(snap) and not gc.is_tracked(snap.actions)
    assert copy_fields(Experience(state={1, 2}), Experience, PAYLOAD_FIELDS) is NotImplemented
    with pytest.raises(AttributeError):
        copy_fields(object(), Experience, PAYLOAD_FIELDS)
    held = [exp.state]  # a tracked referent: left tracked (it could be part of a cycle)
    row = DataRow(ExpMeta("t", None, None, 0, 0.0), Experience(state=held), "r")
    assert untrack(row.exp_meta) is True and not gc.is_tracked(row.exp_meta)
    assert untrack(row.exp_data) is False and gc.is_tracked(row.exp_data)
    snapshot = snapshot_row(row)
    assert not any(map(gc.is_tracked, (snapshot, snapshot.exp_meta, snapshot.exp_data)))
    gc.collect()  # the untracked snapshot stays whole
    assert snapshot.exp_data.state == [{"a": [1, {"b": [2]}]}]


def test_in_memory_queries_do_not_see_later_mutation_on_either_path(monkeypatch):
    import replaystore.experience.rows as rows_module

    for fast in (True, False):
        if not fast:
            monkeypatch.setattr(rows_module, "COPY_KERNELS", [None] * 5)
        store = InMemoryStorage(snapshot=True)
        state = {"x": 1, "tags": ["a"]}
        row = DataRow(ExpMeta("t", None, None, 0, 0.0), Experience(state=state), f"r{fast}")
        store.add(row)
        store.add_batch(
            [DataRow(ExpMeta("t", None, None, 1, 0.0), Experience(state=state), f"s{fast}")]
        )
        state["x"] = 2
        state["tags"].append("b")
        row.exp_meta.task_id = "other"
        assert store.get_all()[0] is row  # reads return the very objects stored
        assert store.size({"field": "exp_data.state.x", "op": "eq", "value": 1}) == 2
        assert store.size({"field": "exp_data.state.x", "op": "eq", "value": 2}) == 0
        assert [r.id for r in store.get_by_task_id("t")] == [f"r{fast}", f"s{fast}"]


# ----------------------------------------------------------------------------- rows

AGENTS = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))
NAMES = st.one_of(st.none(), st.sampled_from(["n1", "n2"]))


@st.composite
def row_batches(draw):
    """Batches of rows over a few tasks, agents and names (ids unique across batches)."""
    batches = []
    for _ in range(draw(st.integers(1, 5))):
        batch = []
        for _ in range(draw(st.integers(1, 5))):
            i = next(_counter)
            meta = ExpMeta(
                task_id=draw(st.sampled_from(["t1", "t2", "t3", "t4"])),
                task_name=draw(NAMES),
                agent_id=draw(AGENTS),
                step=draw(st.integers(0, 3)),
                execute_time=float(i),
            )
            state = {
                "x": draw(st.sampled_from([0, 1, "a"])),
                "k": draw(st.sampled_from(["p", "q"])),
            }
            batch.append(DataRow(meta, Experience(state=state, actions=[i]), f"r{i}"))
        batches.append(batch)
    return batches


def _leaf(field, values, draw):
    if draw(st.booleans()):
        return {"field": field, "op": "eq", "value": draw(st.sampled_from(values))}
    return {
        "field": field,
        "op": "in_",
        "value": draw(st.lists(st.sampled_from(values), max_size=3)),
    }


@st.composite
def conditions(draw):
    """Conditions mixing the narrowed fields (task_id, agent_id, task_name) with others."""

    def leaf():
        kind = draw(st.sampled_from(["agent", "name", "task", "state", "step"]))
        if kind == "agent":
            return _leaf("exp_meta.agent_id", ["a", "b", "c", "zz", 1], draw)
        if kind == "name":
            return _leaf("exp_meta.task_name", ["n1", "n2", "n3"], draw)
        if kind == "task":
            return _leaf("exp_meta.task_id", ["t1", "t2", "t9"], draw)
        if kind == "state":
            return {
                "field": "exp_data.state.x",
                "op": "eq",
                "value": draw(st.sampled_from([0, 1, "a"])),
            }
        return {"field": "exp_meta.step", "op": "gte", "value": draw(st.integers(0, 3))}

    shape = draw(st.sampled_from(["leaf", "and", "or", "nested"]))
    if shape == "leaf":
        return leaf()
    if shape == "nested":
        return {"or_": [{"and_": [leaf(), leaf()]}, leaf()]}
    parts = [leaf() for _ in range(draw(st.integers(1, 3)))]
    return {"and_" if shape == "and" else "or_": parts}


@SETTINGS
@given(batches=row_batches(), conds=st.lists(conditions(), min_size=1, max_size=4))
def test_in_memory_queries_on_the_lazy_snapshot_match_rows_decoded_at_store_time(batches, conds):
    store = InMemoryStorage(None, snapshot=True)
    decoded = []
    for i, batch in enumerate(batches):
        if i % 2:
            store.add_batch(batch)
        else:
            for row in batch:
                store.add(row)
        decoded += [encode_row(row).row for row in batch]  # the simple path: decoded copies
    for batch in batches:  # later changes to the caller's objects do not reach queries
        for row in batch:
            row.exp_data.state["x"] = "changed"
    for cond in conds:
        pred = compile_predicate(cond)
        expected = [r.id for r in decoded if pred(r)]
        assert [r.id for r in store.get_all(cond)] == expected, cond
        assert store.size(cond) == len(expected)


def _plain_ids(store: SqliteStorage, cond) -> list[str]:
    where, params = compile_sql(cond)
    with store._read() as conn:
        return [
            r[0] for r in conn.execute(f"SELECT id FROM rows WHERE {where} ORDER BY seq", params)
        ]


def _plain_task_ids(store: SqliteStorage, cond) -> list[str]:
    where, params = compile_sql(cond)
    sql = (
        "SELECT task_id FROM tasks WHERE task_id IN "
        f"(SELECT task_id FROM rows WHERE {where}) ORDER BY first_seq"
    )
    with store._read() as conn:
        return [r[0] for r in conn.execute(sql, params)]


@SETTINGS
@given(
    batches=row_batches(),
    conds=st.lists(conditions(), min_size=1, max_size=4),
    cap=st.one_of(st.none(), st.integers(1, 8)),
    eviction=st.sampled_from(["task", "row"]),
)
def test_sqlite_task_keys_narrowing_matches_the_plain_where_through_evictions(
    tmp_path_factory, batches, conds, cap, eviction
):
    path = tmp_path_factory.getbasetemp() / f"keys{next(_counter)}.sqlite"
    store = SqliteStorage(path, cap, eviction=eviction)
    memory = InMemoryStorage(cap, eviction=eviction)
    for i, batch in enumerate(batches):
        if i % 2:
            store.add_batch(batch)
            memory.add_batch(batch)
        else:
            for row in batch:
                store.add(row)
                memory.add(row)
    for cond in conds:
        expected = _plain_ids(store, cond)
        assert [r.id for r in store.get_all(cond)] == expected, cond
        assert [r.id for r in memory.get_all(cond)] == expected, cond
        assert store.size(cond) == len(expected)
        assert store.task_ids(cond) == _plain_task_ids(store, cond) == memory.task_ids(cond), cond
        assert store.sample_task_ids(2, cond, rng=3) == memory.sample_task_ids(2, cond, rng=3)
    store.close()


# ----------------------------------------------------------------------------- SQLite


def _rows(n: int, agents: int = 4, task_len: int = 5) -> list[DataRow]:
    return [
        DataRow(
            ExpMeta(
                f"task{i // task_len}",
                "nav",
                f"agent{(i // task_len) % agents}",
                i % task_len,
                float(i),
            ),
            Experience(state={"i": i}, actions=[]),
            f"id{i}",
        )
        for i in range(n)
    ]


def test_sqlite_eq_on_meta_fields_uses_the_indexes_not_a_table_scan(tmp_path):
    store = SqliteStorage(tmp_path / "plan.sqlite")
    store.add_batch(_rows(200))
    for field, value in [("agent_id", "agent1"), ("task_name", "nav"), ("task_id", "task3")]:
        cond = {"field": f"exp_meta.{field}", "op": "eq", "value": value}
        row_plan = " | ".join(store.query_plan(cond))
        task_plan = " | ".join(store.query_plan(cond, tasks=True))
        assert "SCAN rows" not in row_plan and "SCAN" not in task_plan, (row_plan, task_plan)
        assert "SEARCH rows USING INDEX rows_task (task_id=?)" in row_plan
        if field != "task_id":
            assert "SEARCH task_keys USING PRIMARY KEY (field=? AND value=?)" in task_plan
            assert "SEARCH task_keys USING PRIMARY KEY" in row_plan
        else:
            assert "SEARCH tasks USING PRIMARY KEY (task_id=?)" in task_plan
    # A payload path has no index: the plan says so (a scan), and the answer is still right.
    payload = {"field": "exp_data.state.i", "op": "eq", "value": 7}
    assert any("SCAN rows" in line for line in store.query_plan(payload))
    assert [r.id for r in store.get_all(payload)] == ["id7"]


def test_sqlite_file_without_task_keys_gets_them_built_on_open(tmp_path):
    path = tmp_path / "old.sqlite"
    store = SqliteStorage(path)
    store.add_batch(_rows(40))
    store.close()
    with sqlite3.connect(path) as conn:  # as a file written before task_keys existed
        conn.execute("DROP TABLE task_keys")
    reopened = SqliteStorage(path)
    cond = {"field": "exp_meta.agent_id", "op": "eq", "value": "agent2"}
    assert reopened.task_ids(cond) == ["task2", "task6"]
    assert len(reopened.get_all(cond)) == 10


def test_sqlite_synchronous_is_normal_by_default_and_full_on_request(tmp_path):
    def mode(store):
        with store._read() as conn:
            return conn.execute("PRAGMA synchronous").fetchone()[0]

    assert mode(SqliteStorage(tmp_path / "n.sqlite")) == 1  # NORMAL
    full = SqliteStorage(tmp_path / "f.sqlite", synchronous="full")
    assert mode(full) == 2  # FULL
    full.add(_rows(1)[0])
    assert full.size() == 1
    with pytest.raises(ConfigError, match="synchronous"):
        SqliteStorage(tmp_path / "x.sqlite", synchronous="OFF")


def test_sqlite_one_row_commits_store_what_a_batch_stores(tmp_path):
    rows = _rows(30)
    one = SqliteStorage(tmp_path / "one.sqlite")
    many = SqliteStorage(tmp_path / "many.sqlite")
    for row in rows:
        one.add(row)
    for i in range(0, 30, 7):
        many.add_batch(rows[i : i + 7])
    assert [r.to_dict() for r in one.get_all()] == [r.to_dict() for r in rows]
    assert [r.to_dict() for r in many.get_all()] == [r.to_dict() for r in rows]

    def tables(store):
        with store._read() as conn:
            return [
                conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
                for t in ("tasks", "task_keys", "stats")
            ]

    assert tables(one) == tables(many)
    assert len(tables(one)[1]) == 2 * 6  # six tasks, one agent and one name each


def test_sqlite_duplicate_id_inside_and_across_batches_names_the_row(tmp_path):
    store = SqliteStorage(tmp_path / "dup.sqlite")
    rows = _rows(6)
    store.add_batch(rows[:3])
    with pytest.raises(SchemaError, match="'id1' is already stored"):
        store.add_batch([rows[4], rows[1], rows[5]])
    with pytest.raises(SchemaError, match="'id4' appears twice"):
        store.add_batch([rows[4], rows[4]])
    with pytest.raises(SchemaError, match="'id2' is already stored"):
        store.add(rows[2])
    assert [r.id for r in store.get_all()] == ["id0", "id1", "id2"]
    assert store.task_ids() == ["task0"]


@pytest.mark.parametrize("eviction", ["row", "task"])
def test_sqlite_task_keys_forget_an_agent_whose_rows_were_evicted(tmp_path, eviction):
    # Task mode: one task alone over capacity loses its oldest rows, as row mode does.
    store = SqliteStorage(tmp_path / "evict.sqlite", max_capacity=2, eviction=eviction)
    agents = ["a", "b", "b"]
    rows = [
        DataRow(ExpMeta("t", "n", agent, i, float(i)), Experience(state=i), f"r{i}")
        for i, agent in enumerate(agents)
    ]
    store.add_batch(rows[:2])
    store.add(rows[2])  # evicts r0, the task's only row by agent "a"
    only_a = {"field": "exp_meta.agent_id", "op": "eq", "value": "a"}
    assert store.task_ids(only_a) == []
    assert store.sample_task_ids(5, only_a, rng=0) == []
    assert store.task_ids({"field": "exp_meta.agent_id", "op": "eq", "value": "b"}) == ["t"]


@pytest.mark.parametrize("bad", [None, "id", "meta", "payload"])
def test_in_memory_add_batch_names_the_bad_row_and_stores_nothing(bad):
    def row(i):
        return DataRow(ExpMeta("t", None, None, i, 0.0), Experience(state={"i": i}), f"r{i}")

    broken = row(1)
    if bad == "id":
        broken.id = ""
    elif bad == "meta":
        broken.exp_meta.step = "one"
    elif bad == "payload":
        broken.exp_data.state = {"x": {1, 2}}
    store = InMemoryStorage(snapshot=bad == "payload")  # payloads are checked by snapshots only
    with pytest.raises(SchemaError, match=r"data_batch\[1\]|'r1'"):
        store.add_batch([row(0), None if bad is None else broken, row(2)])
    assert store.size() == 0
    store.add_batch([row(0)])
    with pytest.raises(SchemaError, match="'r0' is already stored"):
        store.add_batch([row(3), row(0)])
    with pytest.raises(SchemaError, match="'r4' is already stored"):
        store.add_batch([row(4), row(4)])
    assert [r.id for r in store.get_all()] == ["r0"]


@needs_jsoncopy
@SETTINGS
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["r0", "r1", "r2", "é", ""]),
            st.lists(META_VALUE, min_size=6, max_size=6),
            st.lists(st.booleans(), min_size=6, max_size=6),
            st.one_of(ANY, st.dictionaries(TEXT, st.lists(LEAF, max_size=3), max_size=3)),
        ),
        max_size=6,
    ),
    capacity=st.sampled_from([None, 2]),
    eviction=st.sampled_from(["task", "row"]),
)
def test_in_memory_add_is_add_batch_of_one_row(rows, capacity, eviction):
    # add() inlines snapshot_row's common case: each row must be accepted or
    # refused (same message) as add_batch([row]) does, and leave the same store.
    fallback = ["t", "n", "a", 3, 1.5, None]
    one = InMemoryStorage(capacity, eviction=eviction)
    batch = InMemoryStorage(capacity, eviction=eviction)
    for row_id, values, good, state in rows:
        meta = ExpMeta.__new__(ExpMeta)
        for i, name in enumerate(META_FIELDS):
            setattr(meta, name, fallback[i] if good[i] else values[i])
        row = DataRow(meta, Experience(state=state, reward_t=1.0), row_id)
        outcomes = []
        for call in (one.add, lambda r: batch.add_batch([r])):
            try:
                call(row)
                outcomes.append("ok")
            except SchemaError as exc:
                message = str(exc).replace("data_batch[0]", "data")
                outcomes.append(message.replace("data_batch", "data"))
        assert outcomes[0] == outcomes[1]
        assert [r.id for r in one.get_all()] == [r.id for r in batch.get_all()]
    for cond in (
        None,
        {"field": "exp_meta.task_id", "op": "eq", "value": "t"},
        {"field": "exp_data.reward_t", "op": "eq", "value": 1.0},
        {"field": "exp_meta.agent_id", "op": "is_null"},
        {"field": "exp_meta.task_name", "op": "in", "value": ["n", "t1", "agent_7"]},
        {"field": "exp_meta.agent_id", "op": "eq", "value": "a"},
    ):
        assert [r.id for r in one.get_all(cond)] == [r.id for r in batch.get_all(cond)]
    assert one.task_ids() == batch.task_ids()


@SETTINGS
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["r0", "r1", "é", ""]),
            st.lists(META_VALUE, min_size=6, max_size=6),
            st.lists(st.booleans(), min_size=6, max_size=6),
            st.one_of(ANY, st.dictionaries(TEXT, st.lists(LEAF, max_size=3), max_size=3)),
        ),
        max_size=5,
    ),
    where=st.sampled_from([None, "data"]),
)
def test_encode_records_is_encode_batch_records(rows, where):
    # SQLite's write path builds record tuples directly on the common case: the
    # same tuples (types included) and the same errors as encode_batch's records.
    fallback = ["t", "n", "a", 3, 1.5, None]
    batch = []
    for row_id, values, good, state in rows:
        meta = ExpMeta.__new__(ExpMeta)
        for i, name in enumerate(META_FIELDS):
            setattr(meta, name, fallback[i] if good[i] else values[i])
        batch.append(DataRow(meta, Experience(state=state, actions=[state]), row_id))
    try:
        simple = [e.record() for e in encode_batch(batch, where, decode=False)]
    except SchemaError as exc:
        with pytest.raises(SchemaError) as fast:
            encode_records(batch, where)
        assert str(fast.value) == str(exc)
        return
    fast_records = encode_records(batch, where)
    assert fast_records == simple
    assert [[type(v) for v in r] for r in fast_records] == [[type(v) for v in r] for r in simple]


@pytest.mark.parametrize(
    "bad", [None, DataRow(ExpMeta("t", None, None, 0, 0.0), Experience(), "r"), {"id": "r"}]
)
def test_encode_records_refuses_a_non_batch_as_encode_batch_does(bad):
    with pytest.raises(SchemaError, match="add_batch expects a list of DataRow"):
        encode_records(bad)
