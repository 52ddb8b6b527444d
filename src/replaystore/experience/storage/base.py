"""The interface every experience storage implements (AWorld's ``Storage``), plus sampling hooks.

The seed's methods (``add add_batch size get_paginated get_all get_by_task_id
get_batch_by_task_ids clear``, and the seed's spelling ``get_bacth_by_task_ids``)
are the contract. Three more methods let samplers ask the storage for what
they need without reading the whole store: :meth:`Storage.task_ids`,
:meth:`Storage.sample_task_ids` and :meth:`Storage.sample_rows`. Their default
implementations here work through ``get_all``; the storages override them with
indexed or SQL versions.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np

from replaystore.errors import ConfigError
from replaystore.experience.query import Condition
from replaystore.experience.rows import DataRow
from replaystore.sampling import SeedLike, as_generator

__all__ = [
    "Eviction",
    "PicklesSettings",
    "Storage",
    "check_capacity",
    "check_count",
    "check_page",
]

Eviction = Literal["task", "row"]


def check_capacity(max_capacity: int | None, eviction: str) -> tuple[int | None, Eviction]:
    """Validate a capacity (``None`` = unbounded, else an int >= 1) and an eviction mode."""
    if max_capacity is not None and (
        isinstance(max_capacity, bool) or not isinstance(max_capacity, int) or max_capacity < 1
    ):
        raise ConfigError(f"max_capacity must be None or an integer >= 1, got {max_capacity!r}")
    if eviction not in ("task", "row"):
        raise ConfigError(f"eviction must be 'task' or 'row', got {eviction!r}")
    return max_capacity, eviction  # type: ignore[return-value]


def check_count(batch_size: int, name: str = "batch_size") -> int:
    """Validate a non-negative integer count."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int | np.integer):
        raise ConfigError(f"{name} must be an integer, got {batch_size!r}")
    if batch_size < 0:
        raise ConfigError(f"{name} must be >= 0, got {batch_size}")
    return int(batch_size)


def check_page(page: int, page_size: int) -> tuple[int, int]:
    """Validate 1-based ``page`` and ``page_size`` (both >= 1), as the seed does."""
    if check_count(page, "page") < 1:
        raise ConfigError(f"page must be >= 1 (pages are 1-based), got {page}")
    if check_count(page_size, "page_size") < 1:
        raise ConfigError(f"page_size must be >= 1, got {page_size}")
    return int(page), int(page_size)


def choose(n: int, k: int, rng: SeedLike) -> np.ndarray:
    """``min(k, n)`` distinct positions in ``range(n)``, uniformly, in random order."""
    gen = as_generator(rng)
    k = min(k, n)
    if k == 0:
        return np.empty(0, dtype=np.int64)
    return gen.choice(n, size=k, replace=False)


class Storage(ABC):
    """Where experience rows live. All methods are safe to call on an empty store.

    Rows come back as :class:`~replaystore.experience.rows.DataRow` objects: the
    in-memory storage returns the very objects stored; storages that keep JSON
    return ``state``/``actions``/``messages`` as plain JSON values, or as your
    types when given ``decoders=`` (see :mod:`replaystore.experience.decoding`).
    Unless said otherwise, lists of rows are in insertion order.
    """

    @abstractmethod
    def add(self, data: DataRow) -> None:
        """Store one row; evict old rows if the store is over capacity.

        Raises:
            SchemaError: the row is invalid; nothing is stored.
        """

    @abstractmethod
    def add_batch(self, data_batch: Sequence[DataRow]) -> None:
        """Store rows all-or-nothing: every row is validated before any is stored.

        Raises:
            SchemaError: a row is invalid (the message names its position); nothing is stored.
        """

    @abstractmethod
    def size(self, query_condition: Condition | None = None) -> int:
        """Number of rows (matching ``query_condition`` when given)."""

    @abstractmethod
    def get_paginated(
        self, page: int, page_size: int, query_condition: Condition | None = None
    ) -> list[DataRow]:
        """Rows ``(page-1)*page_size`` to ``page*page_size - 1`` of the matching rows (1-based)."""

    @abstractmethod
    def get_all(self, query_condition: Condition | None = None) -> list[DataRow]:
        """Every row (matching ``query_condition`` when given)."""

    @abstractmethod
    def get_by_task_id(self, task_id: str) -> list[DataRow]:
        """The rows of one task in insertion order (``[]`` for an unknown task)."""

    @abstractmethod
    def get_batch_by_task_ids(self, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        """``{task_id: rows}`` for each requested id, in request order (``[]`` when unknown)."""

    def get_bacth_by_task_ids(self, task_ids: Sequence[str]) -> dict[str, list[DataRow]]:
        """AWorld's spelling of :meth:`get_batch_by_task_ids`."""
        return self.get_batch_by_task_ids(task_ids)

    @abstractmethod
    def clear(self) -> None:
        """Remove every row."""

    def task_ids(self, query_condition: Condition | None = None) -> list[str]:
        """Distinct task ids having at least one matching row, oldest task first."""
        return list(dict.fromkeys(r.exp_meta.task_id for r in self.get_all(query_condition)))

    def sample_task_ids(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[str]:
        """Up to ``batch_size`` distinct task ids, uniformly among tasks with a matching row."""
        ids = self.task_ids(query_condition)
        return [ids[i] for i in choose(len(ids), check_count(batch_size), rng)]

    def sample_tasks(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> dict[str, list[DataRow]]:
        """``{task_id: rows}`` for up to ``batch_size`` sampled tasks, in sampled order."""
        picked = self.sample_task_ids(batch_size, query_condition, rng)
        return self.get_batch_by_task_ids(picked)

    def sample_rows(
        self, batch_size: int, query_condition: Condition | None = None, rng: SeedLike = None
    ) -> list[DataRow]:
        """Up to ``batch_size`` distinct matching rows, uniformly, in random order."""
        rows = self.get_all(query_condition)
        return [rows[i] for i in choose(len(rows), check_count(batch_size), rng)]

    def __len__(self) -> int:
        return self.size()


class PicklesSettings(ABC):
    """Pickling for a storage that holds connections, locks or caches: a pickle keeps
    only its settings (the attributes named in ``_pickled``, in that order), and the
    unpickled copy rebuilds the rest with :meth:`_reset_local`, reconnecting on use.

    ``_pickle_defaults`` gives the settings that a pickle from an older version lacks.
    """

    _pickled: ClassVar[tuple[str, ...]] = ()
    _pickle_defaults: ClassVar[Mapping[str, Any]] = {}

    @abstractmethod
    def _reset_local(self) -> None:
        """Set this process's connections, locks and caches from the settings."""

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._pickled}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**self._pickle_defaults, **state})
        self._reset_local()
