"""Prompt messages for a web agent: task + previous steps + current observation.

:class:`ConversationBuilder` is what the trajectory buffer calls (as
``agent.conversation_builder`` or ``agent`` itself) to rebuild a prompt that was
not kept in ``Response.raw_prompt``. Its output is a list of OpenAI-style chat
messages, alternating user/assistant after the system message and ending on the
user turn the model answers, so it is valid input for a chat model and, with the
response appended, a valid LLaMA-Factory conversation.

Message layout for a history of ``n`` steps and ``history_window`` = ``w``
(``k = max(0, n - w)`` older steps are summarised, steps are numbered from 1)::

    [0]  {"role": "system", "content": system_prompt}                         (str)
    for each of the last min(n, w) steps s = k+1 .. n:
         {"role": "user", "content": [
             {"type": "text", "text": <summary of steps 1..k, first round only>},
             {"type": "text", "text": "Step s observation\\nURL: ...\\nTitle: ..."},
             {"type": "image_url", "image_url": {"url": <step s screenshot>}},
         ]}
         {"role": "assistant", "content": <step s response.raw_response>}    (str)
    last {"role": "user", "content": [
             {"type": "text", "text": <summary, only when there is no round>},
             {"type": "text", "text": "Task: ...\\nCurrent step: n+1\\nURL: ...\\nTitle: ...
                                     \\nAccessibility tree:\\n..."},
             {"type": "image_url", "image_url": {"url": <current screenshot>}},
         ]}

With ``observation="text"`` no image part is built anywhere and every user
message's content is one string: its text parts above joined with ``"\\n"``
(summary, then the step's text). The default system prompt is then
:data:`DEFAULT_TEXT_SYSTEM_PROMPT`, which mentions no screenshot. The prompt
holds nothing but the task, the page's URL, title and accessibility tree and the
previous replies: no paths and no clock, so the same page gives the same bytes.

The summary text is ``"Previous steps (summarised):"`` followed by one line per
older step: ``"Step 3: click [12]"`` (the action string, see
:func:`_action_text`). URL/Title lines appear only when ``page_metadata`` has
them; an image part only when the observation has an ``image_path``. The
accessibility tree is cut to ``max_ac_tree_chars`` characters, with a
``"... [truncated N characters]"`` line saying how much was cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from replaystore.errors import ArgumentError, ImageError, SchemaError, TrajectoryError
from replaystore.images import image_to_data_url, image_to_file_url
from replaystore.trajectories.components import Observation, Step, Task
from replaystore.trajectories.response_decomposer import get_action_string

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "DEFAULT_TEXT_SYSTEM_PROMPT",
    "OBSERVATION_MODES",
    "ConversationBuilder",
    "ObservationMode",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a web agent. You see a screenshot and the accessibility tree of a web page "
    "and complete the user's task one browser action at a time. Think step by step, then "
    "give exactly one action."
)
#: The default system prompt of ``observation="text"`` (a text-only model sees no screenshot).
DEFAULT_TEXT_SYSTEM_PROMPT = (
    "You are a web agent. You see the URL, the title and the text of a web page, one line "
    "per element or text, each ending with its id (button 'Submit' id=12). Complete the "
    "user's task one browser action at a time. Think step by step, then give exactly one "
    'action after "Action: ", one of: click("12"), fill("12", "text"), '
    'select_option("12", "option"), press("12", "Enter"), scroll(0, 300), answer("text").'
)

#: What the model is shown of a page: ``screenshot`` (image + accessibility tree and URL)
#: or ``text`` (accessibility tree and URL only, for text-only models).
ObservationMode = Literal["screenshot", "text"]
OBSERVATION_MODES: tuple[str, ...] = ("screenshot", "text")


def _action_text(step: Step) -> str:
    """The action string of a step: ``action.action_string``, else the response's action."""
    if step.action.action_string:
        return step.action.action_string
    from_response = get_action_string(step.response)
    if from_response:
        return from_response
    return "" if step.action.action is None else str(step.action.action)


class ConversationBuilder:
    """Builds the chat messages a web agent is prompted with (layout in the module docstring).

    Args:
        system_prompt: content of the first (system) message (default:
            :data:`DEFAULT_SYSTEM_PROMPT`, or :data:`DEFAULT_TEXT_SYSTEM_PROMPT` in text mode).
        history_window: how many of the most recent previous steps appear as full
            rounds (screenshot + response); older steps become one summary line each.
        image_format: ``"file"`` for ``file://`` URLs (vLLM reads the file; the
            prompt stays small), ``"base64"`` for data URLs (self-contained; each
            screenshot costs about 4/3 of its file size in the prompt).
        max_ac_tree_chars: the current accessibility tree is cut to this many characters.
        include_ac_tree: put the accessibility tree in the final user message at all.
        observation: ``"screenshot"`` (image parts, content as a list of parts) or
            ``"text"`` (no image parts, each user message's content one string; for
            a model that reads no images).

    Cost of :meth:`build`: O(history length) for the summary, plus reading each
    screenshot in the window when ``image_format="base64"``.
    """

    def __init__(
        self,
        system_prompt: str | None = None,
        history_window: int = 4,
        image_format: Literal["file", "base64"] = "file",
        *,
        max_ac_tree_chars: int = 4000,
        include_ac_tree: bool = True,
        observation: ObservationMode = "screenshot",
    ) -> None:
        if not isinstance(history_window, int) or history_window < 0:
            raise ArgumentError(f"history_window must be an int >= 0, got {history_window!r}")
        if image_format not in ("file", "base64"):
            raise ArgumentError(f"image_format must be 'file' or 'base64', got {image_format!r}")
        if not isinstance(max_ac_tree_chars, int) or max_ac_tree_chars < 0:
            raise ArgumentError(f"max_ac_tree_chars must be an int >= 0, got {max_ac_tree_chars!r}")
        if observation not in OBSERVATION_MODES:
            raise ArgumentError(f"observation must be 'screenshot' or 'text', got {observation!r}")
        if system_prompt is None:
            system_prompt = (
                DEFAULT_TEXT_SYSTEM_PROMPT if observation == "text" else DEFAULT_SYSTEM_PROMPT
            )
        self.observation: ObservationMode = observation
        self.system_prompt = system_prompt
        self.history_window = history_window
        self.image_format = image_format
        self.max_ac_tree_chars = max_ac_tree_chars
        self.include_ac_tree = include_ac_tree

    def build(
        self,
        task: Task | Mapping[str, Any],
        history: Sequence[Mapping[str, Any] | Step],
        observation: Observation | Mapping[str, Any],
    ) -> list[dict[str, Any]]:
        """The prompt messages for acting on ``observation`` after ``history``.

        Args:
            task: the task (a :class:`Task` or its dict).
            history: the trajectory's previous steps, oldest first (step mappings,
                :class:`Step` objects, or their JSON dicts).
            observation: what the agent sees now.

        Raises:
            TrajectoryError: a history step is malformed or its screenshot is missing
                (the step number is named).
            SchemaError: ``task`` or ``observation`` is malformed.
            ImageError: the current screenshot is missing or not an image.
        """
        task = Task.from_dict(task)
        observation = Observation.from_dict(observation)
        steps: list[Step] = []
        for i, step in enumerate(history):
            try:
                steps.append(Step.from_mapping(step))
            except SchemaError as exc:
                raise TrajectoryError(f"history step {i + 1}: {exc}") from exc

        cut = max(0, len(steps) - self.history_window)
        summary = self._summary(steps[:cut])
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
        for number, step in enumerate(steps[cut:], start=cut + 1):
            parts = []
            if summary is not None:
                parts.append(summary)
                summary = None
            parts.append(_text(f"Step {number} observation{_page_lines(step.observation)}"))
            try:
                parts.extend(self._image_parts(step.observation))
            except ImageError as exc:
                raise TrajectoryError(f"history step {number}: {exc}") from exc
            messages.append({"role": "user", "content": self._content(parts)})
            messages.append({"role": "assistant", "content": step.response.raw_response})

        final = [] if summary is None else [summary]
        final.append(_text(self._current_text(task, observation, len(steps) + 1)))
        final.extend(self._image_parts(observation))
        messages.append({"role": "user", "content": self._content(final)})
        return messages

    def _content(self, parts: list[dict[str, Any]]) -> list[dict[str, Any]] | str:
        """A user message's content: the parts, or (text mode) their texts as one string."""
        if self.observation == "text":
            return "\n".join(part["text"] for part in parts)
        return parts

    @staticmethod
    def _summary(older: Sequence[Step]) -> dict[str, str] | None:
        if not older:
            return None
        lines = [f"Step {i}: {_action_text(step)}" for i, step in enumerate(older, start=1)]
        return _text("Previous steps (summarised):\n" + "\n".join(lines))

    def _image_parts(self, observation: Observation) -> list[dict[str, Any]]:
        if self.observation == "text" or not observation.image_path:
            return []
        if self.image_format == "base64":
            url = image_to_data_url(observation.image_path)
        else:
            url = image_to_file_url(observation.image_path)
        return [{"type": "image_url", "image_url": {"url": url}}]

    def _current_text(self, task: Task, observation: Observation, number: int) -> str:
        text = f"Task: {task.task_name}\nCurrent step: {number}{_page_lines(observation)}"
        if self.include_ac_tree and observation.ac_tree:
            tree = observation.ac_tree
            if len(tree) > self.max_ac_tree_chars:
                cut = len(tree) - self.max_ac_tree_chars
                tree = f"{tree[: self.max_ac_tree_chars]}\n... [truncated {cut} characters]"
            text += f"\nAccessibility tree:\n{tree}"
        return text


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


_LOOPBACK = ("localhost", "127.0.0.1", "[::1]")


def display_url(url: str) -> str:
    """``url`` as a prompt shows it: a loopback server's port left out
    (``http://shop.localhost:41234/p`` is ``http://shop.localhost/p``), so that
    nothing the model reads depends on the port a local server happened to bind."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is None or not (
        host in _LOOPBACK or host.endswith(".localhost") or host == "::1"
    ):
        return url
    netloc = f"[{host}]" if ":" in host else host
    return urlunsplit(parts._replace(netloc=netloc))


def _page_lines(observation: Observation) -> str:
    meta = observation.page_metadata or {}
    lines = ""
    if meta.get("url"):
        lines += f"\nURL: {display_url(str(meta['url']))}"
    if meta.get("title"):
        lines += f"\nTitle: {meta['title']}"
    return lines
