"""A Ray rollout actor's work without Ray: its own suite server and Chromium, one task in,
bytes out, the same trajectory as the in-process collector's; and the collector's run_task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from replaystore.rollouts.collector import RolloutCollector
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.policy import WebAgent
from replaystore.rollouts.ray_worker import RolloutWorker, worker_spec
from replaystore.rollouts.scripted import ScriptedPolicy
from replaystore.rollouts.shipping import unpack_outcome
from replaystore.rollouts.sites import LocalSuite
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import TEST_MAX_STEPS, VIEWPORT, pool, run


def test_run_task_returns_one_outcome_and_stores_nothing(
    browser: Any, suite: LocalSuite, tmp_path: Path
) -> None:
    task = suite.tasks()[0]
    storage = TrajectoryStorage(tmp_path / "storage")
    timings: dict[str, float] = {}

    async def go() -> Any:
        agent = WebAgent(ScriptedPolicy(seed=1), image_urls="file")
        async with pool(browser, 1) as p:
            collector = RolloutCollector(
                agent, Evaluator(), storage, pool=p, max_steps_by_difficulty=TEST_MAX_STEPS
            )
            return await collector.run_task(task, 2, rank=1, index=7, timings=timings)

    outcome = run(go())
    assert outcome.task.task_id == task.task_id
    assert outcome.trajectory[-1]["trajectory_metadata"]["iteration"] == 2
    first = Path(outcome.trajectory[0]["observation"].image_path)
    assert first.parent.name.startswith("0007_") and first.parent.parent.name == "rank001"
    assert timings["browser"] > 0
    assert storage.files() == []


def test_an_actor_rolls_out_a_task_on_its_own_server_and_ships_it(
    chromium: str | None, tmp_path: Path
) -> None:
    with LocalSuite() as driver_suite:
        task = driver_suite.tasks()[0]
    spec = worker_spec(
        policy="scripted",
        serve="suite",
        browsers=1,
        scripted={"seed": 1, "mistake_rate": 0.0, "wrong_answer_rate": 0.0},
        viewport=VIEWPORT,
        collector={"max_steps_by_difficulty": TEST_MAX_STEPS},
    )
    worker = RolloutWorker(spec)

    async def go() -> tuple[dict[str, Any], bytes, Path]:
        place = await worker.start()
        try:
            return place, await worker.run(0, task.to_dict(), 1, 0), worker.root
        finally:
            await worker.stop()

    place, data, root = run(go())
    assert place["origin"].startswith("http://localhost:")
    assert not root.exists()  # the actor keeps nothing once stopped
    outcome = unpack_outcome(data).write(tmp_path)
    port = place["origin"].rsplit(":", 1)[1]
    assert outcome.task.website == f"http://shop.localhost:{port}/"
    assert outcome.reward == 1.0  # a flawless scripted expert
    for step in outcome.trajectory:
        assert Path(step["observation"].image_path).is_relative_to(tmp_path)
        assert Path(step["observation"].image_path).is_file()


def test_a_worker_that_cannot_start_leaves_nothing_behind(chromium: str | None) -> None:
    spec = worker_spec(
        policy="scripted", serve="suite", browsers=1, collector={"no_such_option": 1}
    )
    worker = RolloutWorker(spec)
    with pytest.raises(TypeError, match="no_such_option"):
        run(worker.start())
    assert not worker.root.exists()  # its scratch folder, browser and server are gone
