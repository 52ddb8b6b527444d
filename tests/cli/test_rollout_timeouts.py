"""``replaystore rollout --step-timeout/--request-timeout/--task-timeout/--max-concurrency``
(issue 23, item 4): positive numbers, a request timeout shorter than the step timeout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli

from .conftest import assert_one_line_error


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--step-timeout", "0"),
        ("--request-timeout", "-5"),
        ("--task-timeout", "nan"),
        ("--max-concurrency", "0"),
    ],
)
def test_a_limit_that_is_not_positive_is_one_error_line(
    flag: str, value: str, tmp_path: Path
) -> None:
    proc = run_cli("rollout", flag, value, "--out", tmp_path / "run")
    assert_one_line_error(proc, "rollout", flag)


def test_a_request_timeout_not_below_the_step_timeout_is_one_error_line(tmp_path: Path) -> None:
    proc = run_cli(
        "rollout", "--request-timeout", "60", "--step-timeout", "60", "--out", tmp_path / "run"
    )
    assert_one_line_error(proc, "rollout", "--request-timeout", "--step-timeout")


def test_the_default_request_timeout_must_stay_below_a_shorter_step_timeout(
    tmp_path: Path,
) -> None:
    proc = run_cli("rollout", "--step-timeout", "20", "--out", tmp_path / "run")
    assert_one_line_error(proc, "rollout", "--request-timeout 30", "--step-timeout 20")


def test_the_limits_reach_the_rollout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("playwright")
    from replaystore.rollouts import runner
    from replaystore.rollouts.browser import BrowserUnavailableError

    seen: dict[str, Any] = {}

    async def fake_rollout(*args: Any, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise BrowserUnavailableError("stop here")

    monkeypatch.setattr(runner, "rollout", fake_rollout)
    run_cli(
        "rollout", "--out", tmp_path / "run",
        "--step-timeout", "90", "--request-timeout", "20", "--task-timeout", "600",
        "--max-concurrency", "3",
    )  # fmt: skip
    assert seen["step_timeout_s"] == 90.0
    assert seen["request_timeout_s"] == 20.0
    assert seen["task_timeout_s"] == 600.0
    assert seen["max_concurrency"] == 3
