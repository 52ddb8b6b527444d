"""ReplayBuffer: WebGym's trajectory dataset, its rules, and where it fixes WebGym."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

import replaystore
from replaystore.errors import TrajectoryError
from replaystore.trajectories import ReplayBuffer, Step, TrajectoryBuffer, step_to_dict
from replaystore.trajectories.screenshots import ScreenshotFingerprinter

from .conftest import FakeAgent, TrajectoryFactory


def _actions(buffer: ReplayBuffer) -> list[str]:
    return [buffer[i]["action"] for i in range(len(buffer))]


def test_buffer_is_a_torch_dataset_exported_under_both_names() -> None:
    assert issubclass(ReplayBuffer, torch.utils.data.Dataset)
    assert TrajectoryBuffer is ReplayBuffer
    assert replaystore.TrajectoryBuffer is ReplayBuffer


def test_one_sample_per_step_with_prompt_action_reward_and_flag(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(3, success=True)
    buffer = ReplayBuffer([traj])
    assert len(buffer) == 3
    sample = buffer[1]
    assert set(sample) == {"message", "action", "trajectory_reward", "same_as_next_screenshot"}
    assert sample["message"] == json.loads(traj[1]["response"].raw_prompt)
    assert sample["action"] == traj[1]["response"].raw_response
    assert sample["trajectory_reward"] == 1.0
    assert sample["same_as_next_screenshot"] is False


def test_include_reward_in_sample_false_gives_message_and_action_only(
    trajectory_factory: TrajectoryFactory,
) -> None:
    buffer = ReplayBuffer([trajectory_factory.trajectory(2)], include_reward_in_sample=False)
    assert set(buffer[0]) == {"message", "action"}
    assert set(buffer.get_training_samples()[0]) == {"message", "action"}


def test_trajectory_reward_is_the_final_steps_reward(trajectory_factory: TrajectoryFactory) -> None:
    traj = trajectory_factory.trajectory(3, final_reward=0.5)
    traj[0]["reward"].reward = 1.0  # intermediate rewards do not matter
    buffer = ReplayBuffer([traj])
    assert [buffer[i]["trajectory_reward"] for i in range(3)] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("kind", ["action", "image", "string"])
def test_dummy_invalid_url_trajectories_are_dropped_and_counted(
    trajectory_factory: TrajectoryFactory, kind: str
) -> None:
    good = trajectory_factory.trajectory(2)
    buffer = ReplayBuffer([trajectory_factory.dummy_trajectory(kind), good])
    assert len(buffer) == 2
    assert buffer.stats.dummy_trajectories == 1
    assert buffer.stats.trajectories == 1


def test_a_one_step_real_trajectory_is_not_a_dummy(trajectory_factory: TrajectoryFactory) -> None:
    buffer = ReplayBuffer([trajectory_factory.trajectory(1)])
    assert len(buffer) == 1
    assert buffer.stats.dummy_trajectories == 0


def test_steps_accepted_as_mappings_dicts_or_step_objects(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(2)
    as_dicts = [step_to_dict(step) for step in traj]
    as_steps = [Step.from_mapping(step) for step in traj]
    expected = _actions(ReplayBuffer([traj]))
    assert _actions(ReplayBuffer([as_dicts])) == expected
    assert _actions(ReplayBuffer([as_steps])) == expected


# ------------------------------------------------------------------ prompts


def test_prompt_without_raw_prompt_is_built_by_the_agents_conversation_builder(
    trajectory_factory: TrajectoryFactory, fake_agent: FakeAgent
) -> None:
    traj = trajectory_factory.trajectory(3, raw_prompt=False)
    buffer = ReplayBuffer([traj], agent=fake_agent)
    message = buffer[2]["message"]
    assert message[0] == {"role": "system", "content": "built"}
    task, history, observation = fake_agent.conversation_builder.calls[-1]
    assert task == traj[2]["observation"].task
    assert observation == traj[2]["observation"]
    assert [h["response"] for h in history] == [traj[0]["response"], traj[1]["response"]]


def test_an_agent_that_is_itself_a_builder_is_accepted(
    trajectory_factory: TrajectoryFactory, fake_agent: FakeAgent
) -> None:
    builder = fake_agent.conversation_builder
    buffer = ReplayBuffer([trajectory_factory.trajectory(1, raw_prompt=False)], agent=builder)
    assert buffer[0]["message"][0]["content"] == "built"


def test_raw_prompt_wins_over_the_builder(
    trajectory_factory: TrajectoryFactory, fake_agent: FakeAgent
) -> None:
    traj = trajectory_factory.trajectory(1)
    buffer = ReplayBuffer([traj], agent=fake_agent)
    assert buffer[0]["message"] == json.loads(traj[0]["response"].raw_prompt)
    assert fake_agent.conversation_builder.calls == []


def test_missing_prompt_without_agent_names_trajectory_and_step(
    trajectory_factory: TrajectoryFactory,
) -> None:
    trajs = [trajectory_factory.trajectory(2), trajectory_factory.trajectory(3)]
    trajs[1][2]["response"].raw_prompt = ""
    # at construction, as WebGym fails, not on access
    with pytest.raises(TrajectoryError, match=r"trajectory 1 step 2 has no raw_prompt"):
        ReplayBuffer(trajs)


def test_malformed_raw_prompt_names_trajectory_and_step(
    trajectory_factory: TrajectoryFactory,
) -> None:
    trajs = [trajectory_factory.trajectory(2), trajectory_factory.trajectory(2)]
    trajs[1][0]["response"].raw_prompt = '[{"role": "user", "content": '
    buffer = ReplayBuffer(trajs)
    with pytest.raises(TrajectoryError, match=r"trajectory 1 step 0 has invalid JSON"):
        buffer[2]
    trajs[1][0]["response"].raw_prompt = '{"role": "user"}'
    with pytest.raises(TrajectoryError, match=r"trajectory 1 step 0: raw_prompt must be a list"):
        buffer[2]


def test_validate_finds_a_bad_prompt_up_front(trajectory_factory: TrajectoryFactory) -> None:
    trajs = [trajectory_factory.trajectory(3)]
    assert ReplayBuffer(trajs).validate() == 3
    trajs[0][1]["response"].raw_prompt = "not json"
    with pytest.raises(TrajectoryError, match="trajectory 0 step 1"):
        ReplayBuffer(trajs).validate()


# ------------------------------------------------------------------ success and rewards


def test_final_reward_none_raises_naming_the_trajectory(
    trajectory_factory: TrajectoryFactory,
) -> None:
    trajs = [trajectory_factory.trajectory(2), trajectory_factory.trajectory(3, final_reward=None)]
    with pytest.raises(TrajectoryError, match=r"trajectory 1: final step 2 has reward None"):
        ReplayBuffer(trajs)


def test_missing_or_non_numeric_final_reward_is_a_clear_error(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(2)
    del traj[-1]["reward"]
    with pytest.raises(TrajectoryError, match=r"trajectory 0: final step 1 has no 'reward'"):
        ReplayBuffer([traj])
    traj = trajectory_factory.trajectory(2)
    traj[-1]["reward"].reward = "yes"
    with pytest.raises(TrajectoryError, match="non-numeric reward 'yes'"):
        ReplayBuffer([traj])


def test_empty_trajectory_is_an_error(trajectory_factory: TrajectoryFactory) -> None:
    with pytest.raises(TrajectoryError, match="trajectory 1 has no steps"):
        ReplayBuffer([trajectory_factory.trajectory(1), []])


def test_success_threshold_decides_success(trajectory_factory: TrajectoryFactory) -> None:
    trajs = [trajectory_factory.trajectory(2, final_reward=0.8)]
    assert ReplayBuffer(trajs).num_eligible == 0
    assert ReplayBuffer(trajs, success_threshold=0.7).num_eligible == 2


# ------------------------------------------------------------------ screenshots


def test_identical_screenshots_without_precomputed_flag_are_filtered(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # Steps 0 and 1 show the same pixels (saved as different files, different
    # compression); the seed would assume "different" and train on step 0.
    traj = trajectory_factory.trajectory(
        3, screens=[5, 5, 6], precomputed=False, compress_levels=[1, 9, 6]
    )
    buffer = ReplayBuffer(
        [traj], filter_successful_only=True, fingerprinter=ScreenshotFingerprinter()
    )
    assert buffer.stats.computed_screenshot_steps == 2
    assert [s["same_as_next_screenshot"] for s in buffer.get_training_samples()] == [False, False]
    assert _actions(buffer) == [traj[1]["response"].raw_response, traj[2]["response"].raw_response]


def test_precomputed_flag_is_used_as_is(trajectory_factory: TrajectoryFactory) -> None:
    traj = trajectory_factory.trajectory(3, screens=[1, 2, 3])
    traj[0]["same_as_next_screenshot"] = True  # trusted even though the pixels differ
    fp = ScreenshotFingerprinter()
    buffer = ReplayBuffer([traj], fingerprinter=fp)
    assert buffer[0]["same_as_next_screenshot"] is True
    assert fp.decoded == 0


def test_last_step_is_never_same_as_next(trajectory_factory: TrajectoryFactory) -> None:
    traj = trajectory_factory.trajectory(2, screens=[3, 3])
    traj[1]["same_as_next_screenshot"] = True
    buffer = ReplayBuffer([traj])
    assert [buffer[i]["same_as_next_screenshot"] for i in range(2)] == [True, False]


def test_filter_same_screenshot_false_keeps_repeated_steps_eligible(
    trajectory_factory: TrajectoryFactory,
) -> None:
    traj = trajectory_factory.trajectory(3, screens=[4, 4, 4])
    assert ReplayBuffer([traj]).num_eligible == 1
    assert ReplayBuffer([traj], filter_same_screenshot=False).num_eligible == 3


def test_missing_screenshot_is_a_counted_warning_and_compares_different(
    trajectory_factory: TrajectoryFactory, caplog: pytest.LogCaptureFixture
) -> None:
    traj = trajectory_factory.trajectory(3, screens=[8, 8, 9], precomputed=False)
    traj[1]["observation"].image_path = str(trajectory_factory.root / "gone.png")
    with caplog.at_level(logging.WARNING, logger="replaystore"):
        buffer = ReplayBuffer([traj], fingerprinter=ScreenshotFingerprinter())
    assert buffer.stats.missing_screenshots == 2  # step 0's next and step 1 itself
    assert any("no readable file" in r.message for r in caplog.records)
    assert [buffer[i]["same_as_next_screenshot"] for i in range(3)] == [False, False, False]


@pytest.mark.parametrize("flag", ["no", [True]])
def test_malformed_precomputed_flag_is_an_error(
    trajectory_factory: TrajectoryFactory, flag: object
) -> None:
    trajs = [trajectory_factory.trajectory(1), trajectory_factory.trajectory(2)]
    trajs[1][0]["same_as_next_screenshot"] = flag
    with pytest.raises(TrajectoryError, match=r"trajectory 1 step 0: same_as_next_screenshot"):
        ReplayBuffer(trajs)


# ------------------------------------------------------------------ filtering, shuffle, capacity


def _mixed(factory: TrajectoryFactory, n: int = 20) -> list[list[dict]]:
    # 30% successful trajectories, 3 steps each, no repeated screenshots.
    return [factory.trajectory(3, success=(i % 10) < 3) for i in range(n)]


def test_filter_successful_only_restricts_len_and_getitem(
    trajectory_factory: TrajectoryFactory,
) -> None:
    trajs = _mixed(trajectory_factory)
    assert len(ReplayBuffer(trajs)) == 60
    buffer = ReplayBuffer(trajs, filter_successful_only=True)
    assert len(buffer) == 18
    assert all(buffer[i]["trajectory_reward"] == 1.0 for i in range(len(buffer)))


def test_shuffle_with_filter_successful_only_returns_only_successful_samples(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # The seed shuffles the samples but keeps pre-shuffle indices: ~70% failed here.
    trajs = _mixed(trajectory_factory)
    buffer = ReplayBuffer(trajs, filter_successful_only=True, shuffle=True, seed=3)
    rewards = [buffer[i]["trajectory_reward"] for i in range(len(buffer))]
    assert rewards == [1.0] * 18
    unshuffled = ReplayBuffer(trajs, filter_successful_only=True)
    assert sorted(_actions(buffer)) == sorted(_actions(unshuffled))
    assert _actions(buffer) != _actions(unshuffled)


def test_shuffle_is_seeded(trajectory_factory: TrajectoryFactory) -> None:
    trajs = _mixed(trajectory_factory)
    a = ReplayBuffer(trajs, shuffle=True, seed=11)
    b = ReplayBuffer(trajs, shuffle=True, seed=11)
    c = ReplayBuffer(trajs, shuffle=True, seed=12)
    assert _actions(a) == _actions(b)
    assert _actions(a) != _actions(c)


def test_shuffle_does_not_change_what_recent_means(trajectory_factory: TrajectoryFactory) -> None:
    trajs = _mixed(trajectory_factory)
    plain = ReplayBuffer(trajs, capacity=30)
    shuffled = ReplayBuffer(trajs, capacity=30, shuffle=True, seed=5)
    assert sorted(_actions(plain)) == sorted(_actions(shuffled))
    all_plain = [s["action"] for s in plain.get_training_samples()]
    all_shuffled = [s["action"] for s in shuffled.get_training_samples()]
    assert all_plain == all_shuffled  # oldest eligible first, in collection order


def test_capacity_keeps_most_recent_samples(trajectory_factory: TrajectoryFactory) -> None:
    trajs = _mixed(trajectory_factory)
    everything = _actions(ReplayBuffer(trajs))
    buffer = ReplayBuffer(trajs, capacity=10)
    assert _actions(buffer) == everything[-10:]
    assert buffer.stats.kept_samples == 10
    assert buffer.stats.samples == 60


def test_capacity_with_filter_successful_only_keeps_every_index_valid(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # The seed truncates the samples but keeps indices into the untruncated list.
    trajs = _mixed(trajectory_factory)
    full = ReplayBuffer(trajs)
    kept = set(_actions(full)[-25:])
    buffer = ReplayBuffer(trajs, capacity=25, filter_successful_only=True, shuffle=True, seed=1)
    samples = [buffer[i] for i in range(len(buffer))]
    assert samples and all(s["action"] in kept for s in samples)
    assert all(s["trajectory_reward"] == 1.0 for s in samples)
    training = buffer.get_training_samples()
    assert {s["action"] for s in training} == {s["action"] for s in samples}
    with pytest.raises(IndexError, match="out of range"):
        buffer[len(buffer)]


def test_negative_indices_and_bad_index_types(trajectory_factory: TrajectoryFactory) -> None:
    buffer = ReplayBuffer([trajectory_factory.trajectory(3)])
    assert buffer[-1] == buffer[2]
    with pytest.raises(IndexError, match="index -4 out of range for a buffer of 3"):
        buffer[-4]
    with pytest.raises(TypeError, match="integers"):
        buffer["a"]  # type: ignore[index]


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_bad_capacity_is_rejected(trajectory_factory: TrajectoryFactory, capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer([trajectory_factory.trajectory(1)], capacity=capacity)  # type: ignore[arg-type]


def test_iteration_yields_the_view(trajectory_factory: TrajectoryFactory) -> None:
    buffer = ReplayBuffer(_mixed(trajectory_factory, 5), filter_successful_only=True)
    assert [s["action"] for s in buffer] == _actions(buffer)


# ------------------------------------------------------------------ statistics and logging


def test_stats_report_success_rate_eligible_same_share_and_dummies(
    trajectory_factory: TrajectoryFactory,
) -> None:
    trajs = [
        trajectory_factory.trajectory(4, screens=[1, 1, 2, 3]),
        trajectory_factory.trajectory(2, success=False),
        trajectory_factory.dummy_trajectory(),
    ]
    stats = ReplayBuffer(trajs).stats
    assert stats.trajectories == 2
    assert stats.successful_trajectories == 1
    assert stats.success_rate == 0.5
    assert stats.dummy_trajectories == 1
    assert stats.samples == 6
    assert stats.eligible_samples == 3
    assert stats.same_screenshot_steps == 1
    assert stats.same_screenshot_share == pytest.approx(1 / 6)
    assert stats.as_dict()["eligible_samples"] == 3


def test_summary_is_logged_once_on_rank_zero_only(
    trajectory_factory: TrajectoryFactory,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trajs = [trajectory_factory.trajectory(2)]
    with caplog.at_level(logging.INFO, logger="replaystore.trajectories.buffer"):
        ReplayBuffer(trajs)
    assert sum("success rate" in r.message for r in caplog.records) == 1
    caplog.clear()
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.INFO, logger="replaystore.trajectories.buffer"):
        ReplayBuffer(trajs)
    assert not caplog.records


def test_empty_buffer_is_valid_and_empty() -> None:
    buffer = ReplayBuffer([])
    assert len(buffer) == 0
    assert buffer.stats.success_rate == 0.0
    assert list(buffer.get_training_samples()) == []
    assert list(buffer.get_training_samples(5, 2.0, seed=0)) == []


def test_buffer_keeps_a_few_dozen_bytes_per_step(trajectory_factory: TrajectoryFactory) -> None:
    buffer = ReplayBuffer(_mixed(trajectory_factory, 10))
    per_step = (
        sum(a.nbytes for a in vars(buffer).values() if isinstance(a, np.ndarray))
        / buffer.stats.samples
    )
    assert per_step < 64
