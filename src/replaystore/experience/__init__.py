"""Queryable agent experience (AWorld's ``aworld.replay_buffer`` API).

Rows (:class:`ExpMeta` + :class:`Experience` -> :class:`DataRow`) go into a
storage (in memory, SQLite, or shared between processes); :class:`QueryBuilder`
conditions select rows; samplers pick tasks or rows; converters shape them.
The in-memory storage returns the row objects you stored; the SQLite and
multi-process storages keep JSON and give your types back through
:class:`FieldDecoders` (``decoders={"state": Observation, "actions": ActionModel}``).

Switching from AWorld is an import change::

    from replaystore.experience import (
        ReplayBuffer, DataRow, ExpMeta, Experience, QueryBuilder,
        RandomTaskSample, DefaultConverter, MultiProcMemoryStorage,
    )
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replaystore.experience.buffer import ReplayBuffer
from replaystore.experience.decoding import FieldDecoders
from replaystore.experience.query import QueryBuilder
from replaystore.experience.rows import DataRow, Experience, ExpMeta
from replaystore.experience.sampling import (
    Converter,
    DefaultConverter,
    RandomSampler,
    RandomTaskSample,
    Sampler,
    TaskBatchSampler,
    deprecated_task_sampler,
)
from replaystore.experience.storage import (
    InMemoryStorage,
    MultiProcMemoryStorage,
    SqliteStorage,
    Storage,
    open_storage,
)

ExperienceBuffer = ReplayBuffer

__all__ = [
    "Converter",
    "DataRow",
    "DefaultConverter",
    "ExpMeta",
    "Experience",
    "ExperienceBuffer",
    "FieldDecoders",
    "InMemoryStorage",
    "MultiProcMemoryStorage",
    "PostgresStorage",
    "QueryBuilder",
    "RandomSampler",
    "RandomTaskSample",
    "ReplayBuffer",
    "Sampler",
    "SqliteStorage",
    "Storage",
    "TaskBatchSampler",
    "open_storage",
]


if TYPE_CHECKING:  # what type checkers see; at run time, __getattr__ below
    from replaystore.experience.storage.postgres import PostgresStorage


def __getattr__(name: str) -> Any:
    # PostgresStorage imports psycopg (the "postgres" extra): only when asked for.
    if name == "PostgresStorage":
        from replaystore.experience.storage.postgres import PostgresStorage

        return PostgresStorage
    if name == "TaskSampler":  # the old name of TaskBatchSampler (a DeprecationWarning)
        return deprecated_task_sampler(stacklevel=2)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy PostgresStorage too, so dir() lists every name of __all__.
    return sorted(set(globals()) | set(__all__))
