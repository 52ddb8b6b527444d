"""The ring: wrap-around, batches larger than the capacity, the pointer."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replaystore.transitions import ReplayBuffer

from .conftest import batch, ids_of, transition


def test_capacity_keeps_most_recent_single_adds(make_buffer) -> None:
    buf = make_buffer(4)
    for i in range(11):
        buf.add(transition(i))
    assert ids_of(buf.sample_all(chronological=True)).tolist() == [7, 8, 9, 10]
    assert buf.pointer == 3


def test_batch_crossing_the_end_wraps_to_the_start(make_buffer) -> None:
    buf = make_buffer(5)
    buf.add_batch(batch(range(3)))
    buf.add_batch(batch(range(3, 7)))  # positions 3, 4, 0, 1
    assert ids_of(buf.sample_all()).tolist() == [5, 6, 2, 3, 4]
    assert buf.pointer == 2 and len(buf) == 5


def test_batch_larger_than_capacity_keeps_its_newest_items(make_buffer) -> None:
    buf = make_buffer(4)
    buf.add(transition(100))
    buf.add_batch(batch(range(10)))
    assert ids_of(buf.sample_all(chronological=True)).tolist() == [6, 7, 8, 9]
    # The same positions as ten single adds after one: pointer moved by 11.
    assert buf.pointer == 11 % 4


def test_batch_of_exactly_the_capacity_replaces_everything(make_buffer) -> None:
    buf = make_buffer(4)
    buf.add_batch(batch([50, 51]))
    buf.add_batch(batch(range(4)))
    assert ids_of(buf.sample_all(chronological=True)).tolist() == [0, 1, 2, 3]
    assert buf.pointer == 2


def test_empty_batch_changes_nothing(make_buffer) -> None:
    buf = make_buffer(4)
    buf.add_batch(batch(range(2)))
    buf.add_batch(batch([]))
    assert ids_of(buf.sample_all()).tolist() == [0, 1] and buf.pointer == 2


@pytest.mark.parametrize("kind", ["memory", "memmap"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    capacity=st.integers(1, 12),
    sizes=st.lists(st.integers(0, 30), min_size=1, max_size=8),
    single_every=st.integers(0, 3),
)
def test_ring_holds_exactly_the_last_items_in_order(
    kind: str, capacity: int, sizes: list[int], single_every: int
) -> None:
    with ReplayBuffer("cpu", "cpu", capacity, storage=kind, seed=0) as buf:
        total = 0
        for step, n in enumerate(sizes):
            if single_every and step % single_every == 0:
                buf.add(transition(total))
                total += 1
            buf.add_batch(batch(range(total, total + n)))
            total += n
        if total == 0:
            assert len(buf) == 0
            return
        kept = min(total, capacity)
        assert len(buf) == kept
        assert buf.pointer == total % capacity
        expected = np.arange(total - kept, total)
        assert ids_of(buf.sample_all(chronological=True)).tolist() == expected.tolist()
        # Storage position of item k is k % capacity.
        assert ids_of(buf.sample_all()).tolist() == sorted(expected, key=lambda k: k % capacity)
