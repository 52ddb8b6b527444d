"""Scripted experts for 18 MiniWoB++ tasks, and :func:`play`, which measures them.

:class:`MiniWoBExpert` is a :class:`~replaystore.rollouts.policy.Policy` that reads only
what a text-mode model reads: the goal (``task.task_name``), the task name
(``task.subdomain``), the page text of :mod:`replaystore.rollouts.page_text` and the
trajectory's previous replies. It never looks at the DOM or the page's script, and it
answers as a model does, ``<think>one sentence</think>`` then ``Action: click("12")``
(element-id actions only, one per step). Most decisions are stateless: the page text
says what is left to do (a textbox whose value is not the target is filled, a box in
the wrong state is clicked, then Submit).

Measured with :func:`play` on seeds 60000-60199 (200 per task, 4 workers): 16 tasks at
100%; click-widget 89.5% and navigate-tree 84.0%, which the page text cannot decide (a
textarea and a text input are both ``textbox``, a closed folder and a file both
clickable text): there the expert guesses, and it uses ``multiline`` / ``collapsed``
states when the page text has them (with them both reach 100%). A button half under
another (click-test-2, 11 of seeds 0-149) is clicked where it shows, as every click is
(:func:`~replaystore.rollouts.actions.execute_action`); one covered whole would get
``press(id, "Enter")`` after its click failed.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .actions import execute_action, format_action, parse_action
from .page_text import PageElement, page_text, parse_page_text

__all__ = ["MiniWoBExpert", "play", "success_rates"]

logger = logging.getLogger("replaystore.rollouts.miniwob_experts")

_STATIC = "StaticText"
_TEXTBOX = "textbox"
_ORDINALS = {"1st": 1, "2nd": 2, "3rd": 3, "4th": 4, "5th": 5}
_ACTION_LINE = re.compile(r"Action:\s*(.+?)\s*$", re.DOTALL)


class _Unsolvable(Exception):
    """The expert cannot go on: the message is its answer."""


@dataclass(frozen=True, slots=True)
class _Page:
    """What one step sees: the goal, the page's elements, the episode's past actions."""

    goal: str
    elements: list[PageElement]
    past: list[dict[str, Any]]
    first: list[PageElement]  # the elements of the episode's first page

    def find(self, role: str | tuple[str, ...], name: str) -> PageElement | None:
        """The first element with this role and name (exact, then case-insensitive)."""
        roles = (role,) if isinstance(role, str) else role
        candidates = [e for e in self.elements if e.role in roles]
        for element in candidates:
            if element.name == name:
                return element
        wanted = _plain(name).casefold()
        return next((e for e in candidates if _plain(e.name).casefold() == wanted), None)

    def need(self, role: str | tuple[str, ...], name: str) -> PageElement:
        element = self.find(role, name)
        if element is None:
            raise _Unsolvable(f"I cannot find the {_role_words(role)} {name!r} on the page.")
        return element

    def of_role(self, role: str) -> list[PageElement]:
        return [e for e in self.elements if e.role == role]

    def clicked(self) -> list[str]:
        """The ids this episode clicked, oldest first."""
        return [str(a["element"]) for a in self.past if a.get("key") == "click" and "element" in a]


_Decision = tuple[str, dict[str, Any]]


def _plain(text: str) -> str:
    # The page text writes an apostrophe as U+2019 (its quoting), the goal as '.
    return re.sub(r"\s+", " ", text.replace("\u2019", "'")).strip()


def _role_words(role: str | tuple[str, ...]) -> str:
    roles = (role,) if isinstance(role, str) else role
    return "/".join("text" if r == _STATIC else r for r in roles)


def _quoted(goal: str) -> list[str]:
    return re.findall(r'"([^"]*)"', goal)


def _one_quoted(goal: str) -> str:
    found = _quoted(goal)
    if len(found) != 1:
        raise _Unsolvable(f"I cannot read the quoted target in the goal {goal!r}.")
    return found[0]


def _match(pattern: str, goal: str) -> re.Match[str]:
    found = re.fullmatch(pattern, goal.strip())
    if found is None:
        raise _Unsolvable(f"I cannot read the goal {goal!r}.")
    return found


def _click(element: PageElement, thought: str, page: _Page) -> _Decision:
    """Click ``element``; a button whose click just did nothing (covered whole) gets Enter."""
    last = page.past[-1] if page.past else {}
    retry = last.get("key") == "click" and str(last.get("element")) == element.element_id
    if retry and element.role == "button":
        return (
            f"My click on {element.name!r} did nothing; press Enter on it instead.",
            {"key": "press", "element": element.element_id, "name": "Enter"},
        )
    return thought, {"key": "click", "element": element.element_id}


def _submit(page: _Page, label: str = "Submit") -> _Decision:
    button = page.need("button", label)
    return _click(button, f"Everything is set; click {button.name!r}.", page)


def _fill(element: PageElement, text: str, what: str) -> _Decision:
    return (
        f'Type "{text}" into the {what}.',  # quoted as the goal quotes it
        {"key": "fill", "element": element.element_id, "text": text},
    )


def _masked(element: PageElement) -> str:
    return element.value or ""


# --------------------------------------------------------------------------- the tasks


def _click_test(page: _Page) -> _Decision:
    buttons = page.of_role("button")
    if not buttons:
        raise _Unsolvable("There is no button on the page.")
    return _click(buttons[0], f"Click the button {buttons[0].name!r}.", page)


def _click_test_2(page: _Page) -> _Decision:
    name = _match(r"Click button (.+)\.", page.goal).group(1)
    button = page.need("button", name)
    return _click(button, f"Click the button {name!r}.", page)


def _click_button(page: _Page) -> _Decision:
    name = _one_quoted(page.goal)
    button = page.need("button", name)
    return _click(button, f"Click the {name!r} button.", page)


def _link(page: _Page, name: str) -> PageElement | None:
    """A clickable text (or a link) with this name."""
    for element in page.elements:
        if element.role == "link" and element.name == name:
            return element
        if element.role == _STATIC and element.name == name and "clickable" in element.states:
            return element
    return None


def _click_link(page: _Page) -> _Decision:
    name = _one_quoted(page.goal)
    link = _link(page, name) or page.need(_STATIC, name)
    return _click(link, f"The link {name!r} is on the page; click it.", page)


def _dialog_button(page: _Page, name: str) -> PageElement:
    if name.strip() in ("x", "X", "\u00d7"):
        for label in ("Close", "close", "x", "X", "\u00d7"):
            found = page.find("button", label)
            if found is not None:
                return found
    return page.need("button", name)


def _click_dialog(page: _Page) -> _Decision:
    name = _one_quoted(page.goal)
    button = _dialog_button(page, name)
    return _click(button, f"The dialog's {name!r} is the button {button.name!r}; click it.", page)


def _click_tab(page: _Page) -> _Decision:
    number = _match(r"Click on Tab #(\d+)\.", page.goal).group(1)
    tab = page.need(("tab", "link"), f"Tab #{number}")
    return _click(tab, f"Click the tab {tab.name!r}.", page)


def _click_tab_2(page: _Page) -> _Decision:
    name = _one_quoted(page.goal)
    link = _link(page, name)
    if link is not None:
        return _click(link, f"The link {name!r} is in this tab; click it.", page)
    tabs = page.of_role("tab")
    if not tabs:
        raise _Unsolvable(f"The link {name!r} is not shown and there are no tabs.")
    opened = {tabs[0].element_id, *page.clicked()}  # the first tab is open at the start
    for tab in tabs:
        if tab.element_id not in opened:
            return _click(tab, f"{name!r} is not in this tab; open {tab.name!r}.", page)
    raise _Unsolvable(f"No tab shows the link {name!r}.")


def _click_option(page: _Page) -> _Decision:
    name = _match(r"Select (.+) and click Submit\.", page.goal).group(1)
    radio = page.need("radio", name)
    if "checked" not in radio.states:
        return _click(radio, f"Select the option {name!r}.", page)
    return _submit(page)


def _click_checkboxes(page: _Page) -> _Decision:
    listed = _match(r"Select (.*) and click Submit\.", page.goal).group(1).strip()
    wanted = [] if listed == "nothing" else [n.strip() for n in listed.split(",") if n.strip()]
    boxes = page.of_role("checkbox")
    names = {b.name for b in boxes}
    missing = [n for n in wanted if n not in names]
    if missing:
        raise _Unsolvable(f"I cannot find the checkbox {missing[0]!r} on the page.")
    for box in boxes:
        checked = "checked" in box.states
        if box.name in wanted and not checked:
            return _click(box, f"Check {box.name!r}.", page)
        if box.name not in wanted and checked:
            return _click(box, f"{box.name!r} must not be checked; uncheck it.", page)
    return _submit(page)


_WIDGET_ROLES = {"button": "button", "checkbox": "checkbox", "radio": "radio"}


def _click_widget(page: _Page) -> _Decision:
    kind = _one_quoted(page.goal)
    role = _WIDGET_ROLES.get(kind)
    if role is not None:
        widgets = page.of_role(role)
        if not widgets:
            raise _Unsolvable(f"There is no {kind} widget on the page.")
        return _click(widgets[0], f"{widgets[0].name!r} is a {kind}; click it.", page)
    if kind not in ("text", "textarea"):
        raise _Unsolvable(f"I do not know the widget kind {kind!r}.")
    boxes = page.of_role(_TEXTBOX)
    if not boxes:
        raise _Unsolvable(f"There is no {kind} widget on the page.")
    if any("multiline" in b.states for b in boxes):  # the page text tells them apart
        fits = [b for b in boxes if ("multiline" in b.states) == (kind == "textarea")]
        if fits:
            return _click(fits[0], f"Textbox {fits[0].element_id} is a {kind}; click it.", page)
    # A text input and a textarea look alike in the page text: take the first.
    what = "text input" if kind == "text" else kind
    return _click(boxes[0], f"Textbox {boxes[0].element_id} may be the {what}; click it.", page)


def _enter_text(page: _Page) -> _Decision:
    text = _one_quoted(page.goal)
    boxes = page.of_role(_TEXTBOX)
    if not boxes:
        raise _Unsolvable("There is no text field on the page.")
    if boxes[0].value != text:
        return _fill(boxes[0], text, "text field")
    return _submit(page)


def _enter_password(page: _Page) -> _Decision:
    password = _one_quoted(page.goal)
    boxes = page.of_role(_TEXTBOX)
    if len(boxes) < 2:
        raise _Unsolvable("I cannot find the two password fields.")
    for box, what in zip(boxes[:2], ("password field", "verify field"), strict=True):
        if _masked(box) != "*" * len(password):
            return _fill(box, password, what)
    return _submit(page)


def _labelled_textbox(page: _Page, label: str, index: int) -> PageElement:
    """The textbox named ``label``, or the first after the text ``label``, or the
    ``index``-th textbox."""
    named = page.find(_TEXTBOX, label)
    if named is not None:
        return named
    after = False
    for element in page.elements:
        if element.role == _STATIC and _plain(element.name).casefold() == label.casefold():
            after = True
        elif after and element.role == _TEXTBOX:
            return element
    boxes = page.of_role(_TEXTBOX)
    if len(boxes) <= index:
        raise _Unsolvable(f"I cannot find the {label} field.")
    return boxes[index]


def _login_user(page: _Page) -> _Decision:
    found = _match(r'Enter the username "(.*)" and the password "(.*)" into .*', page.goal)
    user, password = found.group(1), found.group(2)
    username_box = _labelled_textbox(page, "Username", 0)
    password_box = _labelled_textbox(page, "Password", 1)
    if username_box.value != user:
        return _fill(username_box, user, "username field")
    if _masked(password_box) != "*" * len(password):
        return _fill(password_box, password, "password field")
    return _submit(page, "Login")


def _focus_text(page: _Page) -> _Decision:
    boxes = page.of_role(_TEXTBOX)
    if not boxes:
        raise _Unsolvable("There is no textbox on the page.")
    return (
        f"Focus the textbox {boxes[0].element_id}.",
        {"key": "focus", "element": boxes[0].element_id},
    )


def _focus_text_2(page: _Page) -> _Decision:
    ordinal = _match(r"Focus into the (\w+) input textbox\.", page.goal).group(1)
    number = _ORDINALS.get(ordinal)
    boxes = page.of_role(_TEXTBOX)
    if number is None or number > len(boxes):
        raise _Unsolvable(f"I cannot find the {ordinal} textbox.")
    box = boxes[number - 1]
    return (
        f"The {ordinal} textbox is {box.element_id}; focus it.",
        {"key": "focus", "element": box.element_id},
    )


def _choose_list(page: _Page) -> _Decision:
    name = _match(r"Select (.+) from the list and click Submit\.", page.goal).group(1)
    lists = page.of_role("combobox")
    if not lists:
        raise _Unsolvable("There is no list on the page.")
    options = [e for e in page.elements if e.role == "option"]
    if not any(_plain(o.name) == name for o in options):
        raise _Unsolvable(f"The list has no option {name!r}.")
    if _plain(lists[0].value or "") != name:
        return (
            f"Choose {name!r} in the list.",
            {"key": "select_option", "element": lists[0].element_id, "option": name},
        )
    return _submit(page)


def _navigate_tree(page: _Page) -> _Decision:
    name = _one_quoted(page.goal)
    items = [e for e in page.elements if e.role in (_STATIC, "treeitem", "link")]
    for item in items:
        if item.name == name:
            return _click(item, f"{name!r} is in the tree; click it.", page)
    top_ids = {i.element_id for i in page.first}
    collapsed = [i for i in items if "collapsed" in i.states]
    collapsed.sort(key=lambda i: i.element_id not in top_ids)  # the top level first
    if collapsed:  # the page text tells closed folders apart
        return _click(collapsed[0], f"{name!r} is not shown; open {collapsed[0].name!r}.", page)
    # Folders and files look alike in the page text. The first page shows the top level;
    # a folder opened earlier is still there and is not opened again. The last top-level
    # item is rarely a folder holding the name, the one before it most often: try the
    # top level from the second-to-last item backwards, then the last.
    shown = {i.element_id for i in items}
    top = [i for i in page.first if i.role in (_STATIC, "treeitem", "link")] or items
    top = [i for i in top if i.element_id in shown]
    opened = set(page.clicked())
    order = [*reversed(top[:-1]), *top[-1:]]
    for item in order:
        if item.element_id not in opened:
            return _click(item, f"{name!r} is not shown; open the folder {item.name!r}.", page)
    raise _Unsolvable(f"I cannot find {name!r} in the tree.")


_SOLVERS: dict[str, Callable[[_Page], _Decision]] = {
    "click-test": _click_test,
    "click-test-2": _click_test_2,
    "click-button": _click_button,
    "click-link": _click_link,
    "click-dialog": _click_dialog,
    "click-dialog-2": _click_dialog,
    "click-tab": _click_tab,
    "click-tab-2": _click_tab_2,
    "click-option": _click_option,
    "click-checkboxes": _click_checkboxes,
    "click-widget": _click_widget,
    "enter-text": _enter_text,
    "enter-password": _enter_password,
    "focus-text": _focus_text,
    "focus-text-2": _focus_text_2,
    "login-user": _login_user,
    "choose-list": _choose_list,
    "navigate-tree": _navigate_tree,
}


# --------------------------------------------------------------------------- the policy


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _past_action(step: Any) -> dict[str, Any]:
    """The action of a history step: its parsed action, else its reply's ``Action:``."""
    action = _field(step, "action")
    spec = _field(action, "action") if action is not None else None
    if isinstance(spec, dict) and "key" in spec:
        return spec
    raw = _field(_field(step, "response"), "raw_response")
    found = _ACTION_LINE.search(raw) if isinstance(raw, str) else None
    if found is None:
        return {"key": "invalid"}
    parsed = parse_action(found.group(1)).action
    return parsed if isinstance(parsed, dict) else {"key": "invalid"}


def _say(thought: str, action: dict[str, Any]) -> str:
    return f"<think>{thought}</think>\nAction: {format_action(action)}"


def _with_target(thought: str, action: dict[str, Any], elements: Sequence[PageElement]) -> str:
    """``thought`` ending with the acted-on element's line as the page text writes it.

    ``Target: button 'Cancel' id=6`` repeats the observation's own words up to the id,
    so a small model finds the id by copying what follows them in its prompt.
    """
    wanted = str(action.get("element", ""))
    for element in elements:
        if element.element_id == wanted:
            line = f"{element.role} '{element.name}' id={element.element_id}"
            return f"{thought} Target: {line}"
    return thought


class MiniWoBExpert:
    """A scripted expert for the 18 tasks of ``miniwob.EXPERT_TASKS`` (module docstring).

    Implements the rollouts ``Policy`` protocol. An unknown task, or a goal or page it
    cannot read, gets ``answer("...")`` saying so.

    Attributes:
        calls: requests answered.
    """

    #: The task names it knows.
    tasks: tuple[str, ...] = tuple(_SOLVERS)

    def __init__(self) -> None:
        self.calls = 0

    async def respond(self, request: Any) -> str:
        """The reply for this step: ``<think>...</think>\\nAction: ...``."""
        self.calls += 1
        task = request.task
        name = str(_field(task, "subdomain") or "")
        solver = _SOLVERS.get(name)
        if solver is None:
            text = f"I have no expert for the MiniWoB task {name!r}."
            return _say(text, {"key": "answer", "text": text})
        history = list(request.history or [])
        first_tree = _field(_field(history[0], "observation"), "ac_tree") if history else None
        elements = parse_page_text(_field(request.observation, "ac_tree"))
        page = _Page(
            goal=str(_field(task, "task_name") or ""),
            elements=elements,
            past=[_past_action(step) for step in history],
            first=parse_page_text(first_tree) if isinstance(first_tree, str) else elements,
        )
        try:
            thought, action = solver(page)
        except _Unsolvable as exc:
            return _say(str(exc), {"key": "answer", "text": str(exc)})
        return _say(_with_target(thought, action, elements), action)

    async def aclose(self) -> None:
        """Nothing to release."""


# --------------------------------------------------------------------------- play


async def _episode(
    page: Any, expert: MiniWoBExpert, task: Any, max_steps: int, settle_s: float
) -> float:
    from replaystore.trajectories.components import Observation
    from replaystore.trajectories.response_decomposer import ThinkActionParser

    from .miniwob import OBSERVATION_SKIP, episode_state, start_episode
    from .policy import PolicyRequest

    parser = ThinkActionParser()
    await page.goto(task.website, wait_until="load")
    task = await start_episode(page, task)
    history: list[dict[str, Any]] = []
    for step in range(max_steps):
        text = await page_text(page, skip=OBSERVATION_SKIP)
        observation = Observation(task, None, text)
        request = PolicyRequest(task, observation, history, [], step, 0)
        reply = await expert.respond(request)
        action = parse_action(parser.parse_response(reply)["action"])
        history.append({"observation": observation, "action": action, "response": reply})
        if action.action.get("key") == "answer":
            break
        await execute_action(page, action, settle_s=settle_s)
        state = await episode_state(page)
        if state.done:
            return 1.0 if state.raw_reward > 0 else 0.0
    return 0.0


async def play(
    tasks: list[str],
    seeds: list[int],
    *,
    workers: int = 4,
    max_steps: int = 10,
    settle_s: float = 0.05,
    executable_path: str | None = None,
) -> dict[str, list[float]]:
    """Play :class:`MiniWoBExpert` on every (task, seed): the page's rewards per task.

    Starts a :class:`~replaystore.rollouts.miniwob.MiniWoBServer` and a
    :class:`~replaystore.rollouts.browser.BrowserPool` of ``workers`` contexts (one
    page each, reused across episodes) and runs the episodes concurrently. An episode
    loads the page, starts the seed's episode, then reads the page text, asks the
    expert, executes its action, until the page says done or ``max_steps`` run out.
    An episode whose page fails (a load or start timeout) scores 0.0 and is logged.
    ``executable_path``: the Chromium to launch (default: the pool's search).

    Returns:
        ``{task: [1.0 or 0.0 per seed, in seed order]}`` (1.0: done with a positive
        raw reward).

    Raises:
        ConfigError: an unknown task name or bad seeds.
        BrowserUnavailableError: no Chromium (``executable_path`` names one).
    """
    from .browser import BrowserPool
    from .miniwob import PREFIX, MiniWoBServer, miniwob_tasks

    rewards: dict[str, list[float]] = {name: [0.0] * len(seeds) for name in tasks}
    expert = MiniWoBExpert()
    with MiniWoBServer() as server:
        todo = miniwob_tasks(PREFIX + ",".join(tasks), list(seeds), server.url)
        slots = [(name, index) for name in tasks for index in range(len(seeds))]
        queue = list(zip(todo, slots, strict=True))
        queue.reverse()

        async def worker(pool: BrowserPool) -> None:
            async with pool.context() as context:
                page = await context.new_page()
                while queue:
                    task, (name, index) = queue.pop()
                    try:
                        reward = await _episode(page, expert, task, max_steps, settle_s)
                    except Exception as exc:  # a stuck or crashed page fails its episode only
                        logger.warning("%s: episode failed: %s", task.task_id, exc)
                        reward = 0.0
                        await page.close()
                        page = await context.new_page()
                    rewards[name][index] = reward

        async with BrowserPool(max(1, workers), executable_path=executable_path) as pool:
            await asyncio.gather(*(worker(pool) for _ in range(max(1, min(workers, len(queue))))))
    return rewards


def success_rates(rewards: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The mean reward of each task (0.0 for a task with no episode)."""
    return {
        name: (sum(values) / len(values) if values else 0.0) for name, values in rewards.items()
    }
