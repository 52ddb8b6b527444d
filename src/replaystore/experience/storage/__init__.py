"""Experience storages: one interface (:class:`Storage`), three places for the rows.

* :class:`InMemoryStorage`: this process's memory; fastest; one process.
* :class:`SqliteStorage`: one SQLite file; many processes; survives restarts and crashes.
* :class:`MultiProcMemoryStorage`: a ``multiprocessing.Manager``; processes on one
  machine, no files, gone when the manager stops.
* :class:`PostgresStorage`: a PostgreSQL database; writers on many machines
  (needs the ``postgres`` extra; imported on first use).

:func:`open_storage` opens any of the persistent ones from a URL or a path.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replaystore.experience.storage.base import Storage
from replaystore.experience.storage.memory import InMemoryStorage
from replaystore.experience.storage.multiproc import MultiProcMemoryStorage
from replaystore.experience.storage.sqlite import SqliteStorage
from replaystore.experience.storage.urls import open_storage

__all__ = [
    "InMemoryStorage",
    "MultiProcMemoryStorage",
    "PostgresStorage",
    "SqliteStorage",
    "Storage",
    "open_storage",
]


if TYPE_CHECKING:  # what type checkers see; at run time, __getattr__ below
    from replaystore.experience.storage.postgres import PostgresStorage


def __getattr__(name: str) -> Any:
    # PostgresStorage imports psycopg: only when asked for.
    if name == "PostgresStorage":
        from replaystore.experience.storage.postgres import PostgresStorage

        return PostgresStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy PostgresStorage too, so dir() lists every name of __all__.
    return sorted(set(globals()) | set(__all__))
