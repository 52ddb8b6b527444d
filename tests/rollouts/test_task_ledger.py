"""The Ray rollout driver's queue: pull order, lost actors, duplicates, failures (no Ray)."""

from __future__ import annotations

import pytest

from replaystore.rollouts.task_ledger import NoActorsLeftError, TaskFailedError, TaskLedger


def test_actors_pull_tasks_in_order_until_the_queue_is_empty() -> None:
    ledger = TaskLedger(3, ["a", "b"])
    assert [ledger.next_for("a"), ledger.next_for("b"), ledger.next_for("a")] == [0, 1, 2]
    assert ledger.next_for("b") is None
    assert ledger.in_flight("a") == 2


def test_a_slow_actor_takes_fewer_tasks() -> None:
    ledger = TaskLedger(6, ["fast", "slow"])
    slow = ledger.next_for("slow")
    while (index := ledger.next_for("fast")) is not None:
        assert ledger.finish("fast", index)
    assert slow is not None and ledger.finish("slow", slow)
    assert ledger.complete
    assert ledger.counts.per_actor == {"fast": 5, "slow": 1}


def test_a_lost_actors_unfinished_tasks_go_to_the_front_of_the_queue() -> None:
    ledger = TaskLedger(5, ["a", "b"])
    held = [ledger.next_for("a"), ledger.next_for("a"), ledger.next_for("b")]
    assert held == [0, 1, 2]
    assert ledger.finish("a", 0)
    assert ledger.lose("a") == [1]
    assert ledger.actors == ["b"]
    assert ledger.next_for("b") == 1  # before 3 and 4
    assert ledger.counts.reassigned == 1
    assert ledger.counts.lost_actors == ["a"]


def test_losing_an_actor_twice_does_nothing() -> None:
    ledger = TaskLedger(2, ["a", "b"])
    ledger.next_for("a")
    assert ledger.lose("a") == [0]
    assert ledger.lose("a") == []
    assert ledger.counts.reassigned == 1


def test_a_task_finished_twice_is_kept_once_and_the_duplicate_counted() -> None:
    ledger = TaskLedger(2, ["a", "b"])
    assert ledger.next_for("a") == 0
    ledger.lose("a")  # unreachable, not dead: its result may still come
    assert ledger.next_for("b") == 0
    assert ledger.finish("b", 0) is True
    assert ledger.finish("a", 0) is False  # the late result of the lost actor
    assert ledger.counts.duplicates == 1
    assert ledger.counts.done == 1


def test_a_late_result_of_a_lost_actor_is_kept_when_it_comes_first() -> None:
    ledger = TaskLedger(1, ["a", "b"])
    ledger.next_for("a")
    ledger.lose("a")
    assert ledger.finish("a", 0) is True
    assert ledger.next_for("b") is None  # done meanwhile: skipped, not handed out again
    assert ledger.complete


def test_losing_the_last_actor_with_work_left_raises_one_line() -> None:
    ledger = TaskLedger(3, ["a"])
    ledger.next_for("a")
    with pytest.raises(NoActorsLeftError, match=r"no rollout actor is left \(1 lost\): 3 of 3"):
        ledger.lose("a")


def test_losing_the_last_actor_after_every_task_is_done_is_fine() -> None:
    ledger = TaskLedger(1, ["a"])
    ledger.next_for("a")
    ledger.finish("a", 0)
    assert ledger.lose("a") == []


def test_a_failed_call_is_retried_then_fails_the_run_at_the_limit() -> None:
    ledger = TaskLedger(1, ["a"], max_attempts=2)
    ledger.next_for("a")
    ledger.fail("a", 0, "boom")
    assert ledger.next_for("a") == 0
    with pytest.raises(TaskFailedError, match="task 0 failed on 2 tries; the last: boom"):
        ledger.fail("a", 0, "boom")


@pytest.mark.parametrize("total", [-1, True, 1.5])
def test_a_bad_total_is_refused(total: object) -> None:
    with pytest.raises(ValueError, match="total"):
        TaskLedger(total, ["a"])  # type: ignore[arg-type]
