"""RolloutCollector on a real Chromium and the local website suite.

One module-scoped rollout (10 tasks over 6 websites, 3 contexts at once) feeds
most tests; timeouts, the grace period and navigation errors have their own
small runs.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from replaystore.pipeline.blocklist import Blocklist
from replaystore.pipeline.task_history import TaskHistory
from replaystore.pipeline.task_sampler import TaskSampler
from replaystore.rollouts.browser import BrowserPool
from replaystore.rollouts.collector import IterationResult, RolloutCollector, difficulty_category
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.policy import WebAgent
from replaystore.rollouts.scripted import ScriptedPolicy
from replaystore.rollouts.sites import LocalSuite
from replaystore.trajectories.components import Task
from replaystore.trajectories.screenshots import fingerprint_image
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import TEST_MAX_STEPS, ReplayPolicy, pool, reply, run

TASK_IDS = [
    "shop-001", "shop-004", "travel-001", "recipes-001", "library-002",
    "news-001", "news-002", "botwall-001", "botwall-002", "shop-003",
]  # fmt: skip


async def _collect(
    tasks: list[Task], out: Path, agent: Any, browser: Any, **kwargs: Any
) -> tuple[IterationResult, RolloutCollector]:
    workers = kwargs.pop("num_workers", 3)
    async with pool(browser, workers) as contexts:
        collector = RolloutCollector(
            agent,
            Evaluator(),
            TrajectoryStorage(out / "storage"),
            pool=contexts,
            num_workers=workers,
            max_steps_by_difficulty=TEST_MAX_STEPS,
            progress=False,
            handle_sigint=False,
            **kwargs,
        )
        result = await collector.run_iteration(tasks, kwargs.get("iteration", 1))
        return result, collector


@pytest.fixture(scope="module")
def rollout(
    browser: Any, suite: LocalSuite, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("rollout")
    by_id = {t.task_id: t for t in suite.tasks()}
    tasks = [by_id[i] for i in TASK_IDS]
    blocklist = Blocklist(out / "blocklist.jsonl")
    history = TaskHistory()
    # Some wasted clicks (seeded): the same-screenshot steps the buffer must flag.
    policy = ScriptedPolicy(seed=3, mistake_rate=0.25, wrong_answer_rate=0.0)
    agent = WebAgent(policy, image_urls="file")
    result, _ = run(
        _collect(
            tasks, out, agent, browser, num_workers=3, blocklist=blocklist, task_history=history
        )
    )
    return {
        "out": out,
        "tasks": tasks,
        "result": result,
        "blocklist": blocklist,
        "history": history,
        "storage": TrajectoryStorage(out / "storage"),
    }


def test_every_task_is_rolled_out_and_stored(rollout: dict[str, Any]) -> None:
    result: IterationResult = rollout["result"]
    assert len(rollout["tasks"]) >= 10
    assert [o.task.task_id for o in result.outcomes] == TASK_IDS
    assert result.path is not None and result.path.exists()
    stored = rollout["storage"].load_all()
    assert [t[0]["observation"].task.task_id for t in stored] == TASK_IDS
    assert not result.interrupted and not result.skipped


def test_every_step_has_its_own_png_screenshot(rollout: dict[str, Any]) -> None:
    for trajectory in rollout["storage"].load_all():
        paths = [step["observation"].image_path for step in trajectory]
        assert len(set(paths)) == len(paths)
        for path in paths:
            with open(path, "rb") as handle:
                assert handle.read(8) == b"\x89PNG\r\n\x1a\n", path
        metadata = trajectory[0]["observation"].page_metadata
        assert metadata["url"].startswith("http://") and metadata["title"]


def test_scripted_policy_solves_tasks_and_rewards_come_from_the_evaluator(
    rollout: dict[str, Any],
) -> None:
    result: IterationResult = rollout["result"]
    rewards = {o.task.task_id: o.reward for o in result.outcomes}
    answered = [o for o in result.outcomes if o.status == "answered"]
    assert answered, result.status_counts()
    for outcome in answered:
        last = outcome.trajectory[-1]
        assert last["action"].action["key"] == "answer"
        assert last["reward"].submit
    for outcome in answered:
        answer = outcome.trajectory[-1]["action"].action["text"]
        assert rewards[outcome.task.task_id] == float(answer == outcome.task.reference_answer)
    assert result.success_rate > 0


def test_a_click_that_changes_nothing_is_a_same_screenshot_step(rollout: dict[str, Any]) -> None:
    no_ops = 0
    for trajectory in rollout["storage"].load_all():
        for step, after in itertools.pairwise(trajectory):
            raw = step["response"].raw_response
            if "Subscribe" in raw or "click here and see" in raw:  # the policy's wasted clicks
                no_ops += 1
                assert step["same_as_next_screenshot"] is True
                assert fingerprint_image(step["observation"].image_path) == fingerprint_image(
                    after["observation"].image_path
                )
            elif step["action"].action["key"] in ("click", "type"):
                assert step["same_as_next_screenshot"] is False
    assert no_ops >= 2, no_ops


def test_the_collector_flags_same_screenshots_while_it_rolls_out(
    rollout: dict[str, Any],
) -> None:
    """Flags come from the pixels as each screenshot is written (the storage has none
    left to compute: saving an iteration decodes no PNG)."""
    result: IterationResult = rollout["result"]
    stored = {t[0]["observation"].task.task_id: t for t in rollout["storage"].load_all()}
    for outcome in result.outcomes:
        steps = outcome.trajectory
        for step, after in itertools.pairwise(steps):
            if not after["observation"].image_path:
                continue
            same = fingerprint_image(step["observation"].image_path) == fingerprint_image(
                after["observation"].image_path
            )
            assert step["same_as_next_screenshot"] is same  # set in memory, before storage
        flags = [s.get("same_as_next_screenshot") for s in stored[outcome.task.task_id]]
        assert flags[:-1] == [s["same_as_next_screenshot"] for s in steps[:-1]]


def test_anti_bot_site_is_blocked_and_left_out_of_the_next_sample(
    rollout: dict[str, Any],
) -> None:
    result: IterationResult = rollout["result"]
    blocked = [o for o in result.outcomes if o.task.task_id.startswith("botwall")]
    assert {o.status for o in blocked} == {"blocked"}
    for outcome in blocked:
        assert len(outcome.trajectory) == 1 and outcome.trajectory[0]["reward"].is_blocked
        assert "HTTP 403" in outcome.error
    (site,) = result.blocked_sites
    assert site.startswith("http://botwall.localhost:")  # scheme, host and port
    blocklist: Blocklist = rollout["blocklist"]
    assert blocklist.get_blocked_sites() == [site]
    assert blocklist.get_blocked_domains() == {"botwall.localhost"}
    sampler = TaskSampler(rollout["tasks"], blocklist=blocklist, seed=0)
    drawn = sampler.sample_train(len(rollout["tasks"]) - 2, seed=1)
    assert len(drawn) == len(rollout["tasks"]) - 2
    assert not [t for t in drawn if "botwall" in t.website]


def test_task_history_counts_each_attempt(rollout: dict[str, Any]) -> None:
    history: TaskHistory = rollout["history"]
    assert len(history) == len(TASK_IDS)
    for outcome in rollout["result"].outcomes:
        assert history.attempts(outcome.task) == 1
        assert history.level(outcome.task) == (5 if outcome.reward >= 1 else 1)


def test_collector_timings_split_browser_policy_and_overhead(rollout: dict[str, Any]) -> None:
    result: IterationResult = rollout["result"]
    t = result.timings
    assert t["browser"] > 0 and t["policy"] > 0 and t["screenshot"] > 0
    assert 0 <= t["overhead"] < t["browser"]
    metadata = rollout["storage"].metadata(1)[0]
    assert metadata["statuses"] == result.status_counts()


def _slow_tasks(suite: LocalSuite) -> list[Task]:
    by_id = {t.task_id: t for t in suite.tasks()}
    return [by_id["news-001"], by_id["recipes-001"], by_id["shop-004"]]


def test_a_task_killed_by_its_timeout_is_recorded_as_failed(
    browser: Any, suite: LocalSuite, tmp_path: Path
) -> None:
    tasks = _slow_tasks(suite)[:2]
    replies = {t.task_id: [reply("scroll(down)")] for t in tasks}

    class Stalls(ReplayPolicy):
        async def respond(self, request: Any) -> str:
            if request.step >= 1:
                await asyncio.sleep(60)  # a model server that stops answering
            return await super().respond(request)

    history = TaskHistory()
    result, _ = run(
        _collect(
            tasks,
            tmp_path,
            WebAgent(Stalls(replies), image_urls="file"),
            browser,
            num_workers=2,
            # Long enough for step 0 (page load, screenshot, one reply) on a loaded
            # 2-core machine; step 1 then stalls for 60 s and the timeout ends it.
            task_timeout_s=6.0,
            task_history=history,
        )
    )
    assert {o.status for o in result.outcomes} == {"timeout"}
    stored = TrajectoryStorage(tmp_path / "storage").load_all()
    assert len(stored) == 2
    for trajectory in stored:
        assert len(trajectory) >= 1 and trajectory[0]["observation"].image_path
        last = trajectory[-1]
        assert last["reward"].reward == 0.0
        assert last["trajectory_metadata"]["status"] == "timeout"
    assert all(history.attempts(t) == 1 and history.level(t) == 1 for t in tasks)


def test_grace_period_stops_the_slowest_task_and_keeps_it_as_failed(
    browser: Any, suite: LocalSuite, tmp_path: Path
) -> None:
    fast, fast2, slow = _slow_tasks(suite)
    replies = {
        fast.task_id: [reply('answer("x")')],
        fast2.task_id: [reply('answer("y")')],
        slow.task_id: [reply("scroll(down)")],
    }

    class Mixed(ReplayPolicy):
        async def respond(self, request: Any) -> str:
            if request.task.task_id == slow.task_id:
                await asyncio.sleep(0.5)
            return await super().respond(request)

    result, _ = run(
        _collect(
            [fast, slow, fast2],
            tmp_path,
            WebAgent(Mixed(replies), image_urls="file"),
            browser,
            num_workers=3,
            completion_threshold=0.6,
            grace_period_s=0.5,
        )
    )
    statuses = {o.task.task_id: o.status for o in result.outcomes}
    assert statuses == {
        fast.task_id: "answered",
        fast2.task_id: "answered",
        slow.task_id: "grace_expired",
    }
    assert result.seconds < 20
    assert len(TrajectoryStorage(tmp_path / "storage").load_all()) == 3


def test_navigation_errors_are_retried_counted_per_website_and_stored_as_dummies(
    browser: Any, suite: LocalSuite, tmp_path: Path
) -> None:
    good = _slow_tasks(suite)[0]
    dead = Task.from_dict({**good.to_dict(), "task_id": "dead-1", "website": "http://127.0.0.1:9/"})
    replies = {good.task_id: [reply('answer("x")')], "dead-1": [reply('answer("x")')]}
    result, collector = run(
        _collect(
            [dead, good],
            tmp_path,
            WebAgent(ReplayPolicy(replies), image_urls="file"),
            browser,
            num_workers=2,
            navigation_retries=1,
        )
    )
    statuses = {o.task.task_id: o.status for o in result.outcomes}
    assert statuses == {"dead-1": "navigation_error", good.task_id: "answered"}
    assert result.navigation_errors == {"127.0.0.1": 2}
    assert collector.navigation_errors["127.0.0.1"] == 2
    dummy = next(o for o in result.outcomes if o.task.task_id == "dead-1").trajectory
    assert dummy[0]["action"].action_string == "Invalid URL"
    assert dummy[0]["observation"].image_path == ""


def test_an_unparseable_reply_is_a_recorded_no_op_step(
    browser: Any, suite: LocalSuite, tmp_path: Path
) -> None:
    task = _slow_tasks(suite)[0]
    replies = {task.task_id: ["I will just chat.", reply("dance()"), reply('answer("x")')]}
    result, _ = run(
        _collect(
            [task], tmp_path, WebAgent(ReplayPolicy(replies), image_urls="file"), browser,
            num_workers=1,
        )
    )  # fmt: skip
    steps = result.outcomes[0].trajectory
    assert [s["action"].action["key"] for s in steps] == ["invalid", "invalid", "answer"]
    assert "Action:" in steps[0]["action"].action["reason"]
    assert "unknown action" in steps[1]["action"].action["reason"]
    assert result.outcomes[0].status == "answered"


@pytest.mark.parametrize(
    ("difficulty", "category"),
    [(1, "easy"), (2, "medium"), (3, "hard"), (5, "medium"), (9, "hard"), ("Hard", "hard")],
)
def test_difficulty_maps_to_webgym_step_budgets(difficulty: Any, category: str) -> None:
    assert difficulty_category(difficulty) == category


def test_bad_collector_settings_name_the_argument(tmp_path: Path) -> None:
    from replaystore.errors import ConfigError

    agent = WebAgent(ScriptedPolicy())
    storage = TrajectoryStorage(tmp_path)
    pool = BrowserPool(1)
    with pytest.raises(ConfigError, match="num_workers"):
        RolloutCollector(agent, Evaluator(), storage, pool=pool, num_workers=0)
    with pytest.raises(ConfigError, match="max_steps_by_difficulty"):
        RolloutCollector(agent, Evaluator(), storage, pool=pool, max_steps_by_difficulty={"x": 3})
    with pytest.raises(ConfigError, match="completion_threshold"):
        RolloutCollector(agent, Evaluator(), storage, pool=pool, completion_threshold=0)
    with pytest.raises(ConfigError, match="evaluator"):
        RolloutCollector(agent, object(), storage, pool=pool)
