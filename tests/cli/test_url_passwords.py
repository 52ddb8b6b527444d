"""A database password in a store URL never reaches a person or a file.

Every command that takes a URL runs on its success and failure paths; all it
printed, logged and wrote is searched for the password (masked as ``***``).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from cli_runner import run_cli, run_cli_subprocess
from postgres_server import postgres_url_fixture

PASSWORD = "Sup3rSecretPw"
UNREACHABLE = f"postgresql://someone:{PASSWORD}@127.0.0.1:1/runs?connect_timeout=1&schema=s"

postgres_url = pytest.fixture(scope="session")(postgres_url_fixture)


@pytest.fixture
def pg_url(postgres_url: str) -> str:
    """The test server's URL with a password (the server trusts, so any works) and a
    fresh schema."""
    scheme, rest = postgres_url.split("://", 1)
    user, rest = rest.split("@", 1)
    return f"{scheme}://{user}:{PASSWORD}@{rest}&schema=t_{uuid.uuid4().hex[:12]}"


def _assert_no_password(*texts: str, files: Path | None = None) -> None:
    for text in texts:
        assert PASSWORD not in text, text
    for path in sorted(files.rglob("*")) if files is not None else []:
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path


@pytest.fixture(autouse=True)
def _all_log_records(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)


def test_copy_masks_the_password_on_success_and_failure(
    sqlite_store: Path, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    to_pg = run_cli("copy", sqlite_store, pg_url)
    assert to_pg.returncode == 0, to_pg.stderr
    assert ":***@" in to_pg.stdout
    back = run_cli("copy", pg_url, f"sqlite:///{tmp_path / 'x.sqlite'}")
    assert back.returncode == 0, back.stderr
    assert ":***@" in back.stdout
    again = run_cli("copy", sqlite_store, pg_url)  # already holds rows
    assert again.returncode == 2 and ":***@" in again.stderr
    down = run_cli("copy", UNREACHABLE, tmp_path / "y.sqlite")
    assert down.returncode == 2
    foreign = run_cli("copy", f"mysql://u:{PASSWORD}@db/runs", tmp_path / "z.sqlite")
    assert foreign.returncode == 2
    runs = (to_pg, back, again, down, foreign)
    _assert_no_password(*(r.stdout + r.stderr for r in runs), caplog.text, files=tmp_path)


def test_stats_masks_the_password_on_success_and_failure(
    pg_url: str, sqlite_store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert run_cli("copy", sqlite_store, pg_url).returncode == 0
    text, as_json = run_cli("stats", pg_url), run_cli("stats", pg_url, "--json")
    assert text.returncode == 0 and as_json.returncode == 0
    down = run_cli("stats", UNREACHABLE)
    assert down.returncode == 2 and "cannot connect" in down.stderr
    runs = (text, as_json, down)
    _assert_no_password(*(r.stdout + r.stderr for r in runs), caplog.text)


def test_export_masks_the_password_of_a_url_it_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = run_cli("export", UNREACHABLE, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "is an experience store" in proc.stderr
    _assert_no_password(proc.stdout, proc.stderr, caplog.text, files=tmp_path)


def test_usage_errors_mask_the_password() -> None:
    for argv in (
        ["copy", "a.sqlite", "b.sqlite", UNREACHABLE],  # a stray word
        [UNREACHABLE],  # taken for a command
        ["stats", f"mysql://u:{PASSWORD}@db/runs"],  # an unsupported scheme
    ):
        proc = run_cli(*argv)
        assert proc.returncode == 2, argv
        assert "***" in proc.stderr, proc.stderr
        _assert_no_password(proc.stdout, proc.stderr)


def test_log_records_of_a_failing_copy_mask_the_password(tmp_path: Path) -> None:
    proc = run_cli_subprocess("-v", "copy", UNREACHABLE, tmp_path / "y.sqlite")
    assert proc.returncode == 2
    _assert_no_password(proc.stdout, proc.stderr, files=tmp_path)


def test_view_masks_the_password_in_its_messages_and_pages(
    pg_url: str, sqlite_store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("starlette")
    assert run_cli("copy", sqlite_store, pg_url).returncode == 0
    down = run_cli("view", UNREACHABLE)
    assert down.returncode == 2
    proc = subprocess.Popen(
        [sys.executable, "-m", "replaystore.cli", "view", pg_url, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    pages = []
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        url = second.split("serving on ", 1)[1].split()[0]
        for path in ("", "rows", "rows?field=task_id&op=eq&value=x", "row/nope"):
            try:
                with urllib.request.urlopen(url + path, timeout=10) as response:
                    pages.append(response.read().decode())
            except urllib.error.HTTPError as exc:  # the 404 page
                pages.append(exc.read().decode())
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    assert "***" in first
    assert all("PostgreSQL experience store" in page for page in pages)
    _assert_no_password(down.stdout, down.stderr, first, second, out, err, *pages, caplog.text)


def test_experiment_logger_config_masks_the_password(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from replaystore.rollouts.experiment_logger import ExperimentLogger

    config = {"store": UNREACHABLE, "stores": [UNREACHABLE], "nested": {"url": UNREACHABLE}}
    logger = ExperimentLogger("tensorboard", log_dir=tmp_path, config=config)
    logger.close()
    assert "***" in logger.config["store"]
    _assert_no_password(repr(logger.config), files=tmp_path)
