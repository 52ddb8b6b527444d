"""The argument-validation family: one exception type and wording at every boundary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import (
    ArgumentError,
    ArgumentTypeError,
    ConfigError,
    ReplayStoreError,
    check_choice,
    check_int,
    check_number,
)


def test_argument_errors_are_caught_as_value_errors_and_as_the_family() -> None:
    assert issubclass(ArgumentError, ReplayStoreError) and issubclass(ArgumentError, ValueError)
    assert issubclass(ArgumentTypeError, ArgumentError) and issubclass(ArgumentTypeError, TypeError)
    assert issubclass(ConfigError, ArgumentError)


@pytest.mark.parametrize("value", [3, np.int64(3), np.uint8(3), 3.0, np.float32(3.0)])
def test_check_int_accepts_integral_numbers(value: object) -> None:
    result = check_int(value, "batch_size", minimum=1)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize(
    ("value", "minimum", "error", "match"),
    [
        (0, 1, ArgumentError, "batch_size must be a positive integer, got 0"),
        (-2, 0, ArgumentError, "batch_size must be an integer >= 0, got -2"),
        (1, 2, ArgumentError, "batch_size must be an integer >= 2, got 1"),
        (2.5, None, ArgumentError, "batch_size must be an integer, got 2.5"),
        (float("nan"), 1, ArgumentError, "got nan"),
        (float("inf"), 1, ArgumentError, "got inf"),
        (True, 1, ArgumentTypeError, "got True"),
        ("3", 1, ArgumentTypeError, "got '3'"),
        (None, 1, ArgumentTypeError, "got None"),
    ],
)
def test_check_int_names_the_argument_and_the_rule(
    value: object, minimum: int | None, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        check_int(value, "batch_size", minimum=minimum)


def test_check_number_bounds() -> None:
    assert check_number(0, "alpha", minimum=0) == 0.0
    assert check_number(np.float32(0.5), "eps", minimum=0, strict=True) == 0.5
    with pytest.raises(ArgumentError, match=r"eps must be finite and > 0, got 0"):
        check_number(0, "eps", minimum=0, strict=True)
    with pytest.raises(ArgumentError, match=r"alpha must be finite and >= 0, got -1"):
        check_number(-1, "alpha", minimum=0)
    with pytest.raises(ArgumentError, match="beta must be finite"):
        check_number(float("nan"), "beta")
    with pytest.raises(ArgumentTypeError, match="beta must be a finite number"):
        check_number("0.4", "beta")


def test_check_choice_lists_the_accepted_names() -> None:
    assert check_choice("uniform", "sampler", ("uniform", "prioritized")) == "uniform"
    with pytest.raises(ArgumentError, match="sampler must be one of 'uniform', 'prioritized'"):
        check_choice("lifo", "sampler", ("uniform", "prioritized"))
    with pytest.raises(ArgumentError, match="sampler must be one of"):
        check_choice(["uniform"], "sampler", frozenset({"uniform"}))  # unhashable


def _trajectory_and_pipeline_calls(tmp_path: Path) -> list[tuple[str, Callable[[], object]]]:
    from replaystore.pipeline import TaskSampler
    from replaystore.trajectories import ReplayBuffer, TrajectoryStorage
    from replaystore.trajectories.context import ConversationBuilder
    from replaystore.trajectories.export import export_llamafactory
    from replaystore.trajectories.screenshots import ScreenshotFingerprinter
    from replaystore.trajectories.webgym_import import ImportLimits

    storage = TrajectoryStorage(tmp_path / "storage")
    return [
        ("capacity", lambda: ReplayBuffer([], capacity=0)),
        ("success_threshold", lambda: ReplayBuffer([], success_threshold=float("nan"))),
        ("num_samples", lambda: ReplayBuffer([]).get_training_samples(-1)),
        ("world_size", lambda: ReplayBuffer([]).shard(0, 0)),
        ("history_window", lambda: ConversationBuilder(history_window=-1)),
        ("val_ratio", lambda: export_llamafactory([], tmp_path / "out", val_ratio=1.5)),
        ("max_entries", lambda: ScreenshotFingerprinter(max_entries=0)),
        ("iteration", lambda: storage.save_iteration(0, [])),
        ("keep_last_n", lambda: storage.cleanup_old_iterations(keep_last_n=-1)),
        ("ImportLimits", lambda: ImportLimits(max_expansion=0.5)),
        ("world_size", lambda: TaskSampler([], seed=0).sample_train(1, world_size=0)),
    ]


def test_trajectory_and_pipeline_arguments_raise_the_family(tmp_path: Path) -> None:
    """The same family past the transitions package: every argument check of the
    trajectory buffer, prompts, export, screenshots, storage, importer and task sampler."""
    for name, call in _trajectory_and_pipeline_calls(tmp_path):
        with pytest.raises(ArgumentError, match=name):
            call()
