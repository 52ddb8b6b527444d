"""``replaystore copy SRC DST``: copy an experience store (SQLite, PostgreSQL) into another."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from replaystore.cli._common import Parser, UsageError, int_at_least, progress, store_path
from replaystore.formats.sqlite_experience import is_sqlite_file
from replaystore.redaction import redact

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = (
    "Copy every row of the experience store SRC into DST, in insertion "
    "order, batch by batch, then verify DST's row count. A store is a SQLite file "
    "path, a sqlite:///path URL (sqlite:////abs/path for an absolute path) or a "
    "postgresql://user@host/db[?schema=NAME] URL. DST is created when missing and "
    "must be empty unless --append. Copy a store no one is writing to."
)


def add_arguments(parser: Parser) -> None:
    """The options of ``replaystore copy``."""
    parser.add_argument("src", metavar="SRC", help="store to read")
    parser.add_argument("dst", metavar="DST", help="store to write")
    parser.add_argument(
        "--append", action="store_true", help="add to a DST that already holds rows"
    )
    parser.add_argument(
        "--batch-size",
        type=int_at_least(1),
        default=5000,
        help="rows per transaction in DST (default: %(default)s)",
    )


def _open_store(target: str, role: str) -> Any:
    from replaystore.experience.storage.urls import is_postgres_url, open_storage

    if not is_postgres_url(target):
        path = store_path(target)
        if role == "source" and not path.is_file():
            raise UsageError(f"source store {path} does not exist")
        if path.is_file() and not is_sqlite_file(path):
            raise UsageError(f"{role} {path} is not a SQLite experience store")
        target = str(path)
    return open_storage(target)


def run(args: argparse.Namespace) -> int:
    """Copy every row of SRC into DST, verify DST's row count; returns the exit status."""
    from replaystore.experience.storage.urls import iter_store

    if args.src == args.dst:
        raise UsageError("SRC and DST are the same store")
    src = _open_store(args.src, "source")
    dst = _open_store(args.dst, "destination")
    before = dst.size()
    if before and not args.append:
        raise UsageError(
            f"destination {redact(args.dst)} already holds {before} rows: pass --append to "
            "add to it"
        )
    total = src.size()
    copied = 0
    start = time.perf_counter()
    with progress(None, total, "copying", unit="row") as bar:
        for batch in iter_store(src, args.batch_size):
            dst.add_batch(batch)
            copied += len(batch)
            bar.update(len(batch))
    after = dst.size()
    if copied != total or after != before + copied:
        print(
            f"replaystore copy: error: row count mismatch: source had {total} rows, "
            f"{copied} were read, destination went from {before} to {after} "
            "(was a store written to during the copy?)",
            file=sys.stderr,
        )
        return 1
    secs = time.perf_counter() - start
    print(
        f"copied {copied} rows from {redact(args.src)} to {redact(args.dst)} in {secs:.1f} s; "
        f"verified: destination holds {after} rows"
    )
    for store in (src, dst):
        store.close()
    return 0
