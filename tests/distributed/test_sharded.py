"""ShardedReplayBuffer: exact sampling over the union, routing, checkpoints, error types."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from replaystore.distributed import RemoteActorError, ShardedReplayBuffer
from replaystore.errors import (
    ArgumentError,
    BufferIndexError,
    CheckpointError,
    EmptyBufferError,
    PriorityError,
    SchemaError,
)
from replaystore.transitions import ReplayBuffer

pytestmark = pytest.mark.usefixtures("ray_session")


def _ids(start: int, n: int) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + n)
    return {
        "obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32),
        "action": (ids % 2).astype(np.int64),
        "reward": np.ones(n, dtype=np.float32),
        "done": np.zeros(n, dtype=bool),
    }


@pytest.fixture(scope="module")
def sharded() -> ShardedReplayBuffer:
    buf = ShardedReplayBuffer(3, 50, sampler="prioritized", alpha=0.7, beta=0.5, seed=1)
    for shard in range(3):
        buf.add_batch(_ids(shard * 50, 50), shard=shard)  # global index == id
    yield buf
    buf.terminate()


def test_prioritized_sampling_over_shards_matches_one_buffer(sharded: ShardedReplayBuffer) -> None:
    rng = np.random.default_rng(0)
    raw = rng.uniform(0.0, 5.0, size=150) ** 2
    raw[rng.choice(150, 10, replace=False)] = 0.0  # eps keeps them possible
    raw[:50] *= 6.0  # shard 0 holds most of the mass
    sharded.update_priorities(np.arange(150), raw)
    # The single buffer holding the union, with the same priorities.
    one = ReplayBuffer("cpu", "cpu", 150, sampler="prioritized", alpha=0.7, beta=0.5, seed=1)
    one.add_batch(_ids(0, 150))
    one.update_priorities(np.arange(150), raw)
    p = one.priorities()
    expected = p / p.sum()

    counts = np.zeros(150)
    for _ in range(20):
        batch = sharded.sample_batch(1000)
        ids = batch["obs"][:, 0].numpy().astype(np.int64)
        # The global index names the same transition, and the weights are the
        # single buffer's (p_i / p_min) ** -beta with the global minimum.
        np.testing.assert_array_equal(batch["index"].numpy(), ids)
        np.testing.assert_allclose(batch["weight"].numpy(), (p[ids] / p.min()) ** -0.5, rtol=1e-6)
        counts += np.bincount(ids, minlength=150)
    observed = counts / counts.sum()
    # Pool the rare cells so every expected count is >= 5.
    keep = expected * counts.sum() >= 5
    f_obs = np.append(counts[keep], counts[~keep].sum())
    f_exp = np.append(expected[keep], expected[~keep].sum()) * counts.sum()
    assert stats.chisquare(f_obs, f_exp).pvalue > 1e-3
    # A buffer that ignored the shards' totals (each shard a third) would fail.
    wrong = (
        np.concatenate(
            [
                expected[s * 50 : (s + 1) * 50] / expected[s * 50 : (s + 1) * 50].sum()
                for s in range(3)
            ]
        )
        / 3
    )
    assert stats.chisquare(counts, wrong * counts.sum()).pvalue < 1e-6
    assert abs(observed - expected).max() < 0.01


def test_update_priorities_validates_before_any_shard_changes(sharded: ShardedReplayBuffer) -> None:
    before = sharded.sample_all()["obs"].shape[0]
    assert before == 150
    with pytest.raises(BufferIndexError, match="150"):
        sharded.update_priorities([0, 150], [1.0, 1.0])
    with pytest.raises(PriorityError, match="index 7"):
        sharded.update_priorities([3, 7], [1.0, float("nan")])
    with pytest.raises(PriorityError, match="2 indices but 1"):
        sharded.update_priorities([3, 7], [1.0])
    # Error types cross the boundary: the shard's own SchemaError.
    with pytest.raises(SchemaError, match="obs"):
        sharded.add_batch({"obs": np.zeros((2, 3), dtype=np.float32)}, shard=1)
    with pytest.raises(ArgumentError, match="batch_size"):
        sharded.sample_batch(0)
    with pytest.raises(ArgumentError, match="shard"):
        sharded.add_batch(_ids(0, 1), shard=3)


def test_checkpoint_of_all_shards_is_one_manifest(
    sharded: ShardedReplayBuffer, tmp_path: Path
) -> None:
    sharded.save(tmp_path / "ck")
    first = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert first["num_shards"] == 3 and len(first["shards"]) == 3
    want = sharded.sample_all()
    sharded.update_priorities([0], [100.0])
    sharded.save(tmp_path / "ck")  # a new generation replaces the old one
    second = json.loads((tmp_path / "ck" / "manifest.json").read_text())
    assert second["generation"] != first["generation"]
    assert [p.name for p in (tmp_path / "ck").glob("gen-*")] == [second["generation"]]
    sharded.add_batch(_ids(1000, 5), shard=0)
    sharded.load(tmp_path / "ck")
    got = sharded.sample_all()
    np.testing.assert_array_equal(got["obs"].numpy(), want["obs"].numpy())
    with pytest.raises(CheckpointError, match="manifest"):
        sharded.load(tmp_path / "none")


@pytest.mark.slow
def test_uniform_sampling_weights_shards_by_size() -> None:
    buf = ShardedReplayBuffer(2, 100, sampler="uniform", seed=3, single_round=False)
    try:
        with pytest.raises(EmptyBufferError):
            buf.sample_batch(4)
        buf.add_batch(_ids(0, 100), shard=0)
        buf.add_batch(_ids(100, 20), shard=1)
        assert buf.shard_sizes() == [100, 20] and buf.size == 120
        counts = np.zeros(120)
        for _ in range(10):
            ids = buf.sample_batch(1200)["obs"][:, 0].numpy().astype(np.int64)
            counts += np.bincount(ids, minlength=120)
        assert stats.chisquare(counts).pvalue > 1e-3
        with pytest.raises(PriorityError, match="prioritized"):
            buf.update_priorities([0], [1.0])
    finally:
        buf.terminate()


@pytest.mark.slow
def test_dead_shard_is_named_and_restarts_from_its_checkpoint(tmp_path: Path) -> None:
    import ray

    buf = ShardedReplayBuffer(
        2,
        1000,
        sampler="prioritized",
        seed=0,
        name="rs-restart",
        checkpoint_dir=tmp_path,
        checkpoint_every=100,
        max_restarts=1,
    )
    try:
        for i in range(5):  # 250 into shard 0: checkpoints after 100 and 200
            buf.add_batch(_ids(i * 50, 50), shard=0)
        buf.add_batch(_ids(5000, 30), shard=1)  # below checkpoint_every: never saved
        pid = ray.get(buf.actors[0].info.remote())["pid"]
        ray.kill(buf.actors[0], no_restart=False)
        sizes = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # ray.kill is asynchronous
            try:
                sizes = buf.shard_sizes()
            except RemoteActorError as exc:  # while it restarts: named, with the plan
                assert "shard 0 of 'rs-restart'" in str(exc)
                assert "last checkpoint" in str(exc)
                continue
            try:  # a raw actor call, outside our client: Ray's own errors
                restarted = ray.get(buf.actors[0].info.remote())["pid"] != pid
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                continue  # restarting between the two calls
            if restarted:
                break
            time.sleep(0.05)
        # The loss window: the 50 added after the last periodic checkpoint.
        assert sizes == [200, 30]
        info = ray.get(buf.actors[0].info.remote())
        assert info["restored"] == 200 and info["pid"] != pid
        ids = buf.sample_all()["obs"][:200, 0].numpy()
        np.testing.assert_array_equal(ids, np.arange(200, dtype=np.float32))
        # Without restarts left, a dead shard is a clear error naming it.
        ray.kill(buf.actors[1], no_restart=True)
        with pytest.raises(RemoteActorError, match="shard 1 of 'rs-restart'"):
            buf.sample_batch(8)
    finally:
        buf.terminate()
