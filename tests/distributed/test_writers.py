"""Many writer actors into one sharded buffer: nothing lost, nothing duplicated; a dead writer."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import pytest

from replaystore.distributed import BatchingWriter, ShardedReplayBuffer

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


class _Writer:
    """A rollout worker: adds transitions one at a time through a BatchingWriter."""

    def __init__(self, target: Any, writer_id: int) -> None:
        self.writer = BatchingWriter(target, batch_size=500, max_delay_s=1.0, max_in_flight=2)
        self.writer_id = writer_id
        self.done = 0

    def run(self, n: int, start: int = 0, sleep_s: float = 0.0) -> int:
        base = self.writer_id * 1_000_000
        for i in range(start, start + n):
            self.writer.add(
                {
                    "obs": np.full(4, base + i, dtype=np.float64),
                    "action": np.int64(i % 2),
                    "reward": np.float32(1.0),
                    "done": False,
                }
            )
            self.done += 1
            if sleep_s and i % 500 == 499:
                time.sleep(sleep_s)
        self.writer.flush()
        return self.done


def _writer_class() -> Any:
    import ray

    # This test module is not importable in Ray's workers: ship the class by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray.remote(_Writer).options(num_cpus=0)


def _all_ids(buf: ShardedReplayBuffer) -> np.ndarray:
    return buf.sample_all()["obs"][:, 0].numpy().astype(np.int64)


def test_four_writer_actors_store_exactly_40k_without_duplicates() -> None:
    import ray

    buf = ShardedReplayBuffer(2, 25_000, sampler="prioritized", seed=0)
    writers = [_writer_class().remote(buf, w) for w in range(4)]
    try:
        assert ray.get([w.run.remote(10_000) for w in writers]) == [10_000] * 4
        ids = _all_ids(buf)
        assert ids.size == 40_000 == buf.size
        assert np.unique(ids).size == 40_000
        want = np.concatenate([w * 1_000_000 + np.arange(10_000) for w in range(4)])
        np.testing.assert_array_equal(np.sort(ids), want)
        assert sum(buf.shard_sizes()) == 40_000
    finally:
        for w in writers:
            ray.kill(w)
        buf.terminate()


def test_a_killed_writer_does_not_stop_the_buffer_or_the_others() -> None:
    import ray

    buf = ShardedReplayBuffer(2, 50_000, sampler="prioritized", seed=0)
    slow = _writer_class().remote(buf, 0)
    fast = _writer_class().remote(buf, 1)
    try:
        doomed = slow.run.remote(20_000, sleep_s=0.05)
        survivor = fast.run.remote(5_000)
        time.sleep(1.0)
        ray.kill(slow)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(doomed)
        assert ray.get(survivor) == 5_000
        # The buffer goes on: more adds and samples work.
        assert ray.get(fast.run.remote(1_000, start=5_000)) == 6_000
        ids = _all_ids(buf)
        mine = ids[ids >= 1_000_000] - 1_000_000
        np.testing.assert_array_equal(np.sort(mine), np.arange(6_000))
        # The dead writer's acknowledged batches stay; each whole batch or nothing.
        dead = np.sort(ids[ids < 1_000_000])
        assert dead.size % 500 == 0 and dead.size < 20_000
        np.testing.assert_array_equal(dead, np.arange(dead.size))
        assert buf.sample_batch(256)["obs"].shape == (256, 4)
    finally:
        ray.kill(fast)
        buf.terminate()
