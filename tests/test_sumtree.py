"""SumTree: proportional sampling and minimum over priorities, in both backends.

Every behaviour is checked against the compiled kernel and the NumPy fallback;
the last tests check that the two produce bit-identical trees and draws.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from replaystore import sampling
from replaystore.sampling import SumTree

HAS_KERNEL = sampling._csumtree is not None
BACKENDS = [
    pytest.param(
        "c",
        marks=pytest.mark.skipif(not HAS_KERNEL, reason="compiled SumTree kernel not built"),
    ),
    "numpy",
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.mark.parametrize("fanout", [2, 3, 32])
def test_total_and_min_follow_updates(backend: str, fanout: int) -> None:
    tree = SumTree(100, fanout=fanout, backend=backend)
    tree.update([0, 5, 99], [1.0, 2.5, 0.5])
    assert tree.total == pytest.approx(4.0)
    assert tree.min == pytest.approx(0.5)
    tree.update([99], [0.0])
    assert tree.total == pytest.approx(3.5)
    assert tree.min == pytest.approx(1.0)
    np.testing.assert_allclose(tree[[0, 5, 99]], [1.0, 2.5, 0.0])


def test_empty_tree_has_zero_total_and_infinite_min(backend: str) -> None:
    tree = SumTree(10, backend=backend)
    assert tree.total == 0.0
    assert tree.min == np.inf
    np.testing.assert_array_equal(tree.values(), np.zeros(10))


@pytest.mark.parametrize("fanout", [2, 32])
def test_find_maps_prefix_mass_to_slots(backend: str, fanout: int) -> None:
    tree = SumTree(10, fanout=fanout, backend=backend)
    tree.update(np.arange(10), np.arange(10, dtype=float))  # slot 0 has zero mass
    cum = np.cumsum(np.arange(10, dtype=float))
    mass = np.array([0.0, 0.999, 1.0, 2.5, 44.999, 45.0, 1e9])
    expected = np.minimum(np.searchsorted(cum, np.clip(mass, 0, 44.999), side="right"), 9)
    np.testing.assert_array_equal(tree.find(mass), expected)
    assert 0 not in tree.find(np.linspace(0, 45, 1000))


def test_find_of_no_values_is_empty(backend: str) -> None:
    tree = SumTree(8, backend=backend)
    tree.update([2], [1.0])
    assert tree.find([]).shape == (0,)
    assert tree.sample(0, rng=0).shape == (0,)


def test_find_of_nan_still_returns_a_slot_with_mass(backend: str) -> None:
    tree = SumTree(64, fanout=4, backend=backend)
    tree.update([0, 40, 41], [0.0, 1.0, 2.0])
    assert set(tree.find([np.nan, np.nan]).tolist()) <= {40, 41}


def test_find_clips_negative_mass_to_the_first_slot_with_mass(backend: str) -> None:
    tree = SumTree(8, fanout=2, backend=backend)
    tree.update([3, 6], [1.0, 1.0])
    np.testing.assert_array_equal(tree.find([-5.0, 0.0, 1.5, 99.0]), [3, 3, 6, 6])


@pytest.mark.parametrize(("capacity", "fanout"), [(1, 2), (33, 32), (1000, 32), (5000, 7)])
def test_find_agrees_with_searchsorted_over_the_cumulative_sum(
    backend: str, capacity: int, fanout: int
) -> None:
    rng = np.random.default_rng(capacity)
    # Small integers make every sum exact, so the slot owning each mass is unambiguous.
    pri = rng.integers(0, 4, capacity).astype(float)
    pri[rng.integers(capacity)] = 1.0
    tree = SumTree(capacity, fanout=fanout, backend=backend)
    tree.update(np.arange(capacity), pri)
    mass = rng.random(2000) * pri.sum()
    np.testing.assert_array_equal(tree.find(mass), np.searchsorted(np.cumsum(pri), mass, "right"))


def test_sampling_frequencies_match_priorities(backend: str) -> None:
    rng = np.random.default_rng(0)
    pri = rng.random(50) + 0.1
    tree = SumTree(50, backend=backend)
    tree.update(np.arange(50), pri)
    draws = tree.sample(200_000, rng=1)
    counts = np.bincount(draws, minlength=50)
    _, p_value = stats.chisquare(counts, pri / pri.sum() * draws.size)
    assert p_value > 1e-3


def test_zero_priority_slots_are_never_sampled(backend: str) -> None:
    rng = np.random.default_rng(3)
    pri = rng.random(4096) * (rng.random(4096) < 0.1)
    tree = SumTree(4096, fanout=8, backend=backend)
    tree.update(np.arange(4096), pri)
    draws = tree.sample(50_000, rng=4)
    assert (pri[draws] > 0).all()


def test_min_ignores_empty_slots_and_tracks_removals(backend: str) -> None:
    tree = SumTree(64, fanout=4, backend=backend)
    tree.update(np.arange(64), np.linspace(1.0, 64.0, 64))
    tree.update([0, 1], [0.0, 0.0])
    assert tree.min == 3.0
    tree.update(np.arange(64), 0.0)
    assert tree.min == np.inf
    assert tree.total == 0.0


def test_last_value_wins_for_repeated_indices(backend: str) -> None:
    tree = SumTree(16, fanout=2, backend=backend)
    tree.update([3, 7, 3, 3], [1.0, 2.0, 5.0, 0.25])
    np.testing.assert_array_equal(tree[[3, 7]], [0.25, 2.0])
    assert tree.total == 2.25
    assert tree.min == 0.25


def test_single_priority_applies_to_every_index(backend: str) -> None:
    tree = SumTree(10, backend=backend)
    tree.update(np.arange(0, 10, 2), 1.5)
    np.testing.assert_array_equal(tree.values(), np.tile([1.5, 0.0], 5))


def test_accepts_any_integer_index_type(backend: str) -> None:
    tree = SumTree(10, backend=backend)
    tree.update(np.array([[1], [2]], dtype=np.int32), np.array([1.0, 2.0], dtype=np.float32))
    tree.update(range(3, 5), [3, 4])
    np.testing.assert_array_equal(tree[np.array([1, 2, 3, 4], dtype=np.uint8)], [1, 2, 3, 4])
    assert tree[[]].shape == (0,)


def test_rejects_bad_updates_and_writes_nothing(backend: str) -> None:
    tree = SumTree(4, backend=backend)
    tree.update([0], [2.0])
    with pytest.raises(IndexError, match=r"index 4 out of range \[0, 4\)"):
        tree.update([1, 4], [1.0, 1.0])
    with pytest.raises(IndexError, match="index -1 out of range"):
        tree.update([-1], [1.0])
    with pytest.raises(ValueError, match="finite"):
        tree.update([1, 2], [1.0, np.nan])
    with pytest.raises(ValueError, match="finite"):
        tree.update([1], [np.inf])
    with pytest.raises(ValueError, match=r">= 0, found -3\.0"):
        tree.update([1, 2], [1.0, -3.0])
    with pytest.raises(ValueError, match="got 2 indices but 3 priorities"):
        tree.update([1, 2], [1.0, 1.0, 1.0])
    with pytest.raises(TypeError, match="must be integers"):
        tree.update([1.0], [1.0])
    np.testing.assert_array_equal(tree.values(), [2.0, 0.0, 0.0, 0.0])
    assert tree.total == 2.0


def test_getitem_validates_indices(backend: str) -> None:
    tree = SumTree(4, backend=backend)
    with pytest.raises(IndexError, match="index 9 out of range"):
        tree[[0, 9]]
    with pytest.raises(TypeError, match="must be integers"):
        tree[[0.5]]


def test_sampling_an_empty_tree_is_an_error(backend: str) -> None:
    tree = SumTree(4, backend=backend)
    with pytest.raises(ValueError, match="total priority is 0"):
        tree.sample(1)
    tree.update([2], [1.0])
    tree.update([2], [0.0])
    with pytest.raises(ValueError, match="total priority is 0"):
        tree.find([0.0])


def test_default_fanout_is_each_backends_fastest() -> None:
    assert SumTree(10, backend="numpy").fanout == 32
    if HAS_KERNEL:
        assert SumTree(10, backend="c").fanout == 8


def test_constructor_validates_arguments() -> None:
    with pytest.raises(ValueError, match="capacity"):
        SumTree(0)
    with pytest.raises(ValueError, match="fanout"):
        SumTree(10, fanout=1)
    with pytest.raises(ValueError, match="backend must be"):
        SumTree(10, backend="fortran")  # type: ignore[arg-type]


def test_environment_variable_selects_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAYSTORE_SUMTREE", "numpy")
    assert SumTree(10).backend == "numpy"
    monkeypatch.setenv("REPLAYSTORE_SUMTREE", "bogus")
    with pytest.raises(ValueError, match="REPLAYSTORE_SUMTREE"):
        SumTree(10)
    monkeypatch.delenv("REPLAYSTORE_SUMTREE")
    assert SumTree(10).backend == ("c" if HAS_KERNEL else "numpy")


def test_missing_kernel_falls_back_or_fails_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "_csumtree", None)
    monkeypatch.delenv("REPLAYSTORE_SUMTREE", raising=False)
    assert SumTree(10).backend == "numpy"
    with pytest.raises(ImportError, match="backend='numpy'"):
        SumTree(10, backend="c")


def _same_state(a: SumTree, b: SumTree) -> None:
    # Bit-identical: the same sums (not just close ones) and minima at every node.
    np.testing.assert_array_equal(a._sum_flat.view(np.int64), b._sum_flat.view(np.int64))
    np.testing.assert_array_equal(a._min_flat, b._min_flat)


@pytest.mark.skipif(not HAS_KERNEL, reason="compiled SumTree kernel not built")
@pytest.mark.parametrize(("capacity", "fanout"), [(100_000, 32), (50_000, 8), (3000, 2), (777, 5)])
def test_backends_give_identical_trees_and_draws(capacity: int, fanout: int) -> None:
    compiled = SumTree(capacity, fanout=fanout, backend="c")
    reference = SumTree(capacity, fanout=fanout, backend="numpy")
    rng = np.random.default_rng(capacity)
    for _ in range(30):
        idx = rng.integers(0, capacity, 256)
        pri = rng.random(256) * 10.0 ** rng.integers(-3, 4)
        pri[rng.random(256) < 0.1] = 0.0
        compiled.update(idx, pri)
        reference.update(idx, pri)
        _same_state(compiled, reference)
        seed = int(rng.integers(2**32))
        np.testing.assert_array_equal(compiled.sample(256, seed), reference.sample(256, seed))
        mass = rng.uniform(-1.0, 1.1, 61) * compiled.total  # not a multiple of 4 values
        mass[rng.integers(61)] = np.nan
        np.testing.assert_array_equal(compiled.find(mass), reference.find(mass))
        np.testing.assert_array_equal(compiled[idx], reference[idx])


@pytest.mark.skipif(not HAS_KERNEL, reason="compiled SumTree kernel not built")
@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 300),
    fanout=st.integers(2, 9),
    updates=st.lists(
        st.lists(
            st.tuples(st.integers(0, 10_000), st.floats(0.0, 1e6, allow_subnormal=False)),
            min_size=1,
            max_size=40,
        ),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 2**32 - 1),
    draws=st.integers(1, 70),
)
def test_backends_agree_on_any_update_sequence(
    capacity: int, fanout: int, updates: list[list[tuple[int, float]]], seed: int, draws: int
) -> None:
    compiled = SumTree(capacity, fanout=fanout, backend="c")
    reference = SumTree(capacity, fanout=fanout, backend="numpy")
    for batch in updates:
        idx = np.array([i % capacity for i, _ in batch])
        pri = np.array([p for _, p in batch])
        compiled.update(idx, pri)
        reference.update(idx, pri)
        _same_state(compiled, reference)
        np.testing.assert_array_equal(compiled.values(), reference.values())
        if reference.total > 0:
            picked = compiled.sample(draws, seed)
            np.testing.assert_array_equal(picked, reference.sample(draws, seed))
            assert (reference.values()[picked] > 0).all()


@pytest.mark.skipif(not HAS_KERNEL, reason="compiled SumTree kernel not built")
def test_update_that_runs_out_of_memory_leaves_the_tree_unchanged() -> None:
    """Every allocation an update makes is failed in turn (CPython's _testcapi hooks).

    Whichever allocation fails, the update either raises MemoryError with the
    tree exactly as before, or completes; never leaves written leaves whose sums
    were not propagated (the kernel used to write leaves, then allocate).
    """
    testcapi = pytest.importorskip("_testcapi", reason="CPython's _testcapi is not installed")
    idx = np.array([3, 17], dtype=np.int64)
    pri = np.array([5.0, 7.0])
    failures = 0
    for k in range(200):
        tree = SumTree(64, fanout=4, backend="c")
        tree.update(np.arange(64), np.ones(64))
        sums, mins = tree._sum_flat.copy(), tree._min_flat.copy()
        testcapi.set_nomemory(k, k + 1)  # fail only the k-th allocation from here on
        try:
            tree.update(idx, pri)
        except MemoryError:
            testcapi.remove_mem_hooks()
            failures += 1
            np.testing.assert_array_equal(tree._sum_flat, sums, err_msg=f"allocation {k}")
            np.testing.assert_array_equal(tree._min_flat, mins, err_msg=f"allocation {k}")
            continue
        finally:
            testcapi.remove_mem_hooks()
        assert tree.total == 74.0 and tree.values().sum() == 74.0
        break
    else:
        pytest.fail("the update never completed under the allocation hook")
    assert failures > 0  # the hook did reach the update's allocations
