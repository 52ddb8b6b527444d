"""What a stage is, and the driver that runs one: skip when done, time, journal, report.

Every stage of an iteration goes through :func:`run_stage`, which owns the
boilerplate once: a stage the journal marks done is not run again (its value is
read back by :meth:`Stage.resume`); an unfinished one is first offered to its
recovery rule (:meth:`Stage.recover`: an output that was complete when the loop
died is kept), else run and timed; then the journal records it and its report
line goes to the reporter.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from ..partial import keep_finished

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["Outcome", "Recovery", "Stage", "now", "run_stage"]

T = TypeVar("T")


def now() -> float:
    """The stages' clock (monotonic seconds)."""
    return time.perf_counter()


class Recovery(enum.Enum):
    """What a stage does when the journal says it started but did not finish."""

    #: Do the work again from the start (its leftovers are cleared).
    REDO = "redo"
    #: Keep an output that was complete when the loop died (a dataset whose
    #: ``.partial`` was written, a renamed checkpoint, a stored iteration file), else redo.
    KEEP = "keep"


@dataclass
class Outcome(Generic[T]):
    """What one run of a stage produced.

    Args:
        value: what the stage hands on to the stages after it.
        facts: the journal entry's facts (after ``done`` and ``seconds``).
        report: the line for the reporter (None: nothing to say).
        seconds: the stage's own measure of its time (None: the driver's timer).
        record: whether the journal records the stage (False: nothing was done).
    """

    value: T
    facts: dict[str, Any] = field(default_factory=dict)
    report: str | None = None
    seconds: float | None = None
    record: bool = True


class Stage(ABC, Generic[T]):
    """One stage of iteration ``k``; subclasses are dataclasses holding their inputs."""

    #: The stage's key in the journal (one of :data:`~replaystore.loop.journal.STAGES`).
    name: ClassVar[str]
    #: The recovery rule of an unfinished stage.
    recovery: ClassVar[Recovery] = Recovery.REDO
    #: Under :attr:`Recovery.KEEP`: whether a complete-looking ``.partial`` output is
    #: kept too, or only one renamed into place (see :func:`.partial.keep_finished`).
    keeps_partial: ClassVar[bool] = True
    #: The iteration whose journal record holds the stage.
    k: int

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        """The journal's record of this stage when it is done (then it is skipped)."""
        return ctx.journal.done(self.k, self.name)

    def resume(self, ctx: RunContext, record: dict[str, Any]) -> T:
        """The value of a stage the journal marks done (default: None)."""
        return cast("T", None)

    def output(self, ctx: RunContext) -> Path | None:
        """The directory this stage produces (None: none), for :attr:`Recovery.KEEP`."""
        return None

    def complete(self, directory: Path) -> bool:
        """Whether ``directory`` (the output or its ``.partial``) is a finished output."""
        return False

    def recovered(self, ctx: RunContext) -> Outcome[T]:
        """The outcome of a kept output (a stage with :attr:`Recovery.KEEP` defines it)."""
        raise NotImplementedError(f"{self.name}: no recovery of a kept output")

    def recover(self, ctx: RunContext) -> Outcome[T] | None:
        """Apply the recovery rule: the outcome of a kept output, or None to run the stage."""
        if self.recovery is not Recovery.KEEP:
            return None
        target = self.output(ctx)
        if target is None or not keep_finished(
            target, self.complete, partial_counts=self.keeps_partial
        ):
            return None
        return self.recovered(ctx)

    @abstractmethod
    def run(self, ctx: RunContext) -> Outcome[T]:
        """Do the stage's work; the driver journals and reports the outcome."""


def run_stage(ctx: RunContext, stage: Stage[T]) -> T:
    """Run ``stage`` unless the journal marks it done; its value for the stages after it.

    The one place that skips finished stages, times the others, writes their journal
    entry (``{"done": true, "seconds": ..., **facts}``) and sends their report line.
    """
    record = stage.finished(ctx)
    if record is not None:
        return stage.resume(ctx, record)
    started = now()
    outcome = stage.recover(ctx)
    if outcome is None:
        outcome = stage.run(ctx)
    seconds = now() - started if outcome.seconds is None else outcome.seconds
    if outcome.record:
        ctx.journal.finish(stage.k, stage.name, seconds=seconds, **outcome.facts)
    if outcome.report is not None:
        ctx.report(outcome.report)
    return outcome.value
