"""Evaluator: reference matching (exact / numeric / contains, lists of answers) and the
OpenAI-protocol judge against a real local chat-completions server."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import pytest
from PIL import Image

from replaystore.errors import ConfigError
from replaystore.rollouts.evaluator import (
    Evaluator,
    OpenAIJudge,
    match_reference,
    normalize_answer,
    reference_answers,
)
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task

from .fake_openai import FakeOpenAIServer


def make_task(reference, rubric=None) -> Task:
    return Task(
        task_name="Find the price of the red kettle",
        domain="Lifestyle & Leisure",
        subdomain="Shopping",
        website="http://127.0.0.1/shop/",
        difficulty=2,
        evaluator_reference=rubric
        if rubric is not None
        else [{"description": "the kettle's price is stated", "facts": ["price of red kettle"]}],
        reference_answer=reference,
        task_id="shop-7",
    )


def steps_for(task: Task, tmp_path: Path, n: int = 3) -> list[dict]:
    steps = []
    for i in range(n):
        image = tmp_path / f"s{i}.png"
        Image.new("RGB", (16, 16), (40 * i, 10, 10)).save(image)
        last = i == n - 1
        action = 'answer("$24")' if last else f"click({10 * i}, 20)"
        steps.append(
            {
                "observation": Observation(
                    task, str(image), "", {"url": f"http://127.0.0.1/shop/p{i}", "title": "Shop"}
                ),
                "action": Action({"key": "answer" if last else "click"}, action),
                "response": Response(f"<think>.</think>\nAction: {action}", {"action": action}),
                "reward": Reward(0.0, None),
            }
        )
    return steps


def evaluate(evaluator: Evaluator, task: Task, answer, steps=(), **kw):
    return asyncio.run(evaluator.evaluate(task, answer, list(steps), **kw))


def test_normalisation_ignores_case_spacing_quotes_and_final_period():
    assert normalize_answer('  "The Red  Kettle." ') == "the red kettle"
    assert normalize_answer("Ｃafé") == normalize_answer("café")  # NFKC: full-width letters


@pytest.mark.parametrize(
    ("answer", "reference", "method"),
    [
        ("the red kettle", "The Red Kettle", "exact"),
        ("It costs $24.", "$24", "numeric"),
        ("1299", "$1,299.00", "numeric"),
        ("about 12 %", "12%", "numeric"),
        ("3 km", 3, "numeric"),
        ("The answer is the Red Kettle, in stock", "red kettle", "contains"),
    ],
)
def test_matching_methods(answer, reference, method):
    assert match_reference(answer, [reference]) == (method, reference)


@pytest.mark.parametrize(
    ("answer", "reference"),
    [
        ("120 items", "12"),  # numbers compare as numbers, never as substrings
        ("24.5", "$24"),
        ("the red kettles", "red kettle"),  # contains matches whole words only
        ("blue kettle", "red kettle"),
        ("room 12", "Room 12B"),  # a name with a digit is not a number
    ],
)
def test_non_matches(answer, reference):
    assert match_reference(answer, [reference]) is None


def test_numeric_tolerance_is_relative_above_one():
    assert match_reference("1000.4", ["1000"], numeric_tolerance=1e-3) == ("numeric", "1000")
    assert match_reference("1002", ["1000"], numeric_tolerance=1e-3) is None
    assert match_reference("0.0105", ["0.01"], numeric_tolerance=1e-3) == ("numeric", "0.01")


def test_contains_can_be_turned_off():
    assert match_reference("it is the red kettle", ["red kettle"], allow_contains=False) is None


def test_any_of_a_list_of_acceptable_answers_matches():
    task = make_task(["New York City", "NYC", "New York"])
    reward = evaluate(Evaluator(), task, "nyc")
    assert reward.reward == 1.0 and reward.submit and not reward.is_blocked
    assert reward.submission_judgment == {"method": "exact", "answer": "nyc", "matched": "NYC"}
    assert "exact match" in reward.evaluation


def test_wrong_answer_is_zero_and_says_what_it_was_compared_with():
    reward = evaluate(Evaluator(), make_task("$24"), "$31")
    assert reward.reward == 0.0 and reward.submit
    assert reward.submission_judgment["method"] == "no_match"
    assert "'$31' matches no reference ($24)" in reward.evaluation


def test_no_answer_is_zero_and_not_submitted():
    reward = evaluate(Evaluator(), make_task("$24"), None)
    assert (reward.reward, reward.submit, reward.is_blocked) == (0.0, False, False)
    assert "no answer" in reward.evaluation


def test_blocked_is_zero_and_flagged_even_with_a_right_answer():
    reward = evaluate(Evaluator(), make_task("$24"), "$24", blocked=True)
    assert (reward.reward, reward.is_blocked) == (0.0, True)
    assert reward.submission_judgment["method"] == "blocked"


def test_reward_round_trips_through_json():
    reward = evaluate(Evaluator(), make_task(["a", "b"]), "b")
    assert Reward.from_dict(json.loads(json.dumps(reward.to_dict()))) == reward


def test_task_without_reference_or_judge_is_zero_with_the_reason():
    reward = evaluate(Evaluator(), make_task(None), "anything")
    assert reward.reward == 0.0
    assert "no reference answer and no judge" in reward.evaluation


@pytest.mark.parametrize("bad", [[{"a": 1}], True, {"answer": "x"}])
def test_malformed_reference_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="reference_answer"):
        reference_answers(bad)


def test_bad_tolerance_is_named():
    with pytest.raises(ConfigError, match="numeric_tolerance"):
        Evaluator(numeric_tolerance=-1)


def test_judge_is_asked_with_rubric_reference_actions_answer_and_screenshots(tmp_path):
    task = make_task("New York City")
    steps = steps_for(task, tmp_path, n=3)
    with FakeOpenAIServer(reply="Facts hold.\nVerdict: SUCCESS") as server:

        async def go():
            judge = OpenAIJudge(base_url=server.base_url, model="judge-m", max_images=2)
            evaluator = Evaluator(judge=judge)
            try:
                return await evaluator.evaluate(task, "The Big Apple", steps)
            finally:
                await evaluator.aclose()

        reward = asyncio.run(go())
    assert reward.reward == 1.0 and reward.submit
    assert reward.submission_judgment["method"] == "judge"
    assert reward.submission_judgment["verdict"].endswith("Verdict: SUCCESS")
    (body,) = server.requests
    assert body["model"] == "judge-m" and body["temperature"] == 0.0
    system, user = body["messages"]
    assert "Verdict: SUCCESS" in system["content"]
    text = user["content"][0]["text"]
    assert "Task: Find the price of the red kettle" in text
    assert "- the kettle's price is stated: price of red kettle" in text
    assert "Reference answer: New York City" in text
    assert '3. answer("$24")  (on http://127.0.0.1/shop/p2)' in text
    assert "Final answer: The Big Apple" in text
    images = [p["image_url"]["url"] for p in user["content"][1:]]
    assert len(images) == 2  # the last two steps' screenshots
    assert base64.b64decode(images[1].split(",", 1)[1]) == (tmp_path / "s2.png").read_bytes()


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("1. Analysis: wrong item\n2. Verdict: NOT SUCCESS", 0.0),
        ("Verdict: SUCCESS? no. Verdict: NOT SUCCESS", 0.0),  # the last verdict counts
        ("I cannot tell.", 0.0),  # no verdict line: not a success
        ("**Verdict:** SUCCESS", 1.0),
    ],
)
def test_judge_verdict_parsing(tmp_path, reply, expected):
    task = make_task(None, rubric=["the price is stated"])
    with FakeOpenAIServer(reply=reply) as server:

        async def go():
            judge = OpenAIJudge(base_url=server.base_url, model="j")
            try:
                return await Evaluator(judge=judge).evaluate(task, "$24", steps_for(task, tmp_path))
            finally:
                await judge.aclose()

        reward = asyncio.run(go())
    assert reward.reward == expected


def test_judge_not_asked_when_the_reference_matches_or_when_told_not_to(tmp_path):
    task = make_task("$24")
    with FakeOpenAIServer(reply="Verdict: SUCCESS") as server:

        async def go():
            judge = OpenAIJudge(base_url=server.base_url, model="j")
            try:
                right = await Evaluator(judge=judge).evaluate(task, "It is $24", [])
                strict = Evaluator(judge=judge, judge_on_mismatch=False)
                wrong = await strict.evaluate(task, "$30", [])
                return right, wrong
            finally:
                await judge.aclose()

        right, wrong = asyncio.run(go())
    assert right.reward == 1.0 and right.submission_judgment["method"] == "numeric"
    assert wrong.reward == 0.0 and wrong.submission_judgment["method"] == "no_match"
    assert server.requests == []


def test_judge_server_failure_keeps_the_trajectory_with_reward_zero_and_the_reason(tmp_path):
    task = make_task(None)
    with FakeOpenAIServer() as server:
        server.fail_next(401, message="invalid api key")

        async def go():
            judge = OpenAIJudge(base_url=server.base_url, model="j")
            try:
                return await Evaluator(judge=judge).evaluate(task, "$24", steps_for(task, tmp_path))
            finally:
                await judge.aclose()

        reward = asyncio.run(go())
    assert reward.reward == 0.0
    assert "judge failed" in reward.evaluation and "HTTP 401: invalid api key" in reward.evaluation
    assert reward.submission_judgment["error"]


def test_missing_screenshot_is_left_out_of_the_judge_request(tmp_path):
    task = make_task(None)
    steps = steps_for(task, tmp_path, n=2)
    (tmp_path / "s1.png").unlink()
    judge = OpenAIJudge(base_url="http://127.0.0.1:1/v1", model="j", max_images=4)
    parts = judge.messages(task, "x", steps)[1]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url"]
    asyncio.run(judge.aclose())


def test_judge_needs_a_client_or_a_server():
    with pytest.raises(ConfigError, match="OpenAIJudge needs"):
        OpenAIJudge()
    with pytest.raises(ConfigError, match="max_images"):
        OpenAIJudge(base_url="http://127.0.0.1:1/v1", model="j", max_images=-1)


def test_one_answer_listing_every_reference_scores_none_of_the_suite() -> None:
    """A guess at several answers is not an answer: the string that lists every reference
    answer of the bundled suite used to score 16 of 16 by containment."""
    import asyncio

    from replaystore.pipeline.task_sampler import load_tasks
    from replaystore.rollouts.sites.server import TASKS_FILE

    tasks = load_tasks(TASKS_FILE)
    assert len(tasks) == 16
    everything = ", ".join(str(t.reference_answer) for t in tasks)
    evaluator = Evaluator()

    async def score(answer: str) -> list[float]:
        return [float((await evaluator.evaluate(t, answer, [])).reward) for t in tasks]

    assert sum(asyncio.run(score(everything))) == 0
    assert sum(asyncio.run(score(everything.replace(", ", " or ")))) == 0
    assert sum(asyncio.run(score(everything.replace(", ", "\n")))) == 0
    # Each task's own reference still scores, alone or in a sentence.
    own = [asyncio.run(evaluator.evaluate(t, f"It is {t.reference_answer}.", [])) for t in tasks]
    assert all(r.reward == 1.0 for r in own)


@pytest.mark.parametrize(
    ("answer", "matched"),
    [
        ("$39.99", True),
        ("The kettle costs $39.99", True),
        ("$39.99 or $24", False),
        ("24, 39.99", False),
        ("$1,299.00", False),  # one number, not the reference's
        ("$39.99; $39.99", True),  # the same answer twice is still one answer
    ],
)
def test_numeric_answers_must_not_hedge(answer: str, matched: bool) -> None:
    assert (match_reference(answer, ["$39.99"]) is not None) is matched


@pytest.mark.parametrize(
    ("answer", "matched"),
    [
        ("Desk Lamp or Floor Lamp", False),
        ("Desk Lamp / Floor Lamp", False),
        ("Floor Lamp, Desk Lamp, Wall Lamp", False),
        ("the Desk Lamp, under $30", True),
        ("Desk Lamp or desk lamp", True),
    ],
)
def test_text_answers_that_hedge_between_candidates_do_not_match(
    answer: str, matched: bool
) -> None:
    assert (match_reference(answer, ["Desk Lamp"]) is not None) is matched
