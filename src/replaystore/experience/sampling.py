"""Which rows to pick and how to shape them: samplers and converters (AWorld's interfaces).

* :class:`TaskBatchSampler` (AWorld's ``TaskSampler``) picks whole tasks;
  :class:`RandomTaskSample` picks up to ``batch_size`` distinct *tasks* having a
  row that matches the query, and returns every row of those tasks, each task
  sorted by ``(step, execute_time)``.
* :class:`RandomSampler` picks up to ``batch_size`` distinct matching *rows*.
* A :class:`Converter` turns a task's rows into one dataset row; the
  :class:`DefaultConverter` returns the rows unchanged.

Every sampler takes ``seed`` (an int or a ``numpy.random.Generator``); its
methods also accept ``rng=`` to override it for one call. The random choice
itself is delegated to the storage (``sample_task_ids``/``sample_rows``), which
can do it without reading the whole store.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from typing import Any, TypeVar

import numpy as np

from replaystore.experience.query import Condition
from replaystore.experience.rows import DataRow
from replaystore.experience.storage.base import Storage, check_count
from replaystore.sampling import SeedLike, as_generator

__all__ = [
    "Converter",
    "DefaultConverter",
    "RandomSampler",
    "RandomTaskSample",
    "Sampler",
    "TaskBatchSampler",
]

T = TypeVar("T")


class Sampler(ABC):
    """Picks rows from a storage.

    Args:
        seed: an int or a ``numpy.random.Generator`` (default: fresh entropy).
    """

    def __init__(self, seed: SeedLike = None) -> None:
        self.rng: np.random.Generator = as_generator(seed)

    def _generator(self, rng: SeedLike) -> np.random.Generator:
        if rng is not None:
            return as_generator(rng)
        own = getattr(self, "rng", None)
        if own is None:  # a subclass that skipped Sampler.__init__
            own = self.rng = as_generator(None)
        return own

    @abstractmethod
    def sample(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: Condition | None = None,
        *,
        rng: SeedLike = None,
    ) -> list[DataRow]:
        """Return sampled rows (at most what ``batch_size`` allows)."""


class TaskBatchSampler(Sampler):
    """Samples whole tasks for a batch: subclasses choose the task ids (:meth:`sample_task_ids`).

    AWorld's ``TaskSampler`` (``aworld.replay_buffer.base``; under that name in
    :mod:`replaystore.experience.base`). Not
    :class:`replaystore.pipeline.TaskSampler`, which picks the tasks a rollout runs.
    """

    def sorted_by_step(self, task_experience: list[DataRow]) -> list[DataRow]:
        """The rows sorted by ``(step, execute_time)`` (stable: ties keep insertion order)."""
        return sorted(task_experience, key=lambda r: (r.exp_meta.step, r.exp_meta.execute_time))

    @abstractmethod
    def sample_task_ids(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: Condition | None = None,
        *,
        rng: SeedLike = None,
    ) -> list[str]:
        """Up to ``batch_size`` distinct task ids having a row that matches the query."""

    def sample_tasks(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: Condition | None = None,
        *,
        rng: SeedLike = None,
    ) -> dict[str, list[DataRow]]:
        """``{task_id: rows sorted by step}`` for the sampled tasks, in sampled order.

        The query selects tasks; every row of a selected task is returned.
        """
        # Pass rng only when given, so AWorld-style subclasses without it keep working.
        kwargs = {} if rng is None else {"rng": rng}
        ids = self.sample_task_ids(storage, batch_size, query_condition, **kwargs)
        tasks = storage.get_batch_by_task_ids(ids)
        return {tid: self.sorted_by_step(rows) for tid, rows in tasks.items() if rows}

    def sample(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: Condition | None = None,
        *,
        rng: SeedLike = None,
    ) -> list[DataRow]:
        """The rows of the sampled tasks, task after task, each sorted by step.

        (AWorld returns the ``{task_id: rows}`` dict here, against its own
        ``List[DataRow]`` annotation; use :meth:`sample_tasks` for the dict.)
        """
        kwargs = {} if rng is None else {"rng": rng}
        tasks = self.sample_tasks(storage, batch_size, query_condition, **kwargs)
        return [row for rows in tasks.values() for row in rows]


class RandomTaskSample(TaskBatchSampler):
    """Uniformly random distinct tasks among those with a matching row.

    Returns task ids (never rows, unlike AWorld's when the store is small), at
    most ``batch_size`` of them, fewer when fewer tasks match. Cost: the storage's
    ``sample_task_ids``: an index lookup for ``eq``/``in_`` on indexed metadata.
    """

    def sample_task_ids(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: Condition | None = None,
        *,
        rng: SeedLike = None,
    ) -> list[str]:
        k = check_count(batch_size)
        return storage.sample_task_ids(k, query_condition, self._generator(rng))

    def sample_tasks(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: Condition | None = None,
        *,
        rng: SeedLike = None,
    ) -> dict[str, list[DataRow]]:
        k = check_count(batch_size)
        tasks = storage.sample_tasks(k, query_condition, self._generator(rng))
        return {tid: self.sorted_by_step(rows) for tid, rows in tasks.items() if rows}


class RandomSampler(Sampler):
    """Up to ``batch_size`` distinct matching rows, uniformly, in random order."""

    def sample(
        self,
        storage: Storage,
        batch_size: int,
        query_condition: Condition | None = None,
        *,
        rng: SeedLike = None,
    ) -> list[DataRow]:
        k = check_count(batch_size)
        return storage.sample_rows(k, query_condition, self._generator(rng))


class Converter(ABC):
    """Turns the rows of one task (or one sample) into a dataset row."""

    @abstractmethod
    def to_dataset_row(self, task_experience: list[DataRow]) -> Any:
        """Convert ``task_experience`` (rows sorted by step) to one dataset row."""


class DefaultConverter(Converter):
    """Returns the rows unchanged."""

    def to_dataset_row(self, task_experience: list[DataRow]) -> list[DataRow]:
        return task_experience


def deprecated_task_sampler(stacklevel: int) -> type[TaskBatchSampler]:
    """TaskBatchSampler, asked for by its old name: warns once per call site."""
    warnings.warn(
        "replaystore.experience.TaskSampler is deprecated: the class is TaskBatchSampler "
        "(replaystore.pipeline.TaskSampler is the rollout task sampler, another class). "
        "AWorld code keeps AWorld's name, without this warning, by importing it from "
        "replaystore.experience.base (aworld.replay_buffer.base).",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )
    return TaskBatchSampler


def __getattr__(name: str) -> Any:
    if name == "TaskSampler":
        return deprecated_task_sampler(stacklevel=2)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
