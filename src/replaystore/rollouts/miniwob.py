"""MiniWoB++ as a task source: the benchmark's pages, served locally, scored by themselves.

MiniWoB++ (Farama, MIT) is a set of small web tasks. Each page draws a fresh random
instance of its task from a seed and computes its own reward in JavaScript; the field
reports success on seeds never trained on. The pages come from the ``miniwob``
package (``pip install 'replaystore[miniwob]'``): its ``html/`` folder is served by
:class:`MiniWoBServer` on 127.0.0.1, and nothing else of the package is used.

A task is one task name and one seed: :func:`miniwob_tasks` builds them from the
command line's strings (``miniwob:click-button,enter-text`` and ``1000-1049``), each
task once per seed, with the id ``miniwob:<name>:<seed>``. An episode starts as
BrowserGym's ``browsergym-miniwob`` starts one (:func:`start_episode`): the page is
loaded, ``Math.seedrandom(seed)``, the episode timer set out of reach (a slow CPU
model must not lose to the page's 10 s clock), ``core.startEpisodeReal()``, wait for
``WOB_TASK_READY``; the goal is ``core.getUtterance()``, and it becomes the task's
``task_name`` (what the prompt's ``Task:`` line says). The human display (the
score panel, the click canvas, the start cover) is removed.

After each action :func:`episode_state` reads ``WOB_DONE_GLOBAL`` and
``WOB_RAW_REWARD_GLOBAL``: a done episode ends the trajectory, and its reward is the
page's (:func:`page_reward`: 1 for a raw reward > 0, else 0, with the page's reason);
an episode that runs out of steps scores 0. No string is matched.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass, replace
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

from replaystore.errors import ConfigError
from replaystore.rollouts.http_server import BackgroundHTTPServer
from replaystore.trajectories.components import Reward, Task

__all__ = [
    "DOMAIN",
    "EXPERT_TASKS",
    "OBSERVATION_SKIP",
    "PREFIX",
    "QUICK_TASKS",
    "EpisodeState",
    "MiniWoBServer",
    "available_tasks",
    "episode_state",
    "html_root",
    "is_miniwob_spec",
    "is_miniwob_task",
    "miniwob_tasks",
    "page_reward",
    "parse_seeds",
    "parse_task_names",
    "start_episode",
]

logger = logging.getLogger("replaystore.rollouts.miniwob")

#: The ``--tasks`` prefix that names MiniWoB++ tasks (``miniwob:click-button,enter-text``).
PREFIX = "miniwob:"
#: ``Task.domain`` of a MiniWoB++ task.
DOMAIN = "miniwob"
#: The 18 tasks with a scripted expert (:mod:`replaystore.rollouts.miniwob_experts`);
#: ``miniwob:experts`` names them all.
EXPERT_TASKS: tuple[str, ...] = (
    "click-test",
    "click-test-2",
    "click-button",
    "click-link",
    "click-dialog",
    "click-dialog-2",
    "click-tab",
    "click-tab-2",
    "click-option",
    "click-checkboxes",
    "click-widget",
    "enter-text",
    "enter-password",
    "focus-text",
    "focus-text-2",
    "login-user",
    "choose-list",
    "navigate-tree",
)
#: Four easy tasks: the quick MiniWoB++ loop's (``replaystore demo --quick --part miniwob``).
#: Each goal names its target by a label or a position drawn from a few (button ONE or TWO,
#: the dialog's Cancel, OK or x, Tab #1-#3, the 1st-3rd textbox) while the page draws
#: everything else afresh per seed; the tiny model learns that mapping in one trained
#: iteration. Copying a name it has never seen from the goal (click-button, click-link,
#: enter-text) it does not learn at this size and budget (docs/loop.md, "MiniWoB++").
QUICK_TASKS: tuple[str, ...] = ("click-test-2", "click-dialog-2", "click-tab", "focus-text-2")
#: What the page text leaves out: the goal line (the prompt's ``Task:`` says it) and
#: the human display.
OBSERVATION_SKIP = "#query, #reward-display, #click-canvas, #sync-task-cover"
#: Steps a MiniWoB++ episode may take (the 18 tasks need at most 7).
DEFAULT_MAX_STEPS = 10
#: The episode's clock, out of reach (ms; under setTimeout's 2**31 - 1 limit).
_EPISODE_MAX_TIME_MS = 1_000_000_000
_READY_TIMEOUT_S = 10.0
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


def html_root() -> Path:
    """The ``html`` folder of the installed ``miniwob`` package.

    Raises:
        ImportError: the package is missing (names the extra to install).
    """
    try:
        import miniwob
    except ImportError as exc:
        raise ImportError(
            "MiniWoB++ tasks need the miniwob package: pip install 'replaystore[miniwob]'"
        ) from exc
    root = Path(miniwob.__file__).parent / "html"
    if not (root / "miniwob").is_dir() or not (root / "core" / "core.js").is_file():
        raise ImportError(f"the miniwob package at {root.parent} has no html/miniwob pages")
    return root


#: The word lists of MiniWoB++'s ``common/ui_utils.js`` that the pages draw names, labels
#: and link texts from (``PEOPLE_NAMES``, thousands of names, is left out: the tiny
#: tokenizers this vocabulary is for have 1-2k tokens).
VOCABULARY_LISTS = ("FIFTY_NAMES", "COLORS", "lorem_words")
_JS_LIST = re.compile(r"ui_utils\.(\w+)\s*=\s*\[(.*?)\];", re.S)
_JS_STRING = re.compile(r"'([^'\\]*)'" + r'|"([^"\\]*)"')


def page_vocabulary() -> list[str]:
    """The words MiniWoB++'s pages draw their names and labels from (the
    :data:`VOCABULARY_LISTS` of the installed package's ``common/ui_utils.js``), each once,
    in the file's order, trailing commas dropped. The environment's lexicon, not any
    episode: no goal, seed or answer is in it.

    Raises:
        ImportError: the miniwob package is missing.
        RuntimeError: ``ui_utils.js`` no longer defines one of the lists.
    """
    source = (html_root() / "common" / "ui_utils.js").read_text(encoding="utf-8")
    lists = {m.group(1): m.group(2) for m in _JS_LIST.finditer(source)}
    words: dict[str, None] = {}
    for name in VOCABULARY_LISTS:
        if name not in lists:
            raise RuntimeError(f"{html_root()}/common/ui_utils.js defines no ui_utils.{name}")
        for single, double in _JS_STRING.findall(lists[name]):
            word = (single or double).strip().rstrip(",")
            if word:
                words.setdefault(word, None)
    return list(words)


def available_tasks() -> list[str]:
    """The names of every MiniWoB++ task the installed package ships (sorted)."""
    return sorted(p.stem for p in (html_root() / "miniwob").glob("*.html"))


def is_miniwob_spec(spec: Any) -> bool:
    """True when a ``--tasks`` value names MiniWoB++ tasks (``miniwob:...``)."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


def is_miniwob_task(task: Any) -> bool:
    """True for a task made by :func:`miniwob_tasks` (its domain is ``miniwob``)."""
    return getattr(task, "domain", None) == DOMAIN


def parse_task_names(spec: str) -> list[str]:
    """The task names of ``miniwob:a,b,c`` (``miniwob:experts``: the 18 of
    :data:`EXPERT_TASKS`; ``miniwob:quick``: :data:`QUICK_TASKS`), checked against the
    installed package.

    Raises:
        ConfigError: not a ``miniwob:`` value, no name, a repeated name, or a name the
            package does not have (the message names it and where the list is).
    """
    if not is_miniwob_spec(spec):
        raise ConfigError(f"MiniWoB++ tasks are written miniwob:NAME[,NAME...], got {spec!r}")
    body = spec[len(PREFIX) :].strip()
    names: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if part == "experts":
            names.extend(EXPERT_TASKS)
        elif part == "quick":
            names.extend(QUICK_TASKS)
        elif part:
            names.append(part)
    if not names:
        raise ConfigError(f"{spec!r} names no MiniWoB++ task (miniwob:click-button,enter-text)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{spec!r} names {', '.join(repeated)} more than once")
    known = set(available_tasks())
    unknown = [n for n in names if not _NAME.match(n) or n not in known]
    if unknown:
        raise ConfigError(
            f"unknown MiniWoB++ task(s) {', '.join(map(repr, unknown))}: the package has "
            f"{len(known)} (replaystore.rollouts.miniwob.available_tasks())"
        )
    return names


def parse_seeds(spec: str | int | list[int] | tuple[int, ...]) -> list[int]:
    """Seeds from ``"1000-1049"``, ``"1,2,7-9"``, an int, or a list of ints.

    Raises:
        ConfigError: a malformed part, a negative seed, a range that runs backwards,
            a repeated seed, or no seed at all (the message quotes the value).
    """
    if isinstance(spec, bool):
        raise ConfigError(f"seeds must be 'A-B', 'A,B,...' or a list of ints, got {spec!r}")
    if isinstance(spec, int):
        values = [spec]
    elif isinstance(spec, list | tuple):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in spec):
            raise ConfigError(f"seeds must be integers, got {spec!r}")
        values = list(spec)
    elif isinstance(spec, str):
        values = []
        for part in spec.split(","):
            part = part.strip()
            match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
            if match is None:
                raise ConfigError(f"seeds {spec!r}: {part!r} is not N or A-B")
            low = int(match.group(1))
            high = int(match.group(2)) if match.group(2) is not None else low
            if high < low:
                raise ConfigError(f"seeds {spec!r}: the range {part!r} runs backwards")
            values.extend(range(low, high + 1))
    else:
        raise ConfigError(f"seeds must be 'A-B', 'A,B,...' or a list of ints, got {spec!r}")
    if not values:
        raise ConfigError(f"seeds {spec!r} holds no seed")
    if any(v < 0 for v in values):
        raise ConfigError(f"seeds must be >= 0, got {spec!r}")
    if len(set(values)) != len(values):
        repeated = sorted({v for v in values if values.count(v) > 1})
        raise ConfigError(f"seeds {spec!r} repeat {repeated[:5]}")
    return values


def miniwob_tasks(
    spec: str,
    seeds: str | list[int],
    base_url: str,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
) -> list[Task]:
    """One :class:`Task` per (task name, seed), names outer, seeds inner.

    Args:
        spec: ``miniwob:NAME[,NAME...]`` (:func:`parse_task_names`).
        seeds: :func:`parse_seeds`'s forms.
        base_url: the :class:`MiniWoBServer`'s URL (``http://127.0.0.1:PORT``).
        max_steps: each task's step budget.

    The task's ``task_name`` is empty until :func:`start_episode` reads the goal the
    seed drew; ``evaluator_reference`` is ``{"miniwob": name, "seed": seed}``.
    """
    names = parse_task_names(spec)
    values = parse_seeds(seeds)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError(f"max_steps must be an int >= 1, got {max_steps!r}")
    base = base_url.rstrip("/")
    return [
        Task(
            task_name="",
            domain=DOMAIN,
            subdomain=name,
            website=f"{base}/miniwob/{name}.html",
            difficulty="easy",
            evaluator_reference={"miniwob": name, "seed": seed},
            reference_answer=None,
            task_id=f"{PREFIX}{name}:{seed}",
            max_steps=max_steps,
        )
        for name in names
        for seed in values
    ]


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("miniwob server: " + format, *args)


class MiniWoBServer(BackgroundHTTPServer):
    """The ``miniwob`` package's pages on a background HTTP server (a context manager).

    The pages load ``../core/*.js`` and ``../common/*``, so the whole ``html`` folder
    is served, read-only, on ``host`` (loopback by default).

    Attributes:
        url: ``http://127.0.0.1:PORT`` once started.
    """

    name = "MiniWoB++ pages"

    @property
    def url(self) -> str:
        if not self.started:
            raise ValueError("the MiniWoB++ server is not started: use `with MiniWoBServer():`")
        return f"http://{self.host}:{self.port}"

    def handler(self) -> Any:
        """Files under the package's ``html`` folder.

        Raises:
            ImportError: the ``miniwob`` package is missing.
        """
        return functools.partial(_QuietHandler, directory=str(html_root()))


_START_JS = """
([seed, maxTime]) => {
  Math.seedrandom(seed);
  core.EPISODE_MAX_TIME = maxTime;
  core.startEpisodeReal();
  for (const id of ['reward-display', 'click-canvas', 'sync-task-cover']) {
    const el = document.getElementById(id);
    if (el) el.remove();
  }
  return true;
}
"""

_STATE_JS = """
() => ({done: Boolean(WOB_DONE_GLOBAL), raw: Number(WOB_RAW_REWARD_GLOBAL),
        reason: WOB_REWARD_REASON === null || WOB_REWARD_REASON === undefined ?
                null : String(WOB_REWARD_REASON)})
"""


async def start_episode(page: Any, task: Task) -> Task:
    """Start ``task``'s seeded episode on ``page`` (the task's page, loaded): the task
    with the goal the seed drew as its ``task_name``.

    Raises:
        RuntimeError: the page is not a MiniWoB++ task page, or the task did not get
            ready within 10 s.
    """
    reference = task.evaluator_reference or {}
    seed = reference.get("seed") if isinstance(reference, dict) else None
    if not isinstance(seed, int):
        raise RuntimeError(f"task {task.task_id}: no MiniWoB++ seed in evaluator_reference")
    if not await page.evaluate("() => typeof core === 'object' && !!core.startEpisodeReal"):
        raise RuntimeError(f"task {task.task_id}: {page.url} is not a MiniWoB++ task page")
    await page.evaluate(_START_JS, [seed, _EPISODE_MAX_TIME_MS])
    await page.wait_for_function("() => WOB_TASK_READY", timeout=_READY_TIMEOUT_S * 1000.0)
    goal = await page.evaluate("() => core.getUtterance()")
    return replace(task, task_name=str(goal))


@dataclass(frozen=True, slots=True)
class EpisodeState:
    """The page's episode: ``done``, its raw reward (1 success, <= 0 failure) and reason."""

    done: bool
    raw_reward: float
    reason: str | None


async def episode_state(page: Any) -> EpisodeState:
    """``WOB_DONE_GLOBAL``, ``WOB_RAW_REWARD_GLOBAL`` and ``WOB_REWARD_REASON`` of ``page``."""
    value = await page.evaluate(_STATE_JS)
    return EpisodeState(bool(value["done"]), float(value["raw"]), value.get("reason"))


def page_reward(task: Task, state: EpisodeState | None, status: str) -> Reward:
    """The trajectory's :class:`Reward` from the page: 1.0 when the episode is done with
    a raw reward > 0, else 0.0; ``evaluation`` says why (``source: "miniwob"``, the
    raw reward, the page's reason, the task and seed, the trajectory's status)."""
    reference = task.evaluator_reference if isinstance(task.evaluator_reference, dict) else {}
    done = state is not None and state.done
    raw = state.raw_reward if state is not None else 0.0
    success = done and raw > 0
    reason = f"the page's reward ({raw:g})" if done else f"the episode did not end ({status})"
    evaluation = {
        "source": DOMAIN,
        "task": reference.get("miniwob"),
        "seed": reference.get("seed"),
        "done": done,
        "raw_reward": raw,
        "page_reason": state.reason if state is not None else None,
        "reason": reason,
        "status": status,
    }
    return Reward(1.0 if success else 0.0, evaluation)
