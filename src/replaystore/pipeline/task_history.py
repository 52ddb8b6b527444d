"""Attempt levels: how often each task was tried and whether it was solved.

The task sampler favours tasks the agent has not tried yet and avoids tasks it
has solved (or failed too often). :class:`TaskHistory` keeps, per task, the
number of failed attempts and whether any attempt solved it, and turns that
into an *attempt level* (WebGym's ``TaskHistoryManager``,
``webgym/utils/task_history_manager.py``):

====== ===============================================
level  meaning
====== ===============================================
0      never attempted
1 - 4  failed that many times, never solved
5      solved at least once, or failed 5 times or more
====== ===============================================

A trajectory is one attempt at the task of its first step
(``trajectory[0]["observation"].task``); it solved the task when the reward of
its last step is ``>= success_threshold`` (1 by default; a missing reward is a
failure, as in WebGym, for trajectories handed over in memory; a
:class:`~replaystore.trajectories.storage.TrajectoryStorage` never stores one and
refuses to read a file that does, see :mod:`replaystore.trajectories.index`).
A task is identified by its ``task_id`` or, when that is ``None``, by
``(task_name, website)``; a negative integer ``task_id`` (WebGym's ``-1`` for
filtered tasks) is skipped. Use one convention consistently: a task recorded
by id is not found by name.

WebGym recomputes the levels from every trajectory ever collected at each
iteration; :meth:`TaskHistory.update` is incremental (pass only the new
trajectories) and the history persists to a small JSON file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from replaystore.atomic import atomic_write_json
from replaystore.errors import CheckpointError, TrajectoryError
from replaystore.sampling import SeedLike, as_generator, weighted_sample_without_replacement
from replaystore.trajectories.components import Step, Task

__all__ = [
    "DEFAULT_LEVEL_WEIGHTS",
    "MAX_ATTEMPT_LEVEL",
    "TaskHistory",
    "TaskKey",
    "level_weight_table",
    "order_by_weight",
    "task_key",
    "webgym_level_weights",
]

#: Highest attempt level: solved, or failed this many times.
MAX_ATTEMPT_LEVEL = 5

#: WebGym's sampling weight per attempt level: new tasks first, solved tasks last.
DEFAULT_LEVEL_WEIGHTS: Mapping[int, float] = {
    0: 100.0,
    1: 10.0,
    2: 1.0,
    3: 0.1,
    4: 0.01,
    5: 0.001,
}

#: ``("id", task_id)`` or ``("name", task_name, website)``.
TaskKey = tuple[str, ...]

_FORMAT = "replaystore.task_history"
_VERSION = 1


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def task_key(task: Task | Mapping[str, Any] | Any) -> TaskKey | None:
    """The identity of a task: its ``task_id`` if set, else ``(task_name, website)``.

    Accepts a :class:`Task`, a mapping with the same fields, or any object with
    those attributes (WebGym's own ``Task``). Ids are compared as strings, so
    ``3`` and ``"3"`` are one task.

    Returns:
        The key, or ``None`` for a task WebGym marks as filtered (negative integer id).

    Raises:
        TrajectoryError: the task has no id and lacks ``task_name`` or ``website``.
    """
    task_id = _field(task, "task_id")
    if task_id is not None:
        if isinstance(task_id, bool):
            raise TrajectoryError(f"task_id must be a string or integer, got {task_id!r}")
        try:
            if int(task_id) < 0:
                return None
        except (TypeError, ValueError):
            pass
        return ("id", str(task_id))
    name, website = _field(task, "task_name"), _field(task, "website")
    if not isinstance(name, str) or not isinstance(website, str):
        raise TrajectoryError(
            "a task without task_id needs string task_name and website, "
            f"got task_name={name!r}, website={website!r}"
        )
    return ("name", name, website)


def level_weight_table(level_weights: Mapping[int, float] | None = None) -> NDArray[np.float64]:
    """Weights for levels 0..5 as an array of shape (6,): defaults overridden by ``level_weights``.

    ``level_weights`` may name only some levels (``{5: 0.0}`` never samples solved
    tasks; the other levels keep WebGym's defaults).

    Raises:
        ValueError: a key is not an integer level 0..5, or a weight is negative, NaN or inf.
    """
    table = np.array([DEFAULT_LEVEL_WEIGHTS[lvl] for lvl in range(MAX_ATTEMPT_LEVEL + 1)])
    for level, weight in (level_weights or {}).items():
        if isinstance(level, bool) or not isinstance(level, int | np.integer):
            raise ValueError(f"level_weights keys must be integer levels 0..5, got {level!r}")
        if not 0 <= level <= MAX_ATTEMPT_LEVEL:
            raise ValueError(f"level_weights has level {level}; levels are 0..5")
        value = float(weight)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"level_weights[{level}] must be finite and >= 0, got {weight!r}")
        table[int(level)] = value
    return table


def webgym_level_weights(level_weights: Mapping[int, float] | None = None) -> NDArray[np.float64]:
    """Weights for levels 0..5, shape (6,), read as WebGym's ``apply_adaptive_weighted_sampling``
    reads ``level_weights``: ``None`` is :data:`DEFAULT_LEVEL_WEIGHTS`; a mapping is the
    whole table, and a level it does not name weighs 1.0 (``{0: 5.0}`` gives
    ``[5, 1, 1, 1, 1, 1]``; ``{}`` weighs every level alike).

    :func:`level_weight_table` is the other reading (a mapping overrides the defaults
    for the levels it names), used by :class:`~replaystore.pipeline.task_sampler.TaskSampler`,
    :meth:`TaskHistory.weights` and :meth:`TaskHistory.weighted_order`.

    Raises:
        ValueError: a key is not an integer level 0..5, or a weight is negative, NaN or inf.
    """
    if level_weights is None:
        return level_weight_table()
    level_weight_table(level_weights)  # the same checks, naming the bad key or weight
    named = {int(level): weight for level, weight in level_weights.items()}
    return level_weight_table({lvl: named.get(lvl, 1.0) for lvl in range(MAX_ATTEMPT_LEVEL + 1)})


def order_by_weight(weights: NDArray[np.float64], seed: SeedLike = None) -> NDArray[np.int64]:
    """Every position of ``weights`` (shape (n,), >= 0), in a random order drawn by weight.

    Successive weighted sampling without replacement over the positive weights (the
    distribution of WebGym's ``np.random.choice(n, n, replace=False, p=w / w.sum())``),
    then the positions of weight 0 in input order (WebGym's ``choice`` fails on them
    and keeps the input order). Returns int64 indices, shape (n,).
    """
    positive = int(np.count_nonzero(weights))
    order = weighted_sample_without_replacement(weights, positive, as_generator(seed))
    return np.concatenate([order, np.flatnonzero(weights == 0)])


def _step_part(step: Any, part: str, t: int, s: int) -> Any:
    if isinstance(step, Step):
        return getattr(step, part)
    if isinstance(step, Mapping):
        if part not in step:
            raise TrajectoryError(f"trajectory {t} step {s} has no {part!r}")
        return step[part]
    raise TrajectoryError(
        f"trajectory {t} step {s} must be a mapping or a Step, got {type(step).__name__}"
    )


@dataclasses.dataclass(slots=True)
class _Record:
    attempts: int = 0
    failures: int = 0
    solved: bool = False

    @property
    def level(self) -> int:
        if self.solved:
            return MAX_ATTEMPT_LEVEL
        return min(self.failures, MAX_ATTEMPT_LEVEL)


class TaskHistory:
    """Attempt counts per task and the attempt level (0-5) derived from them.

    Args:
        success_threshold: a trajectory solved its task when its final reward is
            ``>= success_threshold``.

    Memory: one small record per attempted task.
    """

    def __init__(self, success_threshold: float = 1.0) -> None:
        threshold = float(success_threshold)
        if not math.isfinite(threshold):
            raise ValueError(f"success_threshold must be finite, got {success_threshold!r}")
        self.success_threshold = threshold
        self._records: dict[TaskKey, _Record] = {}

    def __len__(self) -> int:
        """Number of tasks attempted at least once."""
        return len(self._records)

    def __contains__(self, task: object) -> bool:
        key = task_key(task)
        return key is not None and key in self._records

    def __repr__(self) -> str:
        return f"TaskHistory({len(self)} tasks, levels={self.level_distribution()})"

    # -- updating -------------------------------------------------------------------

    def _outcome(self, trajectory: Any, t: int) -> tuple[TaskKey | None, bool] | None:
        if isinstance(trajectory, str | bytes) or not isinstance(trajectory, Sequence):
            raise TrajectoryError(
                f"trajectory {t} must be a list of steps, got {type(trajectory).__name__}"
            )
        if len(trajectory) == 0:
            return None
        observation = _step_part(trajectory[0], "observation", t, 0)
        task = _field(observation, "task")
        if task is None:
            raise TrajectoryError(f"trajectory {t} step 0: the observation has no task")
        try:
            key = task_key(task)
        except TrajectoryError as exc:
            raise TrajectoryError(f"trajectory {t} step 0: {exc}") from None
        last = len(trajectory) - 1
        reward = _step_part(trajectory[last], "reward", t, last)
        value = None if reward is None else _field(reward, "reward")
        if value is None:
            solved = False
        else:
            try:
                solved = float(value) >= self.success_threshold
            except (TypeError, ValueError):
                raise TrajectoryError(
                    f"trajectory {t} step {last}: reward must be a number, got {value!r}"
                ) from None
        return key, solved

    def update(self, trajectories: Iterable[Sequence[Any]]) -> int:
        """Count each trajectory as one attempt at its task.

        Pass each trajectory once (only the new ones after the first call).
        Every trajectory is checked before any is counted, so a bad one leaves
        the history unchanged. Empty trajectories are ignored.

        Args:
            trajectories: lists of steps (WebGym step mappings, :class:`Step`
                objects, or their JSON dicts).

        Returns:
            The number of trajectories counted.

        Raises:
            TrajectoryError: a trajectory is not a list of steps, its first step
                has no task, or its final reward is not a number (names the
                trajectory and step).

        Cost: O(number of trajectories).
        """
        outcomes = []
        for t, trajectory in enumerate(trajectories):
            outcome = self._outcome(trajectory, t)
            if outcome is not None and outcome[0] is not None:
                outcomes.append(outcome)
        for key, solved in outcomes:
            self._apply(key, solved)  # type: ignore[arg-type]
        return len(outcomes)

    def _apply(self, key: TaskKey, solved: bool) -> None:
        record = self._records.setdefault(key, _Record())
        record.attempts += 1
        if solved:
            record.solved = True
        else:
            record.failures += 1

    def record_attempt(self, task: Task | Mapping[str, Any], solved: bool) -> int:
        """Count one attempt at ``task``; returns its new level (unchanged for a filtered task)."""
        key = task_key(task)
        if key is None:
            return 0
        self._apply(key, bool(solved))
        return self._records[key].level

    def clear(self) -> None:
        """Forget every attempt."""
        self._records.clear()

    # -- queries --------------------------------------------------------------------

    def level(self, task: Task | Mapping[str, Any]) -> int:
        """Attempt level of one task, 0-5 (0 when never attempted)."""
        key = task_key(task)
        record = self._records.get(key) if key is not None else None
        return 0 if record is None else record.level

    def levels(self, tasks: Iterable[Task | Mapping[str, Any]]) -> NDArray[np.int64]:
        """Attempt levels of ``tasks``, shape (len(tasks),). Cost: one dict look-up per task."""
        return np.array([self.level(task) for task in tasks], dtype=np.int64)

    def levels_by_key(self, keys: Sequence[TaskKey | None]) -> NDArray[np.int64]:
        """Attempt levels for precomputed :func:`task_key` values (``None`` -> 0)."""
        records = self._records
        out = np.zeros(len(keys), dtype=np.int64)
        for i, key in enumerate(keys):
            record = records.get(key) if key is not None else None
            if record is not None:
                out[i] = record.level
        return out

    def attempts(self, task: Task | Mapping[str, Any]) -> int:
        """Number of trajectories counted for ``task`` (solved or not)."""
        key = task_key(task)
        record = self._records.get(key) if key is not None else None
        return 0 if record is None else record.attempts

    def level_distribution(
        self, tasks: Iterable[Task | Mapping[str, Any]] | None = None
    ) -> dict[int, int]:
        """Number of tasks at each level, ``{0: n0, ..., 5: n5}`` (every level present).

        Args:
            tasks: the task set to describe (tasks never attempted count at level 0).
                ``None`` describes the attempted tasks only (level 0 is then 0).
        """
        if tasks is None:
            levels = np.array([r.level for r in self._records.values()], dtype=np.int64)
        else:
            levels = self.levels(tasks)
        counts = np.bincount(levels, minlength=MAX_ATTEMPT_LEVEL + 1)
        return {lvl: int(counts[lvl]) for lvl in range(MAX_ATTEMPT_LEVEL + 1)}

    def weights(
        self,
        tasks: Sequence[Task | Mapping[str, Any]],
        level_weights: Mapping[int, float] | None = None,
    ) -> NDArray[np.float64]:
        """Sampling weight of each task from its level, shape (len(tasks),).

        Args:
            tasks: the tasks to weigh.
            level_weights: overrides of :data:`DEFAULT_LEVEL_WEIGHTS`
                (0:100, 1:10, 2:1, 3:0.1, 4:0.01, 5:0.001), by level.

        Raises:
            ValueError: bad ``level_weights`` (see :func:`level_weight_table`).
        """
        return level_weight_table(level_weights)[self.levels(tasks)]

    def with_levels(self, tasks: Iterable[Task]) -> list[Task]:
        """Copies of ``tasks`` whose ``attempt_level`` is the current level (inputs unchanged)."""
        return [dataclasses.replace(task, attempt_level=self.level(task)) for task in tasks]

    # -- WebGym's method names -------------------------------------------------------

    def compute_attempt_levels_from_trajectories(
        self, tasks: Iterable[Task], trajectories: Iterable[Sequence[Any]]
    ) -> list[Task]:
        """WebGym's call: rebuild the history from *all* ``trajectories``, return leveled tasks.

        Unlike :meth:`update`, this replaces what the history held (WebGym passes
        every trajectory collected so far at each iteration). The history is
        unchanged if a trajectory is malformed.
        """
        fresh = TaskHistory(self.success_threshold)
        fresh.update(trajectories)
        self._records = fresh._records
        return self.with_levels(tasks)

    def apply_adaptive_weighted_sampling(
        self,
        tasks: Sequence[Task],
        level_weights: Mapping[int, float] | None = None,
        seed: SeedLike = None,
    ) -> list[Task]:
        """WebGym's call: all ``tasks`` in a random order drawn by level weight, WebGym's weights.

        As in WebGym and in ``TaskHistoryManager.apply_adaptive_weighted_sampling``,
        ``level_weights`` is the whole table: a level it does not name weighs 1.0, so
        ``{0: 5.0}`` weighs levels 0..5 as ``[5, 1, 1, 1, 1, 1]`` (see
        :func:`webgym_level_weights`). :meth:`weighted_order` overrides only the levels
        named. The order is drawn as :meth:`weighted_order` draws it.

        Raises:
            ValueError: bad ``level_weights``.
        """
        weights = webgym_level_weights(level_weights)[self.levels(tasks)]
        return [tasks[int(i)] for i in order_by_weight(weights, seed)]

    def weighted_order(
        self,
        tasks: Sequence[Task],
        level_weights: Mapping[int, float] | None = None,
        seed: SeedLike = None,
    ) -> list[Task]:
        """All ``tasks`` (the same objects) in a random order drawn by :meth:`weights`.

        See :func:`order_by_weight`: low levels tend to come first; tasks whose level
        weight is 0 come last, in their input order.

        Args:
            tasks: the tasks to order.
            level_weights: overrides of :data:`DEFAULT_LEVEL_WEIGHTS` for the levels it
                names (``{0: 5.0}`` weighs levels 0..5 as ``[5, 10, 1, 0.1, 0.01, 0.001]``).
            seed: int or Generator for a reproducible order (None: fresh entropy).

        Raises:
            ValueError: bad ``level_weights`` (see :func:`level_weight_table`).

        Cost: O(n log n) for n tasks.
        """
        return [tasks[int(i)] for i in order_by_weight(self.weights(tasks, level_weights), seed)]

    # -- persistence ----------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The history as JSON-compatible data (the content of :meth:`save`'s file)."""
        records = []
        for key, record in self._records.items():
            ident = (
                {"task_id": key[1]} if key[0] == "id" else {"task_name": key[1], "website": key[2]}
            )
            records.append({**ident, **dataclasses.asdict(record)})
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "success_threshold": self.success_threshold,
            "tasks": records,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "task history") -> TaskHistory:
        """Inverse of :meth:`to_dict`.

        Raises:
            CheckpointError: wrong format or version, or a malformed task record
                (the message names ``source`` and the record index).
        """
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
            raise CheckpointError(f"{source} is not a replaystore task history")
        if data.get("version") != _VERSION:
            raise CheckpointError(
                f"{source} has task history version {data.get('version')!r}; "
                f"this replaystore reads version {_VERSION}"
            )
        try:
            history = cls(float(data["success_threshold"]))
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{source} has no valid success_threshold") from None
        records = data.get("tasks")
        if not isinstance(records, list):
            raise CheckpointError(f"{source}: 'tasks' must be a list")
        for i, rec in enumerate(records):
            history._load_record(rec, f"{source} task record {i}")
        return history

    def _load_record(self, rec: Any, where: str) -> None:
        if not isinstance(rec, Mapping):
            raise CheckpointError(f"{where} is not an object")
        counts = {}
        for name in ("attempts", "failures"):
            value = rec.get(name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CheckpointError(f"{where}: {name!r} must be an integer >= 0, got {value!r}")
            counts[name] = value
        solved = rec.get("solved")
        if not isinstance(solved, bool):
            raise CheckpointError(f"{where}: 'solved' must be true or false, got {solved!r}")
        if counts["failures"] + int(solved) > counts["attempts"]:
            raise CheckpointError(f"{where}: more failures than attempts")
        if isinstance(rec.get("task_id"), str):
            key: TaskKey = ("id", rec["task_id"])
        elif isinstance(rec.get("task_name"), str) and isinstance(rec.get("website"), str):
            key = ("name", rec["task_name"], rec["website"])
        else:
            raise CheckpointError(f"{where} needs a string task_id or task_name and website")
        if key in self._records:
            raise CheckpointError(f"{where} repeats task {key[1:]!r}")
        self._records[key] = _Record(counts["attempts"], counts["failures"], solved)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the history to ``path`` as JSON, atomically (old or new file, never half).

        Cost: O(number of attempted tasks).
        """
        atomic_write_json(path, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TaskHistory:
        """Read a history written by :meth:`save`.

        Raises:
            FileNotFoundError: ``path`` does not exist.
            CheckpointError: the file is not valid JSON or not a task history (names the file).
        """
        source = str(Path(path))
        with open(path, encoding="utf-8") as handle:
            try:
                data = json.load(handle)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise CheckpointError(f"{source} is not valid JSON: {exc}") from None
        return cls.from_dict(data, source)
