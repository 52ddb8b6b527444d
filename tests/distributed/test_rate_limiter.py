"""A RateLimiter through RemoteBuffer (waits inside the actor) and over the shards of
ShardedReplayBuffer (one limiter for the whole buffer), on a real local Ray runtime."""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pytest

from replaystore.distributed import BatchingWriter, RemoteBuffer, ShardedReplayBuffer
from replaystore.errors import ArgumentError, RateLimitTimeout
from replaystore.transitions import RateLimiter, ReplayBuffer

pytestmark = pytest.mark.usefixtures("ray_session")


def _rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    r = np.arange(start, start + n, dtype=np.float32)
    return {"obs": np.stack([r, r], axis=1), "reward": r}


def _ratio() -> RateLimiter:
    return RateLimiter(2, samples_per_insert=1.0, error_buffer=2)  # error range (0, 4)


def test_remote_sample_waits_in_the_actor_while_adds_go_on(ray_session: Any) -> None:
    created = RemoteBuffer.create(
        ReplayBuffer,
        "cpu",
        "cpu",
        50,
        storage="memory",
        rate_limiter=RateLimiter(3),
        name="limited-replay",
    )
    try:
        # A client found by name routes its calls like the creator's.
        client = RemoteBuffer.connect("limited-replay")
        client.add_batch(_rows(1))
        out: dict[str, Any] = {}

        def learner() -> None:
            try:
                out["batch"] = client.sample_batch(4, timeout=30)
            except BaseException as exc:  # handed to the test
                out["error"] = exc

        thread = threading.Thread(target=learner, daemon=True)
        thread.start()
        thread.join(0.3)
        assert thread.is_alive(), "the sample must wait for min_size_to_sample items"
        # Runs although a sample waits inside the actor (its own concurrency group).
        client.add_batch(_rows(2, start=1))
        thread.join(30)
        assert "error" not in out and out["batch"].batch_size == (4,)
        limiter = client.rate_limiter  # a copy of the actor's limiter
        assert (limiter.inserts, limiter.samples) == (3, 4)
    finally:
        created.terminate()


def test_remote_timeouts_raise_rate_limit_timeout_on_the_caller(ray_session: Any) -> None:
    client = RemoteBuffer.create(
        ReplayBuffer, "cpu", "cpu", 50, storage="memory", rate_limiter=_ratio()
    )
    try:
        with pytest.raises(RateLimitTimeout, match="min_size_to_sample=2"):
            client.sample_batch(1, timeout=0.05)
        client.add_batch(_rows(4))
        with pytest.raises(RateLimitTimeout, match="actors are ahead"):
            client.add_batch(_rows(1, start=4), timeout=0.05)
        assert client.size == 4
        client.sample_batch(4)
        with pytest.raises(RateLimitTimeout, match="learner is ahead"):
            client.sample_batch(1, timeout=0.05)
    finally:
        client.terminate()


def test_remote_writer_blocked_by_the_limiter_resumes_when_the_learner_samples(
    ray_session: Any,
) -> None:
    ray = ray_session
    client = RemoteBuffer.create(
        ReplayBuffer, "cpu", "cpu", 50, storage="memory", rate_limiter=_ratio()
    )
    try:
        writer = BatchingWriter(client, batch_size=2, max_in_flight=8)
        for i in range(10):  # 5 batches; only 4 rows fit before the learner samples
            writer.add({"obs": np.full(2, i, dtype=np.float32), "reward": np.float32(i)})
        last = writer._in_flight[-1][0]
        ready, _ = ray.wait([last], timeout=0.3)
        assert not ready
        for _ in range(6):
            client.sample_batch(1, timeout=30)
        writer.flush()
        # Batches kept their order through the actor's inserts group.
        np.testing.assert_array_equal(client.sample_all()["reward"].numpy(), np.arange(10))
    finally:
        client.terminate()


def test_sharded_buffer_has_one_limiter_for_all_shards(ray_session: Any) -> None:
    buf = ShardedReplayBuffer(2, 20, sampler="uniform", seed=0, rate_limiter=_ratio())
    try:
        buf.add_batch(_rows(1), shard=0)
        with pytest.raises(RateLimitTimeout, match="min_size_to_sample=2"):
            buf.sample_batch(1, timeout=0.05)
        buf.add_batch(_rows(3, start=1), shard=1)  # 4 in all: the top of the error range
        with pytest.raises(RateLimitTimeout, match="actors are ahead") as info:
            buf.add_batch(_rows(2, start=4), shard=0, timeout=0.05)
        assert info.value.completed == 0 and buf.shard_sizes() == [1, 3]
        assert buf.sample_batch(3).batch_size == (3,)
        buf.add_batch(_rows(3, start=4), shard=0)  # the learner made room for exactly 3
        limiter = buf.rate_limiter
        assert (limiter.inserts, limiter.samples, limiter.size) == (7, 3, 7)
        with pytest.raises(RateLimitTimeout, match="actors are ahead"):
            buf.add_batch(_rows(1, start=7), timeout=0.05)
    finally:
        buf.terminate()


def test_a_client_connected_by_name_shares_the_shards_limiter(ray_session: Any) -> None:
    """ShardedReplayBuffer.connect finds the limiter actor beside the named shards: the
    creator's inserts count for the client's samples, and the other way round."""
    buf = ShardedReplayBuffer(
        2, 20, sampler="uniform", seed=3, name="limited-shards", rate_limiter=_ratio()
    )
    try:
        client = ShardedReplayBuffer.connect("limited-shards")
        buf.add_batch(_rows(1), shard=0)
        with pytest.raises(RateLimitTimeout, match="min_size_to_sample=2"):
            client.sample_batch(1, timeout=0.05)
        client.add_batch(_rows(3, start=1), shard=1)  # 4 in all: the top of the error range
        with pytest.raises(RateLimitTimeout, match="actors are ahead"):
            buf.add_batch(_rows(1, start=4), shard=0, timeout=0.05)
        assert client.sample_batch(2).batch_size == (2,)
        buf.add_batch(_rows(2, start=4), shard=0)  # room the client's samples made
        for limiter in (buf.rate_limiter, client.rate_limiter):
            assert limiter.state_dict() == {"inserts": 6, "samples": 2, "deletes": 0}
    finally:
        buf.terminate()


def test_sharded_batch_beyond_the_error_range_goes_on_in_parts(ray_session: Any) -> None:
    ray = ray_session
    buf = ShardedReplayBuffer(2, 50, sampler="prioritized", seed=1, rate_limiter=_ratio())
    try:
        ref, _ = buf.submit_add_batch(_rows(12))  # what a BatchingWriter sends
        for _ in range(8):
            buf.sample_batch(1, timeout=30)  # each sample frees one insert on shard 0
        ray.get(ref, timeout=30)
        assert buf.shard_sizes() == [12, 0]
        assert buf.rate_limiter.state_dict() == {"inserts": 12, "samples": 8, "deletes": 0}
    finally:
        buf.terminate()


def test_sharded_checkpoint_keeps_the_limiters_counters(ray_session: Any, tmp_path) -> None:
    buf = ShardedReplayBuffer(2, 4, sampler="uniform", seed=2, rate_limiter=_ratio())
    try:
        buf.add_batch(_rows(3), shard=0)
        buf.sample_batch(2)
        buf.add_batch(_rows(3, start=3), shard=0)  # shard 0 holds 4: 2 overwritten
        buf.sample_batch(1)
        buf.add_batch(_rows(1, start=6), shard=1)
        buf.save(tmp_path / "ckpt")
        buf.sample_batch(4)
        buf.load(tmp_path / "ckpt")
        assert buf.rate_limiter.state_dict() == {"inserts": 7, "samples": 3, "deletes": 2}
        # A manifest without counters (saved without a limiter): its 5 items count
        # as just inserted, none sampled.
        manifest_path = tmp_path / "ckpt" / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        del manifest["rate_limiter"]
        manifest_path.write_text(json.dumps(manifest))
        buf.load(tmp_path / "ckpt")
        assert buf.rate_limiter.state_dict() == {"inserts": 5, "samples": 0, "deletes": 0}
    finally:
        buf.terminate()


def test_sharded_limiter_arguments_are_checked(ray_session: Any) -> None:
    with pytest.raises(ArgumentError, match="total capacity 8"):
        ShardedReplayBuffer(2, 4, rate_limiter=RateLimiter(9))
    with pytest.raises(ArgumentError, match="RateLimiter or None"):
        ShardedReplayBuffer(2, 4, rate_limiter="minsize")  # type: ignore[arg-type]
