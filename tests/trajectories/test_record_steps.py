"""A rollout's own output loads and exports with the defaults (issue 23, item 1).

The collector ends a blocked task with a step no model answered (the anti-bot
wall: a screenshot, an empty response, reward 0 flagged ``is_blocked``). Such a
*record step* is stored, counts for its trajectory's outcome, and is never a
training sample: no ``raw_prompt`` is needed to open the storage, and
``filter_successful_only=True`` and ``export --all`` leave it out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli_runner import run_cli
from replaystore.rollouts.outcomes import blocked_step as _blocked_step
from replaystore.rollouts.outcomes import invalid_url_step as _invalid_url_step
from replaystore.trajectories import TrajectoryBuffer
from replaystore.trajectories.components import Observation
from replaystore.trajectories.storage import TrajectoryStorage


def _wall(factory: Any, task: Any) -> dict[str, Any]:
    shot = factory.screenshot(999)
    observation = Observation(task, str(shot), "[1] heading 'Checking your browser'", {})
    return _blocked_step(observation, "HTTP 403")


@pytest.fixture
def suite_like(trajectory_factory: Any, tmp_path: Path) -> Path:
    """One iteration as a suite run stores it: solved, failed, blocked at once,
    blocked after a step, and a navigation error."""
    f = trajectory_factory
    solved = f.trajectory(2, success=True)
    failed = f.trajectory(2, success=False)
    wall_task = f.task(website="http://botwall.localhost:18432/")
    blocked_at_once = [_wall(f, wall_task)]
    later_task = f.task()
    blocked_later = [f.step(later_task, f.screenshot(7)), _wall(f, later_task)]
    nav_error = [_invalid_url_step(f.task(), "net::ERR_NAME_NOT_RESOLVED")]
    root = tmp_path / "run" / "storage"
    TrajectoryStorage(root).save_iteration(
        1, [solved, failed, blocked_at_once, blocked_later, nav_error], rank=0
    )
    return root


def test_a_blocked_step_is_a_record_step_and_a_model_step_is_not(trajectory_factory) -> None:
    from replaystore.trajectories.index import is_record_step

    f = trajectory_factory
    task = f.task()
    assert is_record_step(_wall(f, task))
    assert is_record_step(_invalid_url_step(task, "boom"))
    assert not is_record_step(f.step(task, f.screenshot(1)))


def test_the_rollout_output_opens_without_an_agent(suite_like: Path) -> None:
    buffer = TrajectoryBuffer.from_storage(suite_like)
    # 2 + 2 model steps + 1 model step before the late wall; walls are no samples
    assert len(buffer) == 5
    assert buffer.stats.trajectories == 4  # the navigation error is a dummy
    assert buffer.stats.successful_trajectories == 1
    assert all(sample["action"] for sample in buffer)


def test_filter_successful_only_keeps_only_the_solved_task(suite_like: Path) -> None:
    buffer = TrajectoryBuffer.from_storage(suite_like, filter_successful_only=True)
    assert len(buffer) == buffer.num_eligible == 2
    assert buffer.stats.kept_samples == 5  # the wall steps are not counted as kept


def test_an_in_memory_buffer_agrees_with_the_storage(suite_like: Path) -> None:
    trajectories = TrajectoryStorage(suite_like).load_all()
    memory = TrajectoryBuffer(trajectories)
    stored = TrajectoryBuffer.from_storage(suite_like)
    assert len(memory) == len(stored) == 5
    assert [s["action"] for s in memory] == [s["action"] for s in stored]


def test_merging_rank_files_keeps_the_record_steps_out(suite_like: Path) -> None:
    TrajectoryStorage(suite_like).merge_ranks(1)
    assert len(TrajectoryBuffer.from_storage(suite_like)) == 5


def test_export_all_of_a_rollout_output_exits_0(suite_like: Path, tmp_path: Path) -> None:
    out = tmp_path / "export"
    proc = run_cli("export", suite_like, "--all", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert "from 5 of 5 samples" in proc.stdout, proc.stdout


def test_a_multi_line_error_reads_as_one_sentence() -> None:
    from replaystore.cli._common import one_line

    text = one_line(ValueError("2 of 3 samples failed; nothing was written:\n  sample 1: x"))
    assert text == "2 of 3 samples failed; nothing was written: sample 1: x"
