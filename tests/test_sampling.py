"""The shared sampling kernels: successive weighted sampling without replacement, recency weights.

The SumTree has its own file, tests/test_sumtree.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from replaystore.sampling import recency_weights, weighted_sample_without_replacement


def test_recency_weights_oldest_first() -> None:
    np.testing.assert_allclose(recency_weights(4, 2.0), [1, 4, 9, 16])
    np.testing.assert_allclose(recency_weights(3, 0.0), [1, 1, 1])


def _successive_inclusion_probabilities(w: np.ndarray, k: int) -> np.ndarray:
    """Exact inclusion probabilities of successive sampling, by enumerating orders."""
    from itertools import permutations

    n = w.size
    incl = np.zeros(n)
    for order in permutations(range(n), k):
        p, left = 1.0, w.sum()
        for i in order:
            p *= w[i] / left
            left -= w[i]
        incl[list(order)] += p
    return incl


@pytest.mark.parametrize("method", ["keys", "rejection"])
def test_without_replacement_matches_successive_sampling(method: str) -> None:
    w = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    k = 2
    expected = _successive_inclusion_probabilities(w, k)
    rng = np.random.default_rng(123)
    trials = 40_000
    counts = np.zeros(w.size)
    firsts = np.zeros(w.size)
    for _ in range(trials):
        pick = weighted_sample_without_replacement(w, k, rng, method=method)
        assert len(set(pick.tolist())) == k
        counts[pick] += 1
        firsts[pick[0]] += 1
    _, p_incl = stats.chisquare(counts, expected * trials)
    _, p_first = stats.chisquare(firsts, w / w.sum() * trials)
    assert p_incl > 1e-3
    assert p_first > 1e-3


def test_without_replacement_never_picks_zero_weight_and_checks_k() -> None:
    w = np.array([0.0, 1.0, 0.0, 1.0])
    pick = weighted_sample_without_replacement(w, 2, rng=0)
    assert sorted(pick.tolist()) == [1, 3]
    with pytest.raises(ValueError, match="only 2 have positive weight"):
        weighted_sample_without_replacement(w, 3, rng=0)
    with pytest.raises(ValueError, match=">= 0"):
        weighted_sample_without_replacement([-1.0, 1.0], 1, rng=0)


def test_without_replacement_is_seeded() -> None:
    w = recency_weights(1000, 2.0)
    a = weighted_sample_without_replacement(w, 100, rng=7)
    b = weighted_sample_without_replacement(w, 100, rng=7)
    np.testing.assert_array_equal(a, b)
