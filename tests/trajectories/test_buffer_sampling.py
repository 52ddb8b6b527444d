"""ReplayBuffer.get_training_samples: eligible samples only, recency bias, exact distribution."""

from __future__ import annotations

from itertools import permutations

import numpy as np
import pytest
from scipy import stats

from replaystore.sampling import recency_sample_without_replacement
from replaystore.trajectories import ReplayBuffer, SampleList

from .conftest import TrajectoryFactory


def _successive_inclusion(w: np.ndarray, k: int) -> np.ndarray:
    """Exact inclusion probabilities of successive weighted sampling, by enumeration."""
    incl = np.zeros(w.size)
    for order in permutations(range(w.size), k):
        p, left = 1.0, w.sum()
        for i in order:
            p *= w[i] / left
            left -= w[i]
        incl[list(order)] += p
    return incl


@pytest.fixture
def mixed_buffer_trajectories(trajectory_factory: TrajectoryFactory) -> list[list[dict]]:
    """Successful, failed and repeated-screenshot trajectories, interleaved."""
    return [
        trajectory_factory.trajectory(3, success=True),
        trajectory_factory.trajectory(2, success=False),
        trajectory_factory.trajectory(3, success=True, screens=[1, 1, 2]),
        trajectory_factory.trajectory(2, success=False),
        trajectory_factory.trajectory(2, success=True),
    ]


def test_training_samples_are_only_eligible_even_without_filter_successful_only(
    mixed_buffer_trajectories: list[list[dict]],
) -> None:
    # The seed returns every sample (failed ones included) when the filter is off.
    buffer = ReplayBuffer(mixed_buffer_trajectories, filter_successful_only=False)
    assert len(buffer) == 12
    samples = buffer.get_training_samples()
    assert len(samples) == 7  # 3 + (3 - 1 repeated) + 2
    assert all(s["trajectory_reward"] == 1.0 for s in samples)
    assert not any(s["same_as_next_screenshot"] for s in samples)


def test_all_eligible_samples_oldest_first_when_num_samples_is_none_or_large(
    mixed_buffer_trajectories: list[list[dict]],
) -> None:
    buffer = ReplayBuffer(mixed_buffer_trajectories)
    everything = [s["action"] for s in buffer.get_training_samples()]
    expected = [
        step["response"].raw_response
        for t in (0, 2, 4)
        for i, step in enumerate(mixed_buffer_trajectories[t])
        if not (t == 2 and i == 0)
    ]
    assert everything == expected
    assert [s["action"] for s in buffer.get_training_samples(100, 2.0)] == expected
    assert [s["action"] for s in buffer.get_training_samples(7)] == expected


@pytest.mark.parametrize("power", [1.0, 2.0, 0.5])
def test_subset_is_distinct_eligible_and_seeded(
    mixed_buffer_trajectories: list[list[dict]], power: float
) -> None:
    buffer = ReplayBuffer(mixed_buffer_trajectories)
    eligible = {s["action"] for s in buffer.get_training_samples()}
    a = buffer.get_training_samples(4, power, seed=9)
    b = buffer.get_training_samples(4, power, seed=9)
    actions = [s["action"] for s in a]
    assert len(a) == 4 and len(set(actions)) == 4
    assert set(actions) <= eligible
    assert actions == [s["action"] for s in b]


def test_unseeded_draws_follow_the_buffers_seeded_stream(
    mixed_buffer_trajectories: list[list[dict]],
) -> None:
    a = ReplayBuffer(mixed_buffer_trajectories, seed=4)
    b = ReplayBuffer(mixed_buffer_trajectories, seed=4)
    first = [a.get_training_samples(3, 2.0).positions for _ in range(5)]
    second = [b.get_training_samples(3, 2.0).positions for _ in range(5)]
    assert all(np.array_equal(x, y) for x, y in zip(first, second, strict=True))
    assert len({tuple(p) for p in first}) > 1  # the stream advances


def test_bad_arguments_are_rejected(mixed_buffer_trajectories: list[list[dict]]) -> None:
    buffer = ReplayBuffer(mixed_buffer_trajectories)
    with pytest.raises(ValueError, match="num_samples"):
        buffer.get_training_samples(-1)
    with pytest.raises(ValueError, match="num_samples"):
        buffer.get_training_samples(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="recency_bias_power"):
        buffer.get_training_samples(2, float("nan"))
    assert len(buffer.get_training_samples(0, 2.0)) == 0


def _eligible_pool(factory: TrajectoryFactory, n: int) -> ReplayBuffer:
    # n one-step successful trajectories: n eligible samples, recency rank = index.
    return ReplayBuffer([factory.trajectory(1) for _ in range(n)])


def test_power_two_matches_successive_weighted_sampling_exactly(
    trajectory_factory: TrajectoryFactory,
) -> None:
    n, k, power, trials = 6, 2, 2.0, 20_000
    buffer = _eligible_pool(trajectory_factory, n)
    weights = (np.arange(n) + 1.0) ** power
    expected = _successive_inclusion(weights, k)
    rng = np.random.default_rng(2024)
    counts = np.zeros(n)
    firsts = np.zeros(n)
    for _ in range(trials):
        picked = buffer.training_positions(k, power, seed=rng)
        counts[picked] += 1
        firsts[picked[0]] += 1
    _, p_incl = stats.chisquare(counts, expected * trials)
    _, p_first = stats.chisquare(firsts, weights / weights.sum() * trials)
    assert p_incl > 1e-3
    assert p_first > 1e-3
    assert counts[-1] > counts[0] * 5  # recent samples are clearly favoured


def test_power_two_on_a_large_pool_matches_numpys_weighted_choice(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # 300 eligible samples, 60 drawn: compare inclusion counts per recency decile
    # with numpy's choice(replace=False, p=...) on the same weights.
    n, k, power, trials = 300, 60, 2.0, 400
    buffer = ReplayBuffer([trajectory_factory.trajectory(30) for _ in range(10)])
    assert buffer.num_eligible == n
    p = (np.arange(n) + 1.0) ** power
    p /= p.sum()
    rng = np.random.default_rng(7)
    ours = np.zeros(10)
    theirs = np.zeros(10)
    for _ in range(trials):
        ours += np.bincount(buffer.training_positions(k, power, seed=rng) // 30, minlength=10)
        theirs += np.bincount(rng.choice(n, k, replace=False, p=p) // 30, minlength=10)
    _, p_value, _, _ = stats.chi2_contingency(np.vstack([ours, theirs]))
    assert p_value > 1e-3


def test_power_one_is_uniform(trajectory_factory: TrajectoryFactory) -> None:
    n, k, trials = 8, 3, 12_000
    buffer = _eligible_pool(trajectory_factory, n)
    rng = np.random.default_rng(5)
    counts = np.zeros(n)
    for _ in range(trials):
        counts[buffer.training_positions(k, 1.0, seed=rng)] += 1
    _, p_value = stats.chisquare(counts, np.full(n, trials * k / n))
    assert p_value > 1e-3


def test_power_just_below_one_is_not_uniform(trajectory_factory: TrajectoryFactory) -> None:
    # The documented jump: 0.999 weighs by rank (almost linearly), 1.0 is flat.
    n, trials = 8, 12_000
    buffer = _eligible_pool(trajectory_factory, n)
    rng = np.random.default_rng(6)
    firsts = np.zeros(n)
    for _ in range(trials):
        firsts[buffer.training_positions(1, 0.999, seed=rng)[0]] += 1
    weights = (np.arange(n) + 1.0) ** 0.999
    _, p_linear = stats.chisquare(firsts, weights / weights.sum() * trials)
    _, p_flat = stats.chisquare(firsts, np.full(n, trials / n))
    assert p_linear > 1e-3
    assert p_flat < 1e-6


def test_recency_is_collection_order_even_when_shuffled(
    mixed_buffer_trajectories: list[list[dict]],
) -> None:
    plain = ReplayBuffer(mixed_buffer_trajectories)
    shuffled = ReplayBuffer(mixed_buffer_trajectories, shuffle=True, seed=8)
    for seed in range(5):
        assert np.array_equal(
            plain.training_positions(3, 2.0, seed=seed),
            shuffled.training_positions(3, 2.0, seed=seed),
        )


def test_sample_list_is_a_lazy_read_only_list(mixed_buffer_trajectories: list[list[dict]]) -> None:
    buffer = ReplayBuffer(mixed_buffer_trajectories)
    samples = buffer.get_training_samples(5, 2.0, seed=1)
    assert isinstance(samples, SampleList)
    materialised = samples.to_list()
    assert len(materialised) == 5
    assert samples == materialised
    assert samples[-1] == materialised[-1]
    assert list(samples[1:3]) == materialised[1:3]
    assert samples.positions.dtype == np.int64
    with pytest.raises(IndexError):
        samples[5]


def test_eligible_only_false_draws_from_every_kept_sample(
    mixed_buffer_trajectories: list[list[dict]],
) -> None:
    buffer = ReplayBuffer(mixed_buffer_trajectories, filter_successful_only=False)
    every = buffer.get_training_samples(eligible_only=False)
    assert [s["action"] for s in every] == [buffer[i]["action"] for i in range(len(buffer))]
    assert {s["trajectory_reward"] for s in every} == {0.0, 1.0}
    draw = buffer.get_training_samples(5, recency_bias_power=2.0, seed=3, eligible_only=False)
    assert len(draw) == 5
    assert len(set(draw.positions.tolist())) == 5
    assert set(draw.positions.tolist()) <= set(range(len(buffer)))
    again = buffer.training_positions(5, recency_bias_power=2.0, seed=3, eligible_only=False)
    np.testing.assert_array_equal(draw.positions, again)


def test_positive_powers_need_no_table_and_negative_ones_cache_one(
    trajectory_factory: TrajectoryFactory,
) -> None:
    # The first call of a power > 0 costs what later calls do: nothing is built or cached.
    buffer = _eligible_pool(trajectory_factory, 64)
    picked = buffer.training_positions(8, 2.0, seed=1)
    assert len(set(picked.tolist())) == 8
    assert buffer._tables == {}
    np.testing.assert_array_equal(picked, buffer.training_positions(8, 2.0, seed=1))
    older = buffer.training_positions(8, -1.0, seed=1)  # favours old samples: alias table
    assert len(set(older.tolist())) == 8
    assert list(buffer._tables) == [(64, -1.0)]


@pytest.mark.parametrize("power", [1.0, 2.0])
@pytest.mark.parametrize("eligible_only", [True, False])
def test_training_positions_are_the_pool_at_the_drawn_ranks(
    mixed_buffer_trajectories: list[list[dict]], power: float, eligible_only: bool
) -> None:
    # eligible_only=False: every kept step, a run of consecutive positions (the
    # ranks are offset, not gathered); eligible_only=True here: a pool with gaps.
    buffer = ReplayBuffer(mixed_buffer_trajectories, filter_successful_only=False)
    pool = buffer.training_positions(eligible_only=eligible_only)
    assert bool((np.diff(pool) == 1).all()) is not eligible_only
    for seed in range(20):
        got = buffer.training_positions(4, power, seed, eligible_only=eligible_only)
        gen = np.random.default_rng(seed)
        if power == 1.0:
            ranks = gen.choice(pool.size, size=4, replace=False)
        else:
            ranks = recency_sample_without_replacement(pool.size, 4, power, gen)
        np.testing.assert_array_equal(got, pool[ranks])
