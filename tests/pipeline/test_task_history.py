"""TaskHistory: attempt levels 0-5 from trajectories, weights, persistence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from replaystore.errors import CheckpointError, TrajectoryError
from replaystore.pipeline.task_history import (
    DEFAULT_LEVEL_WEIGHTS,
    TaskHistory,
    level_weight_table,
    task_key,
)
from replaystore.trajectories.components import (
    Action,
    Observation,
    Response,
    Reward,
    Step,
    Task,
    step_to_dict,
)


def make_task(i: int, *, with_id: bool = True, website: str = "site.com") -> Task:
    return Task(
        task_name=f"task {i}",
        domain="shopping",
        subdomain="retail",
        website=website,
        difficulty=1,
        evaluator_reference=None,
        reference_answer=None,
        task_id=str(i) if with_id else None,
    )


def make_step(task: Task, reward: float | None) -> dict:
    return {
        "observation": Observation(task=task, image_path="s.png", ac_tree=None),
        "action": Action(action={"key": "click"}, action_string="click"),
        "response": Response(raw_response="click", answering_tokens=3),
        "reward": Reward(reward=reward, evaluation=None),
    }


def traj(task: Task, reward: float | None, length: int = 2) -> list[dict]:
    """``length`` steps; only the last step's reward decides success."""
    return [make_step(task, 0.0) for _ in range(length - 1)] + [make_step(task, reward)]


FAIL, SOLVE = 0.0, 1.0


def test_never_attempted_task_is_level_0() -> None:
    assert TaskHistory().level(make_task(0)) == 0


def test_each_failure_raises_the_level_by_one_up_to_5() -> None:
    history, task = TaskHistory(), make_task(0)
    seen = []
    for _ in range(7):
        history.update([traj(task, FAIL)])
        seen.append(history.level(task))
    assert seen == [1, 2, 3, 4, 5, 5, 5]
    assert history.attempts(task) == 7


@pytest.mark.parametrize("failures", [0, 1, 2, 3, 4])
def test_a_success_moves_any_level_to_5(failures: int) -> None:
    history, task = TaskHistory(), make_task(0)
    history.update([traj(task, FAIL)] * failures)
    assert history.level(task) == failures
    history.update([traj(task, SOLVE)])
    assert history.level(task) == 5


def test_failures_after_a_success_keep_level_5() -> None:
    history, task = TaskHistory(), make_task(0)
    history.update([traj(task, SOLVE), traj(task, FAIL), traj(task, FAIL)])
    assert history.level(task) == 5


def test_only_the_final_reward_decides_success() -> None:
    history, task = TaskHistory(), make_task(0)
    solved_early = [make_step(task, 1.0), make_step(task, 0.0)]
    history.update([solved_early])
    assert history.level(task) == 1


def test_missing_final_reward_is_a_failure() -> None:
    history, task = TaskHistory(), make_task(0)
    last = make_step(task, None)
    last["reward"] = None
    history.update([traj(task, None), [last]])
    assert history.level(task) == 2


def test_success_threshold_is_configurable() -> None:
    history, task = TaskHistory(success_threshold=0.5), make_task(0)
    history.update([traj(task, 0.7)])
    assert history.level(task) == 5


def test_incremental_updates_equal_one_update() -> None:
    tasks = [make_task(i) for i in range(3)]
    batches = [
        [traj(tasks[0], FAIL), traj(tasks[1], SOLVE)],
        [traj(tasks[0], FAIL), traj(tasks[2], FAIL)],
    ]
    incremental, at_once = TaskHistory(), TaskHistory()
    for batch in batches:
        incremental.update(batch)
    at_once.update(batches[0] + batches[1])
    assert incremental.to_dict() == at_once.to_dict()
    assert list(incremental.levels(tasks)) == [2, 5, 1]


def test_task_without_id_is_identified_by_name_and_website() -> None:
    history = TaskHistory()
    on_a = make_task(0, with_id=False, website="a.com")
    on_b = make_task(0, with_id=False, website="b.com")
    history.update([traj(on_a, FAIL)])
    assert history.level(on_a) == 1
    assert history.level(on_b) == 0
    assert task_key(on_a) == ("name", "task 0", "a.com")


def test_integer_and_string_ids_are_the_same_task() -> None:
    history = TaskHistory()
    history.update([traj(make_task(3), FAIL)])
    assert history.level({"task_id": 3}) == 1


def test_negative_task_id_marks_a_filtered_task_and_is_skipped() -> None:
    history, task = TaskHistory(), make_task(0)
    task.task_id = "-1"
    assert history.update([traj(task, FAIL)]) == 0
    assert len(history) == 0


def test_steps_may_be_step_objects_or_json_dicts() -> None:
    history, task = TaskHistory(), make_task(0)
    as_steps = [Step(**make_step(task, 0.0))]
    as_dicts = [step_to_dict(make_step(task, 0.0))]
    history.update([as_steps, as_dicts, []])
    assert history.level(task) == 2


def test_bad_trajectory_raises_naming_it_and_changes_nothing() -> None:
    history, task = TaskHistory(), make_task(0)
    broken = traj(task, FAIL)
    del broken[-1]["reward"]
    with pytest.raises(TrajectoryError, match=r"trajectory 1 step 1 has no 'reward'"):
        history.update([traj(task, FAIL), broken])
    assert len(history) == 0


def test_non_numeric_reward_raises() -> None:
    history, task = TaskHistory(), make_task(0)
    with pytest.raises(TrajectoryError, match="reward must be a number"):
        history.update([traj(task, "yes")])  # type: ignore[arg-type]


def test_level_distribution_counts_unattempted_tasks_at_level_0() -> None:
    tasks = [make_task(i) for i in range(5)]
    history = TaskHistory()
    history.update([traj(tasks[0], FAIL), traj(tasks[1], SOLVE), traj(tasks[2], FAIL)])
    assert history.level_distribution(tasks) == {0: 2, 1: 2, 2: 0, 3: 0, 4: 0, 5: 1}
    assert history.level_distribution() == {0: 0, 1: 2, 2: 0, 3: 0, 4: 0, 5: 1}


def test_weights_use_webgym_defaults_per_level() -> None:
    tasks = [make_task(i) for i in range(6)]
    history = TaskHistory()
    for level, task in enumerate(tasks):
        history.update([traj(task, FAIL)] * level)
    assert list(history.levels(tasks)) == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(history.weights(tasks), [100, 10, 1, 0.1, 0.01, 0.001])
    assert dict(DEFAULT_LEVEL_WEIGHTS) == {0: 100, 1: 10, 2: 1, 3: 0.1, 4: 0.01, 5: 0.001}


def test_level_weights_override_only_the_levels_given() -> None:
    np.testing.assert_allclose(level_weight_table({5: 0.0, 0: 7}), [7, 10, 1, 0.1, 0.01, 0])


@pytest.mark.parametrize("bad", [{6: 1.0}, {-1: 1.0}, {1: -0.5}, {2: float("nan")}, {"1": 1.0}])
def test_bad_level_weights_are_rejected(bad: dict) -> None:
    with pytest.raises(ValueError, match="level_weights"):
        level_weight_table(bad)


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    history = TaskHistory(success_threshold=0.9)
    named = make_task(7, with_id=False)
    history.update([traj(make_task(0), FAIL), traj(make_task(1), SOLVE), traj(named, FAIL)])
    path = tmp_path / "history.json"
    history.save(path)
    loaded = TaskHistory.load(path)
    assert loaded.to_dict() == history.to_dict()
    assert loaded.success_threshold == 0.9
    assert loaded.level(named) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]


def test_load_rejects_a_file_that_is_not_a_history(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"tasks": []}), encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"h\.json is not a replaystore task history"):
        TaskHistory.load(path)
    path.write_text("{", encoding="utf-8")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        TaskHistory.load(path)


def test_load_rejects_a_malformed_record_naming_it(tmp_path: Path) -> None:
    history = TaskHistory()
    history.update([traj(make_task(0), FAIL)])
    data = history.to_dict()
    data["tasks"][0]["failures"] = -2
    path = tmp_path / "h.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(CheckpointError, match="task record 0: 'failures'"):
        TaskHistory.load(path)


def test_compute_attempt_levels_from_trajectories_rebuilds_from_all() -> None:
    tasks = [make_task(i) for i in range(3)]
    history = TaskHistory()
    history.update([traj(tasks[2], FAIL)] * 3)
    all_trajectories = [traj(tasks[0], FAIL), traj(tasks[1], SOLVE)]
    leveled = history.compute_attempt_levels_from_trajectories(tasks, all_trajectories)
    assert [t.attempt_level for t in leveled] == [1, 5, 0]
    assert [t.attempt_level for t in tasks] == [0, 0, 0]  # inputs untouched


def test_apply_adaptive_weighted_sampling_is_a_seeded_permutation() -> None:
    tasks = [make_task(i) for i in range(20)]
    history = TaskHistory()
    history.update([traj(t, SOLVE) for t in tasks[:10]])
    first = history.apply_adaptive_weighted_sampling(tasks, seed=3)
    assert first == history.apply_adaptive_weighted_sampling(tasks, seed=3)
    assert sorted(t.task_id for t in first) == sorted(t.task_id for t in tasks)
    never_sampled = history.apply_adaptive_weighted_sampling(tasks, {5: 0.0}, seed=3)
    assert [t.task_id for t in never_sampled[10:]] == [str(i) for i in range(10)]
