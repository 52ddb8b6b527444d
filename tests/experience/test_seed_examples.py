"""AWorld's README examples, unchanged apart from imports."""

from __future__ import annotations

import multiprocessing
import time

# The seed's module paths, with `aworld.replay_buffer` replaced by `replaystore.experience`.
from replaystore.experience import (
    DataRow,
    DefaultConverter,
    Experience,
    ExpMeta,
    RandomTaskSample,
    ReplayBuffer,
)
from replaystore.experience.query_filter import QueryBuilder
from replaystore.experience.storage.multi_proc_mem import MultiProcMemoryStorage

from .helpers import ActionModel, Observation, episode


def test_writing_data_stores_the_row_itself_with_its_pydantic_state():
    replay_buffer = ReplayBuffer()
    data = DataRow(
        exp_meta=ExpMeta(
            task_id="task_1",
            task_name="my_task",
            agent_id="agent_1",
            step=1,
            execute_time=time.time(),
        ),
        exp_data=Experience(state=Observation(), action=ActionModel()),
    )
    replay_buffer.store(data)
    (row,) = replay_buffer.storage.get_all()
    assert row is data  # AWorld's in-memory storage keeps the objects it is given
    assert isinstance(row.exp_data.state, Observation)
    assert isinstance(row.exp_data.action, ActionModel)


def test_reading_data_basic_example_filters_by_task_name():
    replay_buffer = ReplayBuffer()
    replay_buffer.store_batch(episode("t1", 3, task_name="test_task"))
    replay_buffer.store_batch(episode("t2", 2, task_name="other"))
    query_condition = QueryBuilder().eq("exp_meta.task_name", "test_task").build()
    data = replay_buffer.sample(
        sampler=RandomTaskSample(),
        query_condition=query_condition,
        converter=DefaultConverter(),
        batch_size=1000,
    )
    assert [r.exp_meta.step for r in data] == [0, 1, 2]
    assert {r.exp_meta.task_id for r in data} == {"t1"}


def test_sample_task_by_task_id_returns_that_task_sorted_by_step():
    replay_buffer = ReplayBuffer()
    rows = episode("task_1", 4)
    replay_buffer.store_batch(rows[::-1])  # stored out of order
    replay_buffer.store_batch(episode("task_2", 4))
    query = QueryBuilder().eq("exp_meta.task_id", "task_1").build()
    data = replay_buffer.sample_task(query_condition=query, batch_size=10)
    assert len(data) == 1
    assert [r.exp_meta.step for r in data[0]] == [0, 1, 2, 3]


def test_sample_task_by_agent_id_returns_at_most_batch_size_tasks_of_that_agent():
    replay_buffer = ReplayBuffer()
    for i in range(8):
        replay_buffer.store_batch(episode(f"task_{i}", 3, agent_id=f"agent_{i % 2}"))
    query = QueryBuilder().eq("exp_meta.agent_id", "agent_1").build()
    data = replay_buffer.sample_task(query_condition=query, batch_size=5, seed=0)
    assert 1 <= len(data) <= 4  # only four tasks have agent_1
    assert len(data) == 4
    for task in data:
        assert {r.exp_meta.agent_id for r in task} == {"agent_1"}


def write_processing(replay_buffer: ReplayBuffer, task_id: str) -> None:
    for step in range(250):
        replay_buffer.store(
            DataRow(
                exp_meta=ExpMeta(task_id, "my_task", f"agent_{task_id}", step, time.time()),
                exp_data=Experience(state=Observation(content=step), action=ActionModel()),
            )
        )


def test_multiprocessing_example_keeps_every_row_after_writers_exit():
    manager = multiprocessing.Manager()
    replay_buffer = ReplayBuffer(
        storage=MultiProcMemoryStorage(
            data_dict=manager.dict(),
            fifo_queue=manager.list(),
            lock=manager.Lock(),
            max_capacity=10000,
        )
    )
    processes = [
        multiprocessing.Process(target=write_processing, args=(replay_buffer, f"task_{i}"))
        for i in range(4)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert len(replay_buffer) == 1000
    tasks = replay_buffer.sample_task(batch_size=10)
    assert sorted(len(t) for t in tasks) == [250] * 4
    manager.shutdown()


def test_query_builder_simple_equality():
    assert QueryBuilder().eq("exp_meta.task_id", "123").build() == {
        "field": "exp_meta.task_id",
        "value": "123",
        "op": "eq",
    }


def test_query_builder_complex_conditions():
    cond = (
        QueryBuilder().eq("exp_meta.task_id", "123").and_().eq("exp_meta.agent_id", "456").build()
    )
    assert cond == {
        "and_": [
            {"field": "exp_meta.task_id", "value": "123", "op": "eq"},
            {"field": "exp_meta.agent_id", "value": "456", "op": "eq"},
        ]
    }


def test_query_builder_nested_conditions():
    cond = (
        QueryBuilder()
        .eq("exp_meta.task_id", "123")
        .and_()
        .nested(QueryBuilder().eq("exp_meta.agent_id", "111").or_().eq("exp_meta.agent_id", "222"))
        .build()
    )
    assert cond == {
        "and_": [
            {"field": "exp_meta.task_id", "value": "123", "op": "eq"},
            {
                "or_": [
                    {"field": "exp_meta.agent_id", "value": "111", "op": "eq"},
                    {"field": "exp_meta.agent_id", "value": "222", "op": "eq"},
                ]
            },
        ]
    }
