"""Turn a model's raw text into a :class:`Response` with parsed fields (WebGym's decomposer).

``decompose_raw_response(raw_response, model_interface, raw_prompt="")`` calls
``model_interface.parse_response(raw_response)`` exactly as WebGym does and
stores the result as ``Response.answering_tokens``. The return shape is always:

``answering_tokens: dict[str, Any]`` whose ``"action"`` entry (when present) is
the action text that :func:`get_action_string` returns.

The built-in parsers below are ready-made model interfaces: each has a
``parse_response(raw) -> dict[str, str]`` method, returns string fields only
(``"action"`` always, ``"thought"`` when the format has one, plus any other
fields of the format) and raises :class:`ValueError` naming what is missing
when the text does not follow the format.

============================  =======================================================
parser                        accepted text
============================  =======================================================
:class:`ThinkActionParser`    ``<think>reasoning</think> ... Action: click [3]``
:class:`JSONResponseParser`   ``{"thought": "...", "action": "..."}``, bare or in a
                              ```` ```json ```` fence, with text around it
:class:`TagParser`            ``<thought>...</thought><action>...</action>`` (any tags)
============================  =======================================================
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from replaystore.trajectories.components import Action, Response

__all__ = [
    "JSONResponseParser",
    "ModelInterface",
    "TagParser",
    "ThinkActionParser",
    "decompose_raw_response",
    "get_action_string",
]


class ModelInterface(Protocol):
    """Anything with ``parse_response(raw_response)`` returning a mapping of fields or an
    :class:`Action`."""

    def parse_response(self, raw_response: str) -> Mapping[str, Any] | Action: ...


def decompose_raw_response(
    raw_response: str, model_interface: ModelInterface | None = None, raw_prompt: str = ""
) -> Response:
    """Parse ``raw_response`` with ``model_interface.parse_response`` into a :class:`Response`.

    ``answering_tokens`` is a ``dict``: the mapping ``parse_response`` returned
    (copied), or, when it returned an :class:`Action`, ``{"action":
    action.action_string, "parsed_action": action.action}``.

    Raises:
        ValueError: ``model_interface`` is ``None`` (as in WebGym), or its parser
            rejects the text (the parser's message names what is missing).
        TypeError: ``raw_response`` is not a string, or ``parse_response`` returned
            something other than a mapping or an :class:`Action`.
    """
    if model_interface is None:
        raise ValueError("model_interface is required for response parsing")
    if not isinstance(raw_response, str):
        raise TypeError(f"raw_response must be a str, got {type(raw_response).__name__}")
    parsed = model_interface.parse_response(raw_response)
    if isinstance(parsed, Action):
        action_text = parsed.action_string if parsed.action_string is not None else ""
        tokens: dict[str, Any] = {"action": action_text, "parsed_action": parsed.action}
    elif isinstance(parsed, Mapping):
        tokens = dict(parsed)
    else:
        raise TypeError(
            f"{type(model_interface).__name__}.parse_response returned "
            f"{type(parsed).__name__}; expected a mapping of fields or an Action"
        )
    return Response(raw_response=raw_response, answering_tokens=tokens, raw_prompt=raw_prompt)


def get_action_string(response: Response) -> str:
    """The ``"action"`` field of ``response.answering_tokens`` as text; ``""`` when absent.

    Non-string actions (e.g. a dict kept by a custom parser) are JSON-encoded.
    """
    tokens = response.answering_tokens
    if not isinstance(tokens, Mapping):
        return ""
    action = tokens.get("action", "")
    if action is None:
        return ""
    if isinstance(action, str):
        return action
    return json.dumps(action, ensure_ascii=False, sort_keys=True)


def _preview(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


class ThinkActionParser:
    """``<think>reasoning</think>`` followed by an ``Action: ...`` line.

    Returns ``{"thought": reasoning, "action": text}``: the reasoning with
    surrounding whitespace stripped (``""`` when there is no think block), and
    everything after the last ``Action:`` marker outside the think block,
    stripped. A response with only a closing ``</think>`` (chat templates that
    put the opening tag in the prompt) counts everything before it as the thought.

    Args:
        action_marker: the marker that introduces the action (matched case-insensitively).
        require_thought: reject responses without a think block.
    """

    def __init__(self, action_marker: str = "Action:", *, require_thought: bool = False) -> None:
        if not action_marker.strip():
            raise ValueError("action_marker must be non-empty")
        self.action_marker = action_marker
        self.require_thought = require_thought
        self._marker = re.compile(re.escape(action_marker), re.IGNORECASE)

    def parse_response(self, raw_response: str) -> dict[str, str]:
        """Split ``raw_response`` into thought and action.

        Raises:
            ValueError: an unclosed ``<think>``, a missing think block when
                required, or no action marker / an empty action after it.
        """
        text = raw_response
        thought = ""
        open_at = text.find("<think>")
        close_at = text.find("</think>")
        if open_at >= 0 and (close_at < 0 or close_at < open_at):
            raise ValueError(f"unclosed <think> block in response {_preview(text)}")
        if close_at >= 0:
            start = open_at + len("<think>") if open_at >= 0 else 0
            thought = text[start:close_at].strip()
            text = text[close_at + len("</think>") :]
        elif self.require_thought:
            raise ValueError(f"missing <think>...</think> block in response {_preview(text)}")
        markers = list(self._marker.finditer(text))
        if not markers:
            raise ValueError(
                f"missing {self.action_marker!r} after the reasoning in response {_preview(text)}"
            )
        action = text[markers[-1].end() :].strip()
        if not action:
            raise ValueError(f"empty action after {self.action_marker!r} in response")
        return {"thought": thought, "action": action}


_FENCE = re.compile(r"```(?:json)?\s*\n?(.*?)```", re.DOTALL | re.IGNORECASE)


class JSONResponseParser:
    """A JSON object such as ``{"thought": "...", "action": "..."}``.

    The object may stand alone, sit in a ```` ```json ```` (or bare ```` ``` ````)
    fence, or be surrounded by other text (the first decodable object is used).
    Every top-level field is returned; string values as they are, other values
    JSON-encoded, so the result is always ``dict[str, str]``.

    Args:
        required: fields that must be present and non-empty (default: ``("action",)``).
    """

    def __init__(self, required: Sequence[str] = ("action",)) -> None:
        self.required = tuple(required)

    def parse_response(self, raw_response: str) -> dict[str, str]:
        """Decode the JSON object in ``raw_response``.

        Raises:
            ValueError: no JSON object found, or a required field missing or empty.
        """
        obj = self._find_object(raw_response)
        if obj is None:
            raise ValueError(f"no JSON object found in response {_preview(raw_response)}")
        fields = {
            str(key): value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            for key, value in obj.items()
        }
        for name in self.required:
            if name not in obj:
                raise ValueError(f"JSON response has no {name!r} field (fields: {sorted(obj)})")
            if obj[name] is None or not fields[name].strip():
                raise ValueError(f"JSON response has an empty {name!r} field")
        return fields

    @staticmethod
    def _find_object(text: str) -> dict[str, Any] | None:
        candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
        decoder = json.JSONDecoder()
        for candidate in candidates:
            start = candidate.find("{")
            while start >= 0:
                try:
                    obj, _ = decoder.raw_decode(candidate, start)
                except json.JSONDecodeError:
                    start = candidate.find("{", start + 1)
                    continue
                if isinstance(obj, dict):
                    return obj
                start = candidate.find("{", start + 1)
        return None


_TAG = re.compile(r"<([A-Za-z_][\w-]*)>(.*?)</\1>", re.DOTALL)


class TagParser:
    """Fields written as ``<tag>value</tag>``, e.g. ``<thought>..</thought><action>..</action>``.

    Returns every well-formed tag found (first occurrence wins, values stripped),
    or only ``tags`` when given.

    Args:
        tags: the field names to return (``None``: all found).
        required: fields that must be present and non-empty (default: ``("action",)``).
    """

    def __init__(
        self, tags: Sequence[str] | None = None, required: Sequence[str] = ("action",)
    ) -> None:
        self.tags = None if tags is None else tuple(tags)
        self.required = tuple(required)

    def parse_response(self, raw_response: str) -> dict[str, str]:
        """Extract the tagged fields of ``raw_response``.

        Raises:
            ValueError: a required tag is missing, unclosed or empty.
        """
        found: dict[str, str] = {}
        for match in _TAG.finditer(raw_response):
            found.setdefault(match.group(1), match.group(2).strip())
        for name in self.required:
            if name not in found:
                state = "unclosed" if f"<{name}>" in raw_response else "missing"
                raise ValueError(
                    f"{state} <{name}>...</{name}> field in response {_preview(raw_response)}"
                )
            if not found[name]:
                raise ValueError(f"empty <{name}> field in response")
        if self.tags is None:
            return found
        return {name: found[name] for name in self.tags if name in found}
