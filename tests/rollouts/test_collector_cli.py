"""``replaystore rollout`` on the local suite in a real browser: the scripted policy, and an
OpenAI-protocol server (tests/rollouts/fake_openai.py) that is text-only or failing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replaystore.cli import main
from replaystore.pipeline.task_history import TaskHistory
from replaystore.trajectories.storage import TrajectoryStorage

from .fake_openai import FakeOpenAIServer

#: Every task ends at its first step.
ANSWER = '<think>I know it.</think>\nAction: answer("42")'


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


# ------------------------------------------------------------------ model server failures


def _openai_rollout(out: Path, server: FakeOpenAIServer, *extra: str) -> list[str]:
    return [
        "rollout", "--out", str(out), "--workers", "2", "--max-tasks", "3",
        "--policy", "openai", "--base-url", server.base_url, "--model", "tiny", *extra,
    ]  # fmt: skip


def test_text_only_model_sent_screenshots_is_one_line_naming_the_fix_and_exit_2(
    chromium: str | None, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with FakeOpenAIServer(reply=ANSWER) as server:
        server.text_only = True
        argv = _openai_rollout(out, server)
        # A child process: its stderr is exactly what a user sees (logging included).
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from replaystore.cli import main; "
             "sys.exit(main(sys.argv[1:]))", *argv],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "replaystore rollout: error: the model server serves a text-only model (model server "
        f"{server.base_url}/chat/completions refused the request with HTTP 400: tiny is not a "
        "multimodal model): run with --observation text"
    ]
    assert done.stdout == ""
    # stopped at the first refusal: the other tasks never reached the server, nothing stored
    assert len(server.requests) <= 2
    assert TrajectoryStorage(out / "storage").files() == []


def test_text_observation_rolls_out_with_a_text_only_model(
    chromium: str | None, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    with FakeOpenAIServer(reply=ANSWER) as server:
        server.text_only = True
        assert main(_openai_rollout(out, server, "--observation", "text")) == 0
    assert len(server.requests) == 3
    assert all(isinstance(m["content"], str) for r in server.requests for m in r["messages"])
    stored = TrajectoryStorage(out / "storage").load_all()
    assert len(stored) == 3
    sent = [r["messages"] for r in server.requests]
    for trajectory in stored:
        assert trajectory[-1]["trajectory_metadata"]["observation"] == "text"
        assert trajectory[0]["observation"].image_path  # screenshots are still taken
        assert json.loads(trajectory[0]["response"].raw_prompt) in sent  # what the model got


def test_every_task_failing_on_the_model_server_is_a_failed_run_with_one_line(
    chromium: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    with FakeOpenAIServer(reply=ANSWER) as server:
        server.fail_next(404, 404, 404, message="The model `tiny` does not exist.")
        assert main(_openai_rollout(out, server)) == 1
    err = capsys.readouterr().err.splitlines()
    (line,) = [e for e in err if e.startswith("replaystore rollout:")]
    assert line.startswith("replaystore rollout: error: all 3 tasks failed on the model server: ")
    assert "HTTP 404: The model `tiny` does not exist." in line
    assert "Traceback" not in "\n".join(err)
    trajectories = TrajectoryStorage(out / "storage").load_all()
    assert {t[-1]["trajectory_metadata"]["status"] for t in trajectories} == {"error"}
