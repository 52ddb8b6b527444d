"""A Ray rollout's cluster address: one clear line when it cannot be reached (no Ray is
started: the check comes before ``ray.init``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaystore.errors import ConfigError
from replaystore.rollouts.ray_rollout import RayOptions, ray_rollout
from replaystore.trajectories.components import Task
from replaystore.trajectories.storage import TrajectoryStorage

TASKS = [Task("t", "d", "s", "https://example.com/", "easy", None, None, task_id="t0")]


def test_an_unreachable_cluster_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^cannot reach the Ray cluster at 127\.0\.0\.1:1: "):
        ray_rollout(
            TASKS,
            TrajectoryStorage("unused"),
            1,
            spec={},
            options=RayOptions(address="127.0.0.1:1"),
        )


def test_the_rollout_command_says_in_one_line_that_the_cluster_is_unreachable(
    tmp_path: Path,
) -> None:
    from cli_runner import run_cli

    done = run_cli("rollout", "--ray", "127.0.0.1:1", "--out", tmp_path / "run")
    assert done.returncode == 2
    assert done.stderr.startswith("replaystore rollout: error: cannot reach the Ray cluster")
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "flags",
    [["--actors", "2"], ["--browsers-per-actor", "2"], ["--placement", "pack"]],
)
def test_ray_options_without_ray_are_a_usage_error(tmp_path: Path, flags: list[str]) -> None:
    from cli_runner import run_cli

    done = run_cli("rollout", *flags, "--out", tmp_path / "run")
    assert done.returncode == 2
    assert f"{flags[0]} needs --ray ADDRESS" in done.stderr


def test_cdp_and_ray_exclude_each_other(tmp_path: Path) -> None:
    from cli_runner import run_cli

    done = run_cli("rollout", "--ray", "auto", "--cdp", "http://x:9222", "--out", tmp_path)
    assert done.returncode == 2
    assert "--cdp and --ray exclude each other" in done.stderr
