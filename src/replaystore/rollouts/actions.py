"""The action grammar a web agent answers with: parse it, and execute it on a page.

One action per model response, after ``Action:`` (see
:class:`~replaystore.trajectories.response_decomposer.ThinkActionParser`)::

    click(x, y)            left click at (x, y) CSS pixels of the screenshot
    type(x, y, "text")     click at (x, y), then type the text
    key("Enter")           press one key (Playwright key names: Enter, Tab, Escape, ArrowDown...)
    scroll(down|up)        scroll the page by most of a viewport
    back()                 browser back
    goto("https://...")    open a URL (http or https only)
    answer("final answer") end the trajectory; the answer is evaluated

:func:`parse_action` turns the text into a trajectories
:class:`~replaystore.trajectories.components.Action` whose ``action`` is a dict
(``{"key": "click", "x": 10.0, "y": 20.0}``...). Text that does not parse becomes
``{"key": "invalid", "reason": ...}``: the collector records it as a step that
does nothing (the model learns from it) instead of crashing the rollout.

:func:`execute_action` runs a parsed action on a Playwright page (imported lazily:
this module itself needs no browser).
"""

from __future__ import annotations

import ast
import asyncio
import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from replaystore.trajectories.components import Action

__all__ = [
    "ACTION_KEYS",
    "ActionOutcome",
    "NavigationWatcher",
    "execute_action",
    "format_action",
    "parse_action",
]

#: Every ``action["key"]`` :func:`parse_action` can return.
ACTION_KEYS: tuple[str, ...] = (
    "click",
    "type",
    "key",
    "scroll",
    "back",
    "goto",
    "answer",
    "invalid",
)

_CALL = re.compile(r"^\s*([A-Za-z_]+)\s*\((.*)\)\s*$", re.DOTALL)
_MAX_TEXT = 2000  # characters typed by one action; longer text is almost surely a bad parse


def _invalid(text: str, reason: str) -> Action:
    return Action({"key": "invalid", "reason": reason}, text)


def _coordinate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of pixels, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a quoted string, got {value!r}")
    return value


def _arity(name: str, args: tuple[Any, ...], n: int) -> None:
    if len(args) != n:
        raise ValueError(f"{name}() takes {n} argument{'s' if n != 1 else ''}, got {len(args)}")


def parse_action(text: str) -> Action:
    """Parse one action (grammar in the module docstring).

    Args:
        text: the action text, e.g. ``'type(412, 88, "lentil soup")'``.
            Surrounding whitespace and a trailing ``;`` are ignored.

    Returns:
        ``Action(action=dict, action_string=text)``. ``action["key"]`` is one of
        :data:`ACTION_KEYS`; the other entries: ``x``/``y`` (float pixels) for
        click/type, ``text`` for type/answer, ``name`` for key, ``direction``
        (``"down"``/``"up"``) for scroll, ``url`` for goto, ``reason`` for invalid.
        Never raises for bad text (that is an ``invalid`` action).

    Raises:
        TypeError: ``text`` is not a string.

    Cost: one regex match and one ``ast.literal_eval`` of the argument list
    (literals only: no code in the text is ever run).
    """
    if not isinstance(text, str):
        raise TypeError(f"an action must be a string, got {type(text).__name__}")
    stripped = text.strip().rstrip(";").strip()
    match = _CALL.match(stripped)
    if match is None:
        return _invalid(text, f"not an action call like click(x, y): {stripped[:80]!r}")
    name, inner = match.group(1).lower(), match.group(2).strip()
    if name == "scroll":
        direction = inner.strip("'\" ").lower()
        if direction not in ("down", "up"):
            return _invalid(text, f"scroll() takes down or up, got {inner!r}")
        return Action({"key": "scroll", "direction": direction}, text)
    try:
        value = ast.literal_eval(f"({inner},)") if inner else ()
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _invalid(text, f"cannot read the arguments of {name}(): {inner[:80]!r}")
    args: tuple[Any, ...] = tuple(value)
    try:
        if name == "click":
            _arity(name, args, 2)
            action = {
                "key": "click",
                "x": _coordinate(args[0], "x"),
                "y": _coordinate(args[1], "y"),
            }
        elif name == "type":
            _arity(name, args, 3)
            typed = _string(args[2], "text")
            if len(typed) > _MAX_TEXT:
                raise ValueError(f"text is {len(typed)} characters; at most {_MAX_TEXT}")
            action = {
                "key": "type",
                "x": _coordinate(args[0], "x"),
                "y": _coordinate(args[1], "y"),
                "text": typed,
            }
        elif name == "key":
            _arity(name, args, 1)
            key = _string(args[0], "key name").strip()
            if not key:
                raise ValueError("key name is empty")
            action = {"key": "key", "name": key}
        elif name == "back":
            _arity(name, args, 0)
            action = {"key": "back"}
        elif name == "goto":
            _arity(name, args, 1)
            url = _string(args[0], "url").strip()
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
                raise ValueError(f"goto() needs an http(s) URL, got {url[:80]!r}")
            action = {"key": "goto", "url": url}
        elif name == "answer":
            _arity(name, args, 1)
            action = {"key": "answer", "text": _string(args[0], "answer")}
        else:
            return _invalid(text, f"unknown action {name!r}; expected one of {ACTION_KEYS[:-1]}")
    except ValueError as exc:
        return _invalid(text, str(exc))
    return Action(action, text)


def format_action(action: dict[str, Any]) -> str:
    """The text :func:`parse_action` reads back as ``action`` (policies write actions with it).

    Raises:
        ValueError: ``action["key"]`` is missing or not a known action.
    """
    key = action.get("key")
    if key == "click":
        return f"click({action['x']:g}, {action['y']:g})"
    if key == "type":
        return f"type({action['x']:g}, {action['y']:g}, {_quote(action['text'])})"
    if key == "key":
        return f"key({_quote(action['name'])})"
    if key == "scroll":
        return f"scroll({action['direction']})"
    if key == "back":
        return "back()"
    if key == "goto":
        return f"goto({_quote(action['url'])})"
    if key == "answer":
        return f"answer({_quote(action['text'])})"
    raise ValueError(f"cannot format action with key {key!r}; expected one of {ACTION_KEYS[:-1]}")


def _quote(text: str) -> str:
    # repr() of a str is a Python literal that literal_eval reads back exactly.
    return repr(str(text))


class NavigationWatcher:
    """Knows whether an input event started a page load, and waits for it to finish.

    A click or key press starts a navigation asynchronously: waiting for the
    load state right after the event sees the *old* page as loaded, and the next
    screenshot would catch the page mid-navigation. The watcher listens to the
    page's main-frame navigation requests and load events (registered once per page).

    Args:
        page: a ``playwright.async_api.Page``.
    """

    def __init__(self, page: Any) -> None:
        self.page = page
        self._requested = asyncio.Event()
        self._loaded = asyncio.Event()
        page.on("request", self._on_request)
        page.on("requestfailed", self._on_failed)
        page.on("load", self._on_load)

    def _on_request(self, request: Any) -> None:
        if request.is_navigation_request() and request.frame == self.page.main_frame:
            self._requested.set()
            self._loaded.clear()

    def _on_failed(self, request: Any) -> None:
        if request.is_navigation_request() and request.frame == self.page.main_frame:
            self._loaded.set()

    def _on_load(self, _page: Any) -> None:
        self._loaded.set()

    def mark(self) -> None:
        """Forget earlier navigations (call right before the input event)."""
        self._requested.clear()
        self._loaded.clear()

    async def settle(self, settle_s: float, timeout_s: float) -> bool:
        """Wait up to ``settle_s`` for a navigation to start; if one did, wait (up to
        ``timeout_s``) for its page to load. Returns whether the page navigated.

        Raises:
            TimeoutError: a navigation started but its page did not load in time.
        """
        try:
            await asyncio.wait_for(self._requested.wait(), settle_s)
        except TimeoutError:
            return False
        try:
            await asyncio.wait_for(self._loaded.wait(), timeout_s)
        except TimeoutError:
            raise TimeoutError(f"the page did not finish loading within {timeout_s:g} s") from None
        return True


@dataclass(slots=True)
class ActionOutcome:
    """What executing one action did.

    Attributes:
        done: the action ends the trajectory (``answer``).
        answer: the answer text for ``answer``, else None.
        error: why the action failed in the browser (bad key name, navigation
            error...), or None. A failed action is a recorded step, not a crash.
        navigated: the action loaded a page (``goto``/``back``, or a click or
            key press that started a navigation).
    """

    done: bool = False
    answer: str | None = None
    error: str | None = None
    navigated: bool = False


async def execute_action(
    page: Any,
    action: Action | dict[str, Any],
    *,
    navigation_timeout_s: float = 15.0,
    settle_s: float = 0.25,
    watcher: NavigationWatcher | None = None,
) -> ActionOutcome:
    """Run ``action`` on a Playwright ``page`` and wait for the page to settle.

    Args:
        page: a ``playwright.async_api.Page``.
        action: a parsed action (from :func:`parse_action`) or its dict.
        navigation_timeout_s: limit for ``goto``/``back`` and for the page load a
            click or key press may start.
        settle_s: how long after an input event a navigation may still start
            (when one starts, its page load is awaited). Without a ``watcher``
            this is a plain pause followed by a load-state wait.
        watcher: the page's :class:`NavigationWatcher` (the collector keeps
            one per page); without it a new one is made for this call.

    Returns:
        An :class:`ActionOutcome`. Browser-side failures (a navigation error, a
        key name the browser does not know) are reported in ``error``, not raised.

    Raises:
        ValueError: ``action`` is not a parsed action dict (no ``key``).

    Cost: one round trip to the browser per input event, plus the page load when
    the action navigates.
    """
    spec = action.action if isinstance(action, Action) else action
    if not isinstance(spec, dict) or "key" not in spec:
        raise ValueError(f"expected a parsed action dict with a 'key', got {spec!r}")
    from playwright.async_api import Error as PlaywrightError

    key = spec["key"]
    timeout_ms = navigation_timeout_s * 1000.0
    if key in ("click", "type", "key", "scroll"):
        watcher = watcher if watcher is not None else NavigationWatcher(page)
        watcher.mark()
    try:
        if key == "answer":
            return ActionOutcome(done=True, answer=str(spec.get("text", "")))
        if key == "invalid":
            return ActionOutcome(error=str(spec.get("reason", "invalid action")))
        if key == "click":
            await page.mouse.click(spec["x"], spec["y"])
        elif key == "type":
            await page.mouse.click(spec["x"], spec["y"])
            await page.keyboard.type(spec["text"])
        elif key == "key":
            await page.keyboard.press(spec["name"])
        elif key == "scroll":
            delta = 0.8 * (page.viewport_size or {"height": 600})["height"]
            await page.mouse.wheel(0, delta if spec["direction"] == "down" else -delta)
        elif key == "back":
            await page.go_back(timeout=timeout_ms, wait_until="load")
            return ActionOutcome(navigated=True)
        elif key == "goto":
            await page.goto(spec["url"], timeout=timeout_ms, wait_until="load")
            return ActionOutcome(navigated=True)
        else:
            return ActionOutcome(error=f"unknown action key {key!r}")
        assert watcher is not None
        navigated = await watcher.settle(settle_s, navigation_timeout_s)
    except TimeoutError as exc:
        return ActionOutcome(error=f"{key}: {exc}", navigated=True)
    except PlaywrightError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ActionOutcome(error=f"{key}: {first_line}", navigated=key in ("goto", "back"))
    return ActionOutcome(navigated=navigated)
