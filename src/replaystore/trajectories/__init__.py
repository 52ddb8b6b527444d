"""WebGym-style web-agent trajectories: components, replay buffer, storage."""

from __future__ import annotations

from replaystore.trajectories.buffer import BufferStats, ReplayBuffer, SampleList, TrajectoryBuffer
from replaystore.trajectories.components import (
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
from replaystore.trajectories.storage import TrajectoryStorage

__all__ = [
    "Action",
    "BufferStats",
    "Observation",
    "ReplayBuffer",
    "Response",
    "Reward",
    "SampleList",
    "Step",
    "Task",
    "TrajectoryBuffer",
    "TrajectoryStorage",
    "step_from_dict",
    "step_to_dict",
    "trajectory_from_dicts",
    "trajectory_to_dicts",
]
