from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Iterator

import pytest

from replaystore.experience import InMemoryStorage, MultiProcMemoryStorage, SqliteStorage


@pytest.fixture(scope="session")
def manager() -> Iterator[multiprocessing.managers.SyncManager]:
    with multiprocessing.Manager() as m:
        yield m


def _factory(kind, tmp_path, manager):
    """``make(max_capacity=None, eviction="task", **kw)`` building a ``kind`` storage."""
    counter = itertools.count()

    def make(max_capacity=None, eviction="task", **kw):
        if kind == "memory":
            return InMemoryStorage(max_capacity, eviction=eviction, **kw)
        if kind == "sqlite":
            path = tmp_path / f"s{next(counter)}.sqlite"
            return SqliteStorage(path, max_capacity, eviction=eviction, **kw)
        return MultiProcMemoryStorage(
            manager.dict(), manager.list(), manager.Lock(), max_capacity, eviction=eviction, **kw
        )

    make.kind = kind
    return make


@pytest.fixture(params=["memory", "sqlite", "multiproc"])
def make_storage(request, tmp_path, manager):
    """A factory ``make_storage(max_capacity=None, eviction="task")`` for each storage kind."""
    return _factory(request.param, tmp_path, manager)


@pytest.fixture(params=["sqlite", "multiproc"])
def make_json_storage(request, tmp_path, manager):
    """The same factory for the storages that keep rows as JSON (and accept ``decoders=``)."""
    return _factory(request.param, tmp_path, manager)
