"""Rows kept as given, and payloads written by their own serialisers, give the old results.

* the payload encoder per type (pydantic-core's serialiser for models, a cached
  field plan for dataclasses, the compiled ``dumps_encoders``) vs the generic
  path it replaces (``json`` with ``model_dump(mode="json")`` / ``dataclasses.fields``);
* the default in-memory store (rows kept as given, queries on the objects) vs
  ``snapshot=True`` (queries on a JSON snapshot), on the same rows and conditions;
* SQLite round trips of such payloads.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import itertools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

import replaystore.experience.rows as rows_module
from replaystore.errors import ConfigError, SchemaError
from replaystore.experience import (
    DataRow,
    Experience,
    ExpMeta,
    InMemoryStorage,
    QueryBuilder,
    SqliteStorage,
)
from replaystore.experience.rows import (
    META_SPEC,
    PAYLOAD_FIELDS,
    RECORD_SLOTS,
    encode_flat,
    encode_records,
    encode_row,
    to_json_value,
)

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_counter = itertools.count()


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Inner(BaseModel):
    when: datetime.datetime
    color: Color
    note: str | None = None
    tags: tuple[str, ...] = ()


class Outer(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str = Field(serialization_alias="Name")
    inner: Inner | None = None
    items: list[Inner] = []
    level: Level = Level.LOW
    extra: dict[str, Any] = {}
    score: float = 0.0
    raw: Any = None


class Action(BaseModel):
    tool_name: str | None = None
    params: dict[str, Any] = {}


@dataclasses.dataclass
class Point:
    x: int
    y: float
    label: str | None = None
    inner: Inner | None = None


@dataclasses.dataclass
class Track:
    points: list[Point]
    meta: dict[str, Any]


class CustomDump(BaseModel):
    """A model whose own ``model_dump`` must be honoured (the generic path calls it)."""

    a: int = 1

    def model_dump(self, **kw: Any) -> dict[str, Any]:  # type: ignore[override]
        return {"custom": self.a}


# ----------------------------------------------------------------------------- strategies

TEXT = st.text(alphabet='ab_é😀\ud800"\\\n', max_size=4)
SAFE_TEXT = st.text(alphabet="ab_é😀 ", max_size=4)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
NUMPY = st.one_of(st.integers(-3, 3).map(np.int64), st.booleans().map(np.bool_))
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), FINITE, TEXT, NUMPY)
JSONISH = st.recursive(
    LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.one_of(TEXT, st.integers(-3, 3)), inner, max_size=3),
    ),
    max_leaves=6,
)
DATETIMES = st.datetimes(
    min_value=datetime.datetime(1990, 1, 1),
    max_value=datetime.datetime(2100, 1, 1),
    timezones=st.sampled_from([None, datetime.UTC]),
)
INNER = st.builds(
    Inner,
    when=DATETIMES,
    color=st.sampled_from(Color),
    note=st.one_of(st.none(), TEXT),
    tags=st.tuples(SAFE_TEXT),
)
OUTER = st.builds(
    Outer,
    name=st.one_of(SAFE_TEXT, TEXT),
    inner=st.one_of(st.none(), INNER),
    items=st.lists(INNER, max_size=2),
    level=st.sampled_from(Level),
    extra=st.dictionaries(SAFE_TEXT, JSONISH, max_size=2),
    score=FINITE,
    raw=JSONISH,
)
ACTION = st.builds(
    Action,
    tool_name=st.one_of(st.none(), st.sampled_from(["click", "type"])),
    params=st.dictionaries(st.sampled_from(["x", "y"]), st.integers(0, 9), max_size=2),
)
POINT = st.builds(
    Point,
    x=st.integers(-5, 5),
    y=FINITE,
    label=st.one_of(st.none(), TEXT),
    inner=st.one_of(st.none(), INNER),
)
TRACK = st.builds(
    Track, points=st.lists(POINT, max_size=2), meta=st.dictionaries(SAFE_TEXT, JSONISH, max_size=2)
)
STATE = st.one_of(
    JSONISH,
    OUTER,
    POINT,
    TRACK,
    st.dictionaries(SAFE_TEXT, st.one_of(OUTER, POINT, JSONISH), max_size=2),
    st.lists(st.one_of(OUTER, POINT), max_size=2),
)
ACTIONS = st.one_of(st.none(), st.lists(st.one_of(ACTION, JSONISH), max_size=2), ACTION)

# Small pools, so that queries often hit what the rows hold.
QLEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, 1.0]),
    st.sampled_from(["a", "red", "click", "t0"]),
    NUMPY,
)
QKEY = st.one_of(st.sampled_from(["a", "b", "x", "1"]), st.integers(0, 2))
QJSON = st.recursive(
    QLEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(QKEY, inner, max_size=3),
    ),
    max_leaves=6,
)
QSTATE = st.one_of(
    QJSON,
    OUTER,
    POINT,
    TRACK,
    st.dictionaries(st.sampled_from(["a", "b", "p"]), st.one_of(OUTER, POINT, QJSON), max_size=3),
    st.lists(st.one_of(OUTER, POINT, QJSON), max_size=2),
)


# ----------------------------------------------------------------------------- the old path


def _old_default(obj: Any) -> Any:
    """The generic path's conversion, as it was written before the per-type encoders."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON serialisable")


_OLD = json.JSONEncoder(
    default=_old_default, allow_nan=False, ensure_ascii=False, separators=(",", ":")
)


def old_json_value(value: Any) -> Any:
    """``json.loads`` of the generic path's text; ValueError/TypeError where it refused."""
    text = _OLD.encode(value)
    text.encode("utf-8")  # lone surrogates: refused (UnicodeEncodeError is a ValueError)
    return json.loads(text)


def payload_of(exp: Experience) -> dict[str, Any]:
    return {name: getattr(exp, name) for name in PAYLOAD_FIELDS}


def row_of(state: Any, actions: Any = None, reward: float | None = 0.5, i: int = 0) -> DataRow:
    meta = ExpMeta(f"t{i // 3}", "web", f"a{i % 2}", i, float(i))
    return DataRow(meta, Experience(state=state, actions=actions, reward_t=reward), f"r{i}")


# ----------------------------------------------------------------------------- encoders


@SETTINGS
@given(state=STATE, actions=ACTIONS)
def test_payload_encoding_gives_the_generic_paths_json_values(state, actions):
    row = row_of(state, actions)
    try:
        expected = old_json_value(payload_of(row.exp_data))
    except (TypeError, ValueError):
        with pytest.raises(SchemaError, match=r"row 'r0': exp_data"):
            encode_row(row)
        with pytest.raises(SchemaError, match=r"row 'r0': exp_data"):
            encode_records([row])
        return
    encoded = encode_row(row, decode=False)
    assert json.loads(encoded.payload_json) == expected
    (record,) = encode_records([row])
    assert json.loads(record[-1]) == expected
    assert encode_row(row).row.exp_data.state == expected["state"]  # the decoded copy too
    assert to_json_value(state) == expected["state"]
    assert Experience(state, actions).to_dict()["actions"] == expected["actions"]


@SETTINGS
@given(state=STATE, actions=ACTIONS)
def test_compiled_and_python_encoders_write_the_same_text(state, actions):
    exp = Experience(state=state, actions=actions)
    python = rows_module._value_text(
        payload_of(exp), rows_module.COPY_KERNELS[1]
    )  # registers classes
    compiled = rows_module.ENCODE_KERNELS[0](payload_of(exp), rows_module._ENCODERS)
    if python is None:
        assert compiled is NotImplemented
    elif compiled is not NotImplemented:  # the compiled one declines nothing Python writes...
        assert compiled == python
    else:  # ...but a ValueError from a model's serialiser, which the generic path then names
        pytest.fail(f"compiled encoder declined what the Python one wrote: {python!r:.200}")


@SETTINGS
@given(
    payloads=st.lists(st.tuples(STATE, ACTIONS), min_size=1, max_size=6),
    bad_ids=st.sets(st.integers(0, 5), max_size=2),
    fresh=st.booleans(),
)
def test_flat_records_are_each_rows_record_whoever_writes_it(payloads, bad_ids, fresh, monkeypatch):
    # encode_flat's compiled loop stops at a row it cannot take (a non-ASCII id, a
    # payload class not seen yet, a value only the generic path writes, an error) and
    # resumes after it; without the loop, Python writes every row. Either way each
    # row's slots are None and its record, and an error is the one encode_row raises.
    rows = [
        dataclasses.replace(row_of(s, a, i=i), id=f"é{i}" if i in bad_ids else f"r{i}")
        for i, (s, a) in enumerate(payloads)
    ]
    rows_module._resolve_jsoncopy()
    results = []
    for compiled in (True, False):
        with monkeypatch.context() as m:
            if fresh:  # no class seen yet: the loop declines each one's first row
                m.setattr(rows_module, "_ENCODERS", {})
            if not compiled:
                m.setattr(rows_module, "ENCODE_KERNELS", [*rows_module.ENCODE_KERNELS[:2], None])
            try:
                results.append(encode_flat(rows))
            except SchemaError as exc:
                results.append(str(exc))
    try:
        records = [
            encode_row(r, f"data_batch[{i}]", decode=False).record() for i, r in enumerate(rows)
        ]
    except SchemaError as exc:
        assert results == [str(exc)] * 2
        return
    expected = [v for record in records for v in (None, *record)]
    assert results == [expected, expected]
    assert len(expected) == RECORD_SLOTS * len(rows)
    assert [type(v) for v in results[0]] == [type(v) for v in expected]


def test_the_compiled_records_loop_refuses_arguments_it_cannot_use():
    rows_module._resolve_jsoncopy()
    records = rows_module.ENCODE_KERNELS[2]
    if records is None:
        pytest.skip("replaystore._jsoncopy is not built")
    good = ([row_of({})], 0, DataRow, ExpMeta, Experience, META_SPEC, PAYLOAD_FIELDS, {}, [])
    out: list[Any] = []
    assert records(*good[:8], out) == 1 and len(out) == RECORD_SLOTS
    for at, bad in ((0, {"r": 1}), (2, "DataRow"), (6, ["state"]), (7, None), (8, ())):
        args = list(good)
        args[at] = bad
        with pytest.raises(TypeError):
            records(*args)
    with pytest.raises(TypeError, match="takes 9 arguments"):
        records(*good[:8])


def test_a_pydantic_model_is_written_by_its_own_serialiser(monkeypatch):
    calls = []
    serializer = Outer.__pydantic_serializer__

    class Spy:
        def to_json(self, value):
            calls.append(value)
            return serializer.to_json(value)

    model = Outer(name="n", inner=Inner(when=datetime.datetime(2024, 1, 2), color=Color.RED))
    monkeypatch.setitem(rows_module._ENCODERS, Outer, Spy())
    monkeypatch.setattr(Outer, "model_dump", None)  # the generic path would fail on it
    text = encode_row(row_of(model), decode=False).payload_json
    assert calls == [model]
    assert json.loads(text)["state"]["inner"] == {
        "when": "2024-01-02T00:00:00",
        "color": "red",
        "note": None,
        "tags": [],
    }


def test_a_model_overriding_model_dump_is_written_by_its_override():
    row = row_of({"m": CustomDump(a=3)})
    assert json.loads(encode_row(row, decode=False).payload_json)["state"] == {"m": {"custom": 3}}
    assert to_json_value(CustomDump(a=4)) == {"custom": 4}


def test_dataclass_fields_are_read_once_per_class(monkeypatch):
    seen = []
    real_fields = dataclasses.fields

    def counting_fields(obj):
        seen.append(obj)
        return real_fields(obj)

    monkeypatch.setattr(rows_module, "_ENCODERS", {})
    monkeypatch.setattr(rows_module.dataclasses, "fields", counting_fields)
    encode_records([row_of(Point(i, 0.5), i=i) for i in range(5)])
    assert seen == [Point]


def test_a_non_finite_float_inside_a_model_is_null_as_in_pydantics_json():
    # Documented difference: the generic path refused the row (model_dump(mode="json")
    # keeps inf, which JSON cannot hold); pydantic's own serialiser writes null.
    model = Outer(name="n", score=float("inf"))
    with pytest.raises(ValueError):
        old_json_value(model)
    assert json.loads(model.model_dump_json())["score"] is None
    assert (
        json.loads(encode_row(row_of(model), decode=False).payload_json)["state"]["score"] is None
    )
    with pytest.raises(SchemaError, match=r"exp_data\.state"):  # outside a model: as before
        encode_row(row_of({"score": float("inf")}))


def test_a_value_a_model_cannot_serialise_is_refused_naming_the_field():
    with pytest.raises(SchemaError, match=r"row 'r0': exp_data.state"):
        encode_row(row_of(Outer(name="n", raw=object())))
    with pytest.raises(SchemaError, match=r"row 'r0': exp_data.actions"):
        encode_records([row_of({}, [Action(params={"x": object()})])])


def test_numpy_values_still_take_the_generic_path():
    row = row_of({"a": np.int64(3), "p": Point(1, np.float32(0.5))})
    assert json.loads(encode_row(row, decode=False).payload_json)["state"] == {
        "a": 3,
        "p": {"x": 1, "y": 0.5, "label": None, "inner": None},
    }


# ----------------------------------------------------------------------------- the row check


META_VALUE = st.one_of(
    st.none(),
    st.integers(-(2**64), 2**64),
    st.floats(),
    st.sampled_from(["t", "é", "", "x\udfff"]),
    st.booleans(),
    st.just(np.int64(2)),
)


@SETTINGS
@given(values=st.lists(META_VALUE, min_size=6, max_size=6), row_id=META_VALUE)
def test_compiled_row_check_accepts_exactly_the_rows_kept_as_they_are(values, row_id):
    rows_module._resolve_jsoncopy()
    check = rows_module.ENCODE_KERNELS[1]
    if check is None:
        pytest.skip("replaystore._jsoncopy is not built")
    meta = ExpMeta.__new__(ExpMeta)
    for name, value in zip(
        ("task_id", "task_name", "agent_id", "step", "execute_time", "pre_agent"),
        values,
        strict=True,
    ):
        setattr(meta, name, value)
    row = DataRow(meta, Experience(), row_id)
    copied = rows_module.COPY_KERNELS[4](meta, ExpMeta, META_SPEC)
    id_ok = type(row_id) is str and row_id != "" and row_id.isascii()
    assert check(row, DataRow, ExpMeta, Experience, META_SPEC) == (
        id_ok and copied is not NotImplemented
    )
    if check(row, DataRow, ExpMeta, Experience, META_SPEC):
        store = InMemoryStorage()
        store.add(row)
        assert store.get_all()[0] is row


# ----------------------------------------------------------------------------- memory store


FIELDS = [
    "exp_data.state.name",
    "exp_data.state.Name",
    "exp_data.state.inner.color",
    "exp_data.state.inner.when",
    "exp_data.state.level",
    "exp_data.state.x",
    "exp_data.state.points.0.x",
    "exp_data.state.0.name",
    "exp_data.state.a.x",
    "exp_data.state.1",
    "exp_data.state.a",
    "exp_data.state.b",
    "exp_data.state.a.1",
    "exp_data.state.a.a",
    "exp_data.state.p.x",
    "exp_data.state.0",
    "exp_data.state.0.1",
    "exp_data.state",
    "exp_data.actions.0.tool_name",
    "exp_data.actions.tool_name",
    "exp_data.reward_t",
    "exp_meta.agent_id",
    "task_id",
]
VALUES = st.one_of(
    st.sampled_from(["a", "b", "red", "blue", "click", "a0", "t0", "t1", "1990"]),
    st.integers(-3, 3),
    st.booleans(),
    st.sampled_from([0.5, 1.0, 2.0]),
)


@st.composite
def conditions(draw):
    def leaf():
        field = draw(st.sampled_from(FIELDS))
        op = draw(
            st.sampled_from(
                ["eq", "ne", "gt", "lte", "in", "not_in", "like", "is_null", "is_not_null"]
            )
        )
        if op in ("is_null", "is_not_null"):
            return {"field": field, "op": op}
        if op in ("in", "not_in"):
            return {
                "field": field,
                "op": op,
                "value": draw(st.lists(VALUES, min_size=1, max_size=3)),
            }
        if op == "like":
            return {
                "field": field,
                "op": op,
                "value": draw(st.sampled_from(["a", "e", "19", "cl"])),
            }
        value = draw(VALUES)
        if op in ("gt", "lte") and isinstance(value, bool):
            op = "eq"  # booleans are not ordered (a QueryError)
        return {"field": field, "op": op, "value": value}

    shape = draw(st.sampled_from(["leaf", "and", "or"]))
    if shape == "leaf":
        return leaf()
    return {f"{shape}_": [leaf() for _ in range(draw(st.integers(1, 3)))]}


@settings(SETTINGS, max_examples=150)
@given(
    payloads=st.lists(
        st.tuples(QSTATE, ACTIONS, st.one_of(st.none(), st.sampled_from([0.5, 1.0]))),
        min_size=1,
        max_size=8,
    ),
    conds=st.lists(conditions(), min_size=1, max_size=4),
    cap=st.one_of(st.none(), st.integers(2, 6)),
    eviction=st.sampled_from(["task", "row"]),
)
def test_the_default_store_answers_queries_as_the_snapshot_store_does(
    payloads, conds, cap, eviction
):
    rows = []
    for i, (state, actions, reward) in enumerate(payloads):
        row = row_of(state, actions, reward, i)
        try:
            encode_row(row)
        except SchemaError:
            continue  # the snapshot store refuses it; the comparison is on rows both keep
        rows.append(row)
    given_store = InMemoryStorage(cap, eviction=eviction)
    snap_store = InMemoryStorage(cap, eviction=eviction, snapshot=True)
    for i, row in enumerate(rows):
        for store in (given_store, snap_store):
            store.add(row) if i % 2 else store.add_batch([row])
    assert [r.id for r in given_store.get_all()] == [r.id for r in snap_store.get_all()]
    assert all(a is b for a, b in zip(given_store.get_all(), snap_store.get_all(), strict=True))
    for cond in conds:
        assert [r.id for r in given_store.get_all(cond)] == [r.id for r in snap_store.get_all(cond)]
        assert given_store.size(cond) == snap_store.size(cond)
        assert given_store.task_ids(cond) == snap_store.task_ids(cond)
        assert [r.id for r in given_store.sample_rows(3, cond, rng=1)] == [
            r.id for r in snap_store.sample_rows(3, cond, rng=1)
        ]
        assert given_store.sample_task_ids(2, cond, rng=2) == snap_store.sample_task_ids(
            2, cond, rng=2
        )


def test_queries_read_fields_of_pydantic_and_dataclass_payloads():
    store = InMemoryStorage()
    when = datetime.datetime(2024, 5, 6, 7, 8, 9)
    rows = [
        row_of(Outer(name="x", inner=Inner(when=when, color=Color.BLUE), level=Level.HIGH), i=0),
        row_of(Track([Point(3, 0.5)], {"k": (1, 2)}), [Action(tool_name="click")], i=1),
        row_of({"p": Point(4, 1.5, "lbl")}, i=2),
    ]
    store.add_batch(rows)

    def ids(builder: QueryBuilder) -> list[str]:
        return [r.id for r in store.get_all(builder.build())]

    assert ids(QueryBuilder().eq("exp_data.state.inner.color", "blue")) == ["r0"]
    assert ids(QueryBuilder().eq("exp_data.state.inner.when", "2024-05-06T07:08:09")) == ["r0"]
    assert ids(QueryBuilder().eq("exp_data.state.level", 2)) == ["r0"]
    assert ids(QueryBuilder().eq("exp_data.state.Name", "x")) == []  # keys as model_dump writes
    assert ids(QueryBuilder().eq("exp_data.state.points.0.x", 3)) == ["r1"]
    assert ids(QueryBuilder().eq("exp_data.state.meta.k.1", 2)) == ["r1"]  # a tuple is a list
    assert ids(QueryBuilder().eq("exp_data.actions.0.tool_name", "click")) == ["r1"]
    assert ids(QueryBuilder().like("exp_data.state.p.label", "lb")) == ["r2"]
    assert ids(QueryBuilder().is_not_null("exp_data.state.p.label")) == ["r2"]
    assert ids(QueryBuilder().is_null("exp_data.state.p.inner")) == ["r0", "r1", "r2"]
    assert store.get_all()[0] is rows[0]


def test_queries_on_kept_rows_read_numpy_values_tuples_and_int_keys_as_json_does():
    state = {
        "a": np.int64(1),
        "b": np.bool_(True),
        "k": {"1": "first", 1: "one", 2: "two"},
        "t": (1, 2),
    }
    conds = [
        QueryBuilder().eq("exp_data.state.a", 1),
        QueryBuilder().eq("exp_data.state.b", True),
        QueryBuilder().eq("exp_data.state.k.1", "one"),  # JSON keeps the last of two "1" keys
        QueryBuilder().eq("exp_data.state.k.2", "two"),
        QueryBuilder().eq("exp_data.state.t.1", 2),
    ]
    for snapshot in (False, True):
        store = InMemoryStorage(snapshot=snapshot)
        store.add(row_of(state))
        assert [store.size(c.build()) for c in conds] == [1] * len(conds), snapshot


def test_the_default_store_keeps_payloads_unchecked_and_snapshot_refuses_them():
    odd = row_of({"f": object(), "s": {1, 2}})
    store = InMemoryStorage()
    store.add(odd)  # AWorld's semantics: stored as given
    assert store.get_all()[0] is odd
    assert store.size(QueryBuilder().eq("exp_meta.agent_id", "a0").build()) == 1
    with pytest.raises(SchemaError, match=r"row 'r0': exp_data.state.f"):
        store.size(QueryBuilder().eq("exp_data.state.f", 1).build())
    with pytest.raises(SchemaError, match=r"exp_data\.state"):
        InMemoryStorage(snapshot=True).add(odd)


def test_the_default_store_converts_metadata_and_keeps_the_callers_payload():
    exp = Experience(state=Outer(name="n"))
    odd = DataRow(ExpMeta("t", None, None, np.int64(3), 1), exp, "r1")
    wide = DataRow(ExpMeta("täsk", "nämë", None, 0, 0.0), Experience(), "r2")
    store = InMemoryStorage()
    store.add_batch([odd, wide])
    got_odd, got_wide = store.get_all()
    assert got_wide is wide  # non-ASCII text needs no conversion: the caller's row
    assert got_odd.exp_data is exp and type(got_odd.exp_meta.step) is int
    assert type(got_odd.exp_meta.execute_time) is float
    assert store.size(QueryBuilder().eq("exp_meta.step", 3).build()) == 1
    assert store.get_by_task_id("täsk") == [wide]


def test_snapshot_must_be_a_bool():
    with pytest.raises(ConfigError, match="snapshot"):
        InMemoryStorage(snapshot="yes")  # type: ignore[arg-type]
    assert InMemoryStorage().snapshot is False
    assert InMemoryStorage(snapshot=True).snapshot is True


def test_rows_of_one_task_interleaved_with_others_are_indexed_and_evicted_alike():
    # The index's shortcut for "same task, agent and name as the last row" must
    # give what a scan gives, through interleaving and evictions.
    plan = ["A", "A", "B", "A", "B", "B", "C", "A", "C"]
    agents = ["x", "x", "y", "z", "y", "y", "x", "x", "x"]
    for cap, eviction in ((None, "task"), (4, "task"), (3, "row")):
        store = InMemoryStorage(cap, eviction=eviction)
        rows = [
            DataRow(ExpMeta(t, "n", a, i, 0.0), Experience(state=i), f"r{i}")
            for i, (t, a) in enumerate(zip(plan, agents, strict=True))
        ]
        for row in rows:
            store.add(row)
        kept = store.get_all()
        for agent in "xyz":
            cond = QueryBuilder().eq("exp_meta.agent_id", agent).build()
            assert store.get_all(cond) == [r for r in kept if r.exp_meta.agent_id == agent]
        for task in "ABC":
            assert store.get_by_task_id(task) == [r for r in kept if r.exp_meta.task_id == task]


# ----------------------------------------------------------------------------- SQLite


@settings(SETTINGS, max_examples=20)
@given(states=st.lists(st.tuples(STATE, ACTIONS), min_size=1, max_size=4))
def test_sqlite_round_trips_model_and_dataclass_payloads_as_the_generic_path(
    tmp_path_factory, states
):
    path = tmp_path_factory.getbasetemp() / f"enc{next(_counter)}.sqlite"
    store = SqliteStorage(path)
    expected = {}
    kept = []
    for i, (state, actions) in enumerate(states):
        row = row_of(state, actions, i=i)
        try:
            expected[row.id] = old_json_value(payload_of(row.exp_data))
        except (TypeError, ValueError):
            continue
        kept.append(row)
    store.add_batch(kept[::2])
    for row in kept[1::2]:
        store.add(row)
    for got in store.get_all():
        assert {name: getattr(got.exp_data, name) for name in PAYLOAD_FIELDS} == expected[got.id]
    store.close()
