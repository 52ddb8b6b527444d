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
    # WebGym's wrapper knows the native Blocklist, not the other way round (no import cycle)
    assert not hasattr(blocklist, "BlocklistManager")
    assert pipeline.RolloutSampler is rollout_sampler.RolloutSampler
    assert pipeline.TaskHistoryManager is task_history_manager.TaskHistoryManager
    assert pipeline.encode_image_to_file_url is image_utils.encode_image_to_file_url
    assert pipeline.load_all_trajectories is trajectory_storage.load_all_trajectories


def test_package_ships_a_py_typed_marker() -> None:
    # PEP 561: without it, type checkers ignore replaystore's inline annotations.
    from importlib.resources import files

    assert files("replaystore").joinpath("py.typed").is_file()
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads(
        (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    )
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["replaystore"]


@pytest.mark.slow
def test_built_wheel_contains_py_typed_and_the_site_data(tmp_path) -> None:
    import shutil
    import zipfile
    from pathlib import Path

    # Built from a copy: setuptools leaves build/ beside the sources it builds.
    root, copy = Path(__file__).resolve().parents[1], tmp_path / "src-copy"
    copy.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(root / name, copy / name)
    skip = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info")
    shutil.copytree(root / "src", copy / "src", ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         str(copy), "-w", str(tmp_path / "wheels")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("replaystore-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "replaystore/py.typed" in names
    assert "replaystore/rollouts/sites/tasks.jsonl" in names
    assert "replaystore/view/templates/traj_step.html" in names  # the viewer's pages
    assert "replaystore/view/static/view.js" in names
