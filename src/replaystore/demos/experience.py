"""Demo part ``experience``: four writer processes fill one SQLite store while we sample it.

Each writer simulates agent episodes (task ids, agent ids, steps, rewards,
JSON states) and stores them in batches; meanwhile the main process samples
tasks with a query (one agent's tasks, or tasks with a rewarded step) and
records what it got. Outputs under ``out``: ``experience.sqlite`` (the store)
and ``samples.json`` (what the sampler saw).
"""

from __future__ import annotations

import logging
import multiprocessing
import time
from pathlib import Path

from replaystore.atomic import atomic_write_json
from replaystore.experience import (
    DataRow,
    Experience,
    ExpMeta,
    QueryBuilder,
    ReplayBuffer,
    SqliteStorage,
)
from replaystore.sampling import as_generator

__all__ = ["run"]

log = logging.getLogger("replaystore.demos.experience")

WRITERS = 4
AGENTS = ("planner", "browser", "coder")


def _episodes(writer: int, n_tasks: int, seed: int) -> list[list[DataRow]]:
    """Simulated episodes: 5-15 steps, a reward of 1.0 on the last step of solved tasks."""
    rng = as_generator(seed)
    episodes = []
    for t in range(n_tasks):
        length = int(rng.integers(5, 16))
        solved = bool(rng.random() < 0.3)
        agent = AGENTS[int(rng.integers(len(AGENTS)))]
        task_id = f"w{writer}-task{t:04d}"
        rows = []
        for step in range(length):
            last = step == length - 1
            rows.append(
                DataRow(
                    ExpMeta(task_id, "web_nav", agent, step, time.time()),
                    Experience(
                        state={
                            "url": f"https://shop.example/p/{int(rng.integers(100))}",
                            "cart": int(rng.integers(0, 4)),
                        },
                        actions=[{"type": "click", "target": f"#btn{int(rng.integers(9))}"}],
                        reward_t=1.0 if (last and solved) else 0.0,
                    ),
                )
            )
        episodes.append(rows)
    return episodes


def _write(path: str, writer: int, n_tasks: int) -> None:
    buf = ReplayBuffer(SqliteStorage(path))
    batch: list[DataRow] = []
    for rows in _episodes(writer, n_tasks, seed=writer):
        batch.extend(rows)
        if len(batch) >= 100:
            buf.store_batch(batch)
            batch = []
    buf.store_batch(batch)


def run(out: Path, quick: bool) -> list[str]:
    """Run the demo; return the summary lines the CLI prints."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "experience.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    n_tasks = 150 if quick else 2000
    buf = ReplayBuffer(SqliteStorage(path), seed=0)
    by_agent = QueryBuilder().eq("exp_meta.agent_id", "browser").build()
    solved = QueryBuilder().gt("exp_data.reward_t", 0.5).build()

    start = time.perf_counter()
    writers = [
        multiprocessing.Process(target=_write, args=(str(path), w, n_tasks)) for w in range(WRITERS)
    ]
    for p in writers:
        p.start()
    rounds, seen = 0, set()
    while any(p.is_alive() for p in writers) or rounds == 0:
        for task in buf.sample_task(query_condition=by_agent, batch_size=8):
            seen.add(task[0].exp_meta.task_id)
        rounds += 1
        time.sleep(0.01)
    for p in writers:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"experience demo writer exited with {p.exitcode}")
    elapsed = time.perf_counter() - start

    total = buf.size()
    tasks = buf.sample_task(query_condition=solved, batch_size=5)
    solved_sampled = [
        {"task_id": t[0].exp_meta.task_id, "steps": len(t), "agent": t[0].exp_meta.agent_id}
        for t in tasks
    ]
    summary = {
        "rows": total,
        "seconds": round(elapsed, 3),
        "rows_per_second": round(total / elapsed),
        "sampling_rounds_during_writes": rounds,
        "distinct_browser_tasks_sampled": len(seen),
        "solved_tasks_sampled": solved_sampled,
    }
    atomic_write_json(out / "samples.json", summary)
    log.info("experience demo: %d rows in %.2f s", total, elapsed)
    lines = [
        f"{WRITERS} writer processes stored {total:,} rows ({total / elapsed:,.0f} rows/s) "
        f"into {path}",
        f"sampled {rounds} times while writing; saw {len(seen)} distinct 'browser' tasks",
        f"rows with agent_id=browser: {buf.size(by_agent):,}; "
        f"solved tasks (reward > 0.5): {len(buf.storage.task_ids(solved)):,}",
    ]
    lines += [
        f"  solved task {s['task_id']}: {s['steps']} steps by {s['agent']}" for s in solved_sampled
    ]
    lines.append(f"sample summary: {out / 'samples.json'}")
    return lines
