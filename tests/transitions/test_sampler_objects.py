"""Samplers as objects: the Sampler protocol, a user's own sampler, checkpoints of sampler state,
and the public priority readers (``priorities_at``, ``priority_stats``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from numpy.typing import NDArray

from replaystore.errors import ArgumentError, BufferIndexError, CheckpointError, PriorityError
from replaystore.transitions import (
    Draw,
    PrioritizedSampler,
    ReplayBuffer,
    RingState,
    Sampler,
    SliceSampler,
    UniformSampler,
)

from .conftest import batch, ids_of, transition


class NewestFirst:
    """A user's sampler: the newest ``batch_size`` items, newest first; keeps a priority log."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int]] = []
        self.updates: list[tuple[list[int], list[float]]] = []
        self.capacity = 0

    def reset(self, capacity: int) -> None:
        self.capacity = capacity
        self.writes = []

    def on_write(self, start: int, count: int) -> None:
        self.writes.append((start, count))

    def sample(self, batch_size: int, ring: RingState, rng: np.random.Generator) -> Draw:
        newest = (ring.pointer - 1 - np.arange(batch_size)) % ring.capacity
        return Draw(newest, {"rank": np.arange(batch_size)})

    def update_priorities(self, index: NDArray[np.int64], priority: NDArray[np.float64]) -> None:
        self.updates.append((index.tolist(), priority.tolist()))


def test_the_built_in_samplers_and_a_users_satisfy_the_protocol() -> None:
    for obj in (UniformSampler(), PrioritizedSampler(), SliceSampler(4), NewestFirst()):
        assert isinstance(obj, Sampler)
    assert not isinstance(object(), Sampler)


def test_a_users_sampler_plugs_in(make_buffer) -> None:
    user = NewestFirst()
    buf = make_buffer(8, sampler=user)
    assert buf.sampler == "NewestFirst" and buf.sampler_object is user and user.capacity == 8
    buf.add_batch(batch(range(5)))
    buf.add(transition(5))
    buf.add(transition(6))
    assert user.writes == [(0, 5), (5, 1), (6, 1)]
    out = buf.sample_batch(3)
    assert ids_of(out).tolist() == [6, 5, 4]
    assert out["index"].tolist() == [6, 5, 4] and out["rank"].tolist() == [0, 1, 2]
    buf.update_priorities(out["index"], [1.0, 2.0, 3.0])
    assert user.updates == [([6, 5, 4], [1.0, 2.0, 3.0])]
    with pytest.raises(PriorityError):  # validated before the sampler sees it
        buf.update_priorities([0], [-1.0])
    buf.reset()
    assert user.writes == []


def test_a_users_sampler_sees_the_ring_wrap(make_buffer) -> None:
    user = NewestFirst()
    buf = make_buffer(4, sampler=user)
    buf.add_batch(batch(range(6)))
    assert user.writes == [(2, 4)]  # the newest 4 of 6, oldest first
    assert ids_of(buf.sample_batch(4)).tolist() == [5, 4, 3, 2]


def test_a_draw_outside_the_stored_items_is_refused(make_buffer) -> None:
    class Bad(NewestFirst):
        def sample(self, batch_size, ring, rng):
            return Draw(np.array([ring.size]))

    buf = make_buffer(8, sampler=Bad())
    buf.add_batch(batch(range(3)))
    with pytest.raises(BufferIndexError, match="index 3 is out of range"):
        buf.sample_batch(1)


def test_sampler_strings_keep_working_and_bad_ones_are_named() -> None:
    assert ReplayBuffer("cpu", "cpu", 4, sampler="uniform").sampler == "uniform"
    prio = ReplayBuffer("cpu", "cpu", 4, sampler="prioritized", alpha=0.5)
    assert prio.sampler == "prioritized"
    assert isinstance(prio.sampler_object, PrioritizedSampler)
    assert prio.sampler_object.alpha == 0.5
    with pytest.raises(ArgumentError, match="sampler"):
        ReplayBuffer("cpu", "cpu", 4, sampler="slices")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="a Sampler object"):
        ReplayBuffer("cpu", "cpu", 4, sampler=object())  # type: ignore[arg-type]


def test_one_sampler_object_serves_one_buffer(make_buffer) -> None:
    shared = SliceSampler(4)
    first = make_buffer(10, sampler=shared)
    with pytest.raises(ArgumentError, match="already serves another ReplayBuffer"):
        make_buffer(10, sampler=shared)
    first.reset()  # the owner itself may reset it
    assert first.sampler_object is shared


def test_a_flat_minus_one_is_not_padding(make_buffer) -> None:
    buf = make_buffer(10, sampler=SliceSampler(2, prioritized=True))
    buf.add_batch(episodes(6))
    with pytest.raises(BufferIndexError, match="index -1 is out of range"):
        buf.update_priorities([0, -1], [1.0, 1.0])
    buf.update_priorities([[0, -1]], [[2.0, 5.0]])  # the padding of a [S, L] index
    np.testing.assert_allclose(buf.priorities_at([0]), [(2.0 + 1e-6) ** 0.6])


def test_a_prioritized_sampler_object_equals_the_string_form(make_buffer) -> None:
    a = make_buffer(16, sampler="prioritized", alpha=0.7, beta=0.3, seed=9)
    b = make_buffer(16, sampler=PrioritizedSampler(alpha=0.7, beta=0.3), seed=9)
    for buf in (a, b):
        buf.add_batch(batch(range(20)))
        buf.update_priorities(range(8), np.arange(8.0))
    x, y = a.sample_batch(64), b.sample_batch(64)
    assert torch.equal(x["index"], y["index"]) and torch.equal(x["weight"], y["weight"])
    b.beta = 0.9
    assert b.sampler_object.beta == 0.9


# ------------------------------------------------------------- priorities_at


def test_priorities_at_reads_the_stored_priorities_of_given_positions(make_buffer) -> None:
    buf = make_buffer(10, sampler="prioritized", alpha=0.5, eps=0.01)
    buf.add_batch(batch(range(6)))
    buf.update_priorities([1, 4], [3.0, 8.0])
    np.testing.assert_allclose(buf.priorities_at([4, 1, 0]), [8.01**0.5, 3.01**0.5, 1.0])
    got = buf.priorities_at(torch.tensor([[1, 4], [0, 1]]))
    assert got.shape == (2, 2)
    np.testing.assert_allclose(got, buf.priorities()[[[1, 4], [0, 1]]])
    total, minimum = buf.priority_stats()
    assert total == pytest.approx(buf.priorities().sum()) and minimum == 1.0
    with pytest.raises(BufferIndexError, match="index 6 is out of range"):
        buf.priorities_at([6])


def test_priorities_at_on_a_uniform_buffer_says_what_is_needed(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(3)))
    with pytest.raises(PriorityError, match="priorities_at needs a buffer created with"):
        buf.priorities_at([0])


# --------------------------------------------------------------- checkpoints


def episodes(n: int) -> dict[str, np.ndarray]:
    ids = np.arange(n)
    return {"obs": ids.astype(np.float32), "done": ids % 7 == 6}


@pytest.mark.parametrize(
    "make_sampler",
    [
        UniformSampler,
        lambda: PrioritizedSampler(alpha=0.8, beta=0.3),
        lambda: SliceSampler(3, prioritized=True, eta=0.7),
        lambda: SliceSampler(3, strict=False),
    ],
    ids=["uniform", "prioritized", "slice-prioritized", "slice-loose"],
)
def test_checkpoints_restore_a_built_in_samplers_state_exactly(
    make_buffer, ckpt: Path, make_sampler
) -> None:
    src = make_buffer(40, sampler=make_sampler(), seed=11)
    src.add_batch(episodes(55))  # wrapped
    if src.sampler_object.prioritized:
        src.update_priorities(np.arange(0, 40, 3), np.linspace(0.1, 5, 14))
    src.sample_batch(12)
    src.save(ckpt)
    dst = make_buffer(40, sampler=make_sampler(), seed=99)
    dst.load(ckpt)
    if src.sampler_object.prioritized:
        np.testing.assert_array_equal(dst.priorities(), src.priorities())
        assert dst.sampler_object.max_priority == src.sampler_object.max_priority
    for _ in range(3):  # same RNG, same priorities: the same draws
        a, b = src.sample_batch(12), dst.sample_batch(12)
        assert a.batch_size == b.batch_size
        for key in a.keys():  # noqa: SIM118 (a TensorDict)
            assert torch.equal(a[key], b[key]), key
    src.add_batch(episodes(9))
    dst.add_batch(episodes(9))
    a, b = src.sample_batch(12), dst.sample_batch(12)
    assert torch.equal(a["obs"], b["obs"])


def test_a_checkpoint_records_the_sampler_settings(make_buffer, ckpt: Path) -> None:
    buf = make_buffer(20, sampler=SliceSampler(4, end_key="done", prioritized=True))
    buf.add_batch(episodes(20))
    buf.save(ckpt)
    meta = json.loads(ckpt.with_name("buffer.metadata").read_text())
    sampler = meta["sampler"]
    assert sampler["kind"] == "slice" and sampler["slice_len"] == 4
    assert sampler["prioritized"] is True and sampler["eta"] == 0.9
    assert sampler["priorities"]["file"] == "priorities.bin"


def test_a_checkpoint_of_an_unknown_sampler_is_refused(make_buffer, ckpt: Path) -> None:
    buf = make_buffer(20)
    buf.add_batch(batch(range(5)))
    buf.save(ckpt)
    meta_path = ckpt.with_name("buffer.metadata")
    meta = json.loads(meta_path.read_text())
    meta["sampler"] = {"kind": "reservoir"}
    meta_path.write_text(json.dumps(meta))
    other = make_buffer(20)
    with pytest.raises(CheckpointError, match=r"sampler replaystore does not know \('reservoir'"):
        other.load(ckpt)
    assert other.size == 0  # nothing changed


def test_a_checkpoint_of_a_users_sampler_names_its_class(make_buffer, ckpt: Path) -> None:
    buf = make_buffer(20, sampler=NewestFirst())
    buf.add_batch(batch(range(5)))
    buf.save(ckpt)
    with pytest.raises(CheckpointError, match=r"test_sampler_objects\.NewestFirst"):
        make_buffer(20).load(ckpt)


def test_a_checkpoint_cannot_restore_into_a_users_sampler(make_buffer, ckpt: Path) -> None:
    buf = make_buffer(20)
    buf.add_batch(batch(range(5)))
    buf.save(ckpt)
    with pytest.raises(CheckpointError, match="NewestFirst is not a built-in one"):
        make_buffer(20, sampler=NewestFirst()).load(ckpt)


def test_memmap_reopen_restores_slice_priorities(tmp_path: Path) -> None:
    def open_buffer() -> ReplayBuffer:
        return ReplayBuffer(
            "cpu", "cpu", 30, path=tmp_path / "ring", sampler=SliceSampler(2, prioritized=True)
        )

    buf = open_buffer()
    buf.add_batch(episodes(30))
    buf.update_priorities([0, 1, 2], [4.0, 5.0, 6.0])
    buf.flush()
    before = buf.priorities()
    buf.close()
    again = open_buffer()
    np.testing.assert_array_equal(again.priorities(), before)
    assert again.sample_batch(8).batch_size == torch.Size([4, 2])
    again.close()
