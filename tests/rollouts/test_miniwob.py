"""MiniWoB++ as a task source: seeds, task names, episodes started as BrowserGym starts
them, rewards from the pages themselves, and what a degenerate policy scores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replaystore.errors import ConfigError
from replaystore.rollouts import miniwob
from replaystore.rollouts.actions import execute_action, parse_action
from replaystore.rollouts.collector import RolloutCollector
from replaystore.rollouts.evaluator import Evaluator
from replaystore.rollouts.page_text import page_text, parse_page_text
from replaystore.rollouts.policy import WebAgent
from replaystore.trajectories.context import ConversationBuilder
from replaystore.trajectories.storage import TrajectoryStorage

from .conftest import pool, reply, run

pytest.importorskip("miniwob", reason="the miniwob extra brings the MiniWoB++ pages")

#: Held-out seeds of these tests (no test trains on anything).
HELD_OUT = "90000-90003"


@pytest.fixture(scope="module")
def server() -> Iterator[miniwob.MiniWoBServer]:
    with miniwob.MiniWoBServer() as running:
        yield running


# ------------------------------------------------------------------ names and seeds


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("1000-1003", [1000, 1001, 1002, 1003]),
        ("1, 2, 7-9", [1, 2, 7, 8, 9]),
        (5, [5]),
        ([3, 1], [3, 1]),
    ],
)
def test_seeds_are_read_from_ranges_and_lists(spec: Any, expected: list[int]) -> None:
    assert miniwob.parse_seeds(spec) == expected


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("9-1", "runs backwards"),
        ("1-3,2", "repeat [2]"),
        ("a-b", "is not N or A-B"),
        ("", "is not N or A-B"),
        ([1, True], "integers"),
        (-1, ">= 0"),
    ],
)
def test_bad_seeds_are_refused_naming_the_value(spec: Any, words: str) -> None:
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        miniwob.parse_seeds(spec)


def test_task_names_are_checked_against_the_package() -> None:
    assert miniwob.parse_task_names("miniwob:click-button, enter-text") == [
        "click-button",
        "enter-text",
    ]
    assert miniwob.parse_task_names("miniwob:experts") == list(miniwob.EXPERT_TASKS)
    assert len(miniwob.EXPERT_TASKS) == 18
    assert set(miniwob.EXPERT_TASKS) <= set(miniwob.available_tasks())
    with pytest.raises(ConfigError, match=r"unknown MiniWoB\+\+ task.*'click-buton'"):
        miniwob.parse_task_names("miniwob:click-buton")
    with pytest.raises(ConfigError, match="more than once"):
        miniwob.parse_task_names("miniwob:click-test,click-test")
    with pytest.raises(ConfigError, match="names no MiniWoB"):
        miniwob.parse_task_names("miniwob:")


def test_the_page_vocabulary_is_the_word_lists_of_the_pages_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    words = miniwob.page_vocabulary()
    assert len(words) == len(set(words)) > 200
    assert {"Agustina", "Jerald", "magenta", "ipsum", "amet"} <= set(words)
    assert not any(w.endswith(",") or not w for w in words)  # "amet," is "amet"
    # The package's own lists, read from its ui_utils.js, in the file's order.
    root = tmp_path / "html"
    (root / "common").mkdir(parents=True)
    (root / "common" / "ui_utils.js").write_text(
        "ui_utils.FIFTY_NAMES = ['Kenda','Joye'];\nui_utils.COLORS = ['red'];\n"
        'ui_utils.lorem_words = [\n  "lorem", "amet,", "Kenda"];\n',
        encoding="utf-8",
    )
    monkeypatch.setattr(miniwob, "html_root", lambda: root)
    assert miniwob.page_vocabulary() == ["Kenda", "Joye", "red", "lorem", "amet"]
    (root / "common" / "ui_utils.js").write_text("ui_utils.COLORS = ['red'];", encoding="utf-8")
    with pytest.raises(RuntimeError, match=r"no ui_utils\.FIFTY_NAMES"):
        miniwob.page_vocabulary()


def test_a_task_is_a_name_and_a_seed_and_its_id_has_no_port(
    server: miniwob.MiniWoBServer,
) -> None:
    tasks = miniwob.miniwob_tasks("miniwob:click-test,enter-text", "7-8", server.url)
    assert [t.task_id for t in tasks] == [
        "miniwob:click-test:7",
        "miniwob:click-test:8",
        "miniwob:enter-text:7",
        "miniwob:enter-text:8",
    ]
    assert tasks[0].website == f"{server.url}/miniwob/click-test.html"
    assert tasks[0].evaluator_reference == {"miniwob": "click-test", "seed": 7}
    assert str(server.port) not in "".join(t.task_id or "" for t in tasks)


# ------------------------------------------------------------------ episodes


def _episode(browser: Any, server: miniwob.MiniWoBServer, name: str, seed: int, act: Any) -> Any:
    async def go() -> Any:
        [task] = miniwob.miniwob_tasks(f"miniwob:{name}", [seed], server.url)
        async with pool(browser, 1) as p, p.context() as context:
            page = await context.new_page()
            await page.goto(task.website)
            task = await miniwob.start_episode(page, task)
            text = await page_text(page, skip=miniwob.OBSERVATION_SKIP)
            before = await miniwob.episode_state(page)
            clock = await page.evaluate("() => core.EPISODE_MAX_TIME")
            if act is not None:
                await execute_action(page, parse_action(act(text)), settle_s=0.05)
            after = await miniwob.episode_state(page)
            return task, text, before, after, clock

    return run(go())


def test_an_episode_starts_seeded_and_the_page_scores_the_right_click(
    browser: Any, server: miniwob.MiniWoBServer
) -> None:
    def click_me(text: str) -> str:
        button = next(e for e in parse_page_text(text) if e.role == "button")
        return f'click("{button.element_id}")'

    task, text, before, after, clock = _episode(browser, server, "click-test", 3, click_me)
    assert task.task_name == "Click the button."
    assert "button 'Click Me!' id=" in text
    assert not before.done
    assert after.done and after.raw_reward == 1.0
    assert clock >= 10**9  # the page's 10 s clock cannot fail a slow model
    reward = miniwob.page_reward(task, after, "done")
    assert reward.reward == 1.0 and reward.evaluation["source"] == "miniwob"
    assert reward.evaluation["seed"] == 3 and reward.evaluation["task"] == "click-test"
    # The same seed draws the same instance; another seed another one.
    again = _episode(browser, server, "click-button", 11, None)
    same = _episode(browser, server, "click-button", 11, None)
    other = _episode(browser, server, "click-button", 12, None)
    assert again[0].task_name == same[0].task_name and again[1] == same[1]
    assert (again[0].task_name, again[1]) != (other[0].task_name, other[1])


def test_a_wrong_click_ends_the_episode_with_reward_zero(
    browser: Any, server: miniwob.MiniWoBServer
) -> None:
    goal = _episode(browser, server, "click-test-2", 4, None)[0].task_name  # "Click button ONE."
    wanted = goal.rstrip(".").split()[-1]

    def wrong(text: str) -> str:
        other = next(e for e in parse_page_text(text) if e.role == "button" and e.name != wanted)
        return f'click("{other.element_id}")'

    task, _, _, after, _ = _episode(browser, server, "click-test-2", 4, wrong)
    assert after.done and after.raw_reward < 0
    assert miniwob.page_reward(task, after, "done").reward == 0.0
    not_done = miniwob.page_reward(task, None, "max_steps")
    assert not_done.reward == 0.0 and "did not end (max_steps)" in not_done.evaluation["reason"]


# ------------------------------------------------------------------ degenerate policies


class _FirstElement:
    """Always clicks the first element of the page text (a degenerate model)."""

    async def respond(self, request: Any) -> str:
        elements = parse_page_text(request.observation.ac_tree)
        target = elements[0].element_id if elements else "1"
        return reply(f'click("{target}")')

    async def aclose(self) -> None:
        pass


class _SameAnswer:
    """Always answers the same string, whatever the page (a degenerate model)."""

    async def respond(self, request: Any) -> str:
        return reply('answer("submit ok yes Click Me! ONE nam")')

    async def aclose(self) -> None:
        pass


#: Tasks whose goal names an element by a name drawn per seed: a policy that ignores the
#: goal is right by chance only.
_NAMED = "miniwob:click-button,click-link,enter-text,focus-text-2"


def _play(
    browser: Any, server: miniwob.MiniWoBServer, policy: Any, out: Path, tasks: str = _NAMED
) -> Any:
    tasks = miniwob.miniwob_tasks(tasks, HELD_OUT, server.url, max_steps=2)
    agent = WebAgent(policy, conversation_builder=ConversationBuilder(observation="text"))

    async def go() -> Any:
        async with pool(browser, 4) as contexts:
            collector = RolloutCollector(
                agent,
                Evaluator(),
                TrajectoryStorage(out / "storage"),
                pool=contexts,
                num_workers=4,
                progress=False,
                handle_sigint=False,
                settle_s=0.05,
            )
            return await collector.run_iteration(tasks, 1)

    return run(go())


def test_degenerate_policies_score_near_zero_on_held_out_seeds(
    browser: Any, server: miniwob.MiniWoBServer, tmp_path: Path
) -> None:
    first = _play(browser, server, _FirstElement(), tmp_path / "first")
    same = _play(browser, server, _SameAnswer(), tmp_path / "same")
    assert len(first.outcomes) == len(same.outcomes) == 4 * 4
    assert same.success_rate == 0.0  # no string is matched: the pages score
    # Clicking the first element is right only when the seed put the target first.
    assert first.success_rate <= 0.3, first.success_rate
    # The quick loop's tasks (CI's learning test asks the trained model for >= 0.6 there)
    # name their target among two to four fixed ones: chance is higher, still under 0.6.
    quick = _play(browser, server, _FirstElement(), tmp_path / "quick", "miniwob:quick")
    assert len(quick.outcomes) == 4 * 4
    assert quick.success_rate < 0.5, quick.success_rate
    stored = TrajectoryStorage(tmp_path / "first" / "storage").load_all()
    ends = [t[-1] for t in stored]
    assert all(s["reward"].evaluation["source"] == "miniwob" for s in ends)
    assert {s["trajectory_metadata"]["status"] for s in ends} <= {"done", "max_steps"}
    # What the model read: the goal drawn by the seed, the page text with ids, no port.
    prompt = json.loads(stored[0][0]["response"].raw_prompt)
    text = prompt[-1]["content"]
    assert "Task: " in text and " id=" in text and f":{server.port}" not in text


# ------------------------------------------------------------------ the command line


def test_rollout_command_plays_the_experts_on_miniwob_seeds(
    chromium: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replaystore.cli import main

    out = tmp_path / "run"
    argv = ["rollout", "--tasks", "miniwob:click-test,enter-text", "--seeds", "7-8"]
    argv += ["--policy", "scripted", "--observation", "text", "--workers", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "iteration 1 rank 0: 4 tasks (done 4), success 100%" in printed
    stored = TrajectoryStorage(out / "storage").load_all()
    ids = sorted(t[0]["observation"].task.task_id for t in stored)
    assert ids == [f"miniwob:{n}:{s}" for n in ("click-test", "enter-text") for s in (7, 8)]
    for trajectory in stored:
        assert trajectory[-1]["reward"].reward == 1.0
        assert trajectory[-1]["reward"].evaluation["source"] == "miniwob"
        for step in trajectory:  # element-id actions, read from the page text
            assert step["action"].action["key"] in ("click", "fill")
            assert "element" in step["action"].action


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--tasks", "miniwob:click-test"], "needs --seeds"),
        (["--seeds", "1-3"], "--seeds is for MiniWoB++ tasks"),
        (["--tasks", "miniwob:nope", "--seeds", "1"], "unknown MiniWoB++ task(s) 'nope'"),
    ],
)
def test_rollout_command_refuses_bad_miniwob_arguments_in_one_line(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from replaystore.cli import main

    assert main(["rollout", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "run" / "storage").exists()
