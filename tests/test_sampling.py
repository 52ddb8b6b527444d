"""The shared sampling kernels: successive weighted sampling without replacement, recency weights.

The SumTree has its own file, tests/test_sumtree.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from replaystore import sampling
from replaystore.sampling import (
    AliasTable,
    _draw_recency,
    recency_sample_without_replacement,
    recency_weights,
    weighted_sample_without_replacement,
)


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


# ------------------------------------------------------------------ AliasTable (prepared weights)


def _implied_probabilities(table: AliasTable) -> np.ndarray:
    """What a table draws, exactly: own-bucket mass plus the mass aliased to each item."""
    implied = table.probability.copy()
    np.add.at(implied, table.alias, 1.0 - table.probability)
    return implied / table.n


@pytest.mark.parametrize(
    "weights",
    [
        np.array([1.0, 2.0, 3.0, 4.0, 10.0]),
        np.array([1.0, 1.0, 0.0, 0.0, 1.0]),  # p = 1 items and zeros
        np.array([7.0]),
        np.array([100.0] + [1.0] * 11),  # one dominant item feeds every bucket
        np.random.default_rng(3).random(1000) ** 4,
        recency_weights(10_000, 2.0),
        recency_weights(10_000, -0.5),
    ],
)
def test_alias_table_encodes_the_weights_exactly(weights: np.ndarray) -> None:
    table = AliasTable(weights)
    np.testing.assert_allclose(
        _implied_probabilities(table), weights / weights.sum(), rtol=1e-9, atol=1e-15
    )
    assert ((table.probability >= 0) & (table.probability <= 1)).all()
    assert (table.probability[weights == 0] == 0).all()


def test_alias_table_draws_follow_the_weights() -> None:
    w = np.random.default_rng(1).random(40) + 0.05
    draws = AliasTable(w).draw(400_000, rng=2)
    _, p_value = stats.chisquare(np.bincount(draws, minlength=40), w / w.sum() * draws.size)
    assert p_value > 1e-3


def test_alias_table_rejects_bad_weights() -> None:
    for bad, message in [([], "at least one"), ([1.0, np.inf], "finite"), ([-1.0], ">= 0"),
                         ([0.0, 0.0], "positive sum")]:  # fmt: skip
        with pytest.raises(ValueError, match=message):
            AliasTable(bad)


def test_prepared_table_matches_successive_sampling() -> None:
    w = np.array([1.0, 2.0, 3.0, 4.0, 10.0, 0.5, 6.0, 2.5])
    table = AliasTable(w)
    k, trials = 2, 30_000
    expected = _successive_inclusion_probabilities(w, k)
    rng = np.random.default_rng(11)
    counts = np.zeros(w.size)
    firsts = np.zeros(w.size)
    for _ in range(trials):
        pick = weighted_sample_without_replacement(table, k, rng, method="rejection")
        assert pick[0] != pick[1]
        counts[pick] += 1
        firsts[pick[0]] += 1
    _, p_incl = stats.chisquare(counts, expected * trials)
    _, p_first = stats.chisquare(firsts, w / w.sum() * trials)
    assert p_incl > 1e-3
    assert p_first > 1e-3


def test_prepared_table_large_draw_matches_numpy_choice() -> None:
    # 100 of 2,000 at power 2: inclusion per decile against numpy's own sampler.
    n, k, trials = 2000, 100, 300
    w = recency_weights(n, 2.0)
    table = AliasTable(w)
    rng = np.random.default_rng(4)
    ours = np.zeros(10)
    numpy = np.zeros(10)
    for _ in range(trials):
        ours += np.bincount(weighted_sample_without_replacement(table, k, rng) // 200, minlength=10)
        numpy += np.bincount(rng.choice(n, k, replace=False, p=w / w.sum()) // 200, minlength=10)
    _, p_value, _, _ = stats.chi2_contingency(np.vstack([ours, numpy]))
    assert p_value > 1e-3


def test_prepared_table_finishes_a_stalled_stream_and_checks_k() -> None:
    # Nearly all mass on one item: the with-replacement stream stalls after it is
    # taken; the remainder still comes out distinct, from positive weights only.
    w = np.array([1e12] + [1.0] * 99 + [0.0] * 20)
    table = AliasTable(w)
    pick = weighted_sample_without_replacement(table, 60, rng=0, method="rejection")
    assert len(set(pick.tolist())) == 60
    assert pick[0] == 0
    assert pick.max() < 100
    with pytest.raises(ValueError, match="only 100 have positive weight"):
        weighted_sample_without_replacement(table, 101, rng=0)
    with pytest.raises(ValueError, match="non-negative integer"):
        weighted_sample_without_replacement(table, -1, rng=0)


def test_prepared_table_is_seeded_and_reusable() -> None:
    table = AliasTable(recency_weights(5000, 2.0))
    a = weighted_sample_without_replacement(table, 500, rng=3)
    b = weighted_sample_without_replacement(table, 500, rng=3)
    c = weighted_sample_without_replacement(table, 500, rng=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert len(np.unique(a)) == 500


# ------------------------------------------------------------------ recency, no table


@pytest.mark.parametrize("power", [0.5, 2.0, 7.5])
def test_recency_draws_follow_the_discrete_weights(power: float) -> None:
    n, m = 12, 200_000
    draws = _draw_recency(m, n, power, np.random.default_rng(11))
    assert draws.dtype == np.int64 and draws.min() >= 0 and draws.max() < n
    w = recency_weights(n, power)
    _, p_value = stats.chisquare(np.bincount(draws, minlength=n), w / w.sum() * m)
    assert p_value > 1e-3


@pytest.mark.parametrize(("n", "k", "power"), [(9, 2, 2.0), (9, 2, 0.5), (5, 3, 2.0)])
def test_recency_sample_matches_successive_sampling(n: int, k: int, power: float) -> None:
    # (9, 2): the rejection stream; (5, 3): k over a quarter of n, Efraimidis-Spirakis keys.
    w = recency_weights(n, power)
    expected = _successive_inclusion_probabilities(w, k)
    rng = np.random.default_rng(99)
    trials = 20_000
    counts = np.zeros(n)
    firsts = np.zeros(n)
    for _ in range(trials):
        pick = recency_sample_without_replacement(n, k, power, rng)
        assert len(set(pick.tolist())) == k
        counts[pick] += 1
        firsts[pick[0]] += 1
    _, p_incl = stats.chisquare(counts, expected * trials)
    _, p_first = stats.chisquare(firsts, w / w.sum() * trials)
    assert p_incl > 1e-3
    assert p_first > 1e-3


def test_recency_sample_finishes_a_stalled_stream_like_the_table() -> None:
    # Power 12 over 200 items, 40 drawn: the stream keeps hitting the newest,
    # already taken ranks and the keys finish the draw; compare with the table path.
    n, k, power, trials = 200, 40, 12.0, 300
    table = AliasTable(recency_weights(n, power))
    rng = np.random.default_rng(5)
    ours = np.zeros(n // 10)
    theirs = np.zeros(n // 10)
    for _ in range(trials):
        ours += np.bincount(
            recency_sample_without_replacement(n, k, power, rng) // 10, minlength=20
        )
        theirs += np.bincount(
            weighted_sample_without_replacement(table, k, rng) // 10, minlength=20
        )
    used = (ours + theirs) > 0
    _, p_value, _, _ = stats.chi2_contingency(np.vstack([ours[used], theirs[used]]))
    assert p_value > 1e-3


def test_recency_sample_with_a_huge_power_takes_the_newest_without_overflow() -> None:
    pick = recency_sample_without_replacement(1000, 10, 5000.0, rng=0)
    assert sorted(pick.tolist()) == list(range(990, 1000))
    with pytest.raises(ValueError, match="power"):
        recency_sample_without_replacement(10, 2, 0.0)
    with pytest.raises(ValueError, match="k must be"):
        recency_sample_without_replacement(10, 11, 2.0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 3000),
    share=st.floats(0.0, 1.0),
    power=st.floats(0.01, 40.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_recency_sample_is_k_distinct_ranks_and_seeded(
    n: int, share: float, power: float, seed: int
) -> None:
    k = int(share * n)
    pick = recency_sample_without_replacement(n, k, power, rng=seed)
    assert pick.dtype == np.int64 and pick.shape == (k,)
    assert np.unique(pick).size == k and (k == 0 or (pick.min() >= 0 and pick.max() < n))
    np.testing.assert_array_equal(pick, recency_sample_without_replacement(n, k, power, seed))


# ------------------------------------------------------------------ recency, compiled kernel

needs_recency_kernel = pytest.mark.skipif(
    sampling._crecency is None, reason="replaystore._recency is not built (no C compiler)"
)


@needs_recency_kernel
@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 50_000),
    share=st.floats(0.0, 0.6),
    power=st.one_of(st.just(2.0), st.floats(0.01, 40.0)),
    seed=st.integers(0, 2**32 - 1),
)
def test_compiled_recency_sampling_is_the_numpy_path(
    n: int, share: float, power: float, seed: int
) -> None:
    # The same ranks, in the same order, from the same seed: the kernel repeats
    # the NumPy path's arithmetic and its rounds (the byte mask is stamped per
    # call, so calls of different sizes in a row agree too).
    k = int(share * n)
    ours = recency_sample_without_replacement(n, k, power, rng=seed, backend="c")
    simple = recency_sample_without_replacement(n, k, power, rng=seed, backend="numpy")
    np.testing.assert_array_equal(ours, simple)


@needs_recency_kernel
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 10**9),
    m=st.integers(0, 5000),
    power=st.one_of(st.just(2.0), st.floats(0.01, 60.0)),
    seed=st.integers(0, 2**32 - 1),
)
def test_compiled_recency_draws_are_the_numpy_draws(
    n: int, m: int, power: float, seed: int
) -> None:
    kernel = sampling._crecency
    drawn = _draw_recency(m, n, power, np.random.default_rng(seed), kernel)
    expected = _draw_recency(m, n, power, np.random.default_rng(seed), None)
    np.testing.assert_array_equal(drawn, expected)


@needs_recency_kernel
def test_compiled_recency_first_new_skips_taken_ranks_and_stops_at_need() -> None:
    kernel = sampling._crecency
    mask = np.zeros(10, dtype=np.uint8)
    mask[3] = 2  # taken in this draw (stamp 2)
    mask[5] = 1  # taken in an earlier draw: untaken now
    out = np.full(4, -1, dtype=np.int64)
    draws = np.array([5, 3, 5, 1, 7, 1, 9, 2], dtype=np.int64)
    assert kernel.first_new(draws, mask, 3, out, 2) == 3
    assert out[:3].tolist() == [5, 1, 7]
    assert np.flatnonzero(mask == 2).tolist() == [1, 3, 5, 7]
    with pytest.raises(ValueError, match="stamp"):
        kernel.first_new(draws, mask, 3, out, 0)


@needs_recency_kernel
def test_compiled_recency_mask_stamps_wrap_around() -> None:
    # 300 draws in a row on one thread: the stamps run out and the mask is reset.
    for seed in range(300):
        ours = recency_sample_without_replacement(50, 10, 3.0, rng=seed, backend="c")
        simple = recency_sample_without_replacement(50, 10, 3.0, rng=seed, backend="numpy")
        np.testing.assert_array_equal(ours, simple)


@needs_recency_kernel
def test_compiled_recency_kernel_refuses_bad_arguments() -> None:
    kernel = sampling._crecency
    f = np.zeros(4)
    out = np.zeros(4, dtype=np.int64)
    with pytest.raises(TypeError, match="float64"):
        kernel.accept(f.astype(np.float32), f, 10, 2.0, out)
    with pytest.raises(TypeError, match="int64"):
        kernel.accept(f, f, 10, 2.0, out.astype(np.int32))
    with pytest.raises(ValueError, match="len"):
        kernel.accept(f, f[:3], 10, 2.0, out)
    with pytest.raises(ValueError, match="power"):
        kernel.accept(f, f, 10, float("nan"), out)
    with pytest.raises(ValueError, match=r"draws\[1\] is outside \[0, 4\)"):
        kernel.first_new(np.array([0, 4], dtype=np.int64), np.zeros(4, np.uint8), 2, out, 1)
    with pytest.raises(TypeError, match="uint8"):
        kernel.first_new(out, np.zeros(4, dtype=bool).view(np.int8), 2, out, 1)
    with pytest.raises(ValueError, match="need"):
        kernel.first_new(out, np.zeros(4, np.uint8), 5, out, 1)


def test_recency_backend_choice_is_checked(monkeypatch) -> None:
    with pytest.raises(ValueError, match="backend must be 'auto', 'c' or 'numpy'"):
        recency_sample_without_replacement(10, 2, 2.0, 0, backend="fortran")
    monkeypatch.setattr(sampling, "_crecency", None)
    with pytest.raises(ImportError, match="backend='c'"):
        recency_sample_without_replacement(10, 2, 2.0, 0, backend="c")
    pick = recency_sample_without_replacement(10, 2, 2.0, 0, backend="numpy")
    assert np.unique(pick).size == 2
