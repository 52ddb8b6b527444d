"""The experience replay buffer: :class:`ReplayBuffer` (``replaystore.ExperienceBuffer``).

A thin front over a storage, with AWorld's methods: ``store``, ``store_batch``,
``sample`` and ``sample_task``. Data flows one way: rows -> storage -> sampler
(picks rows or tasks) -> converter (shapes them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from replaystore.errors import ConfigError, SchemaError
from replaystore.experience.query import Condition, QueryBuilder, validate_condition
from replaystore.experience.rows import DataRow
from replaystore.experience.sampling import (
    Converter,
    DefaultConverter,
    RandomTaskSample,
    Sampler,
    TaskBatchSampler,
)
from replaystore.experience.storage import InMemoryStorage, Storage
from replaystore.sampling import SeedLike, as_generator

__all__ = ["ReplayBuffer"]

log = logging.getLogger("replaystore.experience")


def _condition(query_condition: Condition | QueryBuilder | None) -> Condition | None:
    if isinstance(query_condition, QueryBuilder):
        query_condition = query_condition.build()
    validate_condition(query_condition)
    return query_condition


class ReplayBuffer:
    """Store agent experience rows and sample tasks or rows by query.

    Args:
        storage: where rows live; default a fresh :class:`InMemoryStorage`
            (10,000 rows) for this buffer alone (AWorld's default is one storage
            object shared by every buffer created without one).
        seed: seeds the default sampler (an int or a ``numpy.random.Generator``).

    Example::

        buf = ReplayBuffer(SqliteStorage("runs/exp.sqlite"))
        buf.store_batch(rows)
        q = QueryBuilder().eq("exp_meta.agent_id", "agent_1").build()
        tasks = buf.sample_task(query_condition=q, batch_size=32, seed=0)
    """

    def __init__(self, storage: Storage | None = None, *, seed: SeedLike = None) -> None:
        if storage is not None and not isinstance(storage, Storage):
            raise ConfigError(f"storage must be a Storage, got {type(storage).__name__}")
        self._storage: Storage = storage if storage is not None else InMemoryStorage()
        self._rng = as_generator(seed)

    @property
    def storage(self) -> Storage:
        """The storage this buffer reads and writes."""
        return self._storage

    def store(self, data: DataRow) -> None:
        """Store one row.

        Raises:
            SchemaError: ``data`` is None, has no ``exp_meta``, or holds a value
                that cannot be stored as JSON; the store is unchanged.
        """
        if data is None:
            raise SchemaError("store() needs a DataRow, got None")
        self._storage.add(data)

    def store_batch(self, data_batch: Sequence[DataRow]) -> None:
        """Store rows all-or-nothing (an empty list is a no-op).

        Raises:
            SchemaError: ``data_batch`` is not a list of rows, or a row is invalid
                (named by its position); no row of the batch is stored.
        """
        if data_batch is None or isinstance(data_batch, DataRow | Mapping | str):
            raise SchemaError(f"store_batch() needs a list of DataRow, got {data_batch!r:.80}")
        batch = list(data_batch)
        if not batch:
            log.debug("store_batch() got an empty batch; nothing stored")
            return
        self._storage.add_batch(batch)

    def _sampler_call(self, sampler: Sampler | None, seed: SeedLike) -> tuple[Sampler, dict]:
        if sampler is None:
            sampler = RandomTaskSample(self._rng)
        kwargs: dict[str, Any] = {} if seed is None else {"rng": as_generator(seed)}
        return sampler, kwargs

    def sample(
        self,
        sampler: Sampler | None = None,
        query_condition: Condition | QueryBuilder | None = None,
        converter: Converter | None = None,
        batch_size: int = 1000,
        *,
        seed: SeedLike = None,
    ) -> Any:
        """Sample with ``sampler`` and convert the rows with ``converter`` in one call.

        Args:
            sampler: default :class:`RandomTaskSample` (rows of up to ``batch_size``
                tasks); :class:`RandomSampler` gives up to ``batch_size`` rows.
            query_condition: a condition dict (or a :class:`QueryBuilder`); ``None``: all.
            converter: default :class:`DefaultConverter` (the list of rows).
            batch_size: tasks or rows to draw (fewer when fewer match).
            seed: seed or generator for this call (else the sampler's own).

        Returns:
            ``converter.to_dataset_row(rows)``; with the defaults a list of rows.

        Raises:
            QueryError: the condition is malformed.
        """
        cond = _condition(query_condition)
        sampler, kwargs = self._sampler_call(sampler, seed)
        rows = sampler.sample(self._storage, batch_size, cond, **kwargs)
        return (converter or DefaultConverter()).to_dataset_row(rows)

    def sample_task(
        self,
        sampler: TaskBatchSampler | None = None,
        query_condition: Condition | QueryBuilder | None = None,
        converter: Converter | None = None,
        batch_size: int = 1000,
        *,
        seed: SeedLike = None,
    ) -> list[Any]:
        """Sample up to ``batch_size`` tasks; one converter output per task.

        The query selects tasks (those with at least one matching row); each
        task's rows are all returned, sorted by ``(step, execute_time)``.

        Raises:
            QueryError: the condition is malformed.
            ConfigError: ``sampler`` is not a :class:`TaskBatchSampler`.
        """
        cond = _condition(query_condition)
        chosen, kwargs = self._sampler_call(sampler, seed)
        if not hasattr(chosen, "sample_tasks"):
            raise ConfigError(
                f"sample_task() needs a TaskBatchSampler, got {type(chosen).__name__}; "
                "use sample() for row samplers"
            )
        tasks = chosen.sample_tasks(self._storage, batch_size, cond, **kwargs)
        conv = converter or DefaultConverter()
        return [conv.to_dataset_row(rows) for rows in tasks.values()]

    def size(self, query_condition: Condition | QueryBuilder | None = None) -> int:
        """Number of stored rows (matching the condition when given)."""
        return self._storage.size(_condition(query_condition))

    def __len__(self) -> int:
        return self._storage.size()

    def clear(self) -> None:
        """Remove every row from the storage."""
        self._storage.clear()
