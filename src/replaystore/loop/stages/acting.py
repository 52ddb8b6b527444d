"""Rollouts in the browser, shared by the rollout, held-out and baseline stages: the prompt
builder, the acting agent (the experts, or the served model), one collector run, and the
greedy measurement rollouts kept apart from the training data."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..tools import LoopStageError
from .base import run_stage
from .serve import ServeStage

if TYPE_CHECKING:
    from ..config import LoopConfig
    from .context import RunContext

__all__ = ["agent", "builder", "greedy_rollout", "roll_out", "server_key"]


def builder(config: LoopConfig) -> Any:
    """The prompt builder of every rollout and of the buffer's rebuilds."""
    from replaystore.trajectories.context import ConversationBuilder

    p = config["prompt"]
    return ConversationBuilder(
        observation=config["observation"],
        history_window=p["history_window"],
        max_ac_tree_chars=p["max_ac_tree_chars"],
    )


def agent(ctx: RunContext, base_url: str | None, rank: int = 0, *, greedy: bool = False) -> Any:
    """The acting agent: the suite's experts without ``base_url``, else the served model."""
    from replaystore.rollouts.policy import OpenAIChatPolicy, WebAgent
    from replaystore.rollouts.scripted import ScriptedPolicy

    cfg = ctx.config
    prompts = builder(cfg)
    if base_url is None and cfg.on_miniwob:
        from replaystore.rollouts.miniwob_experts import MiniWoBExpert

        expert = MiniWoBExpert()
        return WebAgent(expert, conversation_builder=prompts, image_urls="file")
    if base_url is None:
        b = cfg["bootstrap"]
        policy: Any = ScriptedPolicy(
            seed=cfg["seed"] + rank,
            mistake_rate=b["mistake_rate"],
            wrong_answer_rate=b["wrong_answer_rate"],
            improvement=0.0,
        )
        return WebAgent(policy, conversation_builder=prompts, image_urls="file")
    p = cfg["policy"]
    options: dict[str, Any] = {
        "temperature": 0.0 if greedy else p["temperature"],
        "max_tokens": p["max_tokens"],
        "timeout_s": p["timeout_s"],
        "max_retries": p["max_retries"],
        "max_concurrency": cfg["rollout"]["workers"],
    }
    key = server_key(ctx)
    if key is not None:
        options["api_key"] = key
    policy = OpenAIChatPolicy(base_url, ctx.server.served_name, **options)
    return WebAgent(policy, conversation_builder=prompts, image_urls="data")


def server_key(ctx: RunContext) -> str | None:
    """The API key the loop's model server requires (None: it listens on loopback only,
    keyless); it goes to the policy clients and nowhere else."""
    return getattr(ctx.server.server, "api_key", None)


def roll_out(
    ctx: RunContext,
    tasks: list[Any],
    storage: Any,
    number: int,
    *,
    rank: int = 0,
    base_url: str | None,
    screenshot_root: Path,
    metadata: dict[str, Any],
    greedy: bool = False,
) -> Any:
    """``tasks`` rolled out in headless Chromium (or ``--cdp`` browsers, or Ray actors:
    ``rollout.ray``) into iteration ``number`` (rank ``rank``) of ``storage``; the
    collector's result."""
    r = ctx.config["rollout"]
    if r["ray"]["address"] is not None:
        return _roll_out_on_ray(
            ctx, tasks, storage, number, rank, base_url, screenshot_root, metadata, greedy
        )

    async def go() -> Any:
        from replaystore.pipeline.blocklist import Blocklist
        from replaystore.rollouts.browser import BrowserPool
        from replaystore.rollouts.collector import RolloutCollector
        from replaystore.rollouts.evaluator import Evaluator

        acting = agent(ctx, base_url, rank, greedy=greedy)
        try:
            async with BrowserPool(
                r["workers"], viewport=tuple(r["viewport"]), cdp_urls=r["cdp"] or None
            ) as pool:
                collector = RolloutCollector(
                    acting,
                    Evaluator(),
                    storage,
                    pool=pool,
                    num_workers=r["workers"],
                    max_steps_by_difficulty=r["max_steps"],
                    step_timeout_s=r["step_timeout_s"],
                    task_timeout_s=r["task_timeout_s"],
                    settle_s=r["settle_s"],
                    blocklist=Blocklist(ctx.paths.blocklist),
                    logger=ctx.experiment,
                    screenshot_root=screenshot_root,
                    progress=ctx.progress,
                    handle_sigint=False,
                    trajectory_metadata=metadata,
                )
                return await collector.run_iteration(tasks, number, rank=rank)
        finally:
            await acting.aclose()

    return asyncio.run(go())


def _roll_out_on_ray(
    ctx: RunContext,
    tasks: list[Any],
    storage: Any,
    number: int,
    rank: int,
    base_url: str | None,
    screenshot_root: Path,
    metadata: dict[str, Any],
    greedy: bool,
) -> Any:
    """:func:`roll_out` on the Ray actors of ``rollout.ray``: the same agent, rebuilt on
    each actor from names and numbers (:func:`_actor_spec`)."""
    from replaystore.pipeline.blocklist import Blocklist
    from replaystore.rollouts.experiment_logger import log_result
    from replaystore.rollouts.ray_rollout import RayOptions, ray_rollout

    result = ray_rollout(
        tasks,
        storage,
        number,
        spec=_actor_spec(ctx, rank, base_url, metadata, greedy),
        options=RayOptions.from_mapping(ctx.config["rollout"]["ray"]),
        rank=rank,
        screenshot_root=screenshot_root,
        blocklist=Blocklist(ctx.paths.blocklist),
    )
    if ctx.experiment is not None:
        log_result(ctx.experiment, result)
    return result


def _actor_spec(
    ctx: RunContext, rank: int, base_url: str | None, metadata: dict[str, Any], greedy: bool
) -> dict[str, Any]:
    """The Ray actors' :func:`~replaystore.rollouts.ray_worker.worker_spec`: what
    :func:`agent` builds here, as names and numbers (the server's key among them)."""
    from replaystore.rollouts.ray_worker import worker_spec

    cfg = ctx.config
    r, p, b = cfg["rollout"], cfg["policy"], cfg["bootstrap"]
    scripted: dict[str, Any] = {}
    chat: dict[str, Any] = {}
    if base_url is not None:
        policy = "openai"
        chat = {
            "base_url": base_url,
            "model": ctx.server.served_name,
            "temperature": 0.0 if greedy else p["temperature"],
            "max_tokens": p["max_tokens"],
            "timeout_s": p["timeout_s"],
            "max_retries": p["max_retries"],
            "max_concurrency": r["ray"]["browsers_per_actor"],
        }
        if server_key(ctx) is not None:
            chat["api_key"] = server_key(ctx)  # travels in the actors' spec, never logged
    elif cfg.on_miniwob:
        policy = "miniwob_expert"
    else:
        policy = "scripted"
        scripted = {
            "seed": cfg["seed"] + rank,
            "mistake_rate": b["mistake_rate"],
            "wrong_answer_rate": b["wrong_answer_rate"],
            "improvement": 0.0,
        }
    return worker_spec(
        policy=policy,
        serve="miniwob" if cfg.on_miniwob else "suite" if cfg["tasks"] == "suite" else None,
        browsers=r["ray"]["browsers_per_actor"],
        observation=cfg["observation"],
        prompt={
            "history_window": cfg["prompt"]["history_window"],
            "max_ac_tree_chars": cfg["prompt"]["max_ac_tree_chars"],
        },
        scripted=scripted,
        openai=chat,
        viewport=r["viewport"],
        collector={
            "max_steps_by_difficulty": r["max_steps"],
            "step_timeout_s": r["step_timeout_s"],
            "task_timeout_s": r["task_timeout_s"],
            "settle_s": r["settle_s"],
        },
        trajectory_metadata=metadata,
    )


def greedy_rollout(
    ctx: RunContext,
    storage: Any,
    number: int,
    tasks: list[Any],
    acting: Path | str | None,
    *,
    stage: str,
    k: int,
    metadata: dict[str, Any],
) -> list[Any]:
    """``acting`` (None: the experts) rolled out greedily on ``tasks`` into iteration
    ``number`` of ``storage``, a measurement kept apart from training; its trajectories.

    An iteration already stored (the loop was killed after writing it) is read back,
    not rolled out again. The server stays up for the stage that follows.
    """
    from replaystore.rollouts.screenshots import default_screenshot_root, screenshot_folder

    if number not in storage.iterations():
        folder = screenshot_folder(default_screenshot_root(storage.root), number)
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted try's leftovers
        base_url = None if acting is None else run_stage(ctx, ServeStage(k, acting, stage))
        result = roll_out(
            ctx,
            tasks,
            storage,
            number,
            base_url=base_url,
            screenshot_root=default_screenshot_root(storage.root),
            metadata={
                "policy": "demonstrations" if acting is None else "model",
                "checkpoint": ctx.paths.rel(acting),
                **metadata,
            },
            greedy=True,
        )
        error = getattr(result, "model_server_error", None)
        if error:
            raise LoopStageError(f"{stage}: the model server failed: {error}")
    file = next(f for f in storage.files() if f.iteration == number)
    return storage.read_file(file)
