"""Property: the in-memory evaluator and the SQL compilers (SQLite, PostgreSQL) agree."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.experience import DataRow, Experience, ExpMeta, InMemoryStorage, SqliteStorage
from replaystore.experience.query import OPS

_counter = itertools.count()
TEXT = st.text(alphabet="abAB_%é😀0 ", max_size=4)
NUMBER = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([-1.5, -0.5, 0.0, 0.25, 1.0, 2.5, 1e300]),
)
SCALAR = st.one_of(TEXT, NUMBER, st.booleans())
JSONV = st.recursive(
    st.one_of(st.none(), SCALAR),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["x", "y", "z", "ü"]), inner, max_size=3),
    ),
    max_leaves=6,
)
FIELDS = [
    "id",
    "exp_meta.task_id",
    "exp_meta.task_name",
    "exp_meta.agent_id",
    "exp_meta.step",
    "exp_meta.execute_time",
    "exp_meta.pre_agent",
    # bare metadata names, as AWorld's query examples write them
    "task_id",
    "agent_id",
    "step",
    "execute_time",
    "pre_agent",
    "exp_data.reward_t",
    "exp_data.state",
    "exp_data.state.x",
    "exp_data.state.x.y",
    "exp_data.state.y",
    "exp_data.state.ü",
    "exp_data.state.z.0",
    "exp_data.actions.0",
    "exp_data.messages",
]


@st.composite
def rows(draw):
    out = []
    for i in range(draw(st.integers(0, 12))):
        meta = ExpMeta(
            task_id=draw(st.sampled_from(["t1", "t2", "t3", "a", "B"])),
            task_name=draw(st.one_of(st.none(), TEXT)),
            agent_id=draw(st.one_of(st.none(), st.sampled_from(["a", "b", "3", ""]))),
            step=draw(st.integers(-3, 3)),
            execute_time=draw(st.sampled_from([0.0, 1.5, 3.0, -2.0])),
            pre_agent=draw(st.one_of(st.none(), TEXT)),
        )
        exp = Experience(
            state=draw(JSONV),
            actions=draw(JSONV),
            reward_t=draw(st.one_of(st.none(), NUMBER)),
            messages=draw(st.one_of(st.none(), st.lists(TEXT, max_size=2))),
        )
        out.append(DataRow(meta, exp, f"r{i}"))
    return out


@st.composite
def leaves(draw):
    field = draw(st.sampled_from(FIELDS))
    op = draw(st.sampled_from(OPS))
    if op in ("is_null", "is_not_null"):
        return {"field": field, "op": op}
    if op in ("in", "not_in"):
        return {"field": field, "op": op, "value": draw(st.lists(SCALAR, max_size=3))}
    if op in ("like", "not_like"):
        return {"field": field, "op": op, "value": draw(TEXT)}
    if op in ("gt", "gte", "lt", "lte"):
        return {"field": field, "op": op, "value": draw(st.one_of(TEXT, NUMBER))}
    return {"field": field, "op": op, "value": draw(SCALAR)}


CONDITIONS = st.recursive(
    leaves(),
    lambda inner: st.one_of(
        st.builds(lambda xs: {"and_": xs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda xs: {"or_": xs}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=5,
)


@pytest.fixture(scope="module")
def sql_stores(request, tmp_path_factory):
    """``make(kind)``: an empty SQL store of ``kind`` (a fresh SQLite file; PostgreSQL reused)."""
    pg = []

    def make(kind):
        if kind == "sqlite":
            return SqliteStorage(tmp_path_factory.getbasetemp() / f"prop{next(_counter)}.sqlite")
        if not pg:
            url = request.getfixturevalue("postgres_url")
            from replaystore.experience import PostgresStorage

            pg.append(PostgresStorage(url, schema="prop"))
        pg[0].clear()  # one schema for every example: creating tables costs more than clearing
        return pg[0]

    yield make
    for store in pg:
        store.close()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=rows(), conditions=st.lists(CONDITIONS, min_size=1, max_size=4))
def test_evaluator_and_sql_compiler_select_the_same_rows(sql_stores, kind, data, conditions):
    sql_store = sql_stores("sqlite" if kind == "sqlite" else "postgres")
    mem_store = InMemoryStorage(None)
    sql_store.add_batch(data)
    mem_store.add_batch(data)
    for cond in conditions:
        expected = [r.id for r in mem_store.get_all(cond)]
        assert [r.id for r in sql_store.get_all(cond)] == expected, cond
        assert sql_store.size(cond) == len(expected)
        assert sql_store.task_ids(cond) == mem_store.task_ids(cond)
        # Same seed, same rows: the same sample whichever storage holds them.
        assert [r.id for r in sql_store.sample_rows(3, cond, rng=5)] == [
            r.id for r in mem_store.sample_rows(3, cond, rng=5)
        ]
        assert sql_store.sample_task_ids(2, cond, rng=5) == mem_store.sample_task_ids(2, cond, 5)
    if kind == "sqlite":
        sql_store.close()
