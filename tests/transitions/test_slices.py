"""SliceSampler: slices of consecutive steps within an episode, checked against a slow reference.

The reference (:func:`reference_slices`) walks the stored steps oldest to
newest, cuts them into runs at episode ends, and lists every valid start with
its window: the specification written as a loop. Every test builds episodes
whose rows carry their own id (``obs`` = the add number), so a sampled row
tells which step it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from replaystore.errors import ArgumentError, EmptyBufferError, PriorityError, SchemaError
from replaystore.transitions import ReplayBuffer, SliceSampler

scipy_stats = pytest.importorskip("scipy.stats")


def episode_batch(lengths: list[int], first_id: int = 0, open_last: bool = False) -> dict:
    """Consecutive episodes of the given lengths; ``obs`` is the step's add number."""
    n = sum(lengths)
    ids = np.arange(first_id, first_id + n)
    done = np.zeros(n, dtype=bool)
    done[np.cumsum(lengths) - 1] = True
    if open_last:
        done[-1] = False
    return {"obs": ids.astype(np.float32), "reward": (ids % 7).astype(np.float32), "done": done}


def reference_slices(
    done: np.ndarray, size: int, pointer: int, capacity: int, slice_len: int, strict: bool
) -> dict[int, list[int]]:
    """Every valid start -> its real steps' positions, by the rules of the docs."""
    oldest = pointer if size == capacity else 0
    order = [(oldest + r) % capacity for r in range(size)]
    runs: list[list[int]] = [[]]
    for pos in order:
        runs[-1].append(pos)
        if done[pos]:
            runs.append([])
    starts: dict[int, list[int]] = {}
    for run in runs:
        if len(run) >= slice_len:
            for i in range(len(run) - slice_len + 1):
                starts[run[i]] = run[i : i + slice_len]
        elif run and not strict:
            starts[run[0]] = run
    return starts


def stored_done(buf: ReplayBuffer) -> np.ndarray:
    """The ``done`` column in storage order (rows 0..size-1)."""
    return buf.sample_all()["done"].numpy()


def check_sample(buf: ReplayBuffer, out: Any, slice_len: int, strict: bool) -> list[int]:
    """Assert every row of ``out`` is one of the reference's slices; return the starts."""
    ref = reference_slices(
        stored_done(buf), buf.size, buf.pointer, buf.buffer_size, slice_len, strict
    )
    index = out["index"].numpy()
    obs = out["obs"].numpy()
    starts = []
    for row in range(index.shape[0]):
        window = ref.get(int(index[row, 0]))
        assert window is not None, f"row {row} starts at an invalid position {index[row, 0]}"
        real = len(window)
        assert index[row, :real].tolist() == window
        # The rows hold the steps at those positions, in time order.
        ids = obs[row, :real]
        assert (np.diff(ids) == 1).all()
        if not strict:
            assert out["mask"][row].tolist() == [True] * real + [False] * (slice_len - real)
            assert (index[row, real:] == -1).all()
            assert (obs[row, real:] == 0).all() and not out["done"][row, real:].any()
        starts.append(int(index[row, 0]))
    return starts


def chi_square_p(counts: np.ndarray, expected_prob: np.ndarray) -> float:
    expected = expected_prob / expected_prob.sum() * counts.sum()
    return float(scipy_stats.chisquare(counts, expected).pvalue)


# ----------------------------------------------------------------- boundaries


def test_sample_batch_returns_slices_of_consecutive_steps_of_one_episode(make_buffer) -> None:
    buf = make_buffer(200, sampler=SliceSampler(4))
    buf.add_batch(episode_batch([5, 9, 4, 3, 12, 7]))
    out = buf.sample_batch(32)
    assert out.batch_size == torch.Size([8, 4])
    assert out["index"].dtype == torch.int64 and out["index"].shape == (8, 4)
    assert out["obs"].shape == (8, 4) and "weight" not in out.keys()  # noqa: SIM118
    check_sample(buf, out, 4, strict=True)


def test_a_batch_size_that_is_not_a_multiple_of_slice_len_is_refused(make_buffer) -> None:
    buf = make_buffer(50, sampler=SliceSampler(4))
    buf.add_batch(episode_batch([10, 10]))
    with pytest.raises(ArgumentError, match="batch_size 30 is not a multiple of slice_len 4"):
        buf.sample_batch(30)


def test_slices_stop_at_episode_ends_and_cover_every_valid_start(make_buffer) -> None:
    buf = make_buffer(64, sampler=SliceSampler(3))
    buf.add_batch(episode_batch([4, 2, 6, 1, 5]))
    ref = reference_slices(stored_done(buf), buf.size, buf.pointer, 64, 3, True)
    seen = set()
    for _ in range(20):
        seen.update(check_sample(buf, buf.sample_batch(3 * 16), 3, strict=True))
    assert seen == set(ref)  # every valid start is drawn, no other


def test_slices_never_cross_the_write_position_after_the_ring_wraps(make_buffer) -> None:
    # One long episode that never ends: only the write position separates
    # the newest step (pointer - 1) from the oldest (pointer).
    buf = make_buffer(20, sampler=SliceSampler(4))
    ids = episode_batch([33], open_last=True)
    buf.add_batch({k: v[:25] for k, v in ids.items()})
    for i in range(25, 33):  # single adds move the pointer one by one
        buf.add({k: v[i] for k, v in ids.items()})
    assert buf.size == 20 and buf.pointer == 13
    ref = reference_slices(stored_done(buf), 20, 13, 20, 4, True)
    assert len(ref) == 17  # 20 stored steps in time order: starts at ranks 0..16
    seen = set()
    for _ in range(30):
        out = buf.sample_batch(4 * 16)
        seen.update(check_sample(buf, out, 4, strict=True))
        obs = out["obs"].numpy()
        assert (obs.min() >= 13) and (obs.max() <= 32)
    assert seen == set(ref)
    # A slice wraps from the last storage position to the first when the steps do.
    assert any(ref[s] == [18, 19, 0, 1] for s in ref) and 18 in seen


def test_the_newest_open_episode_is_sliceable_up_to_its_newest_step(make_buffer) -> None:
    buf = make_buffer(100, sampler=SliceSampler(3))
    buf.add_batch(episode_batch([4, 6], open_last=True))  # steps 4..9 are still open
    newest = int(buf.size) - 1
    ends = set()
    for _ in range(20):
        out = buf.sample_batch(30)
        check_sample(buf, out, 3, strict=True)
        ends.update(out["index"][:, -1].tolist())
    assert newest in ends and max(ends) == newest
    buf.add({"obs": np.float32(10), "reward": np.float32(3), "done": False})
    out = buf.sample_batch(3 * 64)
    assert newest + 1 in out["index"][:, -1].tolist()


def test_terminated_and_truncated_columns_end_episodes_too(make_buffer) -> None:
    buf = make_buffer(100, sampler=SliceSampler(2))
    n = 12
    ids = np.arange(n, dtype=np.float32)
    terminated = np.zeros(n, dtype=bool)
    truncated = np.zeros(n, dtype=bool)
    terminated[3] = True
    truncated[7] = True
    buf.add_batch(
        {"obs": ids, "done": np.zeros(n, bool), "terminated": terminated, "truncated": truncated}
    )
    starts = set()
    for _ in range(10):
        starts.update(buf.sample_batch(2 * 32)["index"][:, 0].tolist())
    assert starts == set(range(11)) - {3, 7}


def test_strict_slices_never_hold_episodes_shorter_than_slice_len(make_buffer) -> None:
    buf = make_buffer(100, sampler=SliceSampler(5))
    buf.add_batch(episode_batch([2, 3, 4, 1]))
    with pytest.raises(EmptyBufferError, match="no slice of 5 steps"):
        buf.sample_batch(10)
    buf.add_batch(episode_batch([5], first_id=10))
    out = buf.sample_batch(5 * 20)
    assert set(out["index"][:, 0].tolist()) == {10}


def test_loose_slices_return_short_episodes_padded_with_a_mask(make_buffer) -> None:
    buf = make_buffer(100, sampler=SliceSampler(4, strict=False))
    buf.add_batch(episode_batch([2, 6, 1, 3, 5], open_last=True))
    ref = reference_slices(stored_done(buf), buf.size, buf.pointer, 100, 4, strict=False)
    seen = set()
    for _ in range(30):
        out = buf.sample_batch(4 * 16)
        assert out["mask"].dtype == torch.bool and out["mask"].shape == (16, 4)
        seen.update(check_sample(buf, out, 4, strict=False))
    assert seen == set(ref)
    # The short runs 0-1, 8, 9-11 start exactly once each, padded.
    assert {0, 8, 9} <= seen and ref[8] == [8]


def test_an_end_key_the_buffer_lacks_is_named(make_buffer) -> None:
    buf = make_buffer(10, sampler=SliceSampler(2, end_key="is_last"))
    buf.add_batch(episode_batch([5]))
    with pytest.raises(SchemaError, match="no column 'is_last'"):
        buf.sample_batch(2)


def test_bad_slice_sampler_arguments_are_refused() -> None:
    with pytest.raises(ArgumentError, match="slice_len"):
        SliceSampler(0)
    with pytest.raises(ArgumentError, match="eta must be in"):
        SliceSampler(4, eta=1.5)
    with pytest.raises(ArgumentError, match="end_key"):
        SliceSampler(4, end_key="")


# ------------------------------------------------------------- distributions


def test_uniform_slice_starts_pass_a_chi_square_test(make_buffer) -> None:
    buf = make_buffer(300, sampler=SliceSampler(8), seed=3)
    rng = np.random.default_rng(1)
    lengths = rng.integers(3, 40, size=30).tolist()
    buf.add_batch(episode_batch(lengths))  # 300 slots: the ring wraps
    ref = reference_slices(stored_done(buf), buf.size, buf.pointer, 300, 8, True)
    starts = sorted(ref)
    draws = np.concatenate([buf.sample_batch(8 * 500)["index"][:, 0].numpy() for _ in range(40)])
    counts = np.array([np.count_nonzero(draws == s) for s in starts])
    assert counts.sum() == draws.size  # no draw outside the valid starts
    assert chi_square_p(counts, np.ones(len(starts))) > 1e-3


def test_prioritized_slice_starts_follow_the_r2d2_priority(make_buffer) -> None:
    eta, alpha, beta, eps = 0.9, 0.7, 0.5, 1e-6
    sampler = SliceSampler(4, prioritized=True, alpha=alpha, beta=beta, eps=eps, eta=eta)
    buf = make_buffer(120, sampler=sampler, seed=5)
    rng = np.random.default_rng(2)
    buf.add_batch(episode_batch(rng.integers(2, 15, size=14).tolist()))
    raw = rng.exponential(1.0, size=buf.size)
    buf.update_priorities(np.arange(buf.size), raw)
    step = (raw + eps) ** alpha
    np.testing.assert_allclose(buf.priorities(), step)
    ref = reference_slices(stored_done(buf), buf.size, buf.pointer, 120, 4, True)
    starts = sorted(ref)
    q = np.array([eta * step[ref[s]].max() + (1 - eta) * step[ref[s]].mean() for s in starts])
    out = [buf.sample_batch(4 * 500) for _ in range(40)]
    draws = np.concatenate([o["index"][:, 0].numpy() for o in out])
    counts = np.array([np.count_nonzero(draws == s) for s in starts])
    assert counts.sum() == draws.size
    assert chi_square_p(counts, q) > 1e-3
    # Importance weights: (q / q_min) ** -beta on every step of the slice, at most 1.
    first = out[0]
    w = first["weight"].numpy()
    assert w.shape == (500, 4) and w.dtype == np.float32 and (w <= 1).all()
    qs = dict(zip(starts, q, strict=True))
    expected = np.array([(qs[s] / q.min()) ** -beta for s in first["index"][:, 0].tolist()])
    np.testing.assert_allclose(w, np.repeat(expected[:, None], 4, axis=1), rtol=1e-5)


def test_uniform_sampler_would_fail_the_priority_test() -> None:
    # The chi-square test above has power: uniform counts fail it.
    counts = np.array([1000, 1000, 1000, 1000])
    assert chi_square_p(counts, np.array([1.0, 2.0, 1.0, 1.0])) < 1e-6


# ---------------------------------------------------------------- priorities


def test_slice_priorities_update_with_the_sample_index_and_follow_writes(make_buffer) -> None:
    sampler = SliceSampler(3, prioritized=True, alpha=1.0, eps=1e-6, eta=0.5)
    buf = make_buffer(40, sampler=sampler, seed=1)
    buf.add_batch(episode_batch([10, 8, 12]))
    out = buf.sample_batch(3 * 4)
    index = out["index"]
    pri = torch.arange(12, dtype=torch.float64).reshape(4, 3) + 2.0
    buf.update_priorities(index, pri)
    # Last value wins for repeated positions, as for flat updates.
    expected = {}
    for pos, p in zip(index.reshape(-1).tolist(), pri.reshape(-1).tolist(), strict=True):
        expected[pos] = p + 1e-6
    got = buf.priorities_at(index)
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got.reshape(-1), [expected[p] for p in index.reshape(-1).tolist()])
    # Flat positions work as before; new steps get the largest priority so far.
    buf.update_priorities([0, 1], [30.0, 0.0])
    buf.add_batch(episode_batch([3], first_id=30))
    np.testing.assert_allclose(
        buf.priorities_at([0, 1, 30, 32]), [30 + 1e-6, 1e-6] + [30 + 1e-6] * 2
    )
    with pytest.raises(PriorityError, match="got 12 indices but 3 priorities"):
        buf.update_priorities(index, [1.0, 2.0, 3.0])


def test_weights_of_loose_slices_are_zero_on_padding(make_buffer) -> None:
    sampler = SliceSampler(4, strict=False, prioritized=True)
    buf = make_buffer(30, sampler=sampler, seed=2)
    buf.add_batch(episode_batch([2, 2, 2]))
    out = buf.sample_batch(4 * 8)
    assert (out["weight"][~out["mask"]] == 0).all() and (out["weight"][out["mask"]] > 0).all()
    # The padded index (-1) is skipped by update_priorities.
    buf.update_priorities(out["index"], torch.ones(8, 4))


def test_a_uniform_slice_sampler_has_no_priorities(make_buffer) -> None:
    buf = make_buffer(30, sampler=SliceSampler(2))
    buf.add_batch(episode_batch([6]))
    with pytest.raises(PriorityError, match="needs a buffer created with"):
        buf.update_priorities([0], [1.0])
    with pytest.raises(PriorityError):
        buf.priorities_at([0])


# ------------------------------------------------------------- bookkeeping


def expected_tree(buf: ReplayBuffer, sampler: SliceSampler) -> np.ndarray:
    """Start weights by the reference: 0 for invalid starts, else 1 or the slice priority."""
    ref = reference_slices(
        stored_done(buf), buf.size, buf.pointer, buf.buffer_size, sampler.slice_len, sampler.strict
    )
    out = np.zeros(buf.buffer_size)
    step = buf.priorities() if sampler.prioritized else None
    for s, window in ref.items():
        if step is None:
            out[s] = 1.0
        else:
            p = step[window]
            out[s] = sampler.eta * p.max() + (1 - sampler.eta) * p.mean()
    return out


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("prioritized", [False, True])
def test_incremental_bookkeeping_equals_the_reference_through_wraps(
    make_buffer, strict: bool, prioritized: bool
) -> None:
    sampler = SliceSampler(3, strict=strict, prioritized=prioritized)
    buf = make_buffer(23, sampler=sampler, seed=4)
    rng = np.random.default_rng(7)
    next_id = 0
    for step in range(60):
        kind = rng.integers(3)
        if kind == 0:  # one step, ending its episode with probability 1/4
            buf.add(
                {"obs": np.float32(next_id), "reward": np.float32(0), "done": rng.random() < 0.25}
            )
            next_id += 1
        elif kind == 1:  # a batch of episodes, sometimes longer than the ring
            lengths = rng.integers(1, 9, size=rng.integers(1, 5)).tolist()
            buf.add_batch(episode_batch(lengths, next_id, open_last=bool(rng.integers(2))))
            next_id += sum(lengths)
        elif prioritized and buf.size:
            idx = rng.integers(0, buf.size, size=5)
            buf.update_priorities(idx, rng.exponential(size=5))
        if buf.size and step % 3 == 0:
            try:
                check_sample(buf, buf.sample_batch(3 * 4), 3, strict)
            except EmptyBufferError:
                assert not reference_slices(stored_done(buf), buf.size, buf.pointer, 23, 3, strict)
            # The sampler's per-start weights (its sum tree) equal the reference's.
            np.testing.assert_allclose(
                sampler._starts.values(), expected_tree(buf, sampler), rtol=1e-12
            )


# ------------------------------------------------------------------- storage


def test_slices_from_a_million_steps_sample_fast_enough_to_be_usable(make_buffer) -> None:
    # Not a timing test: a smoke test that the bookkeeping is vectorised (a
    # Python loop per item would take minutes here).
    buf = make_buffer(1_000_000, sampler=SliceSampler(8, prioritized=True))
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 500, size=4000)
    lengths = lengths[np.cumsum(lengths) <= 1_000_000].tolist()
    buf.add_batch(episode_batch(lengths))
    out = buf.sample_batch(256)
    check_ids = out["obs"].numpy()
    assert (np.diff(check_ids, axis=1) == 1).all()


def slice_sampler_on(device: str) -> Callable[[], ReplayBuffer]:
    return lambda: ReplayBuffer(device, device, 50, sampler=SliceSampler(3), seed=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_slices_on_cuda_storage_match_cpu_storage() -> None:
    gpu, cpu = slice_sampler_on("cuda")(), slice_sampler_on("cpu")()
    for buf in (gpu, cpu):
        buf.add_batch(episode_batch([7, 2, 9, 4], open_last=True))
    a, b = gpu.sample_batch(30), cpu.sample_batch(30)
    assert a["obs"].device.type == "cuda"
    assert torch.equal(a["index"].cpu(), b["index"]) and torch.equal(a["obs"].cpu(), b["obs"])
