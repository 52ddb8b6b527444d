"""``replaystore rollout`` on the local suite with the scripted policy, in a real browser."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaystore.cli import main
from replaystore.pipeline.task_history import TaskHistory
from replaystore.trajectories.storage import TrajectoryStorage


def test_rollout_command_stores_an_iteration_and_the_history(
    chromium: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main(["rollout", "--out", str(out), "--workers", "2", "--max-tasks", "2"]) == 0
    printed = capsys.readouterr().out
    assert "iteration 1 rank 0: 2 tasks" in printed
    stored = TrajectoryStorage(out / "storage").load_all()
    assert len(stored) == 2
    assert len(TaskHistory.load(out / "task_history.json")) == 2


def test_rollout_command_needs_a_server_for_the_openai_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rollout", "--out", str(tmp_path), "--policy", "openai"]) == 2
    assert "--base-url and --model" in capsys.readouterr().err
