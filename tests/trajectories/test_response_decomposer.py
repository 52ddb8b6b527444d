"""decompose_raw_response / get_action_string and the built-in response parsers."""

from __future__ import annotations

import pytest

from replaystore.trajectories.components import Action, Response
from replaystore.trajectories.response_decomposer import (
    JSONResponseParser,
    TagParser,
    ThinkActionParser,
    decompose_raw_response,
    get_action_string,
)


def test_decompose_requires_a_model_interface():
    with pytest.raises(ValueError, match="model_interface is required"):
        decompose_raw_response("Action: click [1]", None)


def test_decompose_keeps_raw_text_prompt_and_parsed_fields():
    raw = "<think>find the link</think>\nAction: click [3]"
    response = decompose_raw_response(raw, ThinkActionParser(), raw_prompt='[{"role": "user"}]')
    assert response == Response(
        raw_response=raw,
        answering_tokens={"thought": "find the link", "action": "click [3]"},
        raw_prompt='[{"role": "user"}]',
    )
    assert get_action_string(response) == "click [3]"


def test_model_interface_returning_an_action_is_stored_as_fields():
    class ActionInterface:
        def parse_response(self, raw):
            return Action(action={"key": "type", "text": raw}, action_string=f"type {raw}")

    response = decompose_raw_response("hello", ActionInterface())
    assert response.answering_tokens == {
        "action": "type hello",
        "parsed_action": {"key": "type", "text": "hello"},
    }
    assert get_action_string(response) == "type hello"


def test_model_interface_returning_something_else_is_a_type_error():
    class Bad:
        def parse_response(self, raw):
            return ["click"]

    with pytest.raises(TypeError, match=r"Bad\.parse_response returned list"):
        decompose_raw_response("x", Bad())


def test_get_action_string_defaults_and_encodes_non_strings():
    assert get_action_string(Response("r", {}, "")) == ""
    assert get_action_string(Response("r", [1, 2, 3], "")) == ""
    assert get_action_string(Response("r", {"action": None}, "")) == ""
    assert get_action_string(Response("r", {"action": {"key": "click", "id": 2}}, "")) == (
        '{"id": 2, "key": "click"}'
    )


# ThinkActionParser


def test_think_action_takes_last_action_marker_after_the_thought():
    raw = "<think>Action: not this one</think>\nI will click.\naction: click [5]\n"
    assert ThinkActionParser().parse_response(raw) == {
        "thought": "Action: not this one",
        "action": "click [5]",
    }


def test_think_action_accepts_closing_tag_only_and_no_thought():
    assert ThinkActionParser().parse_response("plan it</think>Action: scroll down") == {
        "thought": "plan it",
        "action": "scroll down",
    }
    assert ThinkActionParser().parse_response("Action: go back") == {
        "thought": "",
        "action": "go back",
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("<think>never closed Action: click [1]", "unclosed <think>"),
        ("<think>done</think> I am not sure", "missing 'Action:'"),
        ("<think>done</think> Action:   ", "empty action"),
    ],
)
def test_think_action_malformed_input_names_what_is_missing(raw, message):
    with pytest.raises(ValueError, match=message):
        ThinkActionParser().parse_response(raw)


def test_think_action_can_require_the_thought_and_use_another_marker():
    parser = ThinkActionParser("Next step:", require_thought=True)
    with pytest.raises(ValueError, match="missing <think>"):
        parser.parse_response("Next step: click [1]")
    assert parser.parse_response("<think>t</think>Next step: click [1]")["action"] == "click [1]"


# JSONResponseParser


def test_json_parser_reads_bare_object_and_encodes_non_string_fields():
    raw = '{"thought": "search first", "action": {"key": "type", "text": "shoes"}, "n": 2}'
    assert JSONResponseParser().parse_response(raw) == {
        "thought": "search first",
        "action": '{"key": "type", "text": "shoes"}',
        "n": "2",
    }


def test_json_parser_reads_fenced_object_with_text_around():
    raw = 'Sure.\n```json\n{"thought": "t", "action": "click [9]"}\n```\nDone {not json}'
    assert JSONResponseParser().parse_response(raw) == {"thought": "t", "action": "click [9]"}


def test_json_parser_skips_braces_that_are_not_json():
    raw = 'Set {x} first, then {"action": "stop"}'
    assert JSONResponseParser().parse_response(raw) == {"action": "stop"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("no json here", "no JSON object"),
        ('{"thought": "only thinking"}', "no 'action' field"),
        ('{"action": ""}', "empty 'action'"),
        ('{"action": null}', "empty 'action'"),
        ('["action", "click"]', "no JSON object"),
    ],
)
def test_json_parser_malformed_input_names_what_is_missing(raw, message):
    with pytest.raises(ValueError, match=message):
        JSONResponseParser().parse_response(raw)


def test_json_parser_checks_configured_required_fields():
    with pytest.raises(ValueError, match="no 'thought' field"):
        JSONResponseParser(required=("thought", "action")).parse_response('{"action": "a"}')


# TagParser


def test_tag_parser_returns_all_tags_first_occurrence_wins():
    raw = "<thought> look </thought>\n<action>click [2]</action><action>later</action>"
    assert TagParser().parse_response(raw) == {"thought": "look", "action": "click [2]"}


def test_tag_parser_can_select_tags():
    raw = "<thought>x</thought><action>a</action><memo>m</memo>"
    assert TagParser(tags=("action", "memo")).parse_response(raw) == {"action": "a", "memo": "m"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("<thought>x</thought>", "missing <action>"),
        ("<action>click [1]", "unclosed <action>"),
        ("<action>  </action>", "empty <action>"),
    ],
)
def test_tag_parser_malformed_input_names_what_is_missing(raw, message):
    with pytest.raises(ValueError, match=message):
        TagParser().parse_response(raw)


@pytest.mark.parametrize(
    ("parser", "raw"),
    [
        (ThinkActionParser(), "<think>t</think>Action: click [4]"),
        (JSONResponseParser(), '{"thought": "t", "action": "click [4]"}'),
        (TagParser(), "<thought>t</thought><action>click [4]</action>"),
    ],
)
def test_each_builtin_parser_is_a_model_interface(parser, raw):
    response = decompose_raw_response(raw, parser)
    assert get_action_string(response) == "click [4]"
    assert response.answering_tokens["thought"] == "t"
