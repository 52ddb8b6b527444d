"""Parallel browser rollouts (WebGym's ``AsyncWebGym``): tasks in, stored trajectories out.

:meth:`RolloutCollector.run_iteration` runs one rollout iteration:

1. ``num_workers`` asyncio workers take tasks in order; each task gets its own
   browser context from the :class:`~replaystore.rollouts.browser.BrowserPool`.
2. The task's website is opened (``navigation_retries`` more tries on a
   navigation error, each error logged and counted per website; when every try
   fails the trajectory is WebGym's one-step ``invalid_url`` placeholder).
3. Each step: screenshot (PNG written atomically under ``screenshot_root``, and
   its pixel fingerprint taken in the same worker thread, which sets the previous
   step's ``same_as_next_screenshot``),
   page metadata (url, title) and accessibility tree -> ``agent.act`` (the
   :class:`~replaystore.rollouts.policy.WebAgent`: prompt, policy, response
   decomposition) -> :func:`~replaystore.rollouts.actions.parse_action` ->
   :func:`~replaystore.rollouts.actions.execute_action`. An unparseable action
   is a recorded no-op step. ``answer(...)`` ends the task; so does the task's
   step budget (``max_steps_by_difficulty``; a task's own ``max_steps`` wins).
4. An anti-bot page (:func:`looks_blocked`: a 403/429/503 with challenge words
   or markup, or a page that is mostly a challenge) ends the task as blocked: the
   site (scheme, host and port) goes to the ``blocklist`` (url, task id,
   screenshot), so the next rollouts leave its tasks out.
5. The evaluator turns the answer into the final step's :class:`Reward`.
6. When every task has ended (or the completion threshold was reached and the
   grace period ran out), the iteration's trajectories are written with
   :class:`~replaystore.trajectories.storage.TrajectoryStorage` (one file per
   iteration and rank), ``task_history`` is updated and the experiment logger
   gets the iteration's metrics.

Nothing blocks the event loop that drives every browser: screenshot files, the
judge's screenshot reads, the iteration file, the experiment logger and the
runner's file work run in worker threads (``asyncio.to_thread``).

Failures are data, not crashes: a task that runs past ``task_timeout_s`` or a
step past ``step_timeout_s`` is recorded with the steps it made and reward 0
(status ``timeout``/``step_timeout``). The step that was cut keeps what it had
reached: its screenshot and prompt, and the model's reply when the action was
what hung (the action then carries the ``error``); a step cut before the reply
is a record step (action ``step_timeout``, empty reply), stored but no training
sample. The model client's request timeout (30 s by default) is shorter than the
step timeout (120 s), so a request that times out is retried inside its step.

The model server is the exception a run cannot work around: when it answers
that the model is not multimodal (vLLM's HTTP 400 ``"... is not a multimodal
model"``: a text-only model was sent a screenshot) the iteration stops at once,
stores nothing, and
:attr:`IterationResult.model_server_error` carries the server's message; it is
set too when every task ended in ``error`` on a
:class:`~replaystore.errors.ModelServerError` (400/500 after retries, connection
refused, 404), an iteration in which no task reached the model.

Ctrl-C (SIGINT, when the collector runs in the main thread) stops the iteration:
the tasks finished by then are written, the running ones are cut (not stored,
their screenshot folders removed, their ids in the file's ``skipped_task_ids``
with the tasks never started). A second Ctrl-C stops waiting for the cut tasks;
no number of Ctrl-C loses the finished trajectories (the handler stays until the
file is written). The browser ignores the Ctrl-C a terminal sends to the whole
process group (``BrowserPool`` launches it with ``handle_sigint=False``).

Each trajectory's last step carries ``trajectory_metadata``: ``status``,
``seconds``, ``iteration``, ``rank``, ``error``, ``observation`` (what the model
was shown: ``"screenshot"`` or ``"text"``, the agent's ``observation``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import shutil
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from replaystore.errors import ConfigError, ModelServerError
from replaystore.pipeline.blocklist import Blocklist, normalize_domain, normalize_site
from replaystore.pipeline.task_history import TaskHistory
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task
from replaystore.trajectories.response_decomposer import get_action_string
from replaystore.trajectories.storage import TrajectoryStorage

from . import miniwob
from .actions import NavigationWatcher, execute_action, parse_action
from .browser import BrowserPool, page_snapshot
from .experiment_logger import log_result
from .outcomes import (
    DEFAULT_MAX_STEPS,
    FINISHED_STATUSES,
    IterationResult,
    TaskOutcome,
    blocked_step,
    difficulty_category,
    invalid_url_step,
    is_text_only_model_error,
    looks_blocked,
    placeholder_step,
)
from .page_text import page_text
from .screenshots import (
    default_screenshot_root,
    screenshot_folder,
    take_screenshot,
    write_png,
)

__all__ = [
    "DEFAULT_MAX_STEPS",
    "DEFAULT_STEP_TIMEOUT_S",
    "FINISHED_STATUSES",
    "IterationResult",
    "RolloutCollector",
    "TaskOutcome",
    "default_screenshot_root",
    "difficulty_category",
    "is_text_only_model_error",
    "looks_blocked",
    "screenshot_folder",
    "take_screenshot",
]

logger = logging.getLogger("replaystore.rollouts.collector")

#: Seconds one step (observe, policy, action) may take; longer than the model client's
#: request timeout (``chat_client.DEFAULT_REQUEST_TIMEOUT_S``) so its retries fit in a step.
DEFAULT_STEP_TIMEOUT_S = 120.0

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


class _Run:
    """Mutable state of one running task: survives the task's cancellation."""

    __slots__ = (
        "answer",
        "draft",
        "episode",
        "error",
        "fingerprint",
        "index",
        "nav_status",
        "start",
        "status",
        "steps",
        "task",
    )

    def __init__(self, index: int, task: Task) -> None:
        self.index = index
        self.task = task
        self.steps: list[dict[str, Any]] = []
        self.status = "running"
        self.answer: str | None = None
        self.error: str | None = None
        self.nav_status: int | None = None  # HTTP status of the main frame's last navigation
        self.fingerprint: bytes | None = None  # pixel fingerprint of the last screenshot
        # The step in progress: its observation, then the response and action; kept
        # when the step is cut (timeout, grace period) so that nothing reached is lost.
        self.draft: dict[str, Any] | None = None
        # A MiniWoB++ task's episode as its page last reported it (None: not read yet).
        self.episode: miniwob.EpisodeState | None = None
        self.start = time.perf_counter()


class _StepTimeout(Exception):
    pass


class RolloutCollector:
    """Runs rollout iterations in a browser pool (see the module docstring).

    Args:
        agent: has ``await agent.act(task, observation, history, step=, iteration=)``
            returning a :class:`Response` (a :class:`~replaystore.rollouts.policy.WebAgent`).
        evaluator: has ``await evaluator.evaluate(task, answer, steps, blocked=)``
            returning a :class:`Reward` (a :class:`~replaystore.rollouts.evaluator.Evaluator`).
        storage: where iteration files go.
        pool: the browser pool (started by the caller; its ``size`` bounds the
            useful ``num_workers``).
        num_workers: tasks running at once.
        max_steps_by_difficulty: step budget per ``easy``/``medium``/``hard``
            (:func:`difficulty_category`); missing names use :data:`DEFAULT_MAX_STEPS`.
        step_timeout_s: limit for one step (observe + policy + action); keep it above
            the model client's request timeout, so a timed-out request is retried in
            the step. A cut step keeps what it had reached (module docstring).
        task_timeout_s: limit for one task, from its start.
        navigation_timeout_s: limit for one page load.
        navigation_retries: extra tries of the first page load.
        completion_threshold: share of tasks (0-1] after which the grace period starts.
        grace_period_s: how long the slowest tasks may still run after the threshold.
        blocklist: where anti-bot sites are recorded (None: not recorded).
        task_history: updated with every stored attempt (None: no history).
        logger: an experiment logger with ``log_iteration`` (None: no logging).
        screenshot_root: screenshot directory (default ``<storage.root>/screenshots``).
        settle_s: how long after a click or key press a page load may still start.
        progress: show a progress bar (None: only when stderr is a TTY).
        handle_sigint: stop cleanly on Ctrl-C (only when running in the main thread).
        trajectory_metadata: more keys for every trajectory's ``trajectory_metadata``
            (the loop records ``policy`` and ``checkpoint``); the collector's own keys
            (``status``, ``seconds``, ...) win over them.

    Raises:
        ConfigError: a bad number (names the argument).
    """

    def __init__(
        self,
        agent: Any,
        evaluator: Any,
        storage: TrajectoryStorage,
        *,
        pool: BrowserPool,
        num_workers: int = 4,
        max_steps_by_difficulty: Mapping[str, int] | None = None,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        task_timeout_s: float = 1800.0,
        navigation_timeout_s: float = 30.0,
        navigation_retries: int = 2,
        completion_threshold: float = 0.95,
        grace_period_s: float = 30.0,
        blocklist: Blocklist | None = None,
        task_history: TaskHistory | None = None,
        logger: Any = None,
        screenshot_root: str | Path | None = None,
        settle_s: float = 0.25,
        progress: bool | None = None,
        handle_sigint: bool = True,
        trajectory_metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(getattr(agent, "act", None)):
            raise ConfigError(
                f"agent must have an async act(...) method, got {type(agent).__name__}"
            )
        if not callable(getattr(evaluator, "evaluate", None)):
            raise ConfigError(
                f"evaluator must have an async evaluate(...) method, got {type(evaluator).__name__}"
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be an int >= 1, got {num_workers!r}")
        for name, value in (
            ("step_timeout_s", step_timeout_s),
            ("task_timeout_s", task_timeout_s),
            ("navigation_timeout_s", navigation_timeout_s),
        ):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        if not (isinstance(grace_period_s, int | float) and 0 <= grace_period_s < math.inf):
            raise ConfigError(f"grace_period_s must be a number >= 0, got {grace_period_s!r}")
        if (
            isinstance(navigation_retries, bool)
            or not isinstance(navigation_retries, int)
            or navigation_retries < 0
        ):
            raise ConfigError(f"navigation_retries must be an int >= 0, got {navigation_retries!r}")
        if not (isinstance(completion_threshold, int | float) and 0 < completion_threshold <= 1):
            raise ConfigError(
                f"completion_threshold must be in (0, 1], got {completion_threshold!r}"
            )
        steps = dict(DEFAULT_MAX_STEPS)
        for name, value in (max_steps_by_difficulty or {}).items():
            if name not in DEFAULT_MAX_STEPS:
                raise ConfigError(
                    f"max_steps_by_difficulty has unknown key {name!r}; use easy, medium, hard"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"max_steps_by_difficulty[{name!r}] must be an int >= 1, got {value!r}"
                )
            steps[name] = value
        self.agent = agent
        self.evaluator = evaluator
        self.storage = storage
        self.pool = pool
        self.num_workers = num_workers
        self.max_steps_by_difficulty = steps
        self.step_timeout_s = float(step_timeout_s)
        self.task_timeout_s = float(task_timeout_s)
        self.navigation_timeout_s = float(navigation_timeout_s)
        self.navigation_retries = navigation_retries
        self.completion_threshold = float(completion_threshold)
        self.grace_period_s = float(grace_period_s)
        self.blocklist = blocklist
        self.task_history = task_history
        self.logger = logger
        self.screenshot_root = (
            Path(screenshot_root)
            if screenshot_root is not None
            else default_screenshot_root(storage.root)
        )
        self.settle_s = float(settle_s)
        self.progress = progress
        self.handle_sigint = handle_sigint
        self.trajectory_metadata = dict(trajectory_metadata or {})
        #: What the model is shown of a page (the agent's ``observation``; recorded per trajectory).
        self.observation = str(getattr(agent, "observation", "screenshot"))
        #: Failed navigations per website domain, over the collector's life.
        self.navigation_errors: Counter[str] = Counter()

    # ------------------------------------------------------------------ one task

    def max_steps(self, task: Task) -> int:
        """The task's step budget: its own ``max_steps`` when set, else by difficulty."""
        if task.max_steps is not None:
            return int(task.max_steps)
        return self.max_steps_by_difficulty[difficulty_category(task.difficulty)]

    async def _open(self, page: Any, run: _Run, nav_errors: Counter[str]) -> bool:
        """Load the task's website, retrying; False when every try failed."""
        from playwright.async_api import Error as PlaywrightError

        url = run.task.website
        domain = _domain(url)
        tries = self.navigation_retries + 1
        for attempt in range(1, tries + 1):
            try:
                await page.goto(url, wait_until="load", timeout=self.navigation_timeout_s * 1000.0)
                if miniwob.is_miniwob_task(run.task):
                    run.task = await miniwob.start_episode(page, run.task)
                return True
            except PlaywrightError as exc:
                message = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                nav_errors[domain] += 1
                self.navigation_errors[domain] += 1
                logger.warning(
                    "navigation to %s failed (try %d/%d, task %s): %s",
                    url,
                    attempt,
                    tries,
                    run.task.task_id,
                    message,
                )
                run.error = message
                if attempt < tries:
                    await asyncio.sleep(min(2.0, 0.25 * 2 ** (attempt - 1)))
        return False

    async def _observe(
        self, page: Any, run: _Run, step: int, folder: Path, timings: dict[str, float]
    ) -> tuple[Observation, str | None]:
        """Screenshot + snapshot -> Observation, and why the page is an anti-bot wall (or None)."""
        t0 = time.perf_counter()
        png = await take_screenshot(page, str(run.task.task_id))
        t1 = time.perf_counter()
        snap = await page_snapshot(page)
        if self.observation == "text":
            skip = miniwob.OBSERVATION_SKIP if miniwob.is_miniwob_task(run.task) else ""
            snap["tree"] = await page_text(page, skip=skip)
        t2 = time.perf_counter()
        path = folder / f"step_{step:03d}.png"
        fingerprint = await asyncio.to_thread(write_png, path, png)
        t3 = time.perf_counter()
        # The previous step's same-as-next flag, from pixels, while the rollout runs (as
        # WebGym does): the storage then has nothing to decode when the iteration is saved.
        if run.steps and run.fingerprint is not None and fingerprint is not None:
            run.steps[-1]["same_as_next_screenshot"] = run.fingerprint == fingerprint
        run.fingerprint = fingerprint
        timings["screenshot"] += t1 - t0
        timings["browser"] += t2 - t0
        timings["write"] += t3 - t2
        metadata = {"url": page.url, "title": snap["title"]}
        observation = Observation(run.task, str(path), snap["tree"], metadata)
        wall = looks_blocked(run.nav_status, snap["title"], snap["text"], snap.get("challenge", ""))
        return observation, wall

    async def _run_task(self, run: _Run, it: _Iteration, folder: Path) -> None:
        """Open the task's website in a fresh browser context and take its steps."""
        async with self.pool.context() as context:
            page = await context.new_page()

            def on_response(response: Any) -> None:
                # The status of the main frame's last navigation (anti-bot walls answer 403/429).
                request = response.request
                if request.is_navigation_request() and request.frame == page.main_frame:
                    run.nav_status = response.status

            page.on("response", on_response)
            watcher = NavigationWatcher(page)
            if not await self._open(page, run, it.nav_errors):
                run.status = "navigation_error"
                run.steps = [invalid_url_step(run.task, run.error)]
                return
            budget = self.max_steps(run.task)
            for step in range(budget):
                try:
                    async with asyncio.timeout(self.step_timeout_s):
                        finished = await self._step(page, watcher, run, step, it, folder)
                except TimeoutError:
                    raise _StepTimeout(f"step {step} ran past {self.step_timeout_s:g} s") from None
                it.steps_done += 1
                if finished:
                    return
            run.status = "max_steps"

    async def _step(
        self,
        page: Any,
        watcher: Any,
        run: _Run,
        step: int,
        it: _Iteration,
        folder: Path,
    ) -> bool:
        """One observe -> act -> execute round; True when the task ended."""
        timings, iteration = it.timings, it.number
        t_start = time.perf_counter()
        before = dict(timings)
        observation, wall = await self._observe(page, run, step, folder, timings)
        draft: dict[str, Any] = {"observation": observation}
        run.draft = draft
        if wall is not None:
            run.draft = None
            run.steps.append(blocked_step(observation, wall))
            run.status = "blocked"
            run.error = f"anti-bot page at {page.url}: {wall}"
            if self.blocklist is not None:
                await asyncio.to_thread(
                    self.blocklist.record_blocked_website,
                    page.url,
                    task_id=run.task.task_id,
                    screenshot_path=observation.image_path,
                )
                it.blocked_sites.append(normalize_site(page.url))
            logger.info("task %s: %s", run.task.task_id, run.error)
            _account(timings, before, t_start)
            return True
        t0 = time.perf_counter()
        response = await self.agent.act(
            run.task, observation, run.steps, step=step, iteration=iteration
        )
        t1 = time.perf_counter()
        timings["policy"] += t1 - t0
        action = parse_action(get_action_string(response) or "")
        if action.action["key"] == "invalid" and isinstance(response.answering_tokens, Mapping):
            parse_error = response.answering_tokens.get("parse_error")
            if parse_error:
                action.action["reason"] = str(parse_error)
        draft.update(response=response, action=action)
        t2 = time.perf_counter()
        outcome = await execute_action(
            page,
            action,
            navigation_timeout_s=self.navigation_timeout_s,
            settle_s=self.settle_s,
            watcher=watcher,
        )
        t3 = time.perf_counter()
        timings["browser"] += t3 - t2
        if outcome.error is not None and outcome.navigated:
            domain = _domain(page.url or run.task.website)
            self.navigation_errors[domain] += 1
            logger.warning("task %s step %d: %s", run.task.task_id, step, outcome.error)
        record: dict[str, Any] = {
            "observation": observation,
            "action": action,
            "response": response,
            "reward": Reward(0.0, None),
        }
        if outcome.error is not None:
            record["action"] = Action(
                {**action.action, "error": outcome.error}, action.action_string
            )
        run.steps.append(record)
        run.draft = None
        if outcome.done:
            run.status = "answered"
            run.answer = outcome.answer
        elif miniwob.is_miniwob_task(run.task):
            run.episode = await miniwob.episode_state(page)
            if run.episode.done:
                run.status = "done"
                outcome.done = True
        _account(timings, before, t_start)
        return outcome.done

    async def _cut_step(self, run: _Run) -> dict[str, Any]:
        """The step a timeout (or another cut) interrupted, with what it had reached.

        After the model replied: the step as it would have been stored, its action
        marked with the ``error`` that cut it (the page hung on the action). Before:
        the observation (screenshot, page metadata) and the prompt the model was sent,
        rebuilt by the agent's ``conversation_builder``, with action ``run.status``
        and an empty reply: a record step, stored but no training sample.
        """
        draft, run.draft = run.draft or {}, None
        why = run.error or run.status
        if "response" in draft:
            action = draft["action"]
            return {
                "observation": draft["observation"],
                "action": Action({**action.action, "error": why}, action.action_string),
                "response": draft["response"],
                "reward": Reward(0.0, None),
            }
        return {
            "observation": draft["observation"],
            "action": Action({"key": run.status, "error": why}, run.status),
            "response": Response(
                raw_response="",
                answering_tokens={"action": ""},
                raw_prompt=await self._prompt(run.task, draft["observation"], run.steps),
            ),
            "reward": Reward(0.0, None),
        }

    async def _prompt(
        self, task: Task, observation: Observation, history: list[dict[str, Any]]
    ) -> str:
        """The stored prompt (JSON) for ``observation``, as the agent builds it; ``""`` when
        the agent has no ``conversation_builder`` or the build fails."""
        builder = getattr(self.agent, "conversation_builder", None)
        if builder is None:
            return ""
        try:
            messages = await asyncio.to_thread(builder.build, task, history, observation)
        except Exception as exc:  # the prompt is a nicety of a record step, never fatal
            logger.debug("task %s: the cut step's prompt cannot be rebuilt: %s", task.task_id, exc)
            return ""
        return json.dumps(messages, ensure_ascii=False)

    async def _finish(
        self, run: _Run, iteration: int, rank: int, status: str | None = None
    ) -> TaskOutcome:
        """Evaluate (finished tasks) and stamp the last step; the task's outcome."""
        if status is not None:
            run.status = status
        seconds = time.perf_counter() - run.start
        if run.draft is not None:
            run.steps.append(await self._cut_step(run))
        if not run.steps:
            run.steps = [placeholder_step(run.task, run.status, run.error)]
        if miniwob.is_miniwob_task(run.task):
            # Scored by the page itself: 1 when it ended the episode with a reward > 0.
            reward = miniwob.page_reward(run.task, run.episode, run.status)
        elif run.status in ("answered", "max_steps", "blocked"):
            reward = await self.evaluator.evaluate(
                run.task, run.answer, run.steps, blocked=run.status == "blocked"
            )
        elif run.status == "navigation_error":
            reward = Reward(0.0, {"status": "navigation_error", "error": run.error})
        else:
            reward = Reward(0.0, {"status": run.status, "error": run.error})
        if not isinstance(reward, Reward):
            raise ConfigError(
                f"{type(self.evaluator).__name__}.evaluate returned {type(reward).__name__}, "
                "not a Reward"
            )
        last = run.steps[-1]
        last["reward"] = reward
        last["trajectory_metadata"] = {
            **self.trajectory_metadata,
            "status": run.status,
            "seconds": round(seconds, 4),
            "iteration": iteration,
            "rank": rank,
            "error": run.error,
            "observation": self.observation,
        }
        value = float(reward.reward) if reward.reward is not None else 0.0
        return TaskOutcome(run.task, run.status, run.steps, value, run.error, seconds)

    # ------------------------------------------------------------------ iteration

    async def run_iteration(
        self, tasks: Sequence[Task | Mapping[str, Any]], iteration: int, rank: int = 0
    ) -> IterationResult:
        """Roll out ``tasks`` and store them as ``iteration`` for ``rank``.

        The stages: :meth:`_start_workers` (one asyncio task per worker, each taking
        tasks in order), :meth:`_supervise` (waits for them; completion threshold and
        grace period), :meth:`_store` (the iteration file, task history) and
        :meth:`_report` (log line, experiment logger). Ctrl-C is caught from the
        start until the file is written (:meth:`_on_ctrl_c`).

        Args:
            tasks: the tasks (:class:`Task` or mappings of its fields).
            iteration: the iteration number (>= 1) of the file written.
            rank: this process's rank (one file per iteration and rank).

        Returns:
            An :class:`IterationResult` (``interrupted`` after Ctrl-C).

        Raises:
            SchemaError: a malformed task (names its position).
            ConfigError: a task's difficulty has no step budget; an evaluator
                returns something other than a :class:`Reward`.
            StorageError: the iteration file exists already.
            BrowserUnavailableError / RuntimeError: the pool is not usable.

        Cost: per step one screenshot, one page evaluation, one policy call and
        one action; one iteration file (with its fsync) at the end.
        """
        todo = [Task.from_dict(t) for t in tasks]
        for task in todo:
            self.max_steps(task)  # a bad difficulty fails before any browser work
        if int(iteration) != iteration or iteration < 1:
            raise ValueError(f"iteration must be an integer >= 1, got {iteration!r}")
        it = _Iteration(int(iteration), int(rank), todo, _Progress(len(todo), self.progress))
        it.base = screenshot_folder(self.screenshot_root, it.number, it.rank)
        loop = asyncio.get_running_loop()
        catching = False
        if self.handle_sigint and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGINT, self._on_ctrl_c, it)
                catching = True
        try:
            self._start_workers(it)
            await self._supervise(it)
            it.bar.close()
            result = await self._store(it)
        finally:
            it.bar.close()
            await self._stop_workers(it)
            if catching:  # only now: no Ctrl-C can come between the tasks and their file
                with contextlib.suppress(Exception):
                    loop.remove_signal_handler(signal.SIGINT)
        await self._report(it, result)
        return result

    async def run_task(
        self,
        task: Task | Mapping[str, Any],
        iteration: int,
        *,
        rank: int = 0,
        index: int = 0,
        timings: dict[str, float] | None = None,
    ) -> TaskOutcome:
        """Roll out one task and return its outcome, storing nothing (a Ray rollout actor
        runs this; its driver stores). Failures are the outcome's status and ``error``, as
        in :meth:`run_iteration`; screenshots go to ``<index>_<task id>`` under
        :func:`screenshot_folder` (``iteration``, ``rank``). ``timings``: this task's step
        timings are added to it. Cancelling the call cuts the task (nothing returned)."""
        todo = Task.from_dict(task)
        self.max_steps(todo)  # a bad difficulty fails before any browser work
        it = _Iteration(int(iteration), int(rank), [todo], _Progress(0, False))
        it.base = screenshot_folder(self.screenshot_root, it.number, it.rank)
        try:
            await self._attempt(it, index, todo)
        finally:
            for key, value in it.timings.items():
                if timings is not None:
                    timings[key] = timings.get(key, 0.0) + value
        return it.outcomes[index]

    def _start_workers(self, it: _Iteration) -> None:
        """One asyncio task per worker (at most one per task)."""
        it.queue = list(enumerate(it.todo))
        it.queue.reverse()
        it.workers = [
            asyncio.create_task(self._worker(it))
            for _ in range(min(self.num_workers, len(it.todo)))
        ]

    async def _worker(self, it: _Iteration) -> None:
        """Takes tasks until none is left or the iteration stops."""
        while it.queue and it.stop_reason is None:
            index, task = it.queue.pop()
            await self._attempt(it, index, task)

    async def _attempt(self, it: _Iteration, index: int, task: Task) -> None:
        """Run one task in its screenshot folder; record its outcome however it ends."""
        run = _Run(index, task)
        it.runs[index] = run
        folder = it.base / f"{index:04d}_{_SAFE_NAME.sub('_', str(task.task_id or 'task'))[:60]}"
        it.folders[index] = folder
        it.bar.started()
        status: str | None = None
        try:
            await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
            async with asyncio.timeout(self.task_timeout_s):
                await self._run_task(run, it, folder)
        except TimeoutError:
            status, run.error = "timeout", f"task ran past {self.task_timeout_s:g} s"
        except _StepTimeout as exc:
            status, run.error = "step_timeout", str(exc)
        except asyncio.CancelledError:
            reason = it.stop_reason or "interrupted"
            if reason == "interrupted":  # cut by Ctrl-C: not stored, nothing to finish
                seconds = time.perf_counter() - run.start
                it.outcomes[index] = TaskOutcome(task, reason, [], 0.0, "Ctrl-C", seconds)
                it.bar.finished(True, it.steps_done)
                raise
            if reason == "text_only_model":
                it.server_failed.add(index)
                reason, run.error = "error", f"stopped: {it.server_message}"
            it.outcomes[index] = await asyncio.shield(self._finish(run, it.number, it.rank, reason))
            it.bar.finished(True, it.steps_done)
            raise
        except ModelServerError as exc:
            status, run.error = "error", f"ModelServerError: {exc}"
            it.server_failed.add(index)
            logger.info("task %s: model server failed: %s", task.task_id, exc)
            if it.server_message is None:  # one traceback per iteration, not one per task
                logger.debug("task %s's model server failure", task.task_id, exc_info=exc)
                it.server_message = str(exc)
            if is_text_only_model_error(str(exc)):
                # Every request with a screenshot will get the same answer.
                it.outcomes[index] = await self._finish(run, it.number, it.rank, status)
                it.bar.finished(True, it.steps_done)
                it.cancel("text_only_model")
                return
        except Exception as exc:  # a broken page or policy fails this task, not the run
            logger.exception("task %s failed", task.task_id)
            status, run.error = "error", f"{type(exc).__name__}: {exc}"
        if status is not None and index not in it.server_failed:
            logger.warning("task %s: %s", task.task_id, run.error)
        it.outcomes[index] = await self._finish(run, it.number, it.rank, status)
        it.bar.finished(it.outcomes[index].failed, it.steps_done)

    async def _supervise(self, it: _Iteration) -> None:
        """Wait for the workers; start the grace period at the completion threshold and
        cut the slowest tasks when it is over. Returns early after a second Ctrl-C.

        Raises:
            Exception: what a worker raised outside its task's handling (then the
                other workers are cancelled).
        """
        threshold_at: float | None = None
        pending = set(it.workers)
        while pending and it.ctrl_c < 2:
            done, pending = await asyncio.wait(pending, timeout=0.1)
            for w in done:
                if not w.cancelled() and w.exception() is not None:
                    it.cancel("error")
                    raise w.exception()  # type: ignore[misc]
            if it.stop_reason is not None or not it.todo:
                continue
            if (
                threshold_at is None
                and len(it.outcomes) / len(it.todo) >= self.completion_threshold
            ):
                threshold_at = time.perf_counter()
                if pending:
                    logger.info(
                        "completion threshold reached (%d/%d); grace period %g s",
                        len(it.outcomes),
                        len(it.todo),
                        self.grace_period_s,
                    )
            if (
                threshold_at is not None
                and pending
                and (time.perf_counter() - threshold_at >= self.grace_period_s)
            ):
                logger.warning(
                    "grace period over: stopping %d unfinished task(s)",
                    sum(1 for i in it.runs if i not in it.outcomes),
                )
                it.cancel("grace_expired")

    def _on_ctrl_c(self, it: _Iteration) -> None:
        """SIGINT: the first stops the iteration (the tasks finished by then are stored,
        the running ones are cut), the second stops waiting for the cut tasks; any
        further one only says the file is being written."""
        it.ctrl_c += 1
        if it.ctrl_c == 1:
            it.finished_at_ctrl_c = set(it.outcomes)
            running = sum(1 for i in it.runs if i not in it.outcomes)
            saved = (
                f"saving its {len(it.finished_at_ctrl_c)} finished trajectories"
                if it.finished_at_ctrl_c
                else "no task has finished, nothing to save"
            )
            logger.warning(
                "Ctrl-C: stopping iteration %d: %s; %d running task(s) cut "
                "(Ctrl-C again stops waiting for them)",
                it.number,
                saved,
                running,
            )
            it.cancel("interrupted")
        elif it.ctrl_c == 2:
            logger.warning("Ctrl-C again: not waiting for the cut tasks")
        else:
            logger.warning("Ctrl-C: saving the finished trajectories; the iteration ends soon")

    async def _stop_workers(self, it: _Iteration, wait_s: float = 5.0) -> None:
        """Cancel the workers still running (after a second Ctrl-C or an error) and give
        them ``wait_s`` to close their browser contexts."""
        left = [w for w in it.workers if not w.done()]
        for w in left:
            w.cancel()
        if left:
            await asyncio.wait(left, timeout=wait_s)

    async def _store(self, it: _Iteration) -> IterationResult:
        """Write the iteration file and the task history; the iteration's result.

        Stored: every task that ended, or after Ctrl-C the tasks finished by then;
        the others are named in the file's ``skipped_task_ids`` and their screenshot
        folders removed. A text-only model stores nothing.
        """
        interrupted = it.ctrl_c > 0
        text_only = it.stop_reason == "text_only_model"
        kept = sorted(it.finished_at_ctrl_c if interrupted else it.outcomes)
        ordered = [it.outcomes[i] for i in kept]
        # Never started (the grace period, Ctrl-C) or cut by Ctrl-C: named in the file.
        skipped = [t for i, t in enumerate(it.todo) if i not in kept]
        model_server_error = None
        # A failed iteration is reported by the caller from the result (the CLI: one line);
        # a partly failed one gets one warning here instead of one per task.
        if text_only or (it.outcomes and it.server_failed >= set(it.outcomes)):
            model_server_error = it.server_message
            logger.info("iteration %d failed on the model server: %s", it.number, it.server_message)
        elif it.server_failed:
            logger.warning(
                "%d of %d tasks failed on the model server; the first: %s",
                len(it.server_failed),
                len(it.outcomes),
                it.server_message,
            )
        # A text-only model refused the first screenshot: the tasks' records say only that.
        stored = [] if text_only else ordered
        path = None
        if stored:
            path = await asyncio.to_thread(
                self.storage.save_iteration,
                it.number,
                [o.trajectory for o in stored],
                rank=it.rank,
                metadata={
                    "collector": "replaystore.rollouts",
                    "statuses": dict(Counter(o.status for o in stored)),
                    "interrupted": interrupted,
                    "skipped_task_ids": [t.task_id for t in skipped],
                    "blocked_sites": sorted(set(it.blocked_sites)),
                },
            )
        unstored = [it.folders[i] for i in it.folders if text_only or i not in kept]
        if unstored:
            await asyncio.to_thread(_remove_folders, unstored, it.base)
        if self.task_history is not None and not text_only:
            self.task_history.update(
                [o.trajectory for o in ordered if o.status != "navigation_error"]
            )
        return IterationResult(
            iteration=it.number,
            rank=it.rank,
            outcomes=ordered,
            skipped=skipped,
            path=path,
            interrupted=interrupted,
            blocked_sites=sorted(set(it.blocked_sites)),
            navigation_errors=dict(it.nav_errors),
            seconds=time.perf_counter() - it.started,
            timings=it.timings,
            model_server_error=model_server_error,
        )

    async def _report(self, it: _Iteration, result: IterationResult) -> None:
        """The iteration's log line and the experiment logger's metrics."""
        logger.info(
            "iteration %d rank %d: %d trajectories, %d steps, success %.0f%%, %.2f steps/s%s",
            result.iteration,
            result.rank,
            len(result.outcomes),
            result.steps,
            100 * result.success_rate,
            result.steps_per_second,
            " (interrupted)" if result.interrupted else "",
        )
        if self.logger is not None:
            # A backend may write event files or upload (W&B): not on the event loop.
            await asyncio.to_thread(log_result, self.logger, result)


class _Iteration:
    """Mutable state of one :meth:`RolloutCollector.run_iteration`, shared by its workers,
    its supervisor, the Ctrl-C handler and the store."""

    def __init__(self, number: int, rank: int, todo: list[Task], bar: _Progress) -> None:
        self.number = number
        self.rank = rank
        self.todo = todo
        self.bar = bar
        self.started = time.perf_counter()
        self.base = Path()  # the iteration's screenshot folder for this rank
        self.queue: list[tuple[int, Task]] = []  # (index, task), next one last
        self.workers: list[asyncio.Task[None]] = []
        self.runs: dict[int, _Run] = {}
        self.outcomes: dict[int, TaskOutcome] = {}
        self.folders: dict[int, Path] = {}  # each started task's screenshot folder
        self.timings = dict.fromkeys(("browser", "screenshot", "policy", "write", "overhead"), 0.0)
        self.nav_errors: Counter[str] = Counter()
        self.blocked_sites: list[str] = []
        self.steps_done = 0
        self.stop_reason: str | None = None  # interrupted, grace_expired, text_only_model, error
        # Tasks that ended on a ModelServerError, and the first server message.
        self.server_failed: set[int] = set()
        self.server_message: str | None = None
        self.ctrl_c = 0
        self.finished_at_ctrl_c: set[int] = set()  # what an interrupted iteration stores

    def cancel(self, reason: str) -> None:
        """Stop the iteration: no new task starts and the running ones are cancelled."""
        if self.stop_reason is None:
            self.stop_reason = reason
        for w in self.workers:
            w.cancel()


# ---------------------------------------------------------------------- helpers


def _account(timings: dict[str, float], before: dict[str, float], t_start: float) -> None:
    """Add the step's time outside browser, policy and screenshot writes to ``overhead``."""
    inside = sum(timings[k] - before[k] for k in ("browser", "policy", "write"))
    timings["overhead"] += max(0.0, time.perf_counter() - t_start - inside)


def _remove_folders(folders: list[Path], base: Path) -> None:
    """Remove the screenshot folders of tasks that were not stored, then ``base`` and its
    parent (the iteration's folder) if that left them empty."""
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    for directory in (base, base.parent):
        with contextlib.suppress(OSError):
            directory.rmdir()  # only when empty


def _domain(url: str) -> str:
    try:
        return normalize_domain(url)
    except ValueError:
        return url or "?"


class _Progress:
    """tasks done / running / failed and steps/s on a TTY; silent otherwise."""

    def __init__(self, total: int, enabled: bool | None) -> None:
        show = sys.stderr.isatty() if enabled is None else enabled
        self._bar = None
        self.running = self.failed = 0
        self._t0 = time.perf_counter()
        if show and total:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="task", desc="rollouts", leave=True)

    def started(self) -> None:
        self.running += 1
        self._refresh(None)

    def finished(self, failed: bool, steps: int) -> None:
        self.running -= 1
        self.failed += int(failed)
        if self._bar is not None:
            self._bar.update(1)
        self._refresh(steps)

    def _refresh(self, steps: int | None) -> None:
        if self._bar is None:
            return
        postfix: dict[str, int | str] = {"running": self.running, "failed": self.failed}
        if steps is not None:
            postfix["steps/s"] = f"{steps / max(1e-9, time.perf_counter() - self._t0):.2f}"
        self._bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
