"""FairLock: mutual exclusion, FIFO hand-over, no barging by the releasing thread.

Every test drives the threads with events and waits for states (a thread queued
on the lock), never for a time: the outcome cannot depend on machine speed.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from replaystore._fairlock import FairLock

JOIN_S = 60  # only a guard against a deadlock; a passing run takes milliseconds


def _wait_until(condition: Callable[[], bool]) -> None:
    """Block until ``condition()`` holds (the other threads only need to get scheduled).

    The deadline only turns a deadlock into a failure; no outcome depends on it.
    """
    deadline = time.monotonic() + JOIN_S
    while not condition():
        assert time.monotonic() < deadline, "a thread never reached the awaited state"
        time.sleep(0.0005)


def _start(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def _join(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(JOIN_S)
        assert not thread.is_alive(), "a thread is still blocked on the lock (deadlock)"


def test_uncontended_acquire_release_and_context_manager() -> None:
    lock = FairLock()
    assert not lock.locked()
    assert lock.acquire() is True
    assert lock.locked() and lock.waiting() == 0
    lock.release()
    assert not lock.locked()
    with lock:
        assert lock.locked()
    assert not lock.locked()


def test_release_of_an_unlocked_lock_is_an_error() -> None:
    lock = FairLock()
    with pytest.raises(RuntimeError):
        lock.release()


def test_waiting_threads_get_the_lock_in_arrival_order_before_the_releaser_again() -> None:
    """The releasing thread cannot take the lock back while others wait (no barging)."""
    lock = FairLock()
    order: list[str] = []

    def waiter(name: str) -> Callable[[], None]:
        def run() -> None:
            with lock:
                order.append(name)

        return run

    lock.acquire()
    threads = []
    for i, name in enumerate(["first", "second", "third"]):
        threads.append(_start(waiter(name)))
        _wait_until(lambda i=i: lock.waiting() == i + 1)  # queued in this order
    lock.release()
    for _ in range(3):  # the releaser comes straight back, as a writer in a loop does
        with lock:
            order.append("releaser")
    _join(*threads)
    assert order == ["first", "second", "third", "releaser", "releaser", "releaser"]


def test_hand_over_keeps_the_lock_held_for_the_next_owner() -> None:
    lock = FairLock()
    got_it = threading.Event()
    leave = threading.Event()

    def waiter() -> None:
        with lock:
            got_it.set()
            leave.wait(JOIN_S)

    lock.acquire()
    thread = _start(waiter)
    _wait_until(lambda: lock.waiting() == 1)
    lock.release()
    got_it.wait(JOIN_S)
    # Ownership moved to the waiter without the lock being free in between.
    assert lock.locked() and lock.waiting() == 0
    leave.set()
    _join(thread)
    assert not lock.locked()


@pytest.mark.parametrize("n_threads", [2, 4])
def test_mutual_exclusion_under_many_threads(n_threads: int) -> None:
    """A read-modify-write of a shared counter loses no update, and nobody deadlocks.

    ``time.sleep(0)`` inside the critical section gives up the GIL there, so
    without mutual exclusion another thread would run in the middle of it.
    """
    lock = FairLock()
    counter = [0]
    inside = [0]
    overlaps = [0]
    rounds = 500
    start = threading.Barrier(n_threads)

    def worker() -> None:
        start.wait(JOIN_S)
        for _ in range(rounds):
            with lock:
                inside[0] += 1
                if inside[0] != 1:
                    overlaps[0] += 1
                value = counter[0]
                time.sleep(0)
                counter[0] = value + 1
                inside[0] -= 1

    threads = [_start(worker) for _ in range(n_threads)]
    _join(*threads)
    assert overlaps[0] == 0
    assert counter[0] == n_threads * rounds
    assert not lock.locked() and lock.waiting() == 0
