"""WebGym (574a205): its trajectory-buffer call sites, replayed with only the imports changed.

``from webgym.data.replay_buffer import ReplayBuffer`` ->
``from replaystore.trajectories import ReplayBuffer``. Shaped like
``scripts/update_prepare.py`` (``ReplayBuffer(trajectories, agent, capacity=...,
filter_successful_only=...)`` with WebGym's ``WebAgent``, then ``samples``,
``training_indices``, ``get_training_samples``) and like WebGym's buffer
construction, which fails at once, naming trajectory and step, when a step has
no stored prompt. The agent here is shaped like WebGym's ``WebAgent``: no
``conversation_builder``; ``context_manager.get_model_interface()
.conversation_builder`` with ``build_conversation`` (which WebGym's buffer
never calls).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from replaystore.errors import TrajectoryError
from replaystore.trajectories import ReplayBuffer, TrajectoryStorage
from replaystore.trajectories.components import Action, Observation, Response, Reward, Task


class _WebGymConversationBuilder:
    """WebGym's ConversationBuilder interface: build_conversation, not build."""

    def build_conversation(self, task, trajectory, current_observation, **kwargs):
        raise AssertionError("WebGym's buffer never builds prompts")

    def get_conversation_type(self) -> str:
        return "multi_turn"


class _WebGymContextManager:
    def __init__(self) -> None:
        self.model_interface = SimpleNamespace(conversation_builder=_WebGymConversationBuilder())

    def get_model_interface(self):
        return self.model_interface


class _WebAgent:
    """The attributes of WebGym's WebAgent that its ReplayBuffer touches."""

    def __init__(self) -> None:
        self.context_manager = _WebGymContextManager()
        self.prompt_constructor = self.context_manager.get_model_interface().conversation_builder


def _step(task: Task, i: int, *, reward: float, prompt: bool = True, same: bool = False) -> dict:
    messages = [{"role": "user", "content": f"{task.task_name} step {i}"}]
    return {
        "observation": Observation(
            task=task, image_path=f"/shots/{task.task_id}_{i}.png", ac_tree="[1] link"
        ),
        "action": Action({"key": "click", "element": i}, f"click [{i}]"),
        "response": Response(
            f"Action: click [{i}]", 3, raw_prompt=json.dumps(messages) if prompt else ""
        ),
        "reward": Reward(reward, None, submit=reward is not None and reward > 0),
        "same_as_next_screenshot": same,
    }


def _trajectory(n: int, task_id: int, *, success: bool, missing_prompt_at: int | None = None):
    task = Task(f"task {task_id}", "d", "s", "https://example.com", 1, None, None, task_id=task_id)
    final = 1.0 if success else 0.0
    return [
        _step(task, i, reward=final if i == n - 1 else 0.0, prompt=i != missing_prompt_at)
        for i in range(n)
    ]


def _collection(**missing):
    return [
        _trajectory(3, 0, success=True),
        _trajectory(2, 1, success=False),
        _trajectory(2, 2, success=True, missing_prompt_at=missing.get("t2")),
    ]


def test_update_prepare_builds_with_a_webagent_and_reads_samples_and_indices():
    agent = _WebAgent()
    replay_buffer = ReplayBuffer(
        _collection(),
        agent,
        capacity=None,
        filter_successful_only=True,
        include_reward_in_sample=True,
        shuffle=False,
        filter_same_screenshot=True,
    )
    assert replay_buffer.context_manager is agent.context_manager
    assert replay_buffer.conversation_builder is agent.prompt_constructor
    assert len(replay_buffer.samples) == 7
    assert list(replay_buffer.training_indices) == [0, 1, 2, 5, 6]
    assert len(replay_buffer) == 5
    sampled = replay_buffer.get_training_samples(num_samples=3, recency_bias_power=2.0, seed=0)
    assert len(sampled) == 3
    for sample in sampled:
        assert sample["trajectory_reward"] == 1.0
        assert sample["message"][0]["role"] == "user"
    assert replay_buffer[0]["message"] == [{"role": "user", "content": "task 0 step 0"}]


@pytest.mark.parametrize("agent", [None, "webagent"])
def test_a_step_without_a_prompt_fails_at_construction_naming_trajectory_and_step(agent):
    trajectories = _collection(t2=1)
    the_agent = _WebAgent() if agent else None
    with pytest.raises(TrajectoryError, match=r"trajectory 2 step 1 has no raw_prompt") as info:
        ReplayBuffer(trajectories, the_agent, filter_successful_only=True)
    if agent:
        assert "_WebAgent" in str(info.value)


def test_a_step_without_a_prompt_outside_capacity_is_never_read():
    trajectories = _collection()
    trajectories[0][0]["response"].raw_prompt = ""
    buffer = ReplayBuffer(trajectories, _WebAgent(), capacity=6)
    assert len(buffer.samples) == 6


def test_an_agent_with_a_builder_rebuilds_missing_prompts_lazily():
    class Builder:
        def build(self, task, history, observation):
            return [{"role": "user", "content": f"rebuilt {task.task_id} after {len(history)}"}]

    buffer = ReplayBuffer(_collection(t2=1), SimpleNamespace(conversation_builder=Builder()))
    assert buffer[6]["message"] == [{"role": "user", "content": "rebuilt 2 after 1"}]


def test_from_storage_fails_at_construction_and_reads_no_step(tmp_path, monkeypatch):
    storage = TrajectoryStorage(tmp_path / "store")
    storage.save_iteration(1, _collection(t2=0))
    storage.save_iteration(2, _collection())
    index = storage.build_index()
    assert index.has_prompt is not None
    assert int((~index.has_prompt).sum()) == 1
    with pytest.raises(TrajectoryError, match=r"trajectory 2 step 0 .*has no raw_prompt"):
        ReplayBuffer.from_storage(tmp_path / "store")
    # only the newest iteration: every prompt is there, and no prompt is parsed to know it
    import replaystore.trajectories.buffer as buffer_module

    def no_parsing(*args, **kwargs):
        raise AssertionError("a prompt was parsed at construction")

    monkeypatch.setattr(buffer_module, "parse_prompt", no_parsing)
    buffer = ReplayBuffer.from_storage(tmp_path / "store", last_n_iterations=1)
    assert len(buffer) == 7 and buffer.stats.eligible_samples == 5
