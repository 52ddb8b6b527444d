"""WebGym's ``webgym/data`` names and attributes, replaying its call sites.

``scripts/update_prepare.py`` reads ``replay_buffer.samples`` (and, through the
buffer's WebGym API, ``training_indices``, ``successful_indices``,
``trajectories``, ``context_manager``); ``scripts/rollout.py`` imports
``domain_subdomain_map``; WebGym code indexes components by field name.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest

from replaystore.trajectories import ReplayBuffer, TrajectoryStorage
from replaystore.trajectories.components import (
    Action,
    Observation,
    Response,
    Reward,
    Task,
    domain_subdomain_map,
)


def _collection(factory):
    return [
        factory.trajectory(3, success=True, screens=[1, 1, 2]),  # step 0 same as next
        factory.trajectory(2, success=False),
        factory.dummy_trajectory(),
        factory.trajectory(2, success=True),
    ]


def test_domain_subdomain_map_is_webgyms_table() -> None:
    assert domain_subdomain_map["Career & Education"] == ["Education & Learning", "Jobs & Career"]
    assert len(domain_subdomain_map) == 6
    assert sum(len(v) for v in domain_subdomain_map.values()) == 24


def test_components_are_indexed_by_field_name_as_webgym_code_does() -> None:
    task = Task("t", "d", "s", "w", 1, None, None, task_id=3)
    observation = Observation(task=task, image_path="/s.png", ac_tree="tree")
    assert observation["image_path"] == "/s.png" and observation["task"]["task_id"] == 3
    assert observation.get("page_metadata", {}) is None and observation.get("nope", 7) == 7
    assert "image_path" in observation and "nope" not in observation
    for component in (
        task,
        observation,
        Action({"key": "click"}, "click"),
        Response("r", 3),
        Reward(1.0, "ok"),
    ):
        name = next(iter(type(component).__dataclass_fields__))
        assert component[name] is getattr(component, name)
        with pytest.raises(KeyError, match="no field 'missing'"):
            component["missing"]
        with pytest.raises(TypeError):
            component[0]
        with pytest.raises(TypeError, match="not iterable"):
            iter(component)


def test_observation_accepts_webgyms_deprecated_submit() -> None:
    task = Task("t", "d", "s", "w", 1, None, None)
    with pytest.warns(DeprecationWarning, match="Reward"):
        observation = Observation(task=task, image_path="x.png", ac_tree=None, submit=True)
    assert observation == Observation(task, "x.png", None)
    assert "submit" not in observation.to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Observation(task, "x.png", None, submit=None)


def test_update_prepare_sequence_reads_samples_and_indices(trajectory_factory) -> None:
    trajectories = _collection(trajectory_factory)
    agent = SimpleNamespace(context_manager=object())
    replay_buffer = ReplayBuffer(
        agent=agent,
        trajectories=trajectories,
        capacity=None,
        filter_successful_only=True,
        include_reward_in_sample=False,
        shuffle=False,
        filter_same_screenshot=True,
    )
    assert len(replay_buffer.samples) == 7  # the dummy is dropped, as in WebGym
    assert replay_buffer.context_manager is agent.context_manager
    assert replay_buffer.trajectories is trajectories
    assert list(replay_buffer.training_indices) == [1, 2, 5, 6]
    assert replay_buffer.successful_indices is replay_buffer.training_indices
    assert len(replay_buffer) == len(replay_buffer.training_indices)
    for i, j in enumerate(replay_buffer.training_indices):
        full = replay_buffer.samples[j]
        assert set(full) == {"message", "action", "trajectory_reward", "same_as_next_screenshot"}
        assert replay_buffer[i] == {"message": full["message"], "action": full["action"]}
    rewards = [s["trajectory_reward"] for s in replay_buffer.samples]
    assert rewards == [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("filter_successful_only", [True, False])
@pytest.mark.parametrize("capacity", [None, 5])
def test_indices_stay_valid_under_shuffle_and_capacity(
    trajectory_factory, filter_successful_only, capacity
) -> None:
    buffer = ReplayBuffer(
        _collection(trajectory_factory),
        capacity=capacity,
        filter_successful_only=filter_successful_only,
        shuffle=True,
        seed=11,
    )
    indices = buffer.training_indices
    assert len(buffer.samples) == (capacity or 7) and len(indices) == len(buffer)
    assert not indices.flags.writeable
    assert all(buffer[i] == buffer.samples[j] for i, j in enumerate(indices))
    if not filter_successful_only:
        assert np.array_equal(indices, np.arange(len(buffer.samples)))


def test_from_storage_buffer_keeps_webgyms_attributes_lazy(trajectory_factory, tmp_path) -> None:
    trajectories = _collection(trajectory_factory)
    storage = TrajectoryStorage(tmp_path / "store")
    storage.save_iteration(1, trajectories[:2])
    storage.save_iteration(2, trajectories[2:])
    buffer = ReplayBuffer.from_storage(storage.root, filter_successful_only=True)
    in_memory = ReplayBuffer(storage.load_all(), filter_successful_only=True)
    assert len(buffer.samples) == len(in_memory.samples) == 7
    assert np.array_equal(buffer.training_indices, in_memory.training_indices)
    assert list(buffer.samples) == list(in_memory.samples)
    stored = buffer.trajectories
    assert len(stored) == 4 and len(stored[2]) == 1  # the dummy is listed, as in WebGym
    assert [len(t) for t in stored] == [len(t) for t in storage.load_all()]
    assert stored[-1][0]["response"] == storage.load_all()[-1][0]["response"]
    with pytest.raises(IndexError):
        stored[4]
    assert buffer.context_manager is None
