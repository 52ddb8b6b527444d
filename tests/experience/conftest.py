from __future__ import annotations

import itertools
import multiprocessing
import uuid
from collections.abc import Iterator

import pytest

from postgres_server import postgres_url_fixture
from replaystore.experience import InMemoryStorage, MultiProcMemoryStorage, SqliteStorage

postgres_url = pytest.fixture(scope="session")(postgres_url_fixture)


@pytest.fixture(scope="session")
def manager() -> Iterator[multiprocessing.managers.SyncManager]:
    with multiprocessing.Manager() as m:
        yield m


def _factory(kind, tmp_path, manager, request):
    """``make(max_capacity=None, eviction="task", **kw)`` building a ``kind`` storage."""
    counter = itertools.count()

    def make(max_capacity=None, eviction="task", **kw):
        if kind == "postgres":
            return request.getfixturevalue("make_postgres")(max_capacity, eviction=eviction, **kw)
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


@pytest.fixture
def make_postgres(postgres_url):
    """``make(max_capacity=None, **kw)``: a PostgresStorage in a fresh schema; closed after."""
    from replaystore.experience import PostgresStorage

    made = []

    def make(max_capacity=None, **kw):
        kw.setdefault("schema", f"t_{uuid.uuid4().hex[:16]}")
        store = PostgresStorage(postgres_url, max_capacity, **kw)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture(params=["memory", "sqlite", "multiproc", "postgres"])
def make_storage(request, tmp_path, manager):
    """A factory ``make_storage(max_capacity=None, eviction="task")`` for each storage kind."""
    return _factory(request.param, tmp_path, manager, request)


@pytest.fixture(params=["sqlite", "multiproc", "postgres"])
def make_json_storage(request, tmp_path, manager):
    """The same factory for the storages that keep rows as JSON (and accept ``decoders=``)."""
    return _factory(request.param, tmp_path, manager, request)
