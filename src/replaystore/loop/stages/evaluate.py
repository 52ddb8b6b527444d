"""The ``evaluate`` stage: the iteration's success rate, read back from the stored file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .base import Outcome, Stage
from .facts import success

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["EvaluateStage"]


@dataclass
class EvaluateStage(Stage[None]):
    """Iteration ``k``'s success facts, by the buffer's rules (:func:`~.facts.success`)."""

    name = "evaluate"

    k: int

    def run(self, ctx: RunContext) -> Outcome[None]:
        storage = ctx.storage()
        file = next(f for f in storage.files() if f.iteration == self.k + 1)
        facts = success(storage.read_file(file))
        report = (
            f"iteration {self.k}: success {facts['successful']}/{facts['num_tasks']} = "
            f"{facts['success_rate']:.0%} ({ctx.journal.iteration(self.k)['policy']})"
        )
        return Outcome(None, facts, report=report)
