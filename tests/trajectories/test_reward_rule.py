"""One final-reward rule (trajectories/index.py) for every consumer of a trajectory store.

A non-dummy trajectory's final reward must be a finite number: ``save_iteration``
refuses anything else (nothing written), and a file written before that rule is
refused alike by stats, load_all (hence TaskHistory), from_storage, export and
the CLI's stats and export commands.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from replaystore import cli
from replaystore.errors import TrajectoryError
from replaystore.pipeline import TaskHistory
from replaystore.trajectories import ReplayBuffer, TrajectoryStorage
from replaystore.trajectories.index import final_reward_value, final_reward_values

from .conftest import TrajectoryFactory

NONE_REWARD = r"trajectory 1 of .*iteration_000002\.rank000\.jsonl: final step 2 has reward None"


def set_header_final_reward(path: Path, t: int, value: Any) -> None:
    """Rewrite a file's header as a writer before the rule left it: trajectory ``t``'s
    final reward ``value`` (the step lines and their CRCs are untouched)."""
    header_line, _, body = path.read_bytes().partition(b"\n")
    header = json.loads(header_line)
    header["index"]["final_rewards"][t] = value
    path.write_bytes(json.dumps(header).encode("utf-8") + b"\n" + body)


@pytest.mark.parametrize("bad", [None, "1", math.nan, math.inf, [1.0]])
def test_save_iteration_refuses_a_bad_final_reward_and_writes_nothing(
    trajectory_factory: TrajectoryFactory, bad: Any
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    trajectories = [trajectory_factory.trajectory(2), trajectory_factory.trajectory(3)]
    trajectories[1][-1]["reward"].reward = bad
    with pytest.raises(TrajectoryError, match=r"^trajectory 1: final step 2 has"):
        storage.save_iteration(1, trajectories)
    assert storage.files() == []


def test_dummy_trajectories_keep_their_none_reward(trajectory_factory: TrajectoryFactory) -> None:
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    storage.save_iteration(
        1, [trajectory_factory.trajectory(2), trajectory_factory.dummy_trajectory()]
    )
    stats = storage.stats()
    assert (stats["total_trajectories"], stats["dummy_trajectories"]) == (2, 1)
    assert stats["successful_trajectories"] == 1
    assert len(ReplayBuffer.from_storage(storage.root)) == 2


def test_numeric_final_rewards_are_stored_as_json_numbers(
    trajectory_factory: TrajectoryFactory,
) -> None:
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    trajectories = [trajectory_factory.trajectory(1) for _ in range(3)]
    trajectories[0][-1]["reward"].reward = np.float64(1.0)
    trajectories[1][-1]["reward"].reward = True
    trajectories[2][-1]["reward"].reward = 0
    path = storage.save_iteration(1, trajectories)
    header = json.loads(path.read_bytes().partition(b"\n")[0])
    assert header["index"]["final_rewards"] == [1.0, True, 0]
    assert storage.stats()["successful_trajectories"] == 2


def test_final_reward_value_is_the_rule() -> None:
    assert final_reward_value(1, "trajectory 0", 0) == 1.0
    assert final_reward_value(False, "trajectory 0", 0) == 0.0
    assert final_reward_value(np.float64(0.5), "trajectory 0", 0) == 0.5
    for bad in (None, "0", math.nan, -math.inf, {"reward": 1}):
        with pytest.raises(TrajectoryError, match=r"^trajectory 7: final step 3 has"):
            final_reward_value(bad, "trajectory 7", 3)


def test_final_reward_values_are_the_rule_applied_to_each() -> None:
    plain = [1, 0.25, True, False, 2**70, -3]
    got = final_reward_values(plain, np.arange(6), lambda k: f"trajectory {k}")
    assert got.dtype == np.float64
    assert got.tolist() == [final_reward_value(v, "t", 0) for v in plain]
    assert final_reward_values([np.float64(0.5)], np.zeros(1), str).tolist() == [0.5]
    assert final_reward_values([], np.zeros(0), str).size == 0
    for bad in (None, "0", math.nan, -math.inf, {"reward": 1}):
        with pytest.raises(TrajectoryError, match=r"^trajectory 1: final step 4 has"):
            final_reward_values([1.0, bad, None], np.array([2, 4, 6]), lambda k: f"trajectory {k}")
    with pytest.raises(OverflowError):  # as float() of it
        final_reward_values([10**400], np.zeros(1), str)


@pytest.fixture
def legacy_store(trajectory_factory: TrajectoryFactory) -> TrajectoryStorage:
    """A store whose iteration 2 holds a None final reward (written before the rule)."""
    storage = TrajectoryStorage(trajectory_factory.root / "store")
    storage.save_iteration(1, [trajectory_factory.trajectory(2)])
    path = storage.save_iteration(
        2, [trajectory_factory.trajectory(2), trajectory_factory.trajectory(3, success=False)]
    )
    set_header_final_reward(path, 1, None)
    return storage


def test_stats_refuses_a_stored_none_reward(legacy_store: TrajectoryStorage) -> None:
    # Before the rule, stats() counted it as unsuccessful and succeeded.
    with pytest.raises(TrajectoryError, match=NONE_REWARD):
        legacy_store.stats()


def test_load_all_and_task_history_refuse_a_stored_none_reward(
    legacy_store: TrajectoryStorage,
) -> None:
    # Before the rule, load_all returned it and TaskHistory counted a failed attempt.
    history = TaskHistory()
    with pytest.raises(TrajectoryError, match=NONE_REWARD):
        history.update(legacy_store.load_all())
    assert len(history) == 0
    with pytest.raises(TrajectoryError, match=NONE_REWARD):
        list(legacy_store.iter_trajectories())


def test_from_storage_refuses_a_stored_none_reward(legacy_store: TrajectoryStorage) -> None:
    with pytest.raises(TrajectoryError, match=NONE_REWARD):
        ReplayBuffer.from_storage(legacy_store.root)


def test_cli_stats_and_export_fail_alike_on_a_stored_none_reward(
    legacy_store: TrajectoryStorage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["stats", str(legacy_store.root)]) == 2
    stats_err = capsys.readouterr().err
    assert cli.main(["export", str(legacy_store.root), "--out", str(tmp_path / "out")]) == 2
    export_err = capsys.readouterr().err
    assert "reward None" in stats_err
    assert stats_err.replace("replaystore stats", "") == export_err.replace(
        "replaystore export", ""
    )


def test_one_success_rule_counts_attempts_without_dummies() -> None:
    from replaystore.trajectories.index import count_successes, success_rate

    rewards = np.array([1.0, 0.0, 0.5, 0.0, 1.0])
    dummy = np.array([False, False, False, True, True])
    assert count_successes(rewards, dummy, 1.0) == (1, 3)  # dummies are no attempts
    assert count_successes(rewards, dummy, 0.5) == (2, 3)
    assert count_successes([], [], 1.0) == (0, 0)
    assert success_rate(1, 3) == pytest.approx(1 / 3)
    assert success_rate(0, 0) == 0.0 and math.isnan(success_rate(0, 0, empty=math.nan))
    with pytest.raises(ValueError, match="3 final rewards for 2 dummy flags"):
        count_successes([1.0, 0.0, 1.0], [False, True], 1.0)


def test_storage_stats_cli_and_viewer_report_the_same_rate(
    trajectory_factory: TrajectoryFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The same storage through the three readers: the rate is one rule's.
    storage = TrajectoryStorage(tmp_path / "store")
    won = trajectory_factory.trajectory(2, final_reward=1.0)
    lost = trajectory_factory.trajectory(3, final_reward=0.0)
    storage.save_iteration(1, [won, lost, trajectory_factory.trajectory(1, final_reward=1.0)])
    stats = storage.stats()
    assert (stats["successful_trajectories"], stats["dummy_trajectories"]) == (2, 0)
    assert cli.main(["stats", str(tmp_path / "store"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["success_rate"] == pytest.approx(2 / 3)
    from replaystore.view.trajectories import TrajectoryIndex

    assert TrajectoryIndex(tmp_path / "store").overview()["success_rate"] == pytest.approx(2 / 3)
