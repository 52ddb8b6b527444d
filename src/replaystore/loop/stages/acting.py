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

__all__ = ["agent", "builder", "greedy_rollout", "roll_out"]


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
    policy = OpenAIChatPolicy(
        base_url,
        ctx.server.served_name,
        temperature=0.0 if greedy else p["temperature"],
        max_tokens=p["max_tokens"],
        timeout_s=p["timeout_s"],
        max_retries=p["max_retries"],
        max_concurrency=cfg["rollout"]["workers"],
    )
    return WebAgent(policy, conversation_builder=prompts, image_urls="data")


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
    """``tasks`` rolled out in headless Chromium (or ``--cdp`` browsers) into iteration
    ``number`` (rank ``rank``) of ``storage``; the collector's result."""
    r = ctx.config["rollout"]

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
