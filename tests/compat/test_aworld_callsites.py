"""AWorld (0aa3416, the last commit with ``aworld/replay_buffer``): its call sites, replayed.

Each test is shaped like a call sequence in AWorld's ``tests/replay_buffer`` with
only the imports changed: ``aworld.replay_buffer.base`` ->
``replaystore.experience.base``, ``aworld.replay_buffer.query_filter`` ->
``replaystore.experience.query_filter``. ``Observation``/``ActionModel`` are
pydantic stand-ins for ``aworld.core.common``'s models.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel, Field

from replaystore.errors import QueryError
from replaystore.experience.base import (
    DataRow,
    DefaultConverter,
    Experience,
    ExpMeta,
    InMemoryStorage,
    QueryCondition,
    QueryFilter,
    RandomTaskSample,
    ReplayBuffer,
)
from replaystore.experience.query import compile_predicate
from replaystore.experience.query_filter import QueryBuilder
from replaystore.experience.storage import SqliteStorage


class Observation(BaseModel):
    content: Any = None
    info: dict[str, Any] = Field(default_factory=dict)


class ActionModel(BaseModel):
    agent_name: str | None = None
    tool_name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)


def _row(task_id: str, agent_id: str, step: int) -> DataRow:
    return DataRow(
        exp_meta=ExpMeta(
            task_id=task_id,
            task_name="default_task_name",
            agent_id=agent_id,
            step=step,
            execute_time=time.time() + step,
        ),
        exp_data=Experience(state=Observation(), actions=[ActionModel()]),
    )


def test_base_module_exports_every_name_aworld_base_has():
    import replaystore.experience.base as base

    names = {
        "Experience", "ExpMeta", "DataRow", "Storage", "Sampler", "TaskSampler", "Converter",
        "InMemoryStorage", "RandomTaskSample", "DefaultConverter", "ReplayBuffer",
        "QueryCondition", "QueryFilter", "T",
    }  # fmt: skip
    assert names <= set(base.__all__)
    for name in names:
        assert getattr(base, name) is not None


def test_query_builder_examples_with_bare_field_names_build_aworlds_documented_dicts():
    # AWorld's query_builder.py example(): task_id = "123"
    assert QueryBuilder().eq("task_id", "123").build() == {
        "field": "task_id",
        "value": "123",
        "op": "eq",
    }
    # example1(): (task_id = "123" and agent_id = "111") or (task_id = "456" and agent_id = "222")
    query = (
        QueryBuilder()
        .eq("task_id", "123")
        .and_()
        .eq("agent_id", "111")
        .or_()
        .nested(QueryBuilder().eq("task_id", "456").and_().eq("agent_id", "222"))
        .build()
    )
    leaf = lambda f, v: {"field": f, "value": v, "op": "eq"}  # noqa: E731
    assert query == {
        "or_": [
            {"and_": [leaf("task_id", "123"), leaf("agent_id", "111")]},
            {"and_": [leaf("task_id", "456"), leaf("agent_id", "222")]},
        ]
    }
    # example2(): task_id = "123" and (agent_id = "111" or agent_id = "222")
    query = (
        QueryBuilder()
        .eq("task_id", "123")
        .and_()
        .nested(QueryBuilder().eq("agent_id", "111").or_().eq("agent_id", "222"))
        .build()
    )
    assert query == {
        "and_": [
            leaf("task_id", "123"),
            {"or_": [leaf("agent_id", "111"), leaf("agent_id", "222")]},
        ]
    }


def test_query_filter_checks_a_row_as_aworlds_query_filter_test_does():
    row = DataRow(
        exp_meta=ExpMeta(
            task_id="task_1",
            task_name="default_task_name",
            agent_id="agent_1",
            step=1,
            execute_time=time.time(),
        ),
        exp_data=Experience(state=Observation(), action=[ActionModel()]),
    )
    query = QueryBuilder().eq("exp_meta.task_id", "task_1").build()
    assert QueryFilter(query).check_condition(row)
    query = QueryBuilder().eq("exp_meta.task_id", "task_2").build()
    assert not QueryFilter(query).check_condition(row)
    query = (
        QueryBuilder()
        .eq("exp_meta.task_id", "task_1")
        .and_()
        .eq("exp_meta.agent_id", "agent_2")
        .build()
    )
    assert not QueryFilter(query).check_condition(row)
    # the bare spelling selects the same
    assert QueryFilter(QueryBuilder().eq("task_id", "task_1").build()).check_condition(row)
    assert not QueryFilter(QueryBuilder().eq("agent_id", "agent_2").build()).check_condition(row)


def test_query_filter_filter_keeps_matching_rows_in_order_and_none_keeps_all():
    rows = [_row(f"task_{t}", f"agent_{i}", i) for t in range(3) for i in range(4)]
    cond: QueryCondition = QueryBuilder().eq("agent_id", "agent_2").or_().eq("step", 3).build()
    got = QueryFilter(cond).filter(rows)
    assert [(r.exp_meta.task_id, r.exp_meta.step) for r in got] == [
        (f"task_{t}", s) for t in range(3) for s in (2, 3)
    ]
    assert QueryFilter(None).filter(rows) == rows
    assert QueryFilter(QueryBuilder().gte("step", 2)).filter(rows) == [
        r for r in rows if r.exp_meta.step >= 2
    ]


def test_query_filter_refuses_a_malformed_condition_when_made():
    with pytest.raises(QueryError, match="nope"):
        QueryFilter({"field": "nope", "op": "eq", "value": 1})
    with pytest.raises(QueryError, match="operator"):
        QueryFilter({"field": "task_id", "op": "similar", "value": 1})


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_buffer_write_then_sample_task_as_aworlds_buffer_test_does(kind, tmp_path):
    storage = InMemoryStorage() if kind == "memory" else SqliteStorage(tmp_path / "rb.sqlite")
    buffer = ReplayBuffer(storage, seed=0)
    for t in range(5):
        for i in range(10):
            buffer.store(_row(f"task_{t}", f"agent_{i + 1}", i + 1))

    query = QueryBuilder().eq("exp_meta.task_id", "task_1").build()
    datas = buffer.sample_task(
        query_condition=query,
        sampler=RandomTaskSample(),
        converter=DefaultConverter(),
        batch_size=2,
    )
    assert len(datas) == 1
    assert [r.exp_meta.step for r in datas[0]] == list(range(1, 11))
    assert {r.exp_meta.task_id for r in datas[0]} == {"task_1"}

    query = QueryBuilder().eq("exp_meta.agent_id", "agent_5").build()
    datas = buffer.sample_task(
        query_condition=query,
        sampler=RandomTaskSample(),
        converter=DefaultConverter(),
        batch_size=2,
    )
    assert len(datas) == 2
    for task_rows in datas:
        assert any(r.exp_meta.agent_id == "agent_5" for r in task_rows)

    # the bare names of AWorld's examples select the same rows in this storage
    for bare, full in [
        (QueryBuilder().eq("task_id", "task_3"), QueryBuilder().eq("exp_meta.task_id", "task_3")),
        (
            QueryBuilder().in_("agent_id", ["agent_2", "agent_9"]).and_().gt("step", 4),
            QueryBuilder()
            .in_("exp_meta.agent_id", ["agent_2", "agent_9"])
            .and_()
            .gt("exp_meta.step", 4),
        ),
        (QueryBuilder().is_null("pre_agent"), QueryBuilder().is_null("exp_meta.pre_agent")),
    ]:
        want = sorted(r.id for r in storage.get_all(full.build()))
        assert want
        assert sorted(r.id for r in storage.get_all(bare.build())) == want
        assert buffer.size(bare.build()) == len(want)
        task = buffer.sample_task(query_condition=bare.build(), batch_size=1, seed=1)
        assert task and task[0]


def test_bare_names_mean_exp_meta_in_the_evaluator():
    row = _row("t", "a", 3)
    for field, value in [("task_id", "t"), ("agent_id", "a"), ("step", 3)]:
        assert compile_predicate({"field": field, "op": "eq", "value": value})(row)
        assert not compile_predicate({"field": field, "op": "ne", "value": value})(row)
