"""AWorld's replay-buffer usage with replaystore: SQLite storage, four writer processes.

Run: python examples/experience_multiprocess.py [path/to/store.sqlite]
"""

import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from replaystore.experience import (
    DataRow,
    DefaultConverter,
    Experience,
    ExpMeta,
    QueryBuilder,
    RandomTaskSample,
    ReplayBuffer,
    SqliteStorage,
)


def write_processing(path: str, task_prefix: str) -> None:
    # Each process opens the store itself; SQLite serialises the writers.
    replay_buffer = ReplayBuffer(storage=SqliteStorage(path))
    for episode in range(25):
        task_id = f"{task_prefix}_{episode}"
        rows = [
            DataRow(
                exp_meta=ExpMeta(
                    task_id=task_id,
                    task_name="my_task",
                    agent_id=f"agent_{episode % 2}",
                    step=step,
                    execute_time=time.time(),
                ),
                exp_data=Experience(
                    state={"observation": f"page {step}"},
                    action={"tool": "click", "x": step},
                    reward_t=1.0 if step == 9 else 0.0,
                ),
            )
            for step in range(10)
        ]
        replay_buffer.store_batch(rows)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else str(Path(tempfile.mkdtemp()) / "exp.sqlite")
    replay_buffer = ReplayBuffer(storage=SqliteStorage(path), seed=0)

    processes = [
        multiprocessing.Process(target=write_processing, args=(path, f"task_{i}")) for i in range(4)
    ]
    for p in processes:
        p.start()
    for p in processes:
        p.join()

    # Basic example: rows of up to 1000 tasks named "my_task".
    query_condition = QueryBuilder().eq("exp_meta.task_name", "my_task").build()
    data = replay_buffer.sample(
        sampler=RandomTaskSample(),
        query_condition=query_condition,
        converter=DefaultConverter(),
        batch_size=1000,
    )
    print(f"stored {len(replay_buffer)} rows; sample() returned {len(data)} rows")

    # Query a task by task_id, and tasks by agent_id.
    query = QueryBuilder().eq("exp_meta.task_id", "task_1_3").build()
    (task,) = replay_buffer.sample_task(query_condition=query, batch_size=10)
    print(f"task_1_3 has {len(task)} steps: {[r.exp_meta.step for r in task]}")
    query = QueryBuilder().eq("exp_meta.agent_id", "agent_1").build()
    tasks = replay_buffer.sample_task(query_condition=query, batch_size=5)
    print(f"sampled {len(tasks)} tasks of agent_1: {[t[0].exp_meta.task_id for t in tasks]}")

    # Nested conditions: task_1's episodes that were run by agent_0 or agent_1.
    cond = (
        QueryBuilder()
        .like("exp_meta.task_id", "task_1_")
        .and_()
        .nested(
            QueryBuilder()
            .eq("exp_meta.agent_id", "agent_0")
            .or_()
            .eq("exp_meta.agent_id", "agent_1")
        )
        .build()
    )
    print(f"rows matching the nested condition: {replay_buffer.size(cond)}")


if __name__ == "__main__":
    main()
