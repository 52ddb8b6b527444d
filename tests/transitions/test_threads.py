"""Threads sharing one buffer: whole transitions only, and every thread finishes its work.

Every test does a fixed amount of work in each thread and then joins them; no
outcome depends on how fast the machine is or how the threads are scheduled
(the join timeout only turns a deadlock into a failure).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch

from replaystore.transitions import ReplayBuffer

CONST = 3.0
CAPACITY = 512
JOIN_S = 120  # deadlock guard only
STEPS = 5000  # writer steps: a single add, or a batch of 100 every 7th


def _row(i: int) -> dict[str, object]:
    return {"obs": np.full(64, i * CONST, np.float32), "action": i}


def _rows(first: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(first, first + n)
    obs = np.repeat((ids * CONST).astype(np.float32)[:, None], 64, axis=1)
    return {"obs": obs, "action": ids}


def _run(*targets: Callable[[], None]) -> list[BaseException]:
    """Run every target in its own thread, released together; the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(targets))

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                start.wait(JOIN_S)
                target()
            except BaseException as exc:
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
        assert not t.is_alive(), "a thread did not finish (deadlock)"
    return errors


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_concurrent_writer_and_sampler_see_consistent_rows(storage_kind: str, sampler: str) -> None:
    """A writer adds a fixed sequence (single adds and wrapping batches) while a
    sampler draws a fixed number of batches: every sampled row is one whole
    transition, and afterwards the ring holds exactly the newest items."""
    buf = ReplayBuffer("cpu", "cpu", CAPACITY, storage=storage_kind, sampler=sampler, seed=0)
    buf.add(_row(0))
    n_samples = 300
    sampled = [0]

    def writer() -> None:
        i = 1
        for step in range(1, STEPS + 1):
            if step % 7 == 0:  # batches that wrap around the ring
                buf.add_batch(_rows(i, 100))
                i += 100
            else:
                buf.add(_row(i))
                i += 1

    def sampler_loop() -> None:
        for _ in range(n_samples):
            out = buf.sample_batch(64)
            expected = (out["action"].to(torch.float64)[:, None] * CONST).to(torch.float32)
            if not torch.equal(out["obs"], expected.expand(-1, 64)):
                raise AssertionError("a sampled row mixes two transitions")
            if sampler == "prioritized":
                buf.update_priorities(out["index"], torch.rand(64))
            sampled[0] += 1

    errors = _run(writer, sampler_loop)
    assert not errors, errors[0]
    assert sampled[0] == n_samples
    # id 0, then STEPS - STEPS // 7 single adds and STEPS // 7 batches of 100.
    last = (STEPS - STEPS // 7) + 100 * (STEPS // 7)
    held = buf.sample_all(chronological=True)
    np.testing.assert_array_equal(held["action"].numpy(), np.arange(last - CAPACITY + 1, last + 1))
    buf.close()


def test_two_samplers_and_a_writer_each_finish_their_work(storage_kind: str) -> None:
    buf = ReplayBuffer("cpu", "cpu", CAPACITY, storage=storage_kind, seed=1)
    buf.add_batch(_rows(0, CAPACITY))
    counts = [0, 0]

    def writer() -> None:
        for i in range(CAPACITY, CAPACITY + 2000):
            buf.add(_row(i))

    def sampler_loop(k: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(150):
                out = buf.sample_batch(32)
                expected = (out["action"].to(torch.float64)[:, None] * CONST).to(torch.float32)
                assert torch.equal(out["obs"], expected.expand(-1, 64))
                counts[k] += 1

        return run

    errors = _run(writer, sampler_loop(0), sampler_loop(1))
    assert not errors, errors[0]
    assert counts == [150, 150]
    assert len(buf) == CAPACITY
    buf.close()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_cpu_sample_batch_makes_no_torch_call_that_releases_the_gil(
    storage_kind: str, sampler: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CPU storage sample_batch draws and gathers with NumPy: torch.randint and
    index_select (each gives up the GIL, which a busy writer thread then keeps)
    are never called, and the rows are still whole transitions."""
    buf = ReplayBuffer("cpu", "cpu", CAPACITY, storage=storage_kind, sampler=sampler, seed=0)
    buf.add_batch(_rows(0, CAPACITY))

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("sample_batch called a torch op that releases the GIL")

    monkeypatch.setattr(torch, "randint", forbidden)
    monkeypatch.setattr(torch.Tensor, "index_select", forbidden)
    out = buf.sample_batch(64)
    assert out.batch_size == torch.Size([64])
    expected = (out["action"].to(torch.float64)[:, None] * CONST).to(torch.float32)
    assert torch.equal(out["obs"], expected.expand(-1, 64))
    if sampler == "prioritized":
        assert torch.equal(out["action"], out["index"])  # row i holds id i
    buf.close()


def test_columns_without_a_numpy_view_are_sampled_with_torch() -> None:
    """bfloat16 has no NumPy dtype: such a buffer samples through index_select."""
    buf = ReplayBuffer("cpu", "cpu", 8, storage="memory", seed=0)
    ids = torch.arange(8)
    buf.add_batch({"x": ids.to(torch.bfloat16), "action": ids})
    out = buf.sample_batch(16)
    assert out["x"].dtype == torch.bfloat16
    assert torch.equal(out["x"].to(torch.int64), out["action"])
    buf.close()


def _epoch_batches(buf: ReplayBuffer, calls: int, batch_size: int) -> list[tuple[int, ...]]:
    return [tuple(buf.get_next_batch(batch_size)["action"].tolist()) for _ in range(calls)]


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_two_threads_calling_get_next_batch_share_the_epochs(
    storage_kind: str, sampler: str
) -> None:
    """Two trainer threads drawing from one epoch schedule: no error, and between
    them they get exactly the batches of the schedule (each stored item exactly
    once per epoch), each batch once, as one thread calling alone would."""
    n, batch_size, n_epochs = 96, 4, 40
    per_thread = n_epochs * (n // batch_size) // 2

    def make() -> ReplayBuffer:
        buf = ReplayBuffer("cpu", "cpu", n, storage=storage_kind, sampler=sampler, seed=3)
        buf.add_batch(_rows(0, n))
        assert buf.get_steps_and_iterator(n_epochs, 0, batch_size) == 2 * per_thread
        return buf

    reference = make()
    expected = _epoch_batches(reference, 2 * per_thread, batch_size)
    reference.close()
    for e in range(n_epochs):  # the schedule itself: a permutation per epoch
        epoch = expected[e * (n // batch_size) : (e + 1) * (n // batch_size)]
        assert sorted(i for b in epoch for i in b) == list(range(n))

    buf = make()
    got: list[list[tuple[int, ...]]] = [[], []]

    def trainer(k: int) -> Callable[[], None]:
        def run() -> None:
            got[k] = _epoch_batches(buf, per_thread, batch_size)

        return run

    errors = _run(trainer(0), trainer(1))
    assert not errors, errors[0]
    assert sorted(got[0] + got[1]) == sorted(expected)
    # Each thread's batches keep the schedule's order (an epoch is consumed front to back).
    for mine in got:
        positions = [expected.index(b) for b in mine]
        assert positions == sorted(positions)
    buf.close()


def test_an_epoch_iterator_shared_by_two_threads_yields_each_batch_once(storage_kind: str) -> None:
    n, batch_size = 64, 4
    buf = ReplayBuffer("cpu", "cpu", n, storage=storage_kind, seed=5)
    buf.add_batch(_rows(0, n))
    iterator = buf.create_epoch_iterator(batch_size, n_epochs=30)
    got: list[list[int]] = [[], []]

    def consumer(k: int) -> Callable[[], None]:
        def run() -> None:
            for td in iterator:
                got[k].extend(td["action"].tolist())

        return run

    errors = _run(consumer(0), consumer(1))
    assert not errors, errors[0]
    counts = np.bincount(np.array(got[0] + got[1]), minlength=n)
    assert counts.tolist() == [30] * n
    buf.close()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_four_trainers_and_a_random_sampler_share_epochs_under_load(sampler: str) -> None:
    """Four threads split 200 epochs between them while a fifth samples at
    random; every item is handed out exactly once per epoch, nothing raises."""
    n, batch_size, n_epochs, trainers = 256, 8, 200, 4
    buf = ReplayBuffer("cpu", "cpu", n, storage="memory", sampler=sampler, seed=11)
    buf.add_batch(_rows(0, n))
    steps = buf.get_steps_and_iterator(n_epochs, 0, batch_size)
    got: list[list[int]] = [[] for _ in range(trainers)]

    def trainer(k: int) -> Callable[[], None]:
        def run() -> None:
            for _ in range(steps // trainers):
                got[k].extend(buf.get_next_batch(batch_size)["action"].tolist())

        return run

    def random_sampler() -> None:
        for _ in range(2000):
            buf.sample_batch(32)

    errors = _run(*(trainer(k) for k in range(trainers)), random_sampler)
    assert not errors, errors[0]
    counts = np.bincount(np.concatenate([np.array(g) for g in got]), minlength=n)
    assert counts.tolist() == [n_epochs] * n
    buf.close()
