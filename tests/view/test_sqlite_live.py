"""The viewer reads a SQLite experience store read-only but never ``immutable``: rows
another process commits while it runs show on the next page load (issue 24)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore.errors import StorageError

starlette = pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from replaystore.view import build_app  # noqa: E402

_WRITER = """
import sys
from replaystore.experience import DataRow, Experience, ExpMeta, SqliteStorage
storage = SqliteStorage(sys.argv[1])
storage.add_batch([
    DataRow(ExpMeta(f"late-{i}", "web_nav", "writer", i, 1.8e9 + i), Experience(state={"i": i}))
    for i in range(int(sys.argv[2]))
])
storage.close()
"""


def _write_rows_from_another_process(path: Path, n: int) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(path), str(n)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _match_count(client: TestClient) -> int:
    html = client.get("/rows").text
    found = re.search(r'id="match-count">(\d+) rows match', html)
    assert found, html[:500]
    return int(found.group(1))


def test_rows_another_process_writes_show_on_the_next_page_load(tmp_path: Path) -> None:
    path = tmp_path / "experience.sqlite"
    _write_rows_from_another_process(path, 3)
    assert not Path(f"{path}-wal").exists()  # no writer active when the viewer starts
    client = TestClient(build_app("sqlite_experience_store", path), raise_server_exceptions=False)
    assert _match_count(client) == 3
    _write_rows_from_another_process(path, 4)  # 4 more rows, committed by another process
    assert _match_count(client) == 7
    tasks = client.get("/").text
    assert "late-3" in tasks


def test_a_wal_store_whose_shared_memory_file_cannot_be_made_is_a_clear_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "experience.sqlite"
    _write_rows_from_another_process(path, 1)
    # What a directory this user cannot write does (root may write anywhere): SQLite
    # cannot create the -shm file a WAL reader needs.
    Path(f"{path}-shm").symlink_to(tmp_path / "no-such-directory" / "shm")
    with pytest.raises(StorageError, match=r"WAL mode.*experience\.sqlite-shm.*writable"):
        build_app("sqlite_experience_store", path)
