"""Trajectory components: WebGym's fields, lossless JSON round trips, clear schema errors."""

from __future__ import annotations

import json

import pytest

from replaystore.errors import SchemaError
from replaystore.trajectories import (
    Action,
    Observation,
    Response,
    Reward,
    Step,
    Task,
    step_from_dict,
    step_to_dict,
    trajectory_from_dicts,
    trajectory_to_dicts,
)

from .conftest import TrajectoryFactory


def _json(obj: object) -> object:
    return json.loads(json.dumps(obj))


def test_components_keep_webgyms_fields_and_defaults() -> None:
    task = Task("t", "d", "s", "https://w", 2, None, "42")
    assert (task.attempt_level, task.task_id, task.max_steps, task.trajectory_index) == (
        0,
        None,
        None,
        None,
    )
    assert Observation(task, "x.png", None).page_metadata is None
    assert Response("raw", 12).raw_prompt == ""
    reward = Reward(1.0, "ok")
    assert (reward.is_blocked, reward.submit, reward.submission_judgment) == (False, False, None)


@pytest.mark.parametrize(
    "component",
    [
        Task("t", "d", "s", "w", 1, [{"a": 1}], "ans", 3, "id-1", 10, 7),
        Action({"key": "type", "text": "héllo"}, "type 'héllo'"),
        Response("<think>x</think>", [1, 2], '[{"role": "user", "content": "hi"}]'),
        Reward(None, {"judge": "?"}, True, True, "correct"),
    ],
)
def test_each_component_round_trips_through_json(component: object) -> None:
    data = _json(component.to_dict())  # type: ignore[attr-defined]
    assert type(component).from_dict(data) == component  # type: ignore[attr-defined]


def test_steps_round_trip_through_json(trajectory_factory: TrajectoryFactory) -> None:
    traj = trajectory_factory.trajectory(3, precomputed=True)
    traj[0]["trajectory_metadata"] = {"keypoint_step_ids": [2]}
    back = trajectory_from_dicts(_json(trajectory_to_dicts(traj)))  # type: ignore[arg-type]
    assert back == traj
    step = Step.from_mapping(traj[0])
    assert step.to_mapping() == traj[0]
    assert step_from_dict(_json(step_to_dict(step))) == traj[0]  # type: ignore[arg-type]


def test_step_to_dict_accepts_component_dicts(trajectory_factory: TrajectoryFactory) -> None:
    step = trajectory_factory.trajectory(1)[0]
    as_dicts = {key: getattr(value, "to_dict", lambda v=value: v)() for key, value in step.items()}
    assert step_to_dict(as_dicts) == step_to_dict(step)


def test_schema_errors_name_the_field() -> None:
    with pytest.raises(SchemaError, match="Reward is missing required field 'evaluation'"):
        Reward.from_dict({"reward": 1.0})
    with pytest.raises(SchemaError, match="Action has no field 'extra'"):
        Action.from_dict({"action": None, "action_string": None, "extra": 1})
    with pytest.raises(SchemaError, match="Task expects a mapping"):
        Task.from_dict([1, 2])  # type: ignore[arg-type]


def test_step_errors_name_the_key(trajectory_factory: TrajectoryFactory) -> None:
    step = dict(trajectory_factory.trajectory(1)[0])
    with pytest.raises(SchemaError, match="step has unknown key 'bogus'"):
        step_from_dict({**step_to_dict(step), "bogus": 1})
    del step["reward"]
    with pytest.raises(SchemaError, match="step is missing 'reward'"):
        step_to_dict(step)
    with pytest.raises(SchemaError, match=r"step\['action'\] must be a Action"):
        step_to_dict({**trajectory_factory.trajectory(1)[0], "action": "click"})
