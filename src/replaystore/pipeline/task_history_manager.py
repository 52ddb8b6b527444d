"""WebGym's ``webgym/utils/task_history_manager.py``: attempt levels on task DataFrames.

``TaskHistoryManager(save_path)`` with WebGym's three methods, over
:class:`~replaystore.pipeline.task_history.TaskHistory`. Tasks come and go as
pandas DataFrames (one row per task, the task file's columns), as in WebGym;
pandas is the optional extra ``replaystore[pandas]``.

Attempt levels (WebGym's): 0 never attempted, 1-4 failed that many times, 5
solved (final reward ``>= 1``) or failed 5 times or more. A trajectory counts
for the task of its first step. A task is identified by its ``task_id`` (a
negative id, WebGym's ``-1`` for filtered tasks, is skipped); where WebGym
raises for a row without ``task_id``, the task is identified by
``(task_name, website)`` here. ``None`` trajectories (WebGym's placeholders for
failed rollouts) are skipped, as WebGym does.

Differences (fixes): the input DataFrame is never modified (WebGym's
``apply_adaptive_weighted_sampling`` adds an ``attempt_level`` column to it);
the adaptive draw is seeded (``seed=``) and never silently falls back to the
unsampled order: tasks whose level weight is 0 come last, in input order
(WebGym's ``np.random.choice`` fails on them and returns the input unchanged).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from replaystore.errors import SchemaError
from replaystore.pipeline._frames import check_frame, frame_records
from replaystore.pipeline.task_history import (
    MAX_ATTEMPT_LEVEL,
    TaskHistory,
    TaskKey,
    order_by_weight,
    task_key,
    webgym_level_weights,
)
from replaystore.sampling import SeedLike

__all__ = ["TaskHistoryManager"]

logger = logging.getLogger("replaystore.pipeline.task_history_manager")


def _present(trajectories: Iterable[Any]) -> list[Any]:
    """Trajectories without WebGym's ``None`` / empty placeholders."""
    return [t for t in trajectories if t is not None and len(t) > 0]


def _row_keys(records: Sequence[Mapping[str, Any]]) -> list[TaskKey | None]:
    keys = []
    for i, row in enumerate(records):
        try:
            keys.append(task_key(row))
        except ValueError as exc:
            raise SchemaError(f"tasks row {i}: {exc}") from None
    return keys


def _first_task(trajectory: Sequence[Any], t: int) -> Any:
    step = trajectory[0]
    observation = step.get("observation") if isinstance(step, Mapping) else None
    task = getattr(observation, "task", None)
    if task is None and isinstance(observation, Mapping):
        task = observation.get("task")
    if task is None:
        raise SchemaError(f"trajectory {t} step 0 has no observation.task")
    return task


class TaskHistoryManager:
    """WebGym's ``TaskHistoryManager``: attempt levels computed from trajectories.

    Args:
        save_path: WebGym's run directory (kept as ``save_path``; nothing is written).
        success_threshold: a trajectory solved its task when its final reward is
            ``>= success_threshold`` (WebGym: ``== 1``).

    ``history`` is the :class:`TaskHistory` of the last
    :meth:`compute_attempt_levels_from_trajectories` call.
    """

    def __init__(self, save_path: str | os.PathLike[str], success_threshold: float = 1.0) -> None:
        self.save_path = save_path
        self.history = TaskHistory(success_threshold)

    def compute_attempt_levels_from_trajectories(
        self, tasks: Any, trajectories: Iterable[Any]
    ) -> Any:
        """A copy of ``tasks`` with an ``attempt_level`` column computed from ``trajectories``.

        The history is rebuilt from *all* ``trajectories`` (WebGym passes every
        trajectory collected so far); ``tasks`` is not modified.

        Args:
            tasks: pandas DataFrame, one row per task (``task_id`` or
                ``task_name`` + ``website`` columns identify a task).
            trajectories: lists of WebGym step mappings (``None`` entries skipped).

        Returns:
            The new DataFrame (same index and columns, plus/updated ``attempt_level``, int).

        Raises:
            TypeError: ``tasks`` is not a DataFrame.
            SchemaError: a row has neither ``task_id`` nor ``task_name`` and ``website``.
            TrajectoryError: a trajectory's first step has no task, or its final
                reward is not a number (names the trajectory).

        Cost: O(tasks + trajectories).
        """
        check_frame(tasks)
        fresh = TaskHistory(self.history.success_threshold)
        fresh.update(_present(trajectories))
        self.history = fresh
        levels = fresh.levels_by_key(_row_keys(frame_records(tasks)))
        out = tasks.copy()
        out["attempt_level"] = levels
        counts = np.bincount(levels, minlength=MAX_ATTEMPT_LEVEL + 1)
        logger.info(
            "attempt levels of %d tasks from %d attempted tasks: %s",
            len(out),
            len(fresh),
            {lvl: int(counts[lvl]) for lvl in range(MAX_ATTEMPT_LEVEL + 1)},
        )
        return out

    def compute_cumulative_distribution_from_trajectories(
        self, tasks: Any, trajectories: Iterable[Any]
    ) -> dict[int, int]:
        """How many trajectories were collected for tasks now at each attempt level.

        Each trajectory counts at the *current* level of its task, read from the
        ``attempt_level`` column of ``tasks`` (a task not in ``tasks`` counts at
        level 0, as in WebGym). Only levels that occur are keys.

        Raises:
            TypeError: ``tasks`` is not a DataFrame.
            SchemaError: ``tasks`` has no ``attempt_level`` column, or a row cannot
                be identified; a trajectory's first step has no task.

        Cost: O(tasks + trajectories).
        """
        check_frame(tasks)
        if "attempt_level" not in tasks.columns:
            raise SchemaError(
                "tasks has no 'attempt_level' column: pass the result of "
                "compute_attempt_levels_from_trajectories"
            )
        records = frame_records(tasks)
        level_of = {
            key: int(row["attempt_level"])
            for key, row in zip(_row_keys(records), records, strict=True)
            if key is not None
        }
        counts: dict[int, int] = {}
        for t, trajectory in enumerate(_present(trajectories)):
            key = task_key(_first_task(trajectory, t))
            if key is None:
                continue
            level = level_of.get(key, 0)
            counts[level] = counts.get(level, 0) + 1
        return counts

    def apply_adaptive_weighted_sampling(
        self,
        tasks: Any,
        level_weights: Mapping[int, float] | None = None,
        cumulative_distribution: Mapping[int, int] | None = None,
        total_trajectories: int = 0,
        *,
        seed: SeedLike = None,
    ) -> Any:
        """All of ``tasks`` in a random order drawn by attempt-level weight (WebGym's call).

        Successive weighted sampling without replacement: low levels (new tasks)
        tend to come first. A missing ``attempt_level`` column means level 0.

        Args:
            tasks: pandas DataFrame with an ``attempt_level`` column (0..5).
            level_weights: weight per level; as in WebGym, a level the mapping
                does not name weighs 1.0 (default table: 0:100, 1:10, 2:1, 3:0.1,
                4:0.01, 5:0.001).
            cumulative_distribution: only logged (WebGym's running totals per
                level), as in WebGym.
            total_trajectories: only logged, as in WebGym.
            seed: int or Generator for a reproducible order (None: fresh entropy).

        Returns:
            A new DataFrame with the same rows, reordered, index reset (WebGym's shape).

        Raises:
            TypeError: ``tasks`` is not a DataFrame.
            SchemaError: an ``attempt_level`` outside 0..5 (names the row).
            ValueError: a negative or non-finite weight.

        Cost: O(n log n) for n tasks.
        """
        check_frame(tasks)
        if len(tasks) == 0:
            return tasks.copy()
        table = webgym_level_weights(level_weights)
        if "attempt_level" in tasks.columns:
            raw = tasks["attempt_level"].to_numpy()
            try:
                levels = raw.astype(np.int64)
            except (TypeError, ValueError):
                raise SchemaError("tasks 'attempt_level' must hold integers 0..5") from None
            bad = np.flatnonzero((levels < 0) | (levels > MAX_ATTEMPT_LEVEL) | (levels != raw))
            if bad.size:
                i = int(bad[0])
                raise SchemaError(
                    f"tasks row {i} (index {tasks.index[i]!r}): attempt_level must be "
                    f"an integer 0..5, got {raw[i]!r}"
                )
        else:
            levels = np.zeros(len(tasks), dtype=np.int64)
        out = tasks.iloc[order_by_weight(table[levels], seed)].reset_index(drop=True)
        before = np.bincount(levels, minlength=MAX_ATTEMPT_LEVEL + 1)
        logger.info(
            "adaptive-weighted order of %d tasks; per level %s, weights %s; cumulative %s of %d",
            len(out),
            before.tolist(),
            table.tolist(),
            dict(cumulative_distribution or {}),
            int(total_trajectories),
        )
        return out
