"""The package surface: lazy top-level exports and the pipeline package's names."""

from __future__ import annotations

import subprocess
import sys

import pytest

import replaystore


def test_buffers_are_exported_under_their_short_names() -> None:
    from replaystore import experience, trajectories, transitions

    assert replaystore.TransitionBuffer is transitions.ReplayBuffer
    assert replaystore.ExperienceBuffer is experience.ReplayBuffer
    assert replaystore.TrajectoryBuffer is trajectories.ReplayBuffer


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = replaystore.Nope  # type: ignore[attr-defined]


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, replaystore, replaystore.pipeline; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_pipeline_names_resolve_to_their_modules() -> None:
    import replaystore.pipeline as pipeline
    from replaystore.pipeline import blocklist, task_history, task_sampler

    assert pipeline.Blocklist is blocklist.Blocklist
    assert pipeline.TaskHistory is task_history.TaskHistory
    assert pipeline.TaskSampler is task_sampler.TaskSampler
    assert set(pipeline.__all__) <= set(dir(pipeline))


def test_pipeline_exports_webgym_utils_names() -> None:
    import replaystore.pipeline as pipeline
    from replaystore.pipeline import (
        blocklist,
        blocklist_manager,
        image_utils,
        rollout_sampler,
        task_history_manager,
        trajectory_storage,
    )

    assert set(pipeline.__all__) == {
        "DEFAULT_LEVEL_WEIGHTS",
        "Blocklist",
        "BlocklistManager",
        "RolloutSampler",
        "TaskHistory",
        "TaskHistoryManager",
        "TaskSampler",
        "cleanup_old_iterations",
        "convert_messages_to_path_format",
        "encode_image_to_base64",
        "encode_image_to_file_url",
        "get_next_iteration_number",
        "get_trajectory_stats",
        "load_all_trajectories",
        "load_last_iteration_trajectories",
        "load_tasks",
        "normalize_domain",
        "save_trajectories_incremental",
    }
    assert pipeline.BlocklistManager is blocklist_manager.BlocklistManager
    assert blocklist.BlocklistManager is blocklist_manager.BlocklistManager
    assert pipeline.RolloutSampler is rollout_sampler.RolloutSampler
    assert pipeline.TaskHistoryManager is task_history_manager.TaskHistoryManager
    assert pipeline.encode_image_to_file_url is image_utils.encode_image_to_file_url
    assert pipeline.load_all_trajectories is trajectory_storage.load_all_trajectories
