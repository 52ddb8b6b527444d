"""The ``buffer`` stage: the training samples drawn from the stored iterations.

For ``train.stage: sft`` the trajectory buffer over the stored iterations (successful
trajectories, repeated screenshots dropped, recency-weighted draw); for ``kto`` and
``dpo`` the preference records of the buffer's iterations, successes and failures.
The draw is not stored: it is made again (same seeds) until the export is recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .acting import builder
from .base import Outcome, Stage

if TYPE_CHECKING:
    from .context import RunContext

__all__ = ["BufferStage", "Draw", "PreferenceBufferStage", "buffer_stage"]


@dataclass(frozen=True)
class Draw:
    """The samples drawn (``kind``: sft, kto, dpo) and how they were made, for the report."""

    samples: Sequence[Any]
    kind: str
    made: str


@dataclass
class BufferStage(Stage[Draw]):
    """Iteration ``k``'s SFT samples from the trajectory buffer."""

    name = "buffer"

    k: int

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        return None  # drawn again until the export is recorded

    def run(self, ctx: RunContext) -> Outcome[Draw]:
        from replaystore.trajectories import TrajectoryBuffer

        cfg = ctx.config
        b = cfg["buffer"]
        buffer = TrajectoryBuffer.from_storage(
            ctx.paths.storage_root,
            # Steps stored without a prompt (an anti-bot page ends the task before the
            # model is asked) are rebuilt with the builder the rollouts used.
            agent=builder(cfg),
            last_n_iterations=b["last_n_iterations"],
            filter_successful_only=b["filter_successful_only"],
            filter_same_screenshot=b["filter_same_screenshot"],
            seed=cfg["seed"],
        )
        samples = buffer.get_training_samples(
            b["train_samples"],
            recency_bias_power=b["recency_bias_power"],
            seed=cfg["seed"] + self.k,
        )
        facts = {
            "steps": int(buffer.stats.as_dict()["samples"]),
            "eligible": int(buffer.num_eligible),
            "drawn": len(samples),
        }
        made = f"buffer {len(samples)} training steps drawn"
        return Outcome(Draw(samples, "sft", made), facts)


@dataclass
class PreferenceBufferStage(Stage[Draw]):
    """``train.stage: kto|dpo``: iteration ``k``'s preference records of the buffer's
    iterations (``buffer.last_n_iterations``); the counts (steps, desirable ones, DPO
    pairs) go to the journal."""

    name = "buffer"

    k: int

    def finished(self, ctx: RunContext) -> dict[str, Any] | None:
        return None  # drawn again until the export is recorded

    def run(self, ctx: RunContext) -> Outcome[Draw]:
        from replaystore.trajectories import TrajectoryStorage
        from replaystore.trajectories.preference import (
            dpo_pairs,
            kto_samples,
            preference_steps,
            storage_trajectories,
        )

        kind = ctx.config.train_stage(self.k)
        trajectories = storage_trajectories(
            TrajectoryStorage(ctx.paths.storage_root), ctx.config["buffer"]["last_n_iterations"]
        )
        steps = preference_steps(trajectories)
        desirable = sum(step.success for step in steps)
        facts: dict[str, Any] = {"steps": len(steps), "desirable": desirable}
        if kind == "kto":
            samples = kto_samples(steps)
            made = f"{len(steps)} steps ({desirable} desirable)"
        else:
            samples, pairs = dpo_pairs(steps)
            facts["pairs"] = pairs.as_dict()
            made = f"{len(samples)} pairs from {len(steps)} steps"
        return Outcome(Draw(samples, kind, f"{kind.upper()} records from {made}"), facts)


def buffer_stage(ctx: RunContext, k: int) -> Stage[Draw]:
    """The buffer stage of iteration ``k``'s training stage (``train.stage``)."""
    return BufferStage(k) if ctx.config.train_stage(k) == "sft" else PreferenceBufferStage(k)
