"""Epoch iteration and the training-loop helpers of the seed (epoch- and iteration-based)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from .conftest import batch, ids_of


def _epochs_of(iterator, n_epochs: int, per_epoch: int) -> list[list[int]]:
    batches = [ids_of(b).tolist() for b in iterator]
    flat = [i for b in batches for i in b]
    return [flat[e * per_epoch : (e + 1) * per_epoch] for e in range(n_epochs)]


def test_each_epoch_visits_every_item_exactly_once(make_buffer) -> None:
    buf = make_buffer(23)
    buf.add_batch(batch(range(23)))
    epochs = _epochs_of(buf.create_epoch_iterator(batch_size=5, n_epochs=3), 3, 23)
    for order in epochs:
        assert sorted(order) == list(range(23))


def test_shuffled_epochs_differ_and_last_batch_is_partial(make_buffer) -> None:
    buf = make_buffer(23)
    buf.add_batch(batch(range(23)))
    sizes = [b.batch_size[0] for b in buf.create_epoch_iterator(batch_size=5, n_epochs=2)]
    assert sizes == [5, 5, 5, 5, 3] * 2
    epochs = _epochs_of(buf.create_epoch_iterator(batch_size=5, n_epochs=2), 2, 23)
    assert epochs[0] != epochs[1]
    assert epochs[0] != list(range(23))


def test_same_seed_gives_the_same_epoch_order(make_buffer) -> None:
    orders = []
    for seed in (4, 4, 5):
        buf = make_buffer(30, seed=seed)
        buf.add_batch(batch(range(30)))
        orders.append(_epochs_of(buf.create_epoch_iterator(7, n_epochs=2), 2, 30))
    assert orders[0] == orders[1]
    assert orders[0] != orders[2]


def test_unshuffled_epochs_are_sequential(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    it = buf.create_epoch_iterator(batch_size=4, n_epochs=2, shuffle=False)
    assert [ids_of(b).tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] * 2


def test_drop_last_skips_the_partial_batch(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    it = buf.create_epoch_iterator(batch_size=4, shuffle=False, drop_last=True)
    assert [ids_of(b).tolist() for b in it] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_seed_epoch_example(make_buffer) -> None:
    buffer = make_buffer(1000)
    buffer.add_batch(batch(range(640)))
    seen = []
    iterator = buffer.create_epoch_iterator(batch_size=64, n_epochs=5)
    for b in iterator:  # train_step(batch)
        seen.append(b.batch_size[0])
    assert seen == [64] * 50


def test_calculate_num_batches_counts_full_batches(make_buffer) -> None:
    buf = make_buffer(100)
    buf.add_batch(batch(range(70)))
    assert buf.calculate_num_batches(64) == 1
    assert buf.calculate_num_batches(10) == 7
    assert buf.calculate_num_batches(71) == 0


def test_get_steps_and_iterator_with_epochs(make_buffer) -> None:
    buf = make_buffer(200)
    buf.add_batch(batch(range(150)))
    n_steps = buf.get_steps_and_iterator(n_epochs=10, max_iter=0, batch_size=64)
    assert n_steps == 10 * (150 // 64)
    per_epoch = []
    for step in range(n_steps):
        b = buf.get_next_batch(64)
        assert b.batch_size[0] == 64
        per_epoch.extend(ids_of(b).tolist())
        if step % 2 == 1:  # every epoch: two full batches of distinct items
            assert len(set(per_epoch)) == 128
            per_epoch = []


def test_get_steps_and_iterator_without_epochs_samples_randomly(make_buffer) -> None:
    buf = make_buffer(200, seed=11)
    buf.add_batch(batch(range(150)))
    buf.create_epoch_iterator(batch_size=8, shuffle=False)  # replaced below
    n_steps = buf.get_steps_and_iterator(n_epochs=0, max_iter=1, batch_size=64)
    assert n_steps == 1
    twin = make_buffer(200, seed=11)
    twin.add_batch(batch(range(150)))
    # No iterator: get_next_batch is sample_batch (same seed, same draws).
    assert ids_of(buf.get_next_batch(64)).tolist() == ids_of(twin.sample_batch(64)).tolist()


def test_get_next_batch_falls_back_to_random_when_exhausted(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    buf.create_epoch_iterator(batch_size=5, shuffle=False)
    assert ids_of(buf.get_next_batch(3)).tolist() == [0, 1, 2, 3, 4]
    assert ids_of(buf.get_next_batch(3)).tolist() == [5, 6, 7, 8, 9]
    fallback = buf.get_next_batch(3)  # exhausted: a random batch of the requested size
    assert fallback.batch_size == torch.Size([3])


def test_get_next_batch_without_iterator_samples(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    assert buf.get_next_batch(7).batch_size == torch.Size([7])


def test_get_steps_and_iterator_rejects_negative_epochs(make_buffer) -> None:
    buf = make_buffer(10)
    buf.add_batch(batch(range(10)))
    with pytest.raises(ValueError, match="n_epochs"):
        buf.get_steps_and_iterator(n_epochs=-1, max_iter=5, batch_size=4)


def test_prioritized_epoch_batches_have_unit_weights(make_buffer) -> None:
    buf = make_buffer(10, sampler="prioritized")
    buf.add_batch(batch(range(10)))
    b = next(iter(buf.create_epoch_iterator(batch_size=4, shuffle=False)))
    assert b["index"].tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(b["weight"].numpy(), np.ones(4, np.float32))
