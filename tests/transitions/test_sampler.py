"""The sampler part on its own: epoch schedules hand out each position once per epoch."""

from __future__ import annotations

import torch

from replaystore.transitions.sampler import BatchGatherer, EpochSchedule

CPU = torch.device("cpu")


def _drain(schedule: EpochSchedule, size: int, sampler: BatchGatherer) -> list[list[int]]:
    batches = []
    while (idx := schedule.next_indices(size, sampler)) is not None:
        batches.append(idx.tolist())
    return batches


def test_schedule_hands_out_every_position_once_per_epoch_then_is_exhausted() -> None:
    sampler = BatchGatherer(CPU, CPU, seed=0)
    schedule = EpochSchedule(batch_size=4, n_epochs=3, shuffle=True, drop_last=False)
    batches = _drain(schedule, 10, sampler)
    assert [len(b) for b in batches] == [4, 4, 2] * 3
    for e in range(3):
        assert sorted(i for b in batches[3 * e : 3 * e + 3] for i in b) == list(range(10))
    assert schedule.exhausted
    assert schedule.next_indices(10, sampler) is None  # stays exhausted


def test_schedule_with_drop_last_skips_partial_batches_and_empty_epochs() -> None:
    sampler = BatchGatherer(CPU, CPU, seed=0)
    schedule = EpochSchedule(batch_size=4, n_epochs=2, shuffle=False, drop_last=True)
    assert _drain(schedule, 10, sampler) == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    too_few = EpochSchedule(batch_size=4, n_epochs=5, shuffle=True, drop_last=True)
    assert _drain(too_few, 3, sampler) == [] and too_few.exhausted


def test_an_epoch_permutes_the_items_stored_when_it_starts() -> None:
    sampler = BatchGatherer(CPU, CPU, seed=0)
    schedule = EpochSchedule(batch_size=5, n_epochs=2, shuffle=True, drop_last=False)
    first = schedule.next_indices(5, sampler)  # epoch 1 over 5 items
    assert first is not None and sorted(first.tolist()) == list(range(5))
    second = _drain(schedule, 8, sampler)  # epoch 2 starts with 8 items stored
    assert sorted(i for b in second for i in b) == list(range(8))


def test_same_seed_gives_the_same_schedule() -> None:
    runs = []
    for _ in range(2):
        sampler = BatchGatherer(CPU, CPU, seed=7)
        runs.append(_drain(EpochSchedule(3, 2, shuffle=True, drop_last=False), 9, sampler))
    assert runs[0] == runs[1]
