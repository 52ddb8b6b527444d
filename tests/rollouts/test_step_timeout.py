"""A step cut by the step timeout keeps what it had reached (issue 23, item 4).

A model that never answers leaves the step's screenshot and prompt; an action
that hangs leaves the model's reply too. The HTTP client's request timeout is
shorter than the step timeout, so its retries fit inside a step.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from replaystore.rollouts import collector as collector_module
from replaystore.rollouts.chat_client import ChatCompletionsClient
from replaystore.rollouts.collector import RolloutCollector
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.policy import WebAgent
from replaystore.rollouts.sites import LocalSuite
from replaystore.trajectories.components import Task
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import TEST_MAX_STEPS, ReplayPolicy, pool, reply, run


def _task(suite: LocalSuite) -> Task:
    return next(t for t in suite.tasks() if t.task_id == "news-001")


async def _collect(task: Task, out: Path, agent: Any, browser: Any) -> Any:
    async with pool(browser, 1) as contexts:
        collector = RolloutCollector(
            agent,
            Evaluator(),
            TrajectoryStorage(out / "storage"),
            pool=contexts,
            num_workers=1,
            max_steps_by_difficulty=TEST_MAX_STEPS,
            step_timeout_s=3.0,
            progress=False,
            handle_sigint=False,
        )
        return await collector.run_iteration([task], 1)


class NeverAnswers(ReplayPolicy):
    async def respond(self, request: Any) -> str:
        await asyncio.sleep(60)  # a model server that stops answering
        return await super().respond(request)


def test_a_model_that_never_answers_leaves_the_screenshot_and_the_prompt(
    browser: Any, suite: LocalSuite, tmp_path: Path
) -> None:
    task = _task(suite)
    agent = WebAgent(NeverAnswers({task.task_id: [reply("scroll(down)")]}), image_urls="file")
    result = run(_collect(task, tmp_path, agent, browser))
    assert result.status_counts() == {"step_timeout": 1}
    (trajectory,) = TrajectoryStorage(tmp_path / "storage").load_all()
    (step,) = trajectory
    assert Path(step["observation"].image_path).is_file()
    assert step["observation"].page_metadata["url"].startswith(task.website.rstrip("/"))
    prompt = json.loads(step["response"].raw_prompt)
    assert task.task_name in json.dumps(prompt)
    assert step["response"].raw_response == ""  # no reply: a record of the cut, no sample
    assert step["action"].action["key"] == "step_timeout"
    assert "3 s" in step["action"].action["error"]
    assert step["trajectory_metadata"]["status"] == "step_timeout"


def test_an_action_that_hangs_keeps_the_models_reply(
    browser: Any, suite: LocalSuite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def hangs(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(60)  # a page that never finishes the click

    monkeypatch.setattr(collector_module, "execute_action", hangs)
    task = _task(suite)
    said = reply("click(10, 10)", thought="the first headline")
    agent = WebAgent(ReplayPolicy({task.task_id: [said]}), image_urls="file")
    result = run(_collect(task, tmp_path, agent, browser))
    assert result.status_counts() == {"step_timeout": 1}
    (trajectory,) = TrajectoryStorage(tmp_path / "storage").load_all()
    (step,) = trajectory
    assert step["response"].raw_response == said
    assert json.loads(step["response"].raw_prompt)
    assert Path(step["observation"].image_path).is_file()
    assert step["action"].action_string == "click(10, 10)"
    assert "3 s" in step["action"].action["error"]


def test_the_request_timeout_is_shorter_than_the_step_timeout_by_default() -> None:
    import inspect

    step = inspect.signature(RolloutCollector).parameters["step_timeout_s"].default
    client = ChatCompletionsClient("http://127.0.0.1:9/v1", "tiny")
    assert client.timeout_s < step
    assert client.max_retries >= 1
