"""RateLimiter: Reverb's MinSize / SampleToInsertRatio rules on ReplayBuffer."""

from __future__ import annotations

import math
import pickle
import threading

import numpy as np
import pytest

from replaystore.errors import (
    ArgumentError,
    CheckpointError,
    RateLimitTimeout,
    ReplayStoreError,
    SchemaError,
)
from replaystore.transitions import RateLimiter, ReplayBuffer


def _buffer(limiter: RateLimiter | None, capacity: int = 100) -> ReplayBuffer:
    return ReplayBuffer("cpu", "cpu", capacity, storage="memory", seed=0, rate_limiter=limiter)


def _item(i: int = 0) -> dict[str, np.ndarray]:
    return {"obs": np.full(2, i, dtype=np.float32), "reward": np.float32(i)}


def _rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    r = np.arange(start, start + n, dtype=np.float32)
    return {"obs": np.stack([r, r], axis=1), "reward": r}


def _in_thread(fn, *args, **kwargs) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def body() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


# ------------------------------------------------------------------ blocking


def test_learner_thread_blocks_until_an_actor_adds():
    buf = _buffer(RateLimiter(min_size_to_sample=3))
    buf.add(_item(0))
    thread, out = _in_thread(buf.sample_batch, 4)
    thread.join(0.2)
    assert thread.is_alive(), "the learner must wait for min_size_to_sample items"
    buf.add(_item(1))
    thread.join(0.1)
    assert thread.is_alive()
    buf.add(_item(2))  # the third item: the waiting sample goes on
    thread.join(10)
    assert not thread.is_alive() and "error" not in out
    assert out["value"].batch_size == (4,)
    assert buf.rate_limiter.samples == 4


def test_learner_ahead_of_the_ratio_waits_for_inserts_then_resumes():
    limiter = RateLimiter(2, samples_per_insert=1.0, error_buffer=2)  # error range (0, 4)
    buf = _buffer(limiter)
    buf.add_batch(_rows(4))
    buf.sample_batch(4)  # error 4 - 4 = 0: the learner is at the bottom of the range
    thread, out = _in_thread(buf.sample_batch, 2)
    thread.join(0.2)
    assert thread.is_alive()
    buf.add(_item(5))
    buf.add(_item(6))
    thread.join(10)
    assert not thread.is_alive() and "error" not in out
    assert (limiter.inserts, limiter.samples) == (6, 6)


def test_actors_ahead_of_the_ratio_wait_for_samples_then_resume():
    limiter = RateLimiter(2, samples_per_insert=1.0, error_buffer=2)
    buf = _buffer(limiter)
    buf.add_batch(_rows(4))  # error 4: the top of the range
    thread, out = _in_thread(buf.add, _item(9))
    thread.join(0.2)
    assert thread.is_alive() and len(buf) == 4
    buf.sample_batch(1)
    thread.join(10)
    assert not thread.is_alive() and "error" not in out
    assert len(buf) == 5 and limiter.inserts == 5


def test_add_batch_larger_than_the_error_range_goes_on_in_parts():
    limiter = RateLimiter(2, samples_per_insert=1.0, error_buffer=2)
    buf = _buffer(limiter)
    buf.add_batch(_rows(4))
    thread, out = _in_thread(buf.add_batch, _rows(20, start=4), timeout=30)
    for _ in range(20):  # the learner samples one at a time; each frees one insert
        buf.sample_batch(1, timeout=30)
    thread.join(10)
    assert not thread.is_alive() and "error" not in out
    assert len(buf) == 24
    # Written in order, as one add_batch would have been.
    np.testing.assert_array_equal(buf.sample_all()["reward"].numpy(), np.arange(24))


def test_sample_batch_larger_than_the_error_range_goes_on_in_parts():
    limiter = RateLimiter(1, samples_per_insert=1.0, error_buffer=2)  # range (-1, 3)
    buf = _buffer(limiter)
    buf.add(_item(0))
    thread, out = _in_thread(buf.sample_batch, 10, timeout=30)
    for i in range(9):
        buf.add(_item(i + 1), timeout=30)
    thread.join(10)
    assert not thread.is_alive() and "error" not in out
    assert limiter.samples == 10 and limiter.inserts == 10


# ------------------------------------------------------------------ timeouts


def test_sample_timeout_raises_rate_limit_timeout_and_counts_no_sample():
    limiter = RateLimiter(min_size_to_sample=2)
    buf = _buffer(limiter)
    buf.add(_item())
    with pytest.raises(RateLimitTimeout, match="min_size_to_sample=2") as info:
        buf.sample_batch(3, timeout=0.05)
    assert isinstance(info.value, ReplayStoreError) and isinstance(info.value, TimeoutError)
    assert info.value.requested == 3 and info.value.completed == 0
    assert limiter.samples == 0


def test_partly_granted_sample_that_times_out_gives_its_samples_back():
    limiter = RateLimiter(1, samples_per_insert=1.0, error_buffer=2)  # range (-1, 3)
    buf = _buffer(limiter)
    buf.add_batch(_rows(3))  # error 3: 4 samples allowed, 10 asked
    with pytest.raises(RateLimitTimeout, match="learner is ahead"):
        buf.sample_batch(10, timeout=0.05)
    assert limiter.samples == 0
    buf.sample_batch(4, timeout=0)  # the 4 are still there


def test_add_timeout_raises_and_writes_nothing():
    limiter = RateLimiter(2, samples_per_insert=1.0, error_buffer=2)
    buf = _buffer(limiter)
    buf.add_batch(_rows(4))
    with pytest.raises(RateLimitTimeout, match="actors are ahead") as info:
        buf.add(_item(), timeout=0.05)
    assert info.value.requested == 1 and info.value.completed == 0
    assert len(buf) == 4 and limiter.inserts == 4


def test_add_batch_timeout_says_how_many_rows_were_added():
    limiter = RateLimiter(2, samples_per_insert=1.0, error_buffer=2)
    buf = _buffer(limiter)
    buf.add_batch(_rows(2))  # error 2: two more inserts allowed
    with pytest.raises(RateLimitTimeout, match="first 2 added") as info:
        buf.add_batch(_rows(5, start=2), timeout=0.05)
    assert (info.value.requested, info.value.completed) == (5, 2)
    assert len(buf) == 4 and limiter.inserts == 4


def test_timeout_zero_never_waits_and_bad_timeouts_are_refused():
    buf = _buffer(RateLimiter(1))
    with pytest.raises(RateLimitTimeout):
        buf.sample_batch(1, timeout=0)
    for bad in (-1, float("nan"), "1"):
        with pytest.raises(ArgumentError, match="timeout"):
            buf.sample_batch(1, timeout=bad)
        with pytest.raises(ArgumentError, match="timeout"):
            buf.add(_item(), timeout=bad)
    with pytest.raises(ArgumentError, match="timeout"):
        _buffer(None).sample_batch(1, timeout=-1)


# --------------------------------------------------------------- the rules


def test_min_size_counts_items_that_exist_not_items_ever_inserted():
    limiter = RateLimiter(min_size_to_sample=4)
    buf = _buffer(limiter, capacity=4)
    buf.add_batch(_rows(3))
    assert not limiter.can_sample()
    buf.add(_item(3))
    assert limiter.can_sample(1000)  # MinSize: no ratio, any number once 4 exist
    buf.add_batch(_rows(6))  # the ring overwrites 6: deletes counted
    assert (limiter.inserts, limiter.deletes, limiter.size) == (10, 6, 4)
    buf.sample_batch(8, timeout=0)


def _reverb_can_sample(ins: int, dels: int, smp: int, spi: float, lo: float, mn: int) -> bool:
    return ins - dels >= mn and ins * spi - smp - 1 >= lo


def _reverb_can_insert(ins: int, dels: int, smp: int, spi: float, hi: float, mn: int) -> bool:
    return ins + 1 - dels <= mn or (ins + 1) * spi - smp <= hi


@pytest.mark.parametrize(
    ("spi", "error_buffer", "min_size"),
    [(1.0, 2, 3), (4.0, 10.0, 2), (0.25, 1.5, 5), (2.5, (-3.0, 8.0), 1)],
)
def test_every_single_insert_and_sample_follows_reverbs_rules(spi, error_buffer, min_size):
    limiter = RateLimiter(min_size, samples_per_insert=spi, error_buffer=error_buffer)
    lo, hi = limiter.error_range
    if not isinstance(error_buffer, tuple):
        assert (lo, hi) == (spi * min_size - error_buffer, spi * min_size + error_buffer)
    buf = _buffer(limiter, capacity=16)  # the ring wraps: deletes take part
    rng = np.random.default_rng(7)
    ins = dels = smp = 0
    moves = {"insert": 0, "sample": 0}
    for step in range(600):
        if rng.random() < 0.5:
            allowed = _reverb_can_insert(ins, dels, smp, spi, hi, min_size)
            try:
                buf.add(_item(step), timeout=0)
                ok = True
            except RateLimitTimeout:
                ok = False
            assert ok == allowed, (step, ins, dels, smp)
            if ok:
                dels += ins - dels == 16
                ins += 1
                moves["insert"] += 1
        else:
            allowed = _reverb_can_sample(ins, dels, smp, spi, lo, min_size)
            try:
                buf.sample_batch(1, timeout=0)
                ok = True
            except RateLimitTimeout:
                ok = False
            assert ok == allowed, (step, ins, dels, smp)
            smp += ok
            moves["sample"] += ok
        assert (limiter.inserts, limiter.deletes, limiter.samples) == (ins, dels, smp)
        assert lo - 1 <= ins * spi - smp <= hi + spi or ins - dels <= min_size
    assert min(moves.values()) > 50  # both directions were exercised


def test_batch_of_b_counts_b_samples_and_add_batch_of_n_counts_n_inserts():
    limiter = RateLimiter(1, samples_per_insert=8.0, error_buffer=64)
    buf = _buffer(limiter)
    buf.add_batch(_rows(7))
    buf.sample_batch(32)
    assert (limiter.inserts, limiter.samples) == (7, 32)
    # error 7 * 8 - 32 = 24 may fall to 8 * 1 - 64 = -56: 80 more samples, not 81.
    assert limiter.can_sample(80) and not limiter.can_sample(81)


def test_a_failed_write_releases_its_reservation():
    limiter = RateLimiter(2, samples_per_insert=1.0, error_buffer=2)
    buf = _buffer(limiter)
    buf.add_batch(_rows(3))
    with pytest.raises(SchemaError):
        buf.add({"obs": np.zeros(3, dtype=np.float32), "reward": np.float32(0)})
    assert limiter.inserts == 3
    buf.add(_item(), timeout=0)  # the one free insert was given back


# ------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_size_to_sample": 0}, "min_size_to_sample"),
        ({"min_size_to_sample": 1, "error_buffer": 3}, "needs samples_per_insert"),
        ({"min_size_to_sample": 1, "samples_per_insert": 1.0}, "needs error_buffer"),
        ({"min_size_to_sample": 1, "samples_per_insert": 0, "error_buffer": 3}, "samples_per"),
        ({"min_size_to_sample": 1, "samples_per_insert": 4.0, "error_buffer": 3}, "range of 6"),
        ({"min_size_to_sample": 2, "samples_per_insert": 1.0, "error_buffer": (3, 9)}, "above"),
        ({"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": (1,)}, "pair"),
        ({"min_size_to_sample": 1, "samples_per_insert": math.nan, "error_buffer": 3}, "finite"),
    ],
)
def test_bad_arguments_are_refused_with_their_name(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        RateLimiter(**kwargs)


def test_buffer_refuses_a_limiter_it_cannot_satisfy_or_that_is_taken():
    with pytest.raises(ArgumentError, match="above buffer_size=10"):
        _buffer(RateLimiter(11), capacity=10)
    with pytest.raises(ArgumentError, match="RateLimiter or None"):
        ReplayBuffer("cpu", "cpu", 10, rate_limiter=3)  # type: ignore[arg-type]
    limiter = RateLimiter(1)
    _buffer(limiter)
    with pytest.raises(ArgumentError, match="another buffer"):
        _buffer(limiter)


def test_range_below_the_offset_is_allowed_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="replaystore.transitions.rate_limiter"):
        RateLimiter(10, samples_per_insert=1.0, error_buffer=(-5.0, 5.0))
    assert "deadlock" in caplog.text


# ----------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_restores_the_counters(tmp_path):
    limiter = RateLimiter(2, samples_per_insert=2.0, error_buffer=20)  # range (-16, 24)
    buf = _buffer(limiter, capacity=8)
    buf.add_batch(_rows(10))  # wraps: 2 deletes
    buf.sample_batch(5)
    buf.save(tmp_path / "ckpt")
    fresh = RateLimiter(2, samples_per_insert=2.0, error_buffer=20)
    other = _buffer(fresh, capacity=8)
    other.load(tmp_path / "ckpt")
    assert fresh.state_dict() == {"inserts": 10, "samples": 5, "deletes": 2}
    # error 10 * 2 - 5 = 15 may fall to -16: 31 more samples, not 32.
    assert fresh.can_sample(31) and not fresh.can_sample(32)


def test_checkpoint_without_limiter_state_loads_as_before(tmp_path):
    plain = _buffer(None)
    plain.add_batch(_rows(6))
    plain.save(tmp_path / "ckpt")
    limiter = RateLimiter(2, samples_per_insert=1.0, error_buffer=4)
    buf = _buffer(limiter)
    buf.load(tmp_path / "ckpt")
    assert len(buf) == 6
    assert limiter.state_dict() == {"inserts": 6, "samples": 0, "deletes": 0}
    # A limited checkpoint into a buffer without a limiter: its counters are ignored.
    buf.save(tmp_path / "limited")
    again = _buffer(None)
    again.load(tmp_path / "limited")
    assert len(again) == 6


def test_checkpoint_with_negative_counters_is_refused(tmp_path):
    import json

    buf = _buffer(RateLimiter(1))
    buf.add(_item())
    buf.save(tmp_path / "ckpt")
    meta_path = tmp_path / "ckpt.metadata"
    meta = json.loads(meta_path.read_text())
    meta["rate_limiter"]["samples"] = -1
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="negative"):
        _buffer(RateLimiter(1)).load(tmp_path / "ckpt")


def test_reset_zeroes_the_counters():
    limiter = RateLimiter(1)
    buf = _buffer(limiter)
    buf.add_batch(_rows(3))
    buf.sample_batch(2)
    buf.reset()
    assert limiter.state_dict() == {"inserts": 0, "samples": 0, "deletes": 0}
    with pytest.raises(RateLimitTimeout):
        buf.sample_batch(1, timeout=0)


def test_a_copy_keeps_settings_and_counters_and_is_free_to_bind():
    limiter = RateLimiter(3, samples_per_insert=2.0, error_buffer=(0.0, 9.0))
    _buffer(limiter).add_batch(_rows(4))
    copy = pickle.loads(pickle.dumps(limiter))
    assert copy.config() == limiter.config() and copy.state_dict() == limiter.state_dict()
    assert copy.error_range == (0.0, 9.0)
    _buffer(copy)  # not bound to the original's buffer
