"""Prioritized sampling: distribution, importance weights, validated updates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from replaystore.errors import BufferIndexError, PriorityError

from .conftest import batch, ids_of


def _filled(make_buffer, n: int = 8, **kwargs):
    buf = make_buffer(n, sampler="prioritized", **kwargs)
    buf.add_batch(batch(range(n)))
    return buf


def test_new_items_get_the_current_max_priority(make_buffer) -> None:
    buf = make_buffer(8, sampler="prioritized", alpha=1.0, eps=0.0 + 1e-6)
    buf.add_batch(batch(range(3)))
    np.testing.assert_allclose(buf.priorities(), [1.0, 1.0, 1.0])
    buf.update_priorities([0, 1], [4.0, 0.5])
    buf.add_batch(batch([3, 4]))
    np.testing.assert_allclose(buf.priorities(), [4.0, 0.5, 1.0, 4.0, 4.0], rtol=1e-5)


def test_samples_carry_index_and_weight_entries(make_buffer) -> None:
    buf = _filled(make_buffer)
    out = buf.sample_batch(16)
    assert out["index"].dtype == torch.int64 and out["weight"].dtype == torch.float32
    # The index entry names the storage position of each row.
    assert ids_of(out).tolist() == out["index"].tolist()


def test_sampling_frequencies_follow_priorities_to_the_alpha(make_buffer) -> None:
    alpha, eps = 0.6, 1e-6
    buf = _filled(make_buffer, 8, alpha=alpha, eps=eps, seed=123)
    raw = np.array([0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 0.5, 13.0])
    buf.update_priorities(np.arange(8), raw)
    draws = np.concatenate([buf.sample_batch(5000)["index"].numpy() for _ in range(10)])
    expected = (raw + eps) ** alpha
    expected = expected / expected.sum() * draws.size
    counts = np.bincount(draws, minlength=8)
    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_weights_are_normalised_importance_weights(make_buffer) -> None:
    alpha, beta, eps = 0.7, 0.5, 1e-6
    buf = _filled(make_buffer, 6, alpha=alpha, beta=beta, eps=eps)
    raw = np.array([0.1, 1.0, 2.0, 4.0, 0.0, 3.0])
    buf.update_priorities(range(6), raw)
    out = buf.sample_batch(200)
    p = (raw + eps) ** alpha
    prob = p / p.sum()
    w = (6 * prob) ** -beta
    expected = w[out["index"].numpy()] / w.max()
    np.testing.assert_allclose(out["weight"].numpy(), expected, rtol=1e-5)
    assert out["weight"].max() <= 1.0


def test_beta_can_be_annealed(make_buffer) -> None:
    buf = _filled(make_buffer, 4, alpha=1.0)
    buf.update_priorities(range(4), [1.0, 2.0, 3.0, 4.0])
    buf.beta = 0.0
    assert torch.all(buf.sample_batch(32)["weight"] == 1.0)
    buf.beta = 1.0
    out = buf.sample_batch(32)
    p = out["index"].numpy() + 1.0 + 1e-6
    np.testing.assert_allclose(out["weight"].numpy(), (1.0 + 1e-6) / p, rtol=1e-5)


def test_update_takes_effect_on_sampling(make_buffer) -> None:
    buf = _filled(make_buffer, 8)
    buf.update_priorities(range(8), [0.0] * 7 + [1e6])
    draws = buf.sample_batch(1000)["index"].numpy()
    assert (draws == 7).mean() > 0.99


def test_update_accepts_tensors(make_buffer) -> None:
    buf = _filled(make_buffer, 4, alpha=1.0)
    buf.update_priorities(torch.tensor([2, 3]), torch.tensor([5.0, 6.0], requires_grad=True))
    np.testing.assert_allclose(buf.priorities()[2:], [5.0, 6.0], rtol=1e-5)


@pytest.mark.parametrize(
    ("indices", "priorities", "error", "match"),
    [
        ([0, 1], [1.0, float("nan")], PriorityError, "index 1.*finite"),
        ([0, 1], [1.0, float("inf")], PriorityError, "finite"),
        ([2, 3], [-0.5, 1.0], PriorityError, "index 2.*>= 0"),
        ([0, 1], [1.0], PriorityError, "2 indices but 1"),
        ([0, 8], [1.0, 1.0], BufferIndexError, "index 8"),
        ([-1], [1.0], BufferIndexError, "index -1"),
        ([0, 5], [1.0, 1.0], BufferIndexError, "index 5.*stores 5"),  # not stored yet
        ([0.5], [1.0], BufferIndexError, "integers"),
    ],
)
def test_bad_updates_raise_and_change_nothing(
    make_buffer, indices, priorities, error, match: str
) -> None:
    buf = make_buffer(8, sampler="prioritized", seed=5)
    buf.add_batch(batch(range(5)))
    buf.update_priorities([0, 1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0, 5.0])
    before = buf.priorities()
    with pytest.raises(error, match=match):
        buf.update_priorities(indices, priorities)
    np.testing.assert_array_equal(buf.priorities(), before)


def test_update_priorities_on_a_uniform_buffer_raises(make_buffer) -> None:
    buf = make_buffer(4)
    buf.add_batch(batch(range(4)))
    with pytest.raises(PriorityError, match="prioritized"):
        buf.update_priorities([0], [1.0])


def test_prioritized_sampling_is_seeded(make_buffer) -> None:
    a = _filled(make_buffer, 8, seed=9)
    b = _filled(make_buffer, 8, seed=9)
    for buf in (a, b):
        buf.update_priorities(range(8), np.arange(8.0))
    assert a.sample_batch(50)["index"].tolist() == b.sample_batch(50)["index"].tolist()


def test_overwritten_items_start_again_at_max_priority(make_buffer) -> None:
    buf = make_buffer(4, sampler="prioritized", alpha=1.0)
    buf.add_batch(batch(range(4)))
    buf.update_priorities(range(4), [0.0, 0.0, 0.0, 0.0])
    buf.update_priorities([3], [2.0])
    buf.add_batch(batch([4, 5]))  # overwrite positions 0, 1
    np.testing.assert_allclose(buf.priorities(), [2.0, 2.0, 1e-6, 2.0], rtol=1e-5)
