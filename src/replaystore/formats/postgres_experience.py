"""A PostgreSQL experience store read without writing: its URL, its layout version, its summary.

:class:`~replaystore.experience.storage.postgres.PostgresStorage` writes the store: the
tables ``rows``, ``tasks``, ``stats`` and ``replaystore_version`` in one schema (default
:data:`DEFAULT_SCHEMA`). ``replaystore stats`` and the viewer read it through
:func:`read_summary`, which never creates a table (opening a ``PostgresStorage`` would),
and the writer takes the read side's names from here: the URL's ``schema=`` parameter
(:func:`split_schema`), the schema name rule (:data:`SCHEMA_NAME`), the layout version
(:data:`SCHEMA_VERSION`, :func:`read_layout_version`, :func:`check_layout_version`) and
driver errors without passwords (:func:`error_text`).

Needs psycopg 3 (the ``postgres`` extra) only when a store is read.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from replaystore.errors import ConfigError, StorageError
from replaystore.formats.experience_summary import summarise_rows
from replaystore.redaction import redact, url_passwords

try:  # optional dependency: the "postgres" extra
    import psycopg
    from psycopg import sql
except ImportError:  # pragma: no cover - exercised only without the extra
    psycopg = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_NAME",
    "SCHEMA_VERSION",
    "check_layout_version",
    "error_text",
    "read_layout_version",
    "read_summary",
    "split_schema",
]

SCHEMA_VERSION = 1
"""Version of the table layout this code reads and writes."""

#: The schema of a store whose URL names none.
DEFAULT_SCHEMA = "replaystore"

#: A schema name replaystore accepts: letters, digits and ``_``, at most 63, not
#: starting with a digit (so it is quoted safely and never truncated by PostgreSQL).
SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def split_schema(url: str) -> tuple[str, str | None]:
    """``(conninfo, schema)``: the ``schema=`` query parameter taken out of a ``postgresql://`` URL.

    Every other parameter stays for libpq (``host=/path/to/socket/dir``,
    ``sslmode=...``, ``connect_timeout=...``).
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = [v for k, v in query if k == "schema"]
    rest = [(k, v) for k, v in query if k != "schema"]
    return urlunsplit(parts._replace(query=urlencode(rest))), (schema[-1] if schema else None)


def error_text(exc: BaseException, conninfo: str) -> str:
    """A driver error's text without the password of ``conninfo`` (libpq may quote it)."""
    return redact(str(exc), url_passwords([conninfo]))


def read_layout_version(conn: Any, quoted_schema: str) -> int | None:
    """The layout version the store in ``quoted_schema`` (an SQL identifier, quoted)
    records in its ``replaystore_version`` table, or None when it has no experience
    entry. ``conn``: a psycopg connection, rows as tuples."""
    row = conn.execute(
        f"SELECT version FROM {quoted_schema}.replaystore_version WHERE component = 'experience'"
    ).fetchone()
    return None if row is None else row[0]


def check_layout_version(version: int | None, schema: str) -> None:
    """Refuse a store whose layout (:func:`read_layout_version`) this code does not read.

    Raises:
        StorageError: no experience entry, a newer layout or an unknown one.
    """
    if version is None:
        raise StorageError(
            f"schema {schema!r} has a replaystore_version table without an "
            "'experience' entry: it is not an experience store"
        )
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"store {schema!r} has layout version {version}, newer than this "
            f"replaystore reads ({SCHEMA_VERSION}): upgrade replaystore"
        )
    if version != SCHEMA_VERSION:
        raise StorageError(
            f"store {schema!r} has unknown layout version {version} "
            f"(this replaystore reads version {SCHEMA_VERSION})"
        )


def read_summary(url: str, schema: str | None = None) -> dict[str, Any]:
    """A summary of the store at ``url`` (rows, tasks, agents, ranges, bytes), read-only.

    The keys of :func:`replaystore.formats.sqlite_experience.read_summary` less the path,
    plus ``url`` (its password redacted), ``schema``, ``version`` (the layout version, None
    when not recorded) and ``size_bytes`` (the schema's tables and sequences).

    Unlike opening a :class:`~replaystore.experience.storage.postgres.PostgresStorage`,
    this never creates tables: one read-only transaction.

    Raises:
        StorageError: the server cannot be reached, or there is no replaystore
            experience store in the schema.
        ConfigError: psycopg missing, or a bad schema name.
    """
    if psycopg is None:
        raise ConfigError(
            "PostgresStorage needs psycopg 3 and psycopg-pool: pip install 'replaystore[postgres]'"
        )
    conninfo, url_schema = split_schema(url)
    schema = schema or url_schema or DEFAULT_SCHEMA
    if not SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(f"bad schema name {schema!r}")
    s = sql.Identifier(schema).as_string(None)
    try:
        conn: Any = psycopg.connect(conninfo, connect_timeout=10)  # rows are tuples
    except psycopg.Error as exc:
        raise StorageError(
            f"cannot connect to PostgreSQL at {redact(conninfo)}: {error_text(exc, conninfo)}"
        ) from exc
    try:
        conn.read_only = True
        with conn.transaction():
            exists = conn.execute(
                "SELECT to_regclass(%s) IS NOT NULL", (f"{s}.replaystore_version",)
            ).fetchone()[0]
            if not exists:
                raise StorageError(
                    f"no replaystore experience store in schema {schema!r} at {redact(conninfo)}"
                )
            version = read_layout_version(conn, s)
            counts = summarise_rows(conn, f"{s}.rows")
            size = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'S')",
                (schema,),
            ).fetchone()[0]
    except psycopg.Error as exc:
        raise StorageError(f"cannot read store {schema!r}: {error_text(exc, conninfo)}") from exc
    finally:
        conn.close()

    return {
        "url": redact(conninfo),
        "schema": schema,
        "version": version,
        "size_bytes": int(size),
        **counts,
    }
