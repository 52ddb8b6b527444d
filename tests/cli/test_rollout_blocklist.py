"""``replaystore rollout`` arguments and ``replaystore blocklist`` (issue 23, items 3 and 7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_runner import run_cli
from replaystore.pipeline.blocklist import Blocklist

from .conftest import assert_one_line_error


@pytest.mark.parametrize(
    ("flag", "value"), [("--workers", "0"), ("--max-tasks", "-14"), ("--max-tasks", "0")]
)
def test_a_count_below_one_is_one_error_line(flag: str, value: str, tmp_path: Path) -> None:
    proc = run_cli("rollout", flag, value, "--out", tmp_path / "run")
    assert_one_line_error(proc, "rollout", flag, ">= 1")


def test_an_empty_task_file_is_one_error_line_naming_it(tmp_path: Path) -> None:
    pytest.importorskip("playwright")
    empty = tmp_path / "tasks.jsonl"
    empty.write_text("")
    proc = run_cli("rollout", "--tasks", empty, "--out", tmp_path / "run")
    assert_one_line_error(proc, "rollout", str(empty), "no task")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    blocklist = Blocklist(tmp_path / "blocklist.jsonl")
    blocklist.record_blocked_website("http://localhost:18432/forbidden")
    blocklist.record_blocked_website("http://localhost:5000/")
    return tmp_path


def test_blocklist_list_shows_each_site(run_dir: Path) -> None:
    proc = run_cli("blocklist", "list", "--file", run_dir)
    assert proc.returncode == 0, proc.stderr
    assert "http://localhost:18432" in proc.stdout and "http://localhost:5000" in proc.stdout


def test_blocklist_remove_deletes_one_site(run_dir: Path) -> None:
    proc = run_cli(
        "blocklist", "remove", "http://localhost:18432", "--file", run_dir / "blocklist.jsonl"
    )
    assert proc.returncode == 0, proc.stderr
    assert Blocklist(run_dir).get_blocked_sites() == ["http://localhost:5000"]


def test_blocklist_clear_deletes_every_entry(run_dir: Path) -> None:
    assert run_cli("blocklist", "clear", "--file", run_dir).returncode == 0
    assert Blocklist(run_dir).get_blocked_sites() == []


def test_blocklist_of_a_directory_without_one_is_an_error(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("blocklist", "list", "--file", tmp_path), "blocklist")


def test_rollout_names_the_sites_the_blocklist_skipped(tmp_path: Path) -> None:
    from replaystore.cli.rollout import blocklist_skip_line

    line = blocklist_skip_line({"http://localhost:18432": 3}, tmp_path)
    assert line.startswith("skipped 3 tasks on the blocklist: http://localhost:18432 (3)")
    assert f"replaystore blocklist remove SITE --file {tmp_path / 'blocklist.jsonl'}" in line
