"""The ``heldout`` stage (MiniWoB++ tasks): the acting policy (the experts in iteration 0,
then each checkpoint) plays the fixed held-out set (``evaluation.seeds``, never trained
on) with greedy decoding; success per task and their mean, scored by the pages' own
reward, stored apart in ``heldout/`` and never trained on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .acting import greedy_rollout
from .base import Outcome, Stage
from .facts import per_task, rates
from .sample import heldout_tasks

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["HeldoutStage"]


@dataclass
class HeldoutStage(Stage[None]):
    """Iteration ``k``'s acting policy (``acting``; None: the experts) on the held-out
    set, greedy; stored in ``heldout/storage``, success per task in the journal."""

    name = "heldout"

    k: int
    acting: Path | str | None

    def run(self, ctx: RunContext) -> Outcome[None]:
        from replaystore.trajectories.storage import TrajectoryStorage

        storage = TrajectoryStorage(ctx.paths.out / "heldout" / "storage")
        trajectories = greedy_rollout(
            ctx,
            storage,
            self.k + 1,
            heldout_tasks(ctx),
            self.acting,
            stage=f"held-out evaluation (iteration {self.k})",
            k=self.k,
            metadata={"loop_iteration": self.k, "heldout": True},
        )
        facts = per_task(trajectories)
        facts["seeds"] = str(ctx.config["evaluation"]["seeds"])
        report = (
            f"iteration {self.k}: held-out success {facts['mean']:.0%} over "
            f"{len(facts['tasks'])} tasks x seeds {facts['seeds']} ({rates(facts)})"
        )
        return Outcome(None, facts, report=report)
