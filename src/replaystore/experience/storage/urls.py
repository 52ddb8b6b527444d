"""Open an experience storage by URL: :func:`open_storage`.

URL forms:

* ``postgresql://user:password@host:5432/dbname`` (or ``postgres://``): a
  :class:`~replaystore.experience.storage.postgres.PostgresStorage`. libpq
  parameters go in the query string (``?sslmode=require``, a local server's
  unix socket directory: ``postgresql:///dbname?host=/var/run/postgresql``);
  ``schema=NAME`` picks the PostgreSQL schema of the store (default ``replaystore``).
* ``sqlite:///relative/path.sqlite`` and ``sqlite:////absolute/path.sqlite``
  (SQLAlchemy's convention: the path is what follows ``sqlite:///``): a
  :class:`~replaystore.experience.storage.sqlite.SqliteStorage`.
* a plain path (``runs/exp.sqlite``, a :class:`pathlib.Path`): SQLite as well.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import unquote

from replaystore.errors import ConfigError
from replaystore.experience.decoding import FieldDecoders
from replaystore.experience.rows import DataRow
from replaystore.experience.storage.base import Eviction, Storage, check_count
from replaystore.experience.storage.sqlite import SqliteStorage
from replaystore.redaction import redact

__all__ = ["is_postgres_url", "iter_store", "open_storage", "sqlite_path"]

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_postgres_url(target: str | os.PathLike[str]) -> bool:
    """True for a ``postgresql://`` or ``postgres://`` URL."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))


def sqlite_path(target: str | os.PathLike[str]) -> str | None:
    """The file path of a ``sqlite:///...`` URL or a plain path; ``None`` for other URLs.

    Raises:
        ConfigError: a ``sqlite:`` URL without a path (``sqlite://`` or ``sqlite:///``).
    """
    if not isinstance(target, str):
        return os.fspath(target)
    if target.startswith("sqlite:"):
        if not target.startswith("sqlite:///") or len(target) == len("sqlite:///"):
            raise ConfigError(
                f"bad SQLite URL {target!r}: write sqlite:///relative/path.sqlite "
                "or sqlite:////absolute/path.sqlite"
            )
        return unquote(target[len("sqlite:///") :])
    if _SCHEME.match(target):
        return None
    return target


def open_storage(
    target: str | os.PathLike[str],
    max_capacity: int | None = None,
    *,
    eviction: Eviction = "task",
    decoders: FieldDecoders | Mapping[str, Any] | None = None,
    **options: Any,
) -> Storage:
    """The storage that ``target`` (a URL or a path, see the module doc) names, opened.

    Args:
        target: ``postgresql://...``, ``sqlite:///path`` or a plain file path.
        max_capacity: the most rows kept (``None``: no limit); FIFO as ``eviction`` says.
        eviction: ``"task"`` (default) or ``"row"``.
        decoders: your types back on reads (see :class:`FieldDecoders`).
        **options: passed to the storage's constructor (``timeout=``; for
            PostgreSQL also ``schema=``, ``pool_size=``).

    Example::

        buf = ExperienceBuffer(storage=open_storage("postgresql://rl@db/runs", 1_000_000))

    Raises:
        ConfigError: an unsupported URL scheme (the message lists the supported
            ones), a malformed URL, bad options, or psycopg missing for PostgreSQL.
        StorageError: the store cannot be opened (server unreachable, not a
            replaystore store, a newer layout version).
    """
    if not isinstance(target, str | os.PathLike):
        raise ConfigError(f"a store is a URL or a path, got {type(target).__name__}")
    if is_postgres_url(target):
        from replaystore.experience.storage.postgres import PostgresStorage

        return PostgresStorage(
            str(target), max_capacity, eviction=eviction, decoders=decoders, **options
        )
    path = sqlite_path(target)
    if path is None:
        scheme = _SCHEME.match(str(target)).group(1)  # type: ignore[union-attr]
        raise ConfigError(
            f"unsupported store URL scheme {scheme!r} in {redact(str(target))!r}: use "
            "postgresql://..., sqlite:///path or a plain file path"
        )
    return SqliteStorage(path, max_capacity, eviction=eviction, decoders=decoders, **options)


def iter_store(store: Storage, batch_size: int = 5000) -> Iterator[list[DataRow]]:
    """Every row of ``store`` in insertion order, in lists of up to ``batch_size`` rows.

    PostgreSQL reads through a server-side cursor (one snapshot, memory bounded by
    ``batch_size``); other storages page with ``get_paginated``, so rows written
    meanwhile may be seen or missed: iterate over a store no one is writing to.
    """
    batch_size = check_count(batch_size, "batch_size")
    if batch_size < 1:
        raise ConfigError("batch_size must be >= 1")
    rows_of = getattr(store, "iter_rows", None)
    if callable(rows_of):
        yield from rows_of(batch_size)
        return
    page = 1
    while batch := store.get_paginated(page, batch_size):
        yield batch
        page += 1
