"""ReplayBuffer: store, store_batch, sample, sample_task, converters and errors."""

from __future__ import annotations

import pytest

from replaystore.errors import ConfigError, QueryError, SchemaError
from replaystore.experience import (
    Converter,
    DataRow,
    Experience,
    QueryBuilder,
    RandomSampler,
    RandomTaskSample,
    ReplayBuffer,
)

from .helpers import episode, make_row


def test_store_none_is_a_clear_error():
    buf = ReplayBuffer()
    with pytest.raises(SchemaError, match="None"):
        buf.store(None)
    with pytest.raises(SchemaError):
        buf.store_batch(None)


def test_store_batch_of_nothing_stores_nothing():
    buf = ReplayBuffer()
    buf.store_batch([])
    assert len(buf) == 0


def test_experience_accepts_action_or_actions_not_both():
    assert Experience(state={}, action={"a": 1}).actions == [{"a": 1}]
    assert Experience(state={}, actions=[{"a": 1}, {"b": 2}]).action == {"a": 1}
    with pytest.raises(SchemaError):
        Experience(state={}, actions=[], action={})


def test_datarow_ids_are_unique_uuid_strings():
    a, b = make_row(), make_row()
    assert isinstance(a.id, str) and a.id != b.id


def test_sample_task_applies_the_converter_per_task():
    class StepCount(Converter):
        def to_dataset_row(self, task_experience: list[DataRow]) -> int:
            return len(task_experience)

    buf = ReplayBuffer(seed=0)
    buf.store_batch(episode("a", 3) + episode("b", 5))
    assert sorted(buf.sample_task(converter=StepCount(), batch_size=10)) == [3, 5]


def test_sample_with_default_sampler_returns_rows_of_whole_tasks():
    buf = ReplayBuffer(seed=0)
    buf.store_batch(episode("a", 3) + episode("b", 5))
    rows = buf.sample(batch_size=1)
    assert len({r.exp_meta.task_id for r in rows}) == 1
    assert len(rows) in (3, 5)


def test_sample_task_orders_rows_by_step_then_execute_time():
    buf = ReplayBuffer()
    buf.store_batch(
        [
            make_row("t", 2, execute_time=1.0),
            make_row("t", 1, execute_time=5.0),
            make_row("t", 1, execute_time=3.0),
        ]
    )
    (task,) = buf.sample_task(batch_size=1)
    assert [(r.exp_meta.step, r.exp_meta.execute_time) for r in task] == [
        (1, 3.0),
        (1, 5.0),
        (2, 1.0),
    ]


def test_query_builder_object_is_accepted_as_condition():
    buf = ReplayBuffer()
    buf.store_batch(episode("a", 2, agent_id="x") + episode("b", 2, agent_id="y"))
    assert buf.size(QueryBuilder().eq("exp_meta.agent_id", "x")) == 2


def test_malformed_query_raises_even_on_an_empty_buffer():
    with pytest.raises(QueryError):
        ReplayBuffer().sample_task(query_condition={"field": "x", "op": "eq", "value": 1})


def test_sample_task_needs_a_task_sampler():
    with pytest.raises(ConfigError):
        ReplayBuffer().sample_task(sampler=RandomSampler())


def test_sampling_an_empty_buffer_returns_nothing():
    buf = ReplayBuffer()
    assert buf.sample_task(batch_size=5) == []
    assert buf.sample(RandomSampler(), batch_size=5) == []
    assert RandomTaskSample().sample_task_ids(buf.storage, 3) == []


def test_buffer_seed_makes_default_sampling_reproducible():
    def run():
        buf = ReplayBuffer(seed=42)
        for t in range(20):
            buf.store_batch(episode(f"t{t}", 2))
        return [[r.exp_meta.task_id for r in t] for t in buf.sample_task(batch_size=3)]

    assert run() == run()


def test_storage_must_be_a_storage():
    with pytest.raises(ConfigError):
        ReplayBuffer(storage={})


def test_an_aworld_style_task_sampler_subclass_works_unchanged():
    from replaystore.experience.base import TaskSampler  # aworld.replay_buffer.base's name

    class LatestTasks(TaskSampler):
        def sample_task_ids(self, storage, batch_size, query_condition=None):
            return storage.task_ids(query_condition)[-batch_size:]

    buf = ReplayBuffer()
    for t in range(5):
        buf.store_batch(episode(f"t{t}", 2))
    tasks = buf.sample_task(sampler=LatestTasks(), batch_size=2)
    assert [t[0].exp_meta.task_id for t in tasks] == ["t3", "t4"]
    assert [r.exp_meta.task_id for r in buf.sample(sampler=LatestTasks(), batch_size=1)] == [
        "t4",
        "t4",
    ]
