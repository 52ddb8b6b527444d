"""The action grammar a web agent answers with: parse it, and execute it on a page.

One action per model response, after ``Action:`` (see
:class:`~replaystore.trajectories.response_decomposer.ThinkActionParser`).

Actions on an element named by its id, the id of the page text a text-mode model reads
(:mod:`replaystore.rollouts.page_text`), with BrowserGym's high-level action names so
its prompts and models transfer::

    click("12")                 click the element
    fill("12", "text")          replace the text of a textbox (input, textarea)
    select_option("12", "Red")  choose an option of a select (by its text or value)
    press("12", "Enter")        press a key (Playwright names: Enter, Tab, Control+a...) in it
    focus("12") / clear("12") / hover("12") / dblclick("12")

Actions at screenshot coordinates, for a model that sees the screenshot::

    click(x, y)            left click at (x, y) CSS pixels of the screenshot
    type(x, y, "text")     click at (x, y), then type the text

And the page-wide ones::

    key("Enter")                press one key where the focus is
    scroll(down|up)             scroll the page by most of a viewport
    scroll(dx, dy)              scroll by (dx, dy) pixels (BrowserGym's form)
    back()                      browser back
    goto("https://...")         open a URL (http or https only)
    noop()                      do nothing (wait for the page)
    answer("final answer")      end the trajectory; the answer is evaluated
    send_msg_to_user("...")     BrowserGym's name for answer()

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
import json
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
    "fill",
    "select_option",
    "press",
    "focus",
    "clear",
    "hover",
    "dblclick",
    "key",
    "scroll",
    "back",
    "goto",
    "noop",
    "answer",
    "invalid",
)
#: Actions that name an element by id and take nothing else.
_ELEMENT_ONLY = ("focus", "clear", "hover", "dblclick")
#: How long an element action waits for its element to be actionable (visible,
#: enabled, not covered): a missing or covered element is an error, not a hang.
ELEMENT_TIMEOUT_S = 3.0

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


def _element(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f'an element id is a quoted number like "12", got {value!r}')
    element = str(value).strip()
    if not element.isdigit():
        raise ValueError(f'an element id is a number like "12", got {value!r}')
    return element


def parse_action(text: str) -> Action:
    """Parse one action (grammar in the module docstring).

    Args:
        text: the action text, e.g. ``'type(412, 88, "lentil soup")'``.
            Surrounding whitespace and a trailing ``;`` are ignored.

    Returns:
        ``Action(action=dict, action_string=text)``. ``action["key"]`` is one of
        :data:`ACTION_KEYS`; the other entries: ``element`` (the id, a string of
        digits) for the element actions (``click("12")`` is ``{"key": "click",
        "element": "12"}``), ``x``/``y`` (float pixels) for click/type at
        coordinates, ``text`` for type/fill/answer, ``option`` for select_option,
        ``name`` for key/press, ``direction`` (``"down"``/``"up"``) or ``dx``/``dy``
        for scroll, ``url`` for goto, ``reason`` for invalid.
        ``send_msg_to_user(...)`` is ``answer``.
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
    if name == "scroll" and "," not in inner:
        direction = inner.strip("'\" ").lower()
        if direction not in ("down", "up"):
            return _invalid(text, f"scroll() takes down or up, or (dx, dy), got {inner!r}")
        return Action({"key": "scroll", "direction": direction}, text)
    try:
        value = ast.literal_eval(f"({inner},)") if inner else ()
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _invalid(text, f"cannot read the arguments of {name}(): {inner[:80]!r}")
    args: tuple[Any, ...] = tuple(value)
    action: dict[str, Any]
    try:
        if name == "click" and len(args) == 1 and isinstance(args[0], str):
            action = {"key": "click", "element": _element(args[0])}
        elif name == "click":
            _arity(name, args, 2)
            action = {
                "key": "click",
                "x": _coordinate(args[0], "x"),
                "y": _coordinate(args[1], "y"),
            }
        elif name == "fill":
            _arity(name, args, 2)
            typed = _string(args[1], "text")
            if len(typed) > _MAX_TEXT:
                raise ValueError(f"text is {len(typed)} characters; at most {_MAX_TEXT}")
            action = {"key": "fill", "element": _element(args[0]), "text": typed}
        elif name == "select_option":
            _arity(name, args, 2)
            action = {
                "key": "select_option",
                "element": _element(args[0]),
                "option": _string(args[1], "option"),
            }
        elif name == "press":
            _arity(name, args, 2)
            key = _string(args[1], "key name").strip()
            if not key:
                raise ValueError("key name is empty")
            action = {"key": "press", "element": _element(args[0]), "name": key}
        elif name in _ELEMENT_ONLY:
            _arity(name, args, 1)
            action = {"key": name, "element": _element(args[0])}
        elif name == "scroll":
            _arity(name, args, 2)
            dx, dy = args
            for label, delta in (("dx", dx), ("dy", dy)):
                if isinstance(delta, bool) or not isinstance(delta, int | float):
                    raise ValueError(f"scroll {label} must be a number of pixels, got {delta!r}")
                if not math.isfinite(delta) or abs(delta) > 100_000:
                    raise ValueError(f"scroll {label} must be within 100000 pixels, got {delta!r}")
            action = {"key": "scroll", "dx": float(dx), "dy": float(dy)}
        elif name == "noop":
            if len(args) > 1:
                raise ValueError(f"noop() takes at most 1 argument, got {len(args)}")
            action = {"key": "noop"}
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
        elif name in ("answer", "send_msg_to_user"):
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
    if key in ("click", *_ELEMENT_ONLY) and "element" in action:
        return f"{key}({_quote(action['element'])})"
    if key == "fill":
        return f"fill({_quote(action['element'])}, {_quote(action['text'])})"
    if key == "select_option":
        return f"select_option({_quote(action['element'])}, {_quote(action['option'])})"
    if key == "press":
        return f"press({_quote(action['element'])}, {_quote(action['name'])})"
    if key == "noop":
        return "noop()"
    if key == "scroll" and "dy" in action:
        return f"scroll({action['dx']:g}, {action['dy']:g})"
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
    # A Python literal that literal_eval reads back exactly, in double quotes as
    # BrowserGym writes its actions (json.dumps escapes what repr would, and is a
    # valid Python string literal for any text).
    return json.dumps(str(text), ensure_ascii=False)


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
    if key in ("click", "type", "key", "scroll", "fill", "select_option", "press", *_ELEMENT_ONLY):
        watcher = watcher if watcher is not None else NavigationWatcher(page)
        watcher.mark()
    try:
        if key == "answer":
            return ActionOutcome(done=True, answer=str(spec.get("text", "")))
        if key == "invalid":
            return ActionOutcome(error=str(spec.get("reason", "invalid action")))
        if key == "noop":
            await asyncio.sleep(settle_s)
            return ActionOutcome()
        if "element" in spec:
            error = await _on_element(page, spec)
            if error is not None:
                return ActionOutcome(error=f"{key}: {error}")
        elif key == "click":
            await page.mouse.click(spec["x"], spec["y"])
        elif key == "type":
            await page.mouse.click(spec["x"], spec["y"])
            await page.keyboard.type(spec["text"])
        elif key == "key":
            await page.keyboard.press(spec["name"])
        elif key == "scroll" and "dy" in spec:
            await page.mouse.wheel(spec["dx"], spec["dy"])
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


#: Where to click an element whose centre another element covers: the first point of a
#: 5 x 5 grid over its box (middle rows and columns first) that hit-tests to the element
#: or a descendant, in viewport pixels. None when the centre is clear (the usual case),
#: when the element has no box, or when nothing of it shows.
_VISIBLE_POINT = """el => {
  const r = el.getBoundingClientRect();
  if (!(r.width > 0 && r.height > 0)) return null;
  const mine = (x, y) => {
    const hit = document.elementFromPoint(x, y);
    return hit !== null && (hit === el || el.contains(hit));
  };
  if (mine(r.left + r.width / 2, r.top + r.height / 2)) return null;
  for (const fy of [0.5, 0.3, 0.7, 0.1, 0.9]) {
    for (const fx of [0.5, 0.3, 0.7, 0.1, 0.9]) {
      const x = r.left + fx * r.width, y = r.top + fy * r.height;
      if (mine(x, y)) return [x, y];
    }
  }
  return null;
}"""


async def _click(page: Any, target: Any, timeout: float) -> None:
    """Click ``target`` where it shows, as a person does.

    Playwright clicks an element's centre and, when another element covers that point,
    retries until the cover goes or ``timeout`` runs out. A button half under another
    (MiniWoB++'s click-test-2 draws one on 11 of its first 150 seeds) was then clicked
    or not depending on the machine's load: the same seeds gave different
    demonstrations. Here such a click lands at once on a part of the element that shows;
    an element covered whole, or not laid out, gets Playwright's click, with its
    waiting, as before.
    """
    await target.scroll_into_view_if_needed(timeout=timeout)
    point = await target.evaluate(_VISIBLE_POINT)
    if point is None:
        await target.click(timeout=timeout)
    else:
        await page.mouse.click(point[0], point[1])


async def _on_element(page: Any, spec: dict[str, Any]) -> str | None:
    """Run an element action (``spec["element"]`` is the id); why it failed, or None."""
    from .page_text import element_selector

    element = str(spec["element"])
    locator = page.locator(element_selector(element))
    if await locator.count() == 0:
        return f"no element with id {element} on the page"
    target = locator.first
    timeout = ELEMENT_TIMEOUT_S * 1000.0
    key = spec["key"]
    if key == "click":
        await _click(page, target, timeout)
    elif key == "dblclick":
        await target.dblclick(timeout=timeout)
    elif key == "hover":
        await target.hover(timeout=timeout)
    elif key == "focus":
        await target.focus(timeout=timeout)
    elif key == "clear":
        await target.clear(timeout=timeout)
    elif key == "fill":
        await target.fill(spec["text"], timeout=timeout)
    elif key == "press":
        await target.press(spec["name"], timeout=timeout)
    elif key == "select_option":
        await target.select_option(spec["option"], timeout=timeout)
    else:
        return f"{key} takes no element"
    return None
