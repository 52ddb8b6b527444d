"""The ``baseline`` stage (iteration 0, when ``model.evaluate_untrained``): the untrained
model rolled out once for the learning curve, stored apart in ``baseline/`` and never
trained on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .acting import greedy_rollout
from .base import Outcome, Stage, now
from .facts import per_task, success
from .sample import heldout_tasks

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["BaselineStage"]


@dataclass
class BaselineStage(Stage[None]):
    """Roll out the untrained model: on the held-out set for MiniWoB++ tasks, else on
    iteration 0's ``tasks`` not on the blocklist (the tasks the model's iterations are
    measured on). Recorded in iteration 0 and as the journal's ``baseline``."""

    name = "baseline"

    tasks: list[Any]
    k: int = 0

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        return ctx.journal.data.get("baseline") or None

    def _tasks(self, ctx: RunContext) -> list[Any]:
        if ctx.config.on_miniwob:
            return heldout_tasks(ctx)  # measured where every checkpoint is measured
        # The tasks the model's iterations draw from: iteration 0's, less the sites
        # its rollout put on the blocklist, so that the rates are over the same tasks.
        from replaystore.pipeline.blocklist import Blocklist

        blocklist = Blocklist(ctx.paths.blocklist)
        return [t for t in self.tasks if not blocklist.is_website_blocked(t.website)]

    def run(self, ctx: RunContext) -> Outcome[None]:
        from replaystore.trajectories.storage import TrajectoryStorage

        model = ctx.paths.initial_model
        storage = TrajectoryStorage(ctx.paths.out / "baseline" / "storage")
        tasks = self._tasks(ctx)
        started = now()
        try:
            trajectories = greedy_rollout(
                ctx,
                storage,
                1,
                tasks,
                model,
                stage="baseline (untrained model)",
                k=0,
                metadata={"baseline": True},
            )
        finally:
            ctx.server.stop_after_rollouts()
        seconds = now() - started
        facts = success(trajectories)
        miniwob = ctx.config.on_miniwob
        if miniwob:
            facts["eval"] = {
                **per_task(trajectories),
                "seeds": str(ctx.config["evaluation"]["seeds"]),
            }
        ctx.journal.data["baseline"] = {
            "policy": "model",
            "checkpoint": ctx.paths.rel(model),
            "seconds": {"rollout": round(seconds, 3)},
            **facts,
        }
        where = "the held-out set" if miniwob else "the tasks not blocklisted"
        report = (
            f"untrained model: success {facts['successful']}/{facts['num_tasks']} = "
            f"{facts['success_rate']:.0%} on {where} (baseline/, not trained on)"
        )
        return Outcome(None, facts, report=report, seconds=seconds)
