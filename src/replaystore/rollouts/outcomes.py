"""How rollout tasks and iterations end: statuses, anti-bot walls, the result records.

* :class:`TaskOutcome`: how one task ended (status, trajectory, reward, error, time);
  :data:`FINISHED_STATUSES` are the statuses of a task that ran to its end.
* :class:`IterationResult`: what one
  :meth:`~replaystore.rollouts.collector.RolloutCollector.run_iteration` did.
* :func:`looks_blocked`: whether a page is an anti-bot wall (its site then goes to the
  blocklist); :func:`is_text_only_model_error`: whether a model server refused
  screenshots; :func:`difficulty_category`: a task difficulty as easy/medium/hard, the
  key of the step budgets (:data:`DEFAULT_MAX_STEPS`).

The collector (:mod:`.collector`) produces these; it re-exports every name here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replaystore.errors import ConfigError
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task

__all__ = [
    "DEFAULT_MAX_STEPS",
    "FAILED_STATUSES",
    "FINISHED_STATUSES",
    "TEXT_ONLY_MODEL",
    "IterationResult",
    "TaskOutcome",
    "blocked_step",
    "difficulty_category",
    "invalid_url_step",
    "is_text_only_model_error",
    "looks_blocked",
    "placeholder_step",
]

#: WebGym's ``train_difficulty_max_steps`` (scripts/config/main/rollout_train.yaml).
DEFAULT_MAX_STEPS: dict[str, int] = {"easy": 10, "medium": 20, "hard": 30}

#: vLLM's answer to an image sent to a model without a vision encoder.
TEXT_ONLY_MODEL = "not a multimodal model"
#: Statuses of a task that ran to its end (anything else is a failure).
FINISHED_STATUSES = frozenset({"answered", "done", "max_steps", "blocked", "navigation_error"})
#: Statuses of a task that did not get a judged answer.
FAILED_STATUSES = frozenset(
    {"blocked", "navigation_error", "timeout", "step_timeout", "error", "grace_expired"}
)

#: Statuses an anti-bot wall answers with (with challenge words or markup, see looks_blocked).
_WALL_STATUSES = frozenset({403, 429, 503})
_CHALLENGE_WORDS = re.compile(
    r"captcha|are you a robot|not a robot|verify (?:that )?you are (?:a )?human|"
    r"unusual traffic|checking (?:if the site connection is secure|your browser)|"
    r"access denied|too many requests|just a moment",
    re.IGNORECASE,
)
#: A page with at most this much visible text is "mostly the challenge" when it
#: shows challenge words or markup; an article that mentions CAPTCHA is longer.
_CHALLENGE_PAGE_CHARS = 500


def is_text_only_model_error(message: str) -> bool:
    """Whether a model server's error says it serves a text-only model (vLLM: HTTP 400
    ``"<model> is not a multimodal model"``); the fix is ``observation="text"``."""
    return TEXT_ONLY_MODEL in message.lower()


def difficulty_category(difficulty: Any) -> str:
    """``"easy"``/``"medium"``/``"hard"`` for a task difficulty.

    Our integer scale 1/2/3 maps to easy/medium/hard; larger integers follow
    WebGym's ranges (4-6 medium, 7 and more hard); the names map to themselves.

    Raises:
        ConfigError: anything else (names the value).
    """
    if isinstance(difficulty, str) and difficulty.strip().lower() in DEFAULT_MAX_STEPS:
        return difficulty.strip().lower()
    try:
        value = float(difficulty)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"task difficulty {difficulty!r} is not 1-3, a number, or easy/medium/hard"
        )
    if value <= 1:
        return "easy"
    if value <= 2:
        return "medium"
    if value <= 3:
        return "hard"
    return "medium" if value <= 6 else "hard"


def looks_blocked(status: int | None, title: str, text: str, challenge: str = "") -> str | None:
    """Why the page is an anti-bot wall, or None for an ordinary page.

    A wall is one of:

    * an HTTP 403, 429 or 503 answer whose page shows challenge words (CAPTCHA,
      "are you a robot", "access denied", "too many requests", ...) or challenge
      markup (the suite's botwall page; Cloudflare's 403/503 challenge);
    * a page that is mostly the challenge: at most 500 characters of visible
      text, with challenge markup (reCAPTCHA, hCaptcha, Turnstile) or words.

    An ordinary page that mentions those words (an article about CAPTCHAs, a
    help page on "access denied" errors, a login form with a reCAPTCHA box) is
    not a wall: one such page must not put its site on the blocklist.

    Args:
        status: HTTP status of the page's last main-frame navigation (None: unknown).
        title: the page title.
        text: the page's visible text (the first 2000 characters suffice).
        challenge: the challenge element found in the page (the snapshot's
            ``challenge``: a selector such as ``div.g-recaptcha``), ``""`` for none.
    """
    words = _CHALLENGE_WORDS.search(title) or _CHALLENGE_WORDS.search(text[:2000])
    marker = f"challenge markup {challenge}" if challenge else None
    if words is not None:
        marker = marker or f"challenge text {words.group(0)!r}"
    if marker is None:
        return None
    if status in _WALL_STATUSES:
        return f"HTTP {status}, {marker}"
    if len(" ".join(text.split())) <= _CHALLENGE_PAGE_CHARS:
        return f"challenge page, {marker}"
    return None


@dataclass(slots=True)
class TaskOutcome:
    """How one task ended.

    Attributes:
        task: the task.
        status: ``answered``, ``done`` (a MiniWoB++ page ended its episode),
            ``max_steps``, ``blocked``, ``navigation_error`` (finished), or
            ``timeout``, ``step_timeout``, ``grace_expired``, ``error``,
            ``interrupted`` (cut short).
        trajectory: the steps (WebGym step mappings), last one with the reward.
        reward: the final reward (0 for every cut-short task).
        error: what went wrong, or None.
        seconds: wall time from start to end of the task.
    """

    task: Task
    status: str
    trajectory: list[dict[str, Any]]
    reward: float
    error: str | None
    seconds: float

    @property
    def failed(self) -> bool:
        """The task did not get a judged answer (blocked, navigation error, timeout...)."""
        return self.status in FAILED_STATUSES


@dataclass(slots=True)
class IterationResult:
    """What one :meth:`RolloutCollector.run_iteration` did.

    Attributes:
        outcomes: one per task that started, in task order (after Ctrl-C: one per
            task finished by then).
        skipped: tasks not stored: never started (the grace period ended the
            iteration, or Ctrl-C) or cut by Ctrl-C, in task order.
        path: the iteration file written (None when nothing was written).
        interrupted: Ctrl-C stopped the iteration.
        blocked_sites: sites (``scheme://host:port``) recorded in the blocklist during
            this iteration.
        navigation_errors: failed navigations per website domain.
        seconds: wall time of the iteration.
        timings: summed seconds over all steps: ``browser`` (screenshot, page
            snapshot, action execution), ``screenshot`` (part of browser: the
            capture alone), ``policy`` (``agent.act``), ``write`` (screenshot
            files and their pixel fingerprints, in a worker thread), ``overhead``
            (everything else in the step: the collector's own cost).
        model_server_error: the model server's message when the iteration failed
            on it: the server serves a text-only model (the iteration stopped at
            the first such answer and stored nothing; see :attr:`text_only_model`),
            or every task ended in ``error`` on a :class:`ModelServerError`. None
            otherwise. A caller running iterations unattended should stop on it.
        blocklist_skipped: tasks left out before the iteration because their site
            is on the blocklist, per blocked site (set by
            :func:`~replaystore.rollouts.runner.rollout`; empty otherwise).
        ray: what the cluster did in a Ray rollout
            (:func:`~replaystore.rollouts.ray_rollout.ray_rollout`): ``actors`` (name ->
            host, node, tasks kept), ``nodes``, ``startup_s`` (starting the actors and
            their browsers, not in ``seconds``), ``driver_s`` (the driver's time unpacking
            results and writing their screenshots), ``duplicates`` (results of a task
            already done, dropped), ``reassigned`` (tasks handed on by a lost actor),
            ``lost_actors``; empty for an in-process run.
    """

    iteration: int
    rank: int
    outcomes: list[TaskOutcome]
    skipped: list[Task]
    path: Path | None
    interrupted: bool
    blocked_sites: list[str]
    navigation_errors: dict[str, int]
    seconds: float
    timings: dict[str, float] = field(default_factory=dict)
    model_server_error: str | None = None
    blocklist_skipped: dict[str, int] = field(default_factory=dict)
    ray: dict[str, Any] = field(default_factory=dict)

    @property
    def text_only_model(self) -> bool:
        """The model server refused screenshots: it serves a text-only model (run the
        rollout with ``observation="text"``)."""
        return self.model_server_error is not None and is_text_only_model_error(
            self.model_server_error
        )

    @property
    def trajectories(self) -> list[list[dict[str, Any]]]:
        """The stored trajectories (finished ones, plus cut-short ones unless interrupted)."""
        return [o.trajectory for o in self.outcomes if o.trajectory]

    @property
    def steps(self) -> int:
        """Steps taken by all tasks (the navigation-error placeholder steps excluded)."""
        return sum(len(o.trajectory) for o in self.outcomes if o.status != "navigation_error")

    @property
    def success_rate(self) -> float:
        """Share of started tasks whose reward is >= 1."""
        return (
            sum(o.reward >= 1.0 for o in self.outcomes) / len(self.outcomes)
            if self.outcomes
            else 0.0
        )

    @property
    def steps_per_second(self) -> float:
        """Steps over the iteration's wall time."""
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def status_counts(self) -> dict[str, int]:
        """How many tasks ended with each status."""
        return dict(Counter(o.status for o in self.outcomes))


# ------------------------------------------------------- record steps of ended tasks


def blocked_step(observation: Observation, why: str) -> dict[str, Any]:
    """The step that ends a task at an anti-bot wall: a ``stop`` action, reward 0 with
    ``is_blocked`` and why the page looked like a wall."""
    return {
        "observation": observation,
        "action": Action({"key": "stop", "reason": "blocked"}, "stop [blocked]"),
        "response": Response(raw_response="", answering_tokens={"action": ""}),
        "reward": Reward(0.0, {"status": "blocked", "why": why}, is_blocked=True),
    }


def invalid_url_step(task: Task, error: str | None) -> dict[str, Any]:
    """WebGym's placeholder for a website that did not load (the buffer drops it)."""
    return {
        "observation": Observation(task, "", None, {"url": task.website, "title": ""}),
        "action": Action({"key": "invalid_url", "error": error}, "Invalid URL"),
        "response": Response(raw_response="", answering_tokens={"action": ""}),
        "reward": Reward(0.0, None),
    }


def placeholder_step(task: Task, status: str, error: str | None) -> dict[str, Any]:
    """The one step of a task cut short before its first observation (kept as a record)."""
    return {
        "observation": Observation(task, "", None, {"url": task.website, "title": ""}),
        "action": Action({"key": status, "error": error}, status),
        "response": Response(raw_response="", answering_tokens={"action": ""}),
        "reward": Reward(0.0, None),
    }
