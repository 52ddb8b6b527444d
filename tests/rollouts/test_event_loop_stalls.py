"""No blocking call on the event loop during a rollout (issue 23, item 9).

With 8 workers one blocking call stalls every browser. A heartbeat task on the
rollout's event loop measures its own lateness (the loop's longest stall)
while the slow parts are made slower than any stall the test accepts: the
judge reading screenshots, the experiment logger, and the runner's file work.
Each must run in a worker thread, so the loop keeps beating.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from replaystore.pipeline.task_history import TaskHistory
from replaystore.rollouts import evaluator as evaluator_module
from replaystore.rollouts.chat_client import ChatCompletionsClient
from replaystore.rollouts.collector import RolloutCollector
from replaystore.rollouts.evaluator import Evaluator, OpenAIJudge
from replaystore.rollouts.policy import WebAgent
from replaystore.rollouts.runner import rollout
from replaystore.rollouts.sites import LocalSuite
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import TEST_MAX_STEPS, ReplayPolicy, pool, reply, run
from .fake_openai import FakeOpenAIServer

#: How long each stand-in for a blocking call takes (a slow disk, a slow logger backend).
SLOW_S = 2.0
#: The longest stall the loop may show: half a stand-in (a loaded 2-core CI machine showed
#: stalls up to 0.42 s from scheduling alone).
MAX_STALL_S = 1.0


class Heartbeat:
    """Wakes every ``period_s`` and records how late it woke: the loop's longest stall."""

    def __init__(self, period_s: float = 0.01) -> None:
        self.period_s = period_s
        self.longest_stall_s = 0.0
        self.beats = 0
        self.asleep_since = time.perf_counter()

    async def beat(self) -> None:
        while True:
            self.asleep_since = time.perf_counter()
            await asyncio.sleep(self.period_s)
            self.record()
            self.beats += 1

    def record(self) -> None:
        late = time.perf_counter() - self.asleep_since - self.period_s
        self.longest_stall_s = max(self.longest_stall_s, late)


@contextlib.asynccontextmanager
async def heartbeat() -> AsyncIterator[Heartbeat]:
    """A running heartbeat (it has beaten once); on exit, the beat it was waiting for
    counts too (a stall just before the end is not missed)."""
    monitor = Heartbeat()
    task = asyncio.create_task(monitor.beat())
    while monitor.beats == 0:
        await asyncio.sleep(0)
    try:
        yield monitor
    finally:
        monitor.record()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def slow(function: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_S)
        return function(*args, **kwargs)

    return wrapper


class SlowLogger:
    """An experiment logger whose backend takes its time (a W&B upload, a full disk)."""

    def __init__(self) -> None:
        self.iterations: list[int] = []

    def log_iteration(self, iteration: int, trajectories: Any, **kwargs: Any) -> None:
        time.sleep(SLOW_S)
        self.iterations.append(iteration)


def test_the_judge_and_the_experiment_logger_do_not_stall_the_loop(
    browser: Any, suite: LocalSuite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        evaluator_module, "image_to_data_url", slow(evaluator_module.image_to_data_url)
    )
    by_id = {t.task_id: t for t in suite.tasks()}
    tasks = [by_id["news-001"], by_id["recipes-001"]]
    # A wrong answer: the judge is asked, with the last screenshots.
    replies = {t.task_id: [reply('answer("not the reference")')] for t in tasks}
    experiment = SlowLogger()

    async def collect() -> tuple[Any, Heartbeat]:
        with FakeOpenAIServer(reply="Looks right.\nVerdict: SUCCESS") as server:
            judge = OpenAIJudge(ChatCompletionsClient(server.base_url, "judge"), max_images=1)
            async with pool(browser, 2) as contexts, heartbeat() as monitor:
                collector = RolloutCollector(
                    WebAgent(ReplayPolicy(replies), image_urls="file"),
                    Evaluator(judge=judge),
                    TrajectoryStorage(tmp_path / "storage"),
                    pool=contexts,
                    num_workers=2,
                    max_steps_by_difficulty=TEST_MAX_STEPS,
                    logger=experiment,
                    progress=False,
                    handle_sigint=False,
                )
                result = await collector.run_iteration(tasks, 1)
            await judge.aclose()
        return result, monitor

    result, monitor = run(collect())
    assert result.success_rate == 1.0  # the judge answered: the slow reads happened
    assert experiment.iterations == [1]
    assert monitor.beats > 0
    assert monitor.longest_stall_s < MAX_STALL_S


def test_the_rollout_runner_does_its_file_work_off_the_loop(
    chromium: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TaskHistory, "save", slow(TaskHistory.save))
    monkeypatch.setattr(TrajectoryStorage, "next_iteration", slow(TrajectoryStorage.next_iteration))

    async def roll() -> tuple[Any, Heartbeat]:
        async with heartbeat() as monitor:
            result = await rollout(
                "suite", tmp_path / "run", workers=1, max_tasks=1, progress=False
            )
        return result, monitor

    result, monitor = run(roll())
    assert result.path is not None and (tmp_path / "run" / "task_history.json").exists()
    assert monitor.longest_stall_s < MAX_STALL_S
