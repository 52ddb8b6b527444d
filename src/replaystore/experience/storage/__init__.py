"""Experience storages: one interface (:class:`Storage`), three places for the rows.

* :class:`InMemoryStorage`: this process's memory; fastest; one process.
* :class:`SqliteStorage`: one SQLite file; many processes; survives restarts and crashes.
* :class:`MultiProcMemoryStorage`: a ``multiprocessing.Manager``; processes on one
  machine, no files, gone when the manager stops.
"""

from __future__ import annotations

from replaystore.experience.storage.base import Storage
from replaystore.experience.storage.memory import InMemoryStorage
from replaystore.experience.storage.multiproc import MultiProcMemoryStorage
from replaystore.experience.storage.sqlite import SqliteStorage

__all__ = ["InMemoryStorage", "MultiProcMemoryStorage", "SqliteStorage", "Storage"]
