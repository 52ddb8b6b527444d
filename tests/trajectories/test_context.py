"""ConversationBuilder: prompt messages from task, previous steps and current observation."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaystore.errors import ImageError, TrajectoryError
from replaystore.pipeline.images import image_to_data_url
from replaystore.trajectories.components import step_to_dict
from replaystore.trajectories.context import ConversationBuilder


def check_openai_chat(messages: list[dict]) -> None:
    """OpenAI chat-completions message rules, plus system-first and strict alternation."""
    assert isinstance(messages, list) and messages
    assert messages[0]["role"] == "system" and isinstance(messages[0]["content"], str)
    rest = messages[1:]
    for i, message in enumerate(rest):
        assert set(message) == {"role", "content"}
        assert message["role"] == ("user" if i % 2 == 0 else "assistant")
        content = message["content"]
        if message["role"] == "assistant":
            assert isinstance(content, str)
            continue
        assert isinstance(content, list) and content
        for part in content:
            assert part["type"] in ("text", "image_url")
            if part["type"] == "text":
                assert set(part) == {"type", "text"} and isinstance(part["text"], str)
            else:
                assert set(part) == {"type", "image_url"}
                assert set(part["image_url"]) == {"url"}
                assert part["image_url"]["url"].startswith(("file:///", "data:image/"))
    assert rest[-1]["role"] == "user"


def texts(message: dict) -> list[str]:
    return [p["text"] for p in message["content"] if p["type"] == "text"]


def image_urls(message: dict) -> list[str]:
    return [p["image_url"]["url"] for p in message["content"] if p["type"] == "image_url"]


@pytest.fixture
def steps(trajectory_factory):
    """Seven steps of one trajectory: six as history, the seventh's observation is current."""
    return trajectory_factory.trajectory(7)


def build(builder: ConversationBuilder, steps: list[dict], n_history: int) -> list[dict]:
    current = steps[n_history]["observation"]
    return builder.build(current.task, steps[:n_history], current)


def test_layout_with_short_history(steps):
    messages = build(ConversationBuilder(system_prompt="SYS"), steps, 2)
    check_openai_chat(messages)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert messages[0]["content"] == "SYS"
    for k, step in enumerate(steps[:2]):
        user, assistant = messages[1 + 2 * k], messages[2 + 2 * k]
        assert texts(user) == [
            f"Step {k + 1} observation\nURL: https://example.com/page/{k}\nTitle: Store page {k}"
        ]
        assert image_urls(user) == [Path(step["observation"].image_path).as_uri()]
        assert assistant["content"] == step["response"].raw_response
    final = messages[-1]
    assert image_urls(final) == [Path(steps[2]["observation"].image_path).as_uri()]
    assert texts(final) == [
        f"Task: {steps[2]['observation'].task.task_name}\nCurrent step: 3\n"
        "URL: https://example.com/page/2\nTitle: Store page 2\n"
        "Accessibility tree:\n[1] link 'Home'\n[4] button 'Next'"
    ]


def test_history_window_keeps_last_rounds_and_summarises_older_steps(steps):
    messages = build(ConversationBuilder(history_window=2), steps, 6)
    check_openai_chat(messages)
    assert len(messages) == 1 + 2 * 2 + 1
    first_round = messages[1]
    assert texts(first_round)[0] == (
        "Previous steps (summarised):\n"
        "Step 1: click [2]\nStep 2: click [3]\nStep 3: click [4]\nStep 4: click [5]"
    )
    assert texts(first_round)[1].startswith("Step 5 observation")
    assert texts(messages[3]) == [texts(messages[3])[0]]
    assert texts(messages[3])[0].startswith("Step 6 observation")
    assert [m["content"] for m in messages[2:5:2]] == [
        steps[4]["response"].raw_response,
        steps[5]["response"].raw_response,
    ]
    assert "Current step: 7" in texts(messages[-1])[0]


def test_history_shorter_than_window_has_no_summary(steps):
    messages = build(ConversationBuilder(history_window=4), steps, 4)
    assert len(messages) == 1 + 2 * 4 + 1
    user_texts = [t for m in messages[1:] if m["role"] == "user" for t in texts(m)]
    assert not any("summarised" in t for t in user_texts)


def test_window_zero_puts_the_summary_in_the_final_message(steps):
    messages = build(ConversationBuilder(history_window=0), steps, 3)
    check_openai_chat(messages)
    assert [m["role"] for m in messages] == ["system", "user"]
    summary, current = texts(messages[1])
    assert summary.splitlines()[1:] == [
        "Step 1: click [2]",
        "Step 2: click [3]",
        "Step 3: click [4]",
    ]
    assert current.startswith("Task: ")


def test_summary_falls_back_to_the_response_action_when_no_action_string(trajectory_factory):
    task = trajectory_factory.task()
    step = trajectory_factory.step(task, trajectory_factory.screenshot(1))
    step["action"].action_string = None
    step["response"].answering_tokens = {"action": "type 'shoes'"}
    current = trajectory_factory.step(task, trajectory_factory.screenshot(2), index=1)
    messages = ConversationBuilder(history_window=0).build(task, [step], current["observation"])
    assert texts(messages[1])[0].endswith("Step 1: type 'shoes'")


def test_base64_images_on_request(steps):
    messages = build(ConversationBuilder(image_format="base64", history_window=1), steps, 2)
    check_openai_chat(messages)
    assert image_urls(messages[1]) == [image_to_data_url(steps[1]["observation"].image_path)]
    assert image_urls(messages[-1]) == [image_to_data_url(steps[2]["observation"].image_path)]


def test_accessibility_tree_is_truncated_with_a_note(trajectory_factory):
    task = trajectory_factory.task()
    step = trajectory_factory.step(task, trajectory_factory.screenshot(1))
    step["observation"].ac_tree = "x" * 50
    messages = ConversationBuilder(max_ac_tree_chars=20).build(task, [], step["observation"])
    assert texts(messages[-1])[0].endswith(
        "Accessibility tree:\n" + "x" * 20 + "\n... [truncated 30 characters]"
    )
    without = ConversationBuilder(include_ac_tree=False).build(task, [], step["observation"])
    assert "Accessibility tree" not in texts(without[-1])[0]


def test_observation_without_screenshot_or_metadata_has_text_only(trajectory_factory):
    task = trajectory_factory.task()
    step = trajectory_factory.step(task, "", page_metadata={}, raw_prompt=False)
    messages = ConversationBuilder().build(task, [], step["observation"])
    check_openai_chat(messages)
    assert image_urls(messages[-1]) == []
    assert "URL:" not in texts(messages[-1])[0]


def test_history_as_json_dicts_builds_the_same_messages(steps):
    builder = ConversationBuilder(history_window=2)
    current = steps[5]["observation"]
    as_dicts = [step_to_dict(s) for s in steps[:5]]
    assert builder.build(current.task.to_dict(), as_dicts, current.to_dict()) == build(
        builder, steps, 5
    )


def test_missing_history_screenshot_names_the_step(steps):
    Path(steps[1]["observation"].image_path).unlink()
    with pytest.raises(TrajectoryError, match="history step 2"):
        build(ConversationBuilder(), steps, 3)


def test_malformed_history_step_names_the_step(steps):
    broken = dict(steps[0])
    del broken["reward"]
    with pytest.raises(TrajectoryError, match=r"history step 1.*reward"):
        ConversationBuilder().build(steps[1]["observation"].task, [broken], steps[1]["observation"])


def test_missing_current_screenshot_is_an_image_error(steps):
    Path(steps[2]["observation"].image_path).unlink()
    with pytest.raises(ImageError, match=Path(steps[2]["observation"].image_path).name):
        build(ConversationBuilder(), steps, 2)


@pytest.mark.parametrize(
    "kwargs",
    [{"history_window": -1}, {"image_format": "png"}, {"max_ac_tree_chars": -5}],
)
def test_invalid_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        ConversationBuilder(**kwargs)


def test_buffer_uses_the_builder_for_prompts_it_did_not_keep(trajectory_factory):
    from replaystore.trajectories.buffer import ReplayBuffer

    trajectory = trajectory_factory.trajectory(3, raw_prompt=False)
    builder = ConversationBuilder(history_window=1)
    buffer = ReplayBuffer([trajectory], agent=builder, filter_same_screenshot=False)
    for i in range(3):
        current = trajectory[i]["observation"]
        expected = builder.build(current.task, trajectory[:i], current)
        assert buffer[i]["message"] == expected
        check_openai_chat(buffer[i]["message"])


# --------------------------------------------------------------------------- text mode


def test_text_mode_has_no_image_parts_and_one_string_per_user_message(steps):
    messages = build(ConversationBuilder(observation="text", history_window=2), steps, 6)
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert all(isinstance(m["content"], str) for m in messages)
    assert not any("file://" in m["content"] or "data:image" in m["content"] for m in messages)
    # the text parts of the screenshot layout, joined with newlines
    with_images = build(ConversationBuilder(history_window=2), steps, 6)
    for text_message, image_message in zip(messages[1:], with_images[1:], strict=True):
        if text_message["role"] == "user":
            assert text_message["content"] == "\n".join(texts(image_message))
        else:
            assert text_message == image_message


def test_text_mode_keeps_url_title_and_accessibility_tree(steps):
    final = build(ConversationBuilder(observation="text"), steps, 2)[-1]["content"]
    assert final == (
        f"Task: {steps[2]['observation'].task.task_name}\nCurrent step: 3\n"
        "URL: https://example.com/page/2\nTitle: Store page 2\n"
        "Accessibility tree:\n[1] link 'Home'\n[4] button 'Next'"
    )


def test_text_mode_default_system_prompt_mentions_no_screenshot_and_states_the_actions(steps):
    from replaystore.trajectories.context import DEFAULT_TEXT_SYSTEM_PROMPT

    system = build(ConversationBuilder(observation="text"), steps, 1)[0]["content"]
    assert system == DEFAULT_TEXT_SYSTEM_PROMPT
    assert "screenshot" not in system.lower() and "text of a web page" in system
    # It states the action grammar a text model answers in (element ids, BrowserGym's names).
    for action in ('click("12")', 'fill("12", "text")', "select_option(", 'answer("text")'):
        assert action in system
    assert build(ConversationBuilder(observation="text", system_prompt="S"), steps, 1)[0] == {
        "role": "system",
        "content": "S",
    }


def test_text_mode_prompt_is_byte_stable_and_needs_no_screenshot_files(steps):
    import json

    builder = ConversationBuilder(observation="text")
    first = json.dumps(build(builder, steps, 3)).encode()
    for step in steps[:4]:  # screenshots are not read: removing them changes nothing
        Path(step["observation"].image_path).unlink()
    assert json.dumps(build(ConversationBuilder(observation="text"), steps, 3)).encode() == first


def test_unknown_observation_mode_is_refused():
    with pytest.raises(ValueError, match="observation must be 'screenshot' or 'text'"):
        ConversationBuilder(observation="pixels")  # type: ignore[arg-type]


def test_prompts_leave_out_a_loopback_servers_port():
    from replaystore.trajectories.context import display_url

    assert display_url("http://shop.localhost:41234/p?q=1") == "http://shop.localhost/p?q=1"
    assert display_url("http://127.0.0.1:5000/miniwob/a.html") == "http://127.0.0.1/miniwob/a.html"
    assert display_url("http://[::1]:80/") == "http://[::1]/"
    # A real site's port is part of its address.
    assert display_url("https://example.com:8443/x") == "https://example.com:8443/x"
    assert display_url("https://example.com/x") == "https://example.com/x"
