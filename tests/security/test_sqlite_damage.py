"""Issue 16, item 3: a SQLite store with corrupted pages raises StorageError naming the file."""

from __future__ import annotations

import os
import sqlite3

import numpy as np
import pytest

from replaystore.errors import StorageError
from replaystore.experience import DataRow, Experience, ExpMeta
from replaystore.experience.storage.sqlite import SqliteStorage


def make_row(task_id: str, step: int, state: dict) -> DataRow:
    meta = ExpMeta(
        task_id=task_id, task_name="t", agent_id="a", step=step, execute_time=float(step)
    )
    return DataRow(meta, Experience(state=state, actions=[{"a": step}]))


def _filled_store(path) -> None:
    storage = SqliteStorage(path)
    storage.add_batch(
        [make_row(f"task_{i % 40}", i, state={"text": "x" * 300}) for i in range(400)]
    )
    assert storage.size() == 400
    storage.close()  # the last connection checkpoints the WAL into the main file
    assert not os.path.exists(f"{path}-wal") or os.path.getsize(f"{path}-wal") == 0


def _rows_leaf_pages(path) -> tuple[int, list[int]]:
    """Page size and the leaf pages of the ``rows`` table (children of its interior root)."""
    with sqlite3.connect(path) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'rows'").fetchone()[0]
    conn.close()
    with open(path, "rb") as handle:
        handle.seek((root - 1) * page_size)
        page = handle.read(page_size)
    assert page[0] == 0x05, "the rows table should span several pages (interior root)"
    cells = int.from_bytes(page[3:5], "big")
    pointers = [int.from_bytes(page[12 + 2 * i : 14 + 2 * i], "big") for i in range(cells)]
    children = [int.from_bytes(page[p : p + 4], "big") for p in pointers]
    children.append(int.from_bytes(page[8:12], "big"))
    return page_size, children


def _corrupt_rows_pages(path) -> None:
    """Overwrite every other leaf page of the rows table with seeded random bytes."""
    page_size, leaves = _rows_leaf_pages(path)
    noise = np.random.default_rng(16).integers(0, 256, page_size, dtype=np.uint8).tobytes()
    with open(path, "r+b") as handle:
        for page in leaves[::2]:
            handle.seek((page - 1) * page_size)
            handle.write(noise)


def test_corrupted_pages_raise_storage_error_naming_file_and_integrity_check(tmp_path):
    path = tmp_path / "store.db"
    _filled_store(path)
    _corrupt_rows_pages(path)  # the schema and indexes stay readable: open succeeds
    storage = SqliteStorage(path)
    with pytest.raises(StorageError, match=r"store\.db.*PRAGMA integrity_check") as info:
        storage.get_all()
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    with pytest.raises(StorageError, match="integrity_check"):
        storage.get_by_task_id("task_3")
    # The connection is still usable for the check the message suggests.
    assert storage.integrity_check() != "ok"
    storage.close()


def test_a_file_that_is_not_sqlite_is_named_at_open(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(np.random.default_rng(1).integers(0, 256, 8192, dtype=np.uint8).tobytes())
    with pytest.raises(StorageError, match=r"junk\.db.*integrity_check"):
        SqliteStorage(path).size()
