"""The loop's stages as objects, one module each, and the driver that runs them.

A stage (:class:`~.base.Stage`) has a ``name`` (its key in the journal), a recovery
rule (:class:`~.base.Recovery`: what to do when the journal says it started but did
not finish) and a ``run(ctx)`` over the run's :class:`~.context.RunContext`.
:func:`~.base.run_stage` is the driver: it skips a stage the journal marks done,
times the others, records them in the journal and prints their report line.
:mod:`replaystore.loop.partial` holds the one ``.partial``-then-rename step every
directory output goes through.
"""

from __future__ import annotations

from .base import Outcome, Recovery, Stage, run_stage
from .context import DATASET_NAME, RunContext, RunPaths

__all__ = ["DATASET_NAME", "Outcome", "Recovery", "RunContext", "RunPaths", "Stage", "run_stage"]
