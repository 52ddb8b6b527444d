"""The ``sample`` stage: the iteration's tasks (:class:`~replaystore.pipeline.TaskSampler`
with the task history rebuilt from the stored rollouts and the blocklist), or on
MiniWoB++ every training task on the iteration's fresh seeds; and the fixed held-out
MiniWoB++ set."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaystore.atomic import atomic_write_text

from ..tools import LoopStageError
from .base import Outcome, Stage
from .facts import trajectory_status

if TYPE_CHECKING:
    from ..config import LoopConfig
    from .context import RunContext

__all__ = ["SampleStage", "heldout_tasks", "miniwob_steps"]


def miniwob_steps(config: LoopConfig) -> int:
    """A MiniWoB++ episode's step budget: ``rollout.max_steps.easy`` (every task is easy)."""
    return int(config["rollout"]["max_steps"]["easy"])


def _pages(ctx: RunContext) -> str:
    if ctx.miniwob_url is None:
        raise LoopStageError("sample: the MiniWoB++ pages are not being served")
    return ctx.miniwob_url


def heldout_tasks(ctx: RunContext) -> list[Any]:
    """The fixed held-out MiniWoB++ set (every evaluation task on every held-out seed)."""
    from replaystore.rollouts.miniwob import miniwob_tasks

    cfg = ctx.config
    seeds = cfg["evaluation"]["seeds"]
    return miniwob_tasks(cfg.evaluation_tasks(), seeds, _pages(ctx), max_steps=miniwob_steps(cfg))


def _write_tasks(path: Path, tasks: list[Any]) -> None:
    lines = [json.dumps(t.to_dict(), ensure_ascii=False) for t in tasks]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "\n".join(lines) + "\n")


@dataclass
class SampleStage(Stage[list[Any]]):
    """Iteration ``k``'s tasks from ``tasks_file``, written to the iteration's
    ``tasks.jsonl``; the tasks. MiniWoB++ tasks are made again on a resume (the same
    names and seeds, the pages' current URL)."""

    name = "sample"

    k: int
    tasks_file: Path

    def path(self, ctx: RunContext) -> Path:
        return ctx.paths.iteration_dir(self.k) / "tasks.jsonl"

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        record = super().finished(ctx)
        if ctx.config.on_miniwob or self.path(ctx).exists():
            return record
        return None

    def resume(self, ctx: RunContext, record: dict[str, Any]) -> list[Any]:
        if ctx.config.on_miniwob:
            return self._miniwob_tasks(ctx)
        from replaystore.pipeline.task_sampler import load_tasks

        return load_tasks(self.path(ctx))

    def _miniwob_tasks(self, ctx: RunContext) -> list[Any]:
        """Every training task on iteration ``k``'s fresh seeds."""
        from replaystore.rollouts.miniwob import miniwob_tasks

        cfg = ctx.config
        seeds = cfg.train_seeds(self.k)
        return miniwob_tasks(cfg["tasks"], seeds, _pages(ctx), max_steps=miniwob_steps(cfg))

    def run(self, ctx: RunContext) -> Outcome[list[Any]]:
        if ctx.config.on_miniwob:
            tasks = self._miniwob_tasks(ctx)
            _write_tasks(self.path(ctx), tasks)
            seeds = ctx.config.train_seeds(self.k)
            facts = {"num_tasks": len(tasks), "seeds": [seeds[0], seeds[-1]]}
            return Outcome(tasks, facts, seconds=0.0)
        from replaystore.pipeline.blocklist import Blocklist
        from replaystore.pipeline.task_history import TaskHistory
        from replaystore.pipeline.task_sampler import TaskSampler

        cfg = ctx.config
        history = TaskHistory()
        storage = ctx.storage()
        if storage.iterations():
            history.update(
                t for t in storage.load_all() if trajectory_status(t) not in ("navigation_error",)
            )
        blocklist = Blocklist(ctx.paths.blocklist)
        sampler = TaskSampler(
            self.tasks_file, history=history, blocklist=blocklist, seed=cfg["seed"]
        )
        eligible = int((~sampler.blocked_mask()).sum())
        wanted = cfg["tasks_per_iteration"]
        n = eligible if wanted is None else min(int(wanted), eligible)
        if n == 0:
            raise LoopStageError(
                f"sample (iteration {self.k}): every task's website is on the blocklist "
                f"({ctx.paths.blocklist})"
            )
        import numpy as np

        tasks = sampler.sample_train(n, seed=np.random.default_rng([cfg["seed"], self.k]))
        _write_tasks(self.path(ctx), tasks)
        blocked = sorted(blocklist.get_blocked_domains())
        return Outcome(tasks, {"num_tasks": len(tasks), "blocked": blocked})
