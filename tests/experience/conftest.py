from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest

from replaystore.experience import InMemoryStorage, MultiProcMemoryStorage, SqliteStorage


@pytest.fixture(scope="session")
def manager() -> Iterator[multiprocessing.managers.SyncManager]:
    with multiprocessing.Manager() as m:
        yield m


@pytest.fixture(params=["memory", "sqlite", "multiproc"])
def make_storage(request, tmp_path, manager):
    """A factory ``make_storage(max_capacity=None, eviction="task")`` for each storage kind."""
    counter = iter(range(1000))

    def make(max_capacity=None, eviction="task"):
        if request.param == "memory":
            return InMemoryStorage(max_capacity, eviction=eviction)
        if request.param == "sqlite":
            return SqliteStorage(
                tmp_path / f"s{next(counter)}.sqlite", max_capacity, eviction=eviction
            )
        return MultiProcMemoryStorage(
            manager.dict(), manager.list(), manager.Lock(), max_capacity, eviction=eviction
        )

    make.kind = request.param
    return make
