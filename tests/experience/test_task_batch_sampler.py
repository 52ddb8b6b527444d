"""The experience task sampler is ``TaskBatchSampler``; ``TaskSampler`` is the rollout one.

``replaystore.pipeline.TaskSampler`` picks the tasks the next rollout runs;
``replaystore.experience.TaskBatchSampler`` picks stored tasks for a training batch.
The old experience name still resolves, with a DeprecationWarning, except in
``replaystore.experience.base``: that module is AWorld's ``aworld.replay_buffer.base``
under our package, where ``TaskSampler`` is AWorld's own name (no warning).
"""

from __future__ import annotations

import warnings

import pytest

import replaystore.experience as experience
import replaystore.experience.sampling as sampling
from replaystore.experience import RandomTaskSample, TaskBatchSampler


def test_the_experience_class_is_task_batch_sampler() -> None:
    assert TaskBatchSampler.__name__ == "TaskBatchSampler"
    assert sampling.TaskBatchSampler is TaskBatchSampler
    assert issubclass(RandomTaskSample, TaskBatchSampler)
    assert "TaskBatchSampler" in experience.__all__
    assert "TaskSampler" not in experience.__all__
    assert "TaskSampler" not in sampling.__all__


@pytest.mark.parametrize("module", [experience, sampling], ids=lambda m: m.__name__)
def test_the_old_name_warns_and_gives_the_class(module) -> None:
    with pytest.warns(DeprecationWarning, match=r"TaskBatchSampler.*experience\.base"):
        old = module.TaskSampler
    assert old is TaskBatchSampler


def test_from_import_of_the_old_name_warns() -> None:
    with pytest.warns(DeprecationWarning, match="TaskBatchSampler"):
        from replaystore.experience import TaskSampler  # noqa: F401


def test_aworlds_base_module_keeps_its_name_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from replaystore.experience.base import TaskSampler

        class LatestTasks(TaskSampler):  # AWorld's way to write a task policy
            def sample_task_ids(self, storage, batch_size, query_condition=None, *, rng=None):
                return []

    assert TaskSampler is TaskBatchSampler
    assert isinstance(LatestTasks(seed=0), TaskBatchSampler)


def test_the_rollout_task_sampler_is_another_class() -> None:
    from replaystore.pipeline import TaskSampler

    assert TaskSampler is not TaskBatchSampler
    assert TaskSampler.__name__ == "TaskSampler"
