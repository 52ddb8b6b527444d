"""The ``rollout`` stage: :class:`~replaystore.rollouts.collector.RolloutCollector` in
headless Chromium (or ``--cdp`` browsers), the evaluator scoring each answer; the
iteration's trajectories stored as one iteration file (atomic). Iteration 0 may import
its demonstrations from an existing trajectory storage instead."""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replaystore.errors import ConfigError

from ..tools import LoopStageError
from .acting import roll_out
from .base import Outcome, Recovery, Stage, now, run_stage
from .serve import ServeStage

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["RolloutStage", "merged"]


def merged(storage: Any, number: int) -> bool:
    """Iteration ``number`` has its merged file (rank files a killed merge left are removed)."""
    group = [f for f in storage.files() if f.iteration == number]
    if not any(f.rank is None for f in group):
        return False
    for f in group:
        if f.rank is not None:
            f.path.unlink(missing_ok=True)
    return True


@dataclass
class _Tally:
    """The counts of a rollout's ranks."""

    steps: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    timings: Counter[str] = field(default_factory=Counter)

    def add(self, result: Any) -> None:
        self.steps += result.steps
        self.statuses.update(result.status_counts())
        self.timings.update({key: float(v) for key, v in result.timings.items()})


@dataclass
class RolloutStage(Stage[None]):
    """Roll out (or import) iteration ``k``'s trajectories into one iteration file, acted
    by ``acting`` (None: the demonstrations).

    Demonstrations may be rolled out ``bootstrap.repeats`` times (one rank file
    each, the scripted expert seeded differently per repeat); the rank files are
    then merged. Recovery keeps what a killed run stored: the merged iteration file
    (the stage is recorded, not redone), or each rank file already written.
    """

    name = "rollout"
    recovery = Recovery.KEEP

    k: int
    tasks: list[Any]
    acting: Path | str | None

    def recover(self, ctx: RunContext) -> Outcome[None] | None:
        storage = ctx.storage()
        if not merged(storage, self.k + 1):
            return None
        # The loop died after the iteration file was written, before the journal was.
        return Outcome(
            None,
            {"recovered": True},
            report=f"iteration {self.k}: rollout already stored ({storage.root}); not redone",
            seconds=0.0,
        )

    def run(self, ctx: RunContext) -> Outcome[None]:
        source = ctx.config["bootstrap"]["source"]
        if self.acting is None and source not in (None, "scripted"):
            return self._import_demonstrations(ctx, ctx.config.path(source))
        repeats = ctx.config["bootstrap"]["repeats"] if self.acting is None else 1
        if ctx.config.on_miniwob:
            repeats = 1  # the demonstrations' repeats are more seeds (sample)
        base_url = None
        if self.acting is not None:
            serve = ServeStage(self.k, self.acting, f"serve (iteration {self.k})")
            base_url = run_stage(ctx, serve)
        started = now()
        storage = ctx.storage()
        tally = _Tally()
        try:
            for rank in range(repeats):
                self._rank(ctx, storage, rank, base_url, tally)
        finally:
            if not ctx.config.on_miniwob:
                ctx.server.stop_after_rollouts()  # MiniWoB++'s held-out evaluation uses it next
        path = storage.merge_ranks(self.k + 1)
        seconds = now() - started
        facts = {
            "steps": tally.steps,
            "repeats": repeats,
            "statuses": dict(tally.statuses),
            "timings": {key: round(v, 4) for key, v in tally.timings.items()},
            "file": ctx.paths.rel(path),
        }
        who = "the scripted expert" if self.acting is None else ctx.paths.rel(self.acting)
        times = f", {repeats} times" if repeats > 1 else ""
        report = (
            f"iteration {self.k}: rolled out {len(self.tasks)} tasks{times} with {who} in "
            f"{seconds:.1f} s ({tally.steps} steps)"
        )
        return Outcome(None, facts, report=report, seconds=seconds)

    def _rank(
        self, ctx: RunContext, storage: Any, rank: int, base_url: str | None, tally: _Tally
    ) -> None:
        """Roll out rank ``rank`` unless a killed run stored it already."""
        number = self.k + 1
        if any(f.iteration == number and f.rank == rank for f in storage.files()):
            return  # stored before the loop was killed
        from replaystore.rollouts.screenshots import screenshot_folder

        folder = screenshot_folder(ctx.paths.screenshot_root, number, rank)
        shutil.rmtree(folder, ignore_errors=True)  # an interrupted try's leftovers
        result = roll_out(
            ctx,
            self.tasks,
            storage,
            number,
            rank=rank,
            base_url=base_url,
            screenshot_root=ctx.paths.screenshot_root,
            metadata={
                "policy": "demonstrations" if self.acting is None else "model",
                "checkpoint": ctx.paths.rel(self.acting),
                "loop_iteration": self.k,
            },
        )
        error = getattr(result, "model_server_error", None)
        if error:
            raise LoopStageError(
                f"rollout (iteration {self.k}): the model server failed: {error}; see "
                f"{ctx.paths.log(f'serve-{self.k:03d}.log')}"
            )
        if result.path is None:
            raise LoopStageError(f"rollout (iteration {self.k}): no trajectory was stored")
        tally.add(result)

    def _import_demonstrations(self, ctx: RunContext, source: Path) -> Outcome[None]:
        """Iteration 0's trajectories copied from an existing storage (one iteration file)."""
        from replaystore.trajectories.storage import TrajectoryStorage

        if not source.is_dir():
            raise ConfigError(f"bootstrap.source: {source} is not a trajectory storage directory")
        trajectories = TrajectoryStorage(source).load_all()
        if not trajectories:
            raise ConfigError(f"bootstrap.source: {source} holds no trajectories")
        path = ctx.storage().save_iteration(
            self.k + 1, trajectories, metadata={"source": str(source), "policy": "demonstrations"}
        )
        return Outcome(
            None,
            {"imported": str(source), "file": ctx.paths.rel(path)},
            report=f"iteration {self.k}: {len(trajectories)} demonstrations imported from {source}",
        )
