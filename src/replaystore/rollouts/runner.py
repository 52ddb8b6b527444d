"""One rollout iteration from a task file: what ``replaystore rollout`` runs.

:func:`rollout` wires the pieces together: tasks (a file, or the bundled local
suite served for the run), a browser pool, a policy (scripted, or an
OpenAI-protocol server such as vLLM), the evaluator, the blocklist and task
history kept under ``out``, the trajectory storage ``<out>/storage``, and an
optional experiment logger. ``observation`` chooses what the model is shown:
``"screenshot"`` (screenshot, accessibility tree and URL) or ``"text"``
(accessibility tree and URL, for a text-only model); screenshots are taken and
stored in both modes.

:func:`rollout_on_ray` is the same iteration spread over a Ray cluster's actors
(:mod:`~replaystore.rollouts.ray_rollout`): each actor serves the suite or the
MiniWoB++ pages and runs Chromium itself; the driver stores the trajectories.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replaystore.errors import ConfigError, SchemaError

__all__ = ["SUITE", "rollout", "rollout_on_ray"]

#: The ``tasks`` value that means "the bundled local website suite".
SUITE = "suite"


async def rollout(
    tasks: str | Path,
    out: str | Path,
    *,
    policy: str = "scripted",
    base_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    workers: int = 4,
    iteration: int | None = None,
    rank: int = 0,
    logger_backend: str = "none",
    cdp_urls: Sequence[str] | None = None,
    max_tasks: int | None = None,
    seeds: str | Sequence[int] | None = None,
    progress: bool | None = None,
    observation: str = "screenshot",
    request_timeout_s: float | None = None,
    max_concurrency: int = 8,
    **collector_options: Any,
) -> Any:
    """Run one rollout iteration; returns the :class:`~.collector.IterationResult`.

    Args:
        tasks: a JSONL/CSV/Parquet task file, ``"suite"`` for the local suite
            (served on 127.0.0.1 for the duration of the run), or MiniWoB++ tasks
            (``"miniwob:click-button,enter-text"``, each once per seed of ``seeds``;
            pages served on 127.0.0.1, scored by the pages' own reward).
        out: run directory: ``storage/``, ``blocklist.jsonl``, ``task_history.json``, ``logs/``.
        policy: ``"scripted"`` (the bundled suite's scripted policy, or the MiniWoB++
            experts of :mod:`~.miniwob_experts`) or ``"openai"`` (needs ``base_url``
            and ``model``).
        workers: contexts (tasks) at once.
        iteration: iteration number (default: the storage's next one).
        logger_backend: ``none``, ``wandb`` or ``tensorboard``.
        cdp_urls: use running browsers over CDP instead of launching one.
        max_tasks: roll out only the first N (>= 1) tasks not on the blocklist.
        seeds: the MiniWoB++ seeds (``"1000-1049"``, ``"1,2,7"`` or a list of ints);
            required with ``miniwob:`` tasks.
        observation: ``"screenshot"`` or ``"text"`` (prompts without images; use it
            for a model that reads no images: vLLM answers a screenshot sent to one
            with HTTP 400 "... is not a multimodal model").
        request_timeout_s: seconds one request to the model server may take (policy
            ``openai``; default 30), shorter than the step timeout so that a request
            that times out is retried inside its step.
        max_concurrency: requests in flight to the model server at once (policy ``openai``).
        collector_options: passed to :class:`~.collector.RolloutCollector`
            (``step_timeout_s``, default 120; ``task_timeout_s``, default 1800; ...).

    The result's ``model_server_error`` is set when the iteration failed on the
    model server (see :class:`~.collector.IterationResult`); its
    ``blocklist_skipped`` counts the tasks left out because their site is on
    ``out/blocklist.jsonl``, per blocked site.

    Raises:
        ConfigError: a bad policy name or observation mode, missing
            ``base_url``/``model``, ``workers`` < 1 or ``max_tasks`` < 1, a request
            timeout not shorter than the step timeout.
        SchemaError: a task file that holds no task (names the file).
        BrowserUnavailableError: no browser (its message says how to get one).
    """
    from replaystore.pipeline.task_sampler import load_tasks
    from replaystore.trajectories.context import OBSERVATION_MODES, ConversationBuilder

    from .browser import BrowserPool
    from .chat_client import DEFAULT_REQUEST_TIMEOUT_S
    from .collector import DEFAULT_STEP_TIMEOUT_S, RolloutCollector
    from .evaluator import Evaluator
    from .miniwob import MiniWoBServer, is_miniwob_spec, miniwob_tasks
    from .policy import OpenAIChatPolicy, WebAgent
    from .scripted import ScriptedPolicy
    from .sites import LocalSuite

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    if max_tasks is not None and (
        isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1
    ):
        raise ConfigError(f"max_tasks must be an integer >= 1, got {max_tasks!r}")
    request_timeout = DEFAULT_REQUEST_TIMEOUT_S if request_timeout_s is None else request_timeout_s
    step_timeout = collector_options.get("step_timeout_s", DEFAULT_STEP_TIMEOUT_S)
    if not request_timeout < step_timeout:
        raise ConfigError(
            f"the request timeout ({request_timeout:g} s) must be shorter than the step "
            f"timeout ({step_timeout:g} s), so that a timed-out request is retried in its step"
        )
    if observation not in OBSERVATION_MODES:
        raise ConfigError(f"unknown observation {observation!r}; use screenshot or text")
    on_miniwob = is_miniwob_spec(str(tasks))
    if on_miniwob and seeds is None:
        raise ConfigError("MiniWoB++ tasks need seeds (e.g. seeds='1000-1049')")
    if seeds is not None and not on_miniwob:
        raise ConfigError("seeds are for MiniWoB++ tasks (tasks='miniwob:NAME,...')")
    builder = ConversationBuilder(observation=observation)  # type: ignore[arg-type]
    if policy == "scripted" and on_miniwob:
        from .miniwob_experts import MiniWoBExpert

        chosen: Any = MiniWoBExpert()
        agent = WebAgent(chosen, conversation_builder=builder, image_urls="file")
    elif policy == "scripted":
        chosen = ScriptedPolicy()
        agent = WebAgent(chosen, conversation_builder=builder, image_urls="file")
    elif policy == "openai":
        if not base_url or not model:
            raise ConfigError("--policy openai needs --base-url and --model")
        options: dict[str, Any] = {"timeout_s": request_timeout, "max_concurrency": max_concurrency}
        if api_key is not None:
            options["api_key"] = api_key
        chat = OpenAIChatPolicy(base_url, model, **options)
        agent = WebAgent(chat, conversation_builder=builder, image_urls="data")
    else:
        raise ConfigError(f"unknown policy {policy!r}; use scripted or openai")
    # File work (directories, the storage listing, history, blocklist, the task file)
    # runs in worker threads: nothing here blocks the event loop.
    run_dir = await asyncio.to_thread(
        _open_run_directory, Path(out), iteration, logger_backend, rank
    )
    with contextlib.ExitStack() as stack:
        if str(tasks) == SUITE:
            suite = stack.enter_context(LocalSuite())
            task_list = suite.tasks()
        elif on_miniwob:
            server = stack.enter_context(MiniWoBServer())
            task_list = miniwob_tasks(str(tasks), seeds, server.url)  # type: ignore[arg-type]
        else:
            task_list = await asyncio.to_thread(load_tasks, tasks)
            if not task_list:
                raise SchemaError(f"{tasks}: the task file holds no task")
        task_list, skipped = await asyncio.to_thread(
            _leave_out_blocked, task_list, run_dir.blocklist, max_tasks
        )
        try:
            async with BrowserPool(workers, cdp_urls=cdp_urls) as pool:
                collector = RolloutCollector(
                    agent,
                    Evaluator(),
                    run_dir.storage,
                    pool=pool,
                    num_workers=workers,
                    blocklist=run_dir.blocklist,
                    task_history=run_dir.history,
                    logger=run_dir.experiment,
                    progress=progress,
                    **collector_options,
                )
                result = await collector.run_iteration(task_list, run_dir.number, rank=rank)
        finally:
            await agent.aclose()
            if run_dir.experiment is not None:
                await asyncio.to_thread(run_dir.experiment.close)
    await asyncio.to_thread(run_dir.history.save, run_dir.history_file)
    result.blocklist_skipped = skipped
    return result


def rollout_on_ray(
    tasks: str | Path,
    out: str | Path,
    *,
    ray: Any,
    policy: str = "scripted",
    base_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    iteration: int | None = None,
    rank: int = 0,
    logger_backend: str = "none",
    max_tasks: int | None = None,
    seeds: str | Sequence[int] | None = None,
    observation: str = "screenshot",
    request_timeout_s: float | None = None,
    max_concurrency: int = 8,
    **collector_options: Any,
) -> Any:
    """:func:`rollout` on Ray actors (synchronous: call it from the main thread, so that
    Ctrl-C stops the actors and keeps the finished trajectories).

    Args:
        ray: a :class:`~.ray_rollout.RayOptions` (the cluster, actors, browsers per
            actor, placement); the other arguments are :func:`rollout`'s (``tasks``:
            a task file, ``"suite"`` or ``"miniwob:..."``, served by each actor).

    Returns:
        The :class:`~.outcomes.IterationResult`; its ``ray`` says what the cluster did.

    Raises:
        ConfigError: as :func:`rollout`; the cluster cannot be reached.
        NoActorsLeftError: no actor started, or every actor was lost.
    """
    from replaystore.pipeline.task_sampler import load_tasks

    from .experiment_logger import log_result
    from .miniwob import is_miniwob_spec, miniwob_tasks
    from .ray_rollout import ray_rollout
    from .ray_worker import worker_spec
    from .sites import TASKS_FILE

    if max_tasks is not None and (
        isinstance(max_tasks, bool) or not isinstance(max_tasks, int) or max_tasks < 1
    ):
        raise ConfigError(f"max_tasks must be an integer >= 1, got {max_tasks!r}")
    on_miniwob = is_miniwob_spec(str(tasks))
    if on_miniwob and seeds is None:
        raise ConfigError("MiniWoB++ tasks need seeds (e.g. seeds='1000-1049')")
    if seeds is not None and not on_miniwob:
        raise ConfigError("seeds are for MiniWoB++ tasks (tasks='miniwob:NAME,...')")
    chat: dict[str, Any] = {}
    if policy == "scripted":
        chosen = "miniwob_expert" if on_miniwob else "scripted"
    elif policy == "openai":
        if not base_url or not model:
            raise ConfigError("--policy openai needs --base-url and --model")
        chosen = "openai"
        chat = {"base_url": base_url, "model": model, "max_concurrency": max_concurrency}
        if request_timeout_s is not None:
            chat["timeout_s"] = request_timeout_s
        if api_key is not None:
            chat["api_key"] = api_key
    else:
        raise ConfigError(f"unknown policy {policy!r}; use scripted or openai")
    serve = "suite" if str(tasks) == SUITE else "miniwob" if on_miniwob else None
    spec = worker_spec(
        policy=chosen,
        serve=serve,
        browsers=ray.browsers_per_actor,
        observation=observation,
        openai=chat,
        collector=collector_options,
    )
    run_dir = _open_run_directory(Path(out), iteration, logger_backend, rank)
    if serve == "suite":
        task_list = load_tasks(TASKS_FILE)  # no port: each actor puts its own in
    elif on_miniwob:
        task_list = miniwob_tasks(str(tasks), seeds, "http://127.0.0.1")  # type: ignore[arg-type]
    else:
        task_list = load_tasks(tasks)
        if not task_list:
            raise SchemaError(f"{tasks}: the task file holds no task")
    task_list, skipped = _leave_out_blocked(task_list, run_dir.blocklist, max_tasks)
    try:
        result = ray_rollout(
            task_list,
            run_dir.storage,
            run_dir.number,
            spec=spec,
            options=ray,
            rank=rank,
            blocklist=run_dir.blocklist,
            task_history=run_dir.history,
        )
        if run_dir.experiment is not None:
            log_result(run_dir.experiment, result)
    finally:
        if run_dir.experiment is not None:
            run_dir.experiment.close()
    run_dir.history.save(run_dir.history_file)
    result.blocklist_skipped = skipped
    return result


@dataclass(slots=True)
class _RunDirectory:
    """What a rollout keeps in its run directory, opened."""

    storage: Any  # TrajectoryStorage of <out>/storage
    blocklist: Any  # Blocklist of <out>/blocklist.jsonl
    history: Any  # TaskHistory loaded from history_file (empty when there is none)
    history_file: Path
    number: int  # the iteration to write
    experiment: Any  # ExperimentLogger, or None


def _open_run_directory(
    out: Path, iteration: int | None, logger_backend: str, rank: int
) -> _RunDirectory:
    """Create ``out`` and open what a rollout keeps there (file work: call it in a thread)."""
    from replaystore.pipeline.blocklist import Blocklist
    from replaystore.pipeline.task_history import TaskHistory
    from replaystore.trajectories.storage import TrajectoryStorage

    out.mkdir(parents=True, exist_ok=True)
    storage = TrajectoryStorage(out / "storage")
    history_file = out / "task_history.json"
    history = TaskHistory.load(history_file) if history_file.exists() else TaskHistory()
    number = storage.next_iteration() if iteration is None else int(iteration)
    experiment = None
    if logger_backend != "none":
        from .experiment_logger import ExperimentLogger

        experiment = ExperimentLogger(logger_backend, log_dir=out / "logs", rank=rank)
    return _RunDirectory(
        storage, Blocklist(out / "blocklist.jsonl"), history, history_file, number, experiment
    )


def _leave_out_blocked(
    tasks: list[Any], blocklist: Any, max_tasks: int | None
) -> tuple[list[Any], dict[str, int]]:
    """The tasks whose site is not on the blocklist (the first ``max_tasks``), and how many
    were left out per blocked site (reads the blocklist file: call it in a thread)."""
    from replaystore.pipeline.blocklist import blocking_rule

    rules = blocklist.rules()
    blocking = [blocking_rule(t.website, rules) for t in tasks]
    skipped = Counter(rule.site for rule in blocking if rule is not None)
    kept = [t for t, rule in zip(tasks, blocking, strict=True) if rule is None]
    if max_tasks is not None:
        kept = kept[:max_tasks]
    return kept, dict(sorted(skipped.items()))
