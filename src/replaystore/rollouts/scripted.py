"""A scripted web policy for tests and the demo: it reads the accessibility tree and
follows a known plan, with a skill that improves with the rollout iteration.

It speaks exactly like a model (``<think>...</think>`` then ``Action: ...``, the
grammar of :mod:`replaystore.rollouts.actions`), so everything downstream (the
response decomposer, the collector, the buffer, the export) is exercised as with
a real model. For each suite task it has a plan (``sites/plans.json``): steps
such as "type 'kettle' into the textbox named 'Search products'". At each step
it finds the plan's next element in the observation's tree and acts on it: by its
id in text mode (``click("12")``, ``fill("12", "kettle")``, the page text of
:mod:`~replaystore.rollouts.page_text`), at its centre in screenshot mode; when the
element is not visible it scrolls.

Its mistakes, drawn from a generator seeded by (seed, task, iteration, step):

* a wasted click (on the page's dead *Subscribe* button when there is one,
  else on an empty corner): the next screenshot is the same;
* a wrong final answer.

Both get rarer with the iteration and more frequent with difficulty (see
:meth:`ScriptedPolicy.skill`), so success rates rise over iterations as a
learning policy's would. Progress through the plan is read back from the
trajectory's own previous responses (``history``), as a model would read its history.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .actions import format_action

__all__ = ["ScriptedPolicy", "find_element", "parse_ac_tree"]

_LINE = re.compile(r"^\[(\d+)\] (\S+) '(.*)' @\((-?\d+),(-?\d+)\)$")
_PLAN_MARK = "(plan step "
_TEXT_ROLES = {"textbox", "searchbox", "combobox"}


@dataclass(frozen=True, slots=True)
class Element:
    """One line of the accessibility tree (screenshot mode: ``[i] role 'name' @(x,y)``)
    or of the page text (text mode: ``role 'name' id=N``; ``element_id`` set, no
    coordinates: ``x`` and ``y`` are -1)."""

    index: int
    role: str
    name: str
    x: int
    y: int
    element_id: str | None = None


def parse_ac_tree(ac_tree: str | None) -> list[Element]:
    """The elements of an observation's tree in either of the collector's formats (the
    screenshot mode's accessibility tree, the text mode's page text; bad lines skipped)."""
    from .page_text import parse_page_text

    out = []
    for line in (ac_tree or "").splitlines():
        match = _LINE.match(line.strip())
        if match:
            index, role, name, x, y = match.groups()
            out.append(Element(int(index), role, name, int(x), int(y)))
            continue
        for item in parse_page_text(line):
            out.append(Element(int(item.element_id), item.role, item.name, -1, -1, item.element_id))
    return out


def find_element(elements: list[Element], role: str, name: str) -> Element | None:
    """The first element with ``role`` (textbox also matches searchbox/combobox) and this
    name (case-insensitive, exact)."""
    wanted = name.casefold()
    for el in elements:
        same_role = el.role == role or (role in _TEXT_ROLES and el.role in _TEXT_ROLES)
        if same_role and el.name.casefold() == wanted:
            return el
    return None


def _png_size(path: str | None) -> tuple[int, int]:
    """(width, height) from a PNG header; (800, 600) when it cannot be read."""
    try:
        with open(path or "", "rb") as handle:
            head = handle.read(24)
        if head[:8] == b"\x89PNG\r\n\x1a\n":
            width, height = struct.unpack(">II", head[16:24])
            return int(width), int(height)
    except OSError:
        pass
    return 800, 600


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _difficulty(task: Any) -> int:
    value = _field(task, "difficulty")
    if isinstance(value, str):
        return {"easy": 1, "medium": 2, "hard": 3}.get(value.lower(), 2)
    try:
        return max(1, min(3, int(value)))
    except (TypeError, ValueError):
        return 2


class ScriptedPolicy:
    """Follows the suite's plans with an iteration-dependent skill (module docstring).

    Implements the rollouts ``Policy`` protocol: ``await respond(request) -> str``
    and ``await aclose()``. ``request`` needs ``task``, ``observation``,
    ``history``, ``step`` and ``iteration`` (a ``PolicyRequest``).

    Args:
        plans: ``{task_id: plan}`` (default: the suite's ``plans.json``).
        seed: base seed of the mistake draws.
        mistake_rate: chance of a wasted step at iteration 1, difficulty 1.
        wrong_answer_rate: chance of a wrong final answer at iteration 1, difficulty 1.
        improvement: how much both rates fall per iteration.
    """

    def __init__(
        self,
        plans: Mapping[str, list[list[str]]] | None = None,
        *,
        seed: int = 0,
        mistake_rate: float = 0.3,
        wrong_answer_rate: float = 0.55,
        improvement: float = 0.15,
    ) -> None:
        if plans is None:
            from .sites import load_plans

            plans = load_plans()
        for name, rate in (
            ("mistake_rate", mistake_rate),
            ("wrong_answer_rate", wrong_answer_rate),
            ("improvement", improvement),
        ):
            if not 0.0 <= float(rate) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {rate!r}")
        self.plans = {str(k): [list(step) for step in v] for k, v in plans.items()}
        self.seed = int(seed)
        self.mistake_rate = float(mistake_rate)
        self.wrong_answer_rate = float(wrong_answer_rate)
        self.improvement = float(improvement)
        #: Requests answered (for tests and benchmarks).
        self.calls = 0

    def skill(self, iteration: int, difficulty: int) -> tuple[float, float]:
        """(wasted-step probability, wrong-answer probability) at this iteration/difficulty."""
        learned = self.improvement * max(0, int(iteration) - 1)
        harder = 0.06 * (difficulty - 1)
        mistake = float(np.clip(self.mistake_rate - 0.5 * learned + harder, 0.02, 0.9))
        wrong = float(np.clip(self.wrong_answer_rate - learned + 1.5 * harder, 0.03, 0.95))
        return mistake, wrong

    def _rng(self, task_id: str, iteration: int, step: int) -> np.random.Generator:
        key = zlib.crc32(task_id.encode("utf-8"))
        return np.random.default_rng([self.seed, key, max(0, int(iteration)), int(step)])

    async def respond(self, request: Any) -> str:
        """The model text for this step: ``<think>...</think>\\nAction: ...``."""
        self.calls += 1
        task = request.task
        task_id = str(_field(task, "task_id") or _field(task, "task_name"))
        observation = request.observation
        elements = parse_ac_tree(_field(observation, "ac_tree"))
        history = list(request.history or [])
        done = sum(_PLAN_MARK in _raw(step) for step in history)
        plan = self.plans.get(task_id)
        rng = self._rng(task_id, request.iteration, request.step)
        p_mistake, p_wrong = self.skill(request.iteration, _difficulty(task))
        if plan is None:
            return _say(
                "I have no idea how to solve this task.", {"key": "answer", "text": "unknown"}
            )
        if done >= len(plan):
            done = len(plan) - 1
        goal = plan[done]
        mark = f"{_PLAN_MARK}{done + 1}/{len(plan)})"
        # No wasted click between typing and pressing a key: the typed field keeps its focus.
        if goal[0] not in ("answer", "key") and rng.random() < p_mistake:
            dead = find_element(elements, "button", "Subscribe")
            if dead is not None:
                action = _at(dead, {"key": "click"})
                return _say("Maybe subscribing helps; let me click Subscribe.", action)
            if any(e.element_id is not None for e in elements):
                return _say("Let me wait and see what happens.", {"key": "noop"})
            width, height = _png_size(_field(observation, "image_path"))
            action = {"key": "click", "x": width - 6, "y": height - 6}
            return _say("Let me click here and see what happens.", action)
        if goal[0] == "answer":
            if rng.random() < p_wrong:
                return _say(f"I think I have it. {mark}", {"key": "answer", "text": "not sure"})
            reference = _field(task, "reference_answer")
            if isinstance(reference, list | tuple):
                reference = reference[0] if reference else ""
            return _say(
                f"The page shows the answer. {mark}", {"key": "answer", "text": str(reference)}
            )
        if goal[0] == "key":
            return _say(f"Submit with {goal[1]}. {mark}", {"key": "key", "name": goal[1]})
        role, name = goal[1], goal[2]
        element = find_element(elements, role, name)
        if element is None:
            scrolls = sum("Action: scroll(" in _raw(step) for step in history[-3:])
            if scrolls < 2:
                return _say(
                    f"I cannot see the {role} '{name}'; scroll down.",
                    {"key": "scroll", "direction": "down"},
                )
            return _say(
                f"The {role} '{name}' is not on this page.", {"key": "answer", "text": "not found"}
            )
        if goal[0] == "type":
            if element.element_id is not None:
                action = {"key": "fill", "element": element.element_id, "text": goal[3]}
            else:
                action = {"key": "type", "x": element.x, "y": element.y, "text": goal[3]}
            return _say(
                f"Type '{goal[3]}' into the {role} '{name}' [{element.index}]. {mark}", action
            )
        action = _at(element, {"key": "click"})
        return _say(f"Click the {role} '{name}' [{element.index}]. {mark}", action)

    async def aclose(self) -> None:
        """Nothing to release (the protocol's close)."""


def _at(element: Element, action: dict[str, Any]) -> dict[str, Any]:
    """``action`` aimed at ``element``: by its id in text mode, at its centre otherwise."""
    if element.element_id is not None:
        return {**action, "element": element.element_id}
    return {**action, "x": element.x, "y": element.y}


def _raw(step: Any) -> str:
    response = _field(step, "response")
    text = _field(response, "raw_response") if response is not None else None
    return text if isinstance(text, str) else ""


def _say(thought: str, action: dict[str, Any]) -> str:
    return f"<think>{thought}</think>\nAction: {format_action(action)}"
